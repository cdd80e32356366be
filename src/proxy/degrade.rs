//! The local degrade chain: when the requested model cannot start within the queue timeout
//! (every node that has it busy or down), a category's `degrade = ["qwen2.5:3b"]` serves the
//! next model in its chain instead, on whatever node has that one, rather than failing or
//! going to the cloud. The answer says `X-Corral-Degraded: <model>` and the record keeps the
//! model that answered (`answered_model`) beside the one asked for.
//!
//! Each step waits at most `STEP_WAIT` (or the request's queue timeout, when shorter) for a
//! node: a smaller model is worth serving only if it starts soon, and the client has already
//! waited the queue timeout for the one it asked for. Whether the chain comes before or after
//! the cloud fallback is the category's `degrade_order`. Only the body's `model` changes.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use http::HeaderValue;

use super::forward::{self, Outbound};
use crate::error::BrokerError;
use crate::state::Shared;
use crate::telemetry::Trace;

/// Longest wait for a node of each model in the chain.
pub const STEP_WAIT: Duration = Duration::from_secs(2);

/// Whether a local failure means "the requested model cannot start now", which the chain may
/// answer: its nodes all busy past the queue timeout, busy-refusing, or down.
pub fn is_trigger(e: &BrokerError) -> bool {
    matches!(e, BrokerError::QueueTimeout { .. } | BrokerError::ClusterBusy | BrokerError::NoHealthyNode { .. })
}

/// The first model of the category's chain that answers `out`, marked; `None` when none does.
pub(crate) async fn serve(shared: &Arc<Shared>, out: Option<&Outbound>, trace: &mut Option<Trace>) -> Option<Response> {
    let out = out?;
    let config = shared.config();
    let chain = &config.category(&out.category)?.degrade;
    let asked = crate::config::model_key(out.model.as_deref()?).into_owned();
    for model in chain.iter().filter(|m| crate::config::model_key(m) != asked) {
        let Some(body) = with_model(&out.body, model) else { continue };
        let step = Outbound {
            body,
            model: Some(model.clone()),
            queue_timeout: out.queue_timeout.min(STEP_WAIT),
            ..out.clone()
        };
        if let Some(t) = trace.as_mut() {
            t.row.answered_model = Some(model.clone());
        }
        match forward::forward(shared, step, trace).await {
            Ok(mut r) => {
                tracing::info!(request_id = %out.request_id, asked = %asked, served = %model, "degraded to a smaller model");
                if let Ok(v) = HeaderValue::from_str(model) {
                    r.headers_mut().insert("x-corral-degraded", v);
                }
                return Some(r);
            }
            Err((e, _)) => {
                tracing::debug!(request_id = %out.request_id, model = %model, code = e.code(), "degrade step could not answer");
                if let Some(t) = trace.as_mut() {
                    t.row.answered_model = None;
                }
            }
        }
    }
    None
}

