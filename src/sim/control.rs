//! The simulated node's control endpoint, `/_sim/*` (see docs/sim.md): read and set faults,
//! read what the node received and its counters, reset, and go down for a while.
//!
//! Requests here are never recorded, never refused by the cloud or API-key checks, and answered
//! even while the node is flapped down, so a test can always steer the node it plays with.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use super::ollama::error;
use super::router::{not_found, Incoming};
use super::{Faults, Shared};

pub(super) async fn route(s: Arc<Shared>, call: Incoming) -> Response {
    match (call.method.clone(), call.path.as_str()) {
        (Method::GET, "/_sim/faults") => axum::Json(s.faults().clone()).into_response(),
        (Method::POST | Method::PUT, "/_sim/faults") => set_faults(&s, &call.body),
        (Method::GET, "/_sim/received") => {
            axum::Json(s.received.lock().unwrap_or_else(|p| p.into_inner()).clone()).into_response()
        }
        (Method::GET, "/_sim/stats") => stats(&s),
        (Method::POST, "/_sim/reset") => reset(&s),
        (Method::POST, "/_sim/down") => down(s, &call.body),
        _ => not_found(),
    }
}

fn set_faults(s: &Shared, body: &Bytes) -> Response {
    match serde_json::from_slice::<Faults>(body) {
        Ok(f) => {
            *s.faults() = f;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, &format!("bad faults: {e}")),
    }
}

fn stats(s: &Shared) -> Response {
    axum::Json(json!({
        "running": s.running.load(Ordering::Acquire),
        "queued": s.queued.load(Ordering::Acquire),
        "completed": s.completed.load(Ordering::Acquire),
        "streaming": s.streaming.load(Ordering::Acquire),
        "cancelled": s.cancelled.load(Ordering::Acquire),
        "pulling": s.pulling.load(Ordering::Acquire),
        "pulls_completed": s.pulls_completed.load(Ordering::Acquire),
        "pulls_cancelled": s.pulls_cancelled.load(Ordering::Acquire),
        "pulled_bytes": s.pulled_bytes.load(Ordering::Acquire),
    }))
    .into_response()
}

/// Faults off, the record of received requests emptied, up again if flapped down.
fn reset(s: &Shared) -> Response {
    *s.faults() = Faults::default();
    s.received.lock().unwrap_or_else(|p| p.into_inner()).clear();
    s.flapped_down.store(false, Ordering::Release);
    StatusCode::NO_CONTENT.into_response()
}

/// Stop listening for `for_ms` (as a crashed node would), then listen again on the same address.
fn down(s: Arc<Shared>, body: &Bytes) -> Response {
    let for_ms = serde_json::from_slice::<Value>(body).ok().and_then(|v| v.get("for_ms").and_then(Value::as_u64));
    let Some(for_ms) = for_ms else {
        return error(StatusCode::BAD_REQUEST, "body must be {\"for_ms\": N}");
    };
    // Go down only once this answer has been handed to the connection: the stream's guard
    // fires when hyper drops the body after writing it.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = rx.await;
        super::stop(&s);
        tokio::time::sleep(Duration::from_millis(for_ms)).await;
        if let Err(e) = super::restart(&s).await {
            tracing::error!(addr = %s.addr, error = %e, "simulated node could not listen again");
        }
    });
    struct FireOnDrop(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for FireOnDrop {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    let guard = FireOnDrop(Some(tx));
    let msg = Bytes::from(format!("{{\"down_for_ms\":{for_ms}}}"));
    let stream = futures_util::stream::once(async move {
        let _keep = guard;
        Ok::<_, Infallible>(msg)
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}
