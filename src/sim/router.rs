//! The simulated node's front door: every request comes in here, is recorded (`Received`),
//! checked the way the node it plays would check it, and handed to the API it belongs to:
//! `control` for `/_sim/*`, `openai` for `/v1/*`, `ollama` for the rest.
//!
//! Checks, in order: a body over 64 MiB is 413; a cloud sim answers only `/v1/*`; with an API
//! key, `/v1/*` needs `Authorization: Bearer <key>`; `/api/version` (the liveness probe) is
//! answered before the flap check, since it drives the flapping; a flapped-down node answers
//! 500 to everything but the control endpoint. Unknown routes get Go's plain `404 page not found`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{header, HeaderMap, Method, StatusCode};
use serde_json::Value;

use super::{control, ollama, openai, Received, Shared};

const MAX_BODY: usize = 64 * 1024 * 1024;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// One request as the APIs see it: its body read whole, and parsed if it is JSON.
pub(super) struct Incoming {
    pub method: Method,
    pub path: String,
    pub body: Bytes,
    pub json: Option<Value>,
    /// The body's `model` (or older `name`) field.
    pub model: Option<String>,
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return ollama::error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"),
    };
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let model = json
        .as_ref()
        .and_then(|v| v.get("model").or_else(|| v.get("name")))
        .and_then(Value::as_str)
        .map(str::to_string);
    let call = Incoming { method: parts.method, path: parts.uri.path().to_string(), body, json, model };
    let control = call.path.starts_with("/_sim");
    if !control {
        record(&s, &parts.headers, &call);
    }
    if let Some(refused) = refuse(&s, &parts.headers, &call) {
        return refused;
    }
    if call.path == "/api/version" && call.method == Method::GET {
        return ollama::version(&s);
    }
    if control {
        control::route(s, call).await
    } else if s.flapped_down.load(std::sync::atomic::Ordering::Acquire) {
        ollama::error(StatusCode::INTERNAL_SERVER_ERROR, "simulated flap: node is failing")
    } else if call.path.starts_with("/v1/") {
        openai::route(s, call).await
    } else {
        ollama::route(s, call).await
    }
}

fn record(s: &Shared, headers: &HeaderMap, call: &Incoming) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    s.received.lock().unwrap_or_else(|p| p.into_inner()).push(Received {
        method: call.method.to_string(),
        path: call.path.clone(),
        model: call.model.clone(),
        host: header("host"),
        request_id: header("x-request-id"),
        traceparent: header("traceparent"),
        bearer: header("authorization").and_then(|a| a.strip_prefix("Bearer ").map(str::to_string)),
        body: s.spec.cloud.then(|| String::from_utf8_lossy(&call.body).into_owned()),
    });
}

/// What a cloud API refuses: anything but `/v1/*`, and `/v1/*` without the right key.
fn refuse(s: &Shared, headers: &HeaderMap, call: &Incoming) -> Option<Response> {
    let (method, path) = (&call.method, &call.path);
    if s.spec.cloud && !path.starts_with("/v1/") && !path.starts_with("/_sim") {
        return Some(openai::error(StatusCode::NOT_FOUND, &format!("Invalid URL ({method} {path})")));
    }
    if s.spec.refuse_prefill && path == "/v1/chat/completions" && super::inference::ends_with_assistant(&call.body) {
        return Some(openai::error_with(
            StatusCode::BAD_REQUEST,
            "Assistant response prefill is incompatible with enable_thinking.",
            Some("invalid_request_error"),
            None,
        ));
    }
    if let (Some(key), true) = (&s.spec.api_key, path.starts_with("/v1/")) {
        let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
        if sent != Some(format!("Bearer {key}").as_str()) {
            return Some(openai::error(StatusCode::UNAUTHORIZED, "Incorrect API key provided."));
        }
    }
    None
}

/// What Ollama's router (gin) answers for an unknown route.
pub(super) fn not_found() -> Response {
    (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain")], "404 page not found").into_response()
}