/// The category's `static` answer, when it has one and `out` is a generating endpoint that has
/// a shape for it: Ollama's `/api/chat` and `/api/generate` (`done_reason: "degraded"`), the
/// OpenAI-compatible `/v1/chat/completions` (`finish_reason: "stop"`: SDKs know no other
/// value), streamed when the request streams. Marked `X-Corral-Degraded: static`.
pub(crate) fn static_answer(
    shared: &Arc<Shared>,
    out: Option<&Outbound>,
    trace: &mut Option<Trace>,
) -> Option<Response> {
    let out = out?;
    let config = shared.config();
    let text = config.category(&out.category)?.static_answer.clone()?;
    let path = out.path_and_query.split('?').next().unwrap_or_default();
    let model = out.model.clone().unwrap_or_default();
    let (content_type, body) = match path {
        "/api/chat" | "/api/generate" => {
            ("application/x-ndjson", ollama_static(path, &model, &text, out.stream != Some(false)))
        }
        "/v1/chat/completions" if out.stream == Some(true) => {
            ("text/event-stream", openai_static_stream(&model, &text))
        }
        "/v1/chat/completions" => ("application/json", openai_static(&model, &text)),
        _ => return None,
    };
    if let Some(t) = trace.as_mut() {
        t.row.answered_model = Some("static".into());
    }
    tracing::info!(request_id = %out.request_id, category = %out.category, "answered with the category's static text");
    let mut r = Response::new(axum::body::Body::from(body));
    let headers = r.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("x-corral-degraded", HeaderValue::from_static("static"));
    Some(r)
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// Ollama's shape: a content line then the final one when streamed, one object when not.
fn ollama_static(path: &str, model: &str, text: &str, stream: bool) -> Vec<u8> {
    let chat = path == "/api/chat";
    let piece = |content: &str| {
        if chat {
            serde_json::json!({"model": model, "created_at": now_rfc3339(), "message": {"role": "assistant", "content": content}})
        } else {
            serde_json::json!({"model": model, "created_at": now_rfc3339(), "response": content})
        }
    };
    let end = |mut v: serde_json::Value| {
        v["done"] = true.into();
        v["done_reason"] = "degraded".into();
        for k in [
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        ] {
            v[k] = 0.into();
        }
        v
    };
    let mut lines = Vec::new();
    if stream {
        let mut first = piece(text);
        first["done"] = false.into();
        lines.push(first);
        lines.push(end(piece("")));
    } else {
        lines.push(end(piece(text)));
    }
    lines.iter().map(|l| format!("{l}\n")).collect::<String>().into_bytes()
}

fn openai_static(model: &str, text: &str) -> Vec<u8> {
    let created = time::OffsetDateTime::now_utc().unix_timestamp();
    let v = serde_json::json!({
        "id": format!("chatcmpl-corral-static-{created}"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    });
    format!("{v}\n").into_bytes()
}

fn openai_static_stream(model: &str, text: &str) -> Vec<u8> {
    let created = time::OffsetDateTime::now_utc().unix_timestamp();
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        serde_json::json!({
            "id": format!("chatcmpl-corral-static-{created}"),
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let first = chunk(serde_json::json!({"role": "assistant", "content": text}), serde_json::Value::Null);
    let last = chunk(serde_json::json!({}), "stop".into());
    format!("data: {first}\n\ndata: {last}\n\ndata: [DONE]\n\n").into_bytes()
}

/// The body with its top-level `model` set to `model`.
fn with_model(body: &[u8], model: &str) -> Option<axum::body::Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.as_object_mut()?.insert("model".into(), serde_json::Value::from(model));
    serde_json::to_vec(&v).ok().map(axum::body::Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_answers_are_well_formed_in_each_shape() {
        let lines: Vec<serde_json::Value> = String::from_utf8(ollama_static("/api/chat", "m", "busy, try later", true))
            .expect("utf8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            (lines[0]["message"]["content"].as_str(), lines[0]["done"].as_bool()),
            (Some("busy, try later"), Some(false))
        );
        assert_eq!((lines[1]["done"].as_bool(), lines[1]["done_reason"].as_str()), (Some(true), Some("degraded")));
        let one: serde_json::Value =
            serde_json::from_slice(&ollama_static("/api/generate", "m", "busy", false)).expect("json");
        assert_eq!((one["response"].as_str(), one["done_reason"].as_str()), (Some("busy"), Some("degraded")));
        let v1: serde_json::Value = serde_json::from_slice(&openai_static("m", "busy")).expect("json");
        assert_eq!(v1["choices"][0]["message"]["content"], "busy");
        let sse = String::from_utf8(openai_static_stream("m", "busy")).expect("utf8");
        assert!(sse.ends_with("data: [DONE]\n\n") && sse.matches("data: {").count() == 2, "{sse}");
    }

    #[test]
    fn only_the_model_changes() {
        let body = br#"{"model":"llama3.2:8b","messages":[{"role":"user","content":"hi"}],"stream":false}"#;
        let v: serde_json::Value =
            serde_json::from_slice(&with_model(body, "qwen2.5:3b").expect("json")).expect("json");
        assert_eq!(v["model"], "qwen2.5:3b");
        assert_eq!(v["messages"][0]["content"], "hi");
        assert_eq!(v["stream"], false);
        assert!(with_model(b"[1]", "m").is_none(), "not an object: nothing to degrade");
    }

    #[test]
    fn only_a_model_that_cannot_start_triggers_the_chain() {
        assert!(is_trigger(&BrokerError::QueueTimeout { waited_ms: 1 }));
        assert!(is_trigger(&BrokerError::ClusterBusy));
        assert!(!is_trigger(&BrokerError::model_not_found("m")), "a missing model is not a busy one");
        assert!(!is_trigger(&BrokerError::UpstreamFailed { attempts: 1, detail: String::new() }));
    }
}
