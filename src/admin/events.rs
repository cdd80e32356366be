//! `/admin/events`: the one Server-Sent Events stream that says what changed (node state, a
//! finished request, a config reload, the fallback share). The UI listens and then re-fetches
//! what it shows (push, then pull), so events stay small. A listener that falls behind gets a
//! `lagged` event with the count it missed, never a silent gap.

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast::error::RecvError;

use super::AdminState;
use crate::telemetry::Event;

/// The SSE `event:` name of each telemetry event.
fn kind(e: &Event) -> &'static str {
    match e {
        Event::NodeState { .. } => "node_state",
        Event::Request(_) => "request",
        Event::ConfigReload { .. } => "config_reload",
        Event::FallbackShare { .. } => "fallback_share",
    }
}

/// `GET /admin/events`: one SSE event per thing that changed.
pub(super) async fn events(State(s): State<AdminState>) -> Response {
    let rx = s.shared.telemetry.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let event = match rx.recv().await {
            Ok(e) => {
                let kind = kind(&e);
                SseEvent::default().event(kind).json_data(&e).unwrap_or_else(|_| SseEvent::default().event(kind))
            }
            Err(RecvError::Lagged(n)) => SseEvent::default().event("lagged").data(n.to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(event), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}
