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
