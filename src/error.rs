//! Errors the broker makes itself, as opposed to errors a node returned.
//!
//! Every variant has a stable `code()` (snake_case, listed in `docs/errors.md`), an HTTP
//! `status()`, the side that failed, and whether the request was `forwarded` to a node. The
//! enum is mapped to a response exactly once, in `IntoResponse`: a JSON body
//! `{"error", "code", "forwarded"}` plus `X-Corral-Forwarded: false` and `Retry-After` on
//! rejections that never reached a node, so a client knows it may safely retry elsewhere
//! (linkerd's `l5d-proxy-error` idea). Internal detail goes to the log, not the client.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

/// Which side of the exchange failed; decides who should act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The request itself is wrong: fixing it is the client's job.
    Client,
    /// A node failed or timed out after the request was sent to it.
    Node,
    /// The broker could not place the request (capacity, health, configuration).
    Broker,
}

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("request body must name a model in the \"model\" field")]
    MissingModel,
    #[error("unknown category \"{name}\"; known categories: {known}")]
    UnknownCategory { name: String, known: String },
    #[error("invalid header {name}: {reason}")]
    BadHeader { name: &'static str, reason: String },
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("model \"{0}\" is not served by any configured node")]
    ModelNotFound(String),
    #[error("no route for {method} {path}")]
    UnknownRoute { method: String, path: String },
    #[error("no healthy node can serve model \"{model}\" right now")]
    NoHealthyNode { model: String },
    #[error("no node could be reached for this request ({detail})")]
    NoNodeReachable { detail: String },
    #[error("the broker's queue is full ({depth} requests, {bytes} bytes waiting); try again shortly")]
    QueueFull { depth: usize, bytes: usize },
    #[error("the prompt is about {estimated} tokens but the model runs with a context of {limit} tokens; shorten it or raise options.num_ctx")]
    ContextTooLong { estimated: u64, limit: u64 },
    #[error("every node able to serve this request is busy (waited {waited_ms} ms)")]
    QueueTimeout { waited_ms: u64 },
    #[error("every node answered \"server busy\"; try again shortly")]
    ClusterBusy,
    #[error("the broker is shutting down")]
    ShuttingDown,
    #[error("the broker is paused by its operator and takes no new requests; try again later")]
    Paused,
    #[error("this listener needs a client API key: send Authorization: Bearer <key>")]
    Unauthorized,
    #[error("upstream failed after {attempts} attempt(s): {detail}")]
    UpstreamFailed { attempts: u32, detail: String },
    #[error("upstream timed out after {attempts} attempt(s): {detail}")]
    UpstreamTimeout { attempts: u32, detail: String },
    #[error("failed to read the request body: {0}")]
    BodyRead(String),
    #[error("no local node could serve this request ({local}), and category \"{category}\" does not allow cloud fallback (cloud = \"never\")")]
    CloudNotAllowed { category: String, local: String, forwarded: bool },
    #[error("no local node could serve this request ({local}), and every cloud provider failed: {providers}")]
    CloudFailed { local: String, providers: String },
}

impl BrokerError {
    /// Stable machine-readable code; never change a published one.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "malformed_json",
            Self::MissingModel => "missing_model",
            Self::UnknownCategory { .. } => "unknown_category",
            Self::BadHeader { .. } => "bad_header",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::ModelNotFound(_) => "model_not_found",
            Self::UnknownRoute { .. } => "unknown_route",
            Self::NoHealthyNode { .. } => "no_healthy_node",
            Self::NoNodeReachable { .. } => "no_node_reachable",
            Self::QueueTimeout { .. } => "queue_timeout",
            Self::QueueFull { .. } => "queue_full",
            Self::ContextTooLong { .. } => "context_too_long",
            Self::ClusterBusy => "cluster_busy",
            Self::ShuttingDown => "shutting_down",
            Self::Paused => "paused",
            Self::Unauthorized => "unauthorized",
            Self::UpstreamFailed { .. } => "upstream_failed",
            Self::UpstreamTimeout { .. } => "upstream_timeout",
            Self::BodyRead(_) => "body_read_failed",
            Self::CloudNotAllowed { .. } => "cloud_not_allowed",
            Self::CloudFailed { .. } => "cloud_failed",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::MalformedJson(_)
            | Self::MissingModel
            | Self::UnknownCategory { .. }
            | Self::BadHeader { .. }
            | Self::BodyRead(_)
            | Self::ContextTooLong { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ModelNotFound(_) | Self::UnknownRoute { .. } => StatusCode::NOT_FOUND,
            Self::NoHealthyNode { .. }
            | Self::NoNodeReachable { .. }
            | Self::QueueTimeout { .. }
            | Self::ClusterBusy
            | Self::CloudNotAllowed { .. }
            | Self::Paused
            | Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamFailed { .. } | Self::CloudFailed { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    pub fn side(&self) -> Side {
        if matches!(self, Self::QueueFull { .. }) {
            return Side::Broker;
        }
        match self.status().as_u16() {
            400..=499 => Side::Client,
            502 | 504 => Side::Node,
            _ => Side::Broker,
        }
    }

    /// Whether any node received the request. `false` promises the request ran nowhere.
    pub fn forwarded(&self) -> bool {
        match self {
            Self::CloudNotAllowed { forwarded, .. } => *forwarded,
            // A provider may have started on it before failing.
            Self::CloudFailed { .. } => true,
            _ => matches!(self, Self::UpstreamFailed { .. } | Self::UpstreamTimeout { .. } | Self::ClusterBusy),
        }
    }

    /// Whether the same request may succeed if the client sends it again later.
    pub fn is_retryable(&self) -> bool {
        matches!(self.side(), Side::Broker | Side::Node)
    }

    /// JSON body in Ollama's error shape plus Corral's fields.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": self.to_string(),
            "code": self.code(),
            "forwarded": self.forwarded(),
        })
    }
}

impl IntoResponse for BrokerError {
    fn into_response(self) -> Response {
        match self.side() {
            Side::Client => tracing::debug!(code = self.code(), error = %self, "rejected request"),
            _ => tracing::warn!(code = self.code(), error = %self, "request failed"),
        }
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        if !self.forwarded() {
            headers.insert("x-corral-forwarded", HeaderValue::from_static("false"));
        }
        if self.is_retryable() {
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_snake_case() {
        let all = [
            BrokerError::MalformedJson(String::new()),
            BrokerError::MissingModel,
            BrokerError::UnknownCategory { name: String::new(), known: String::new() },
            BrokerError::BadHeader { name: "x", reason: String::new() },
            BrokerError::BodyTooLarge { limit: 1 },
            BrokerError::ModelNotFound(String::new()),
            BrokerError::UnknownRoute { method: String::new(), path: String::new() },
            BrokerError::NoHealthyNode { model: String::new() },
            BrokerError::NoNodeReachable { detail: String::new() },
            BrokerError::QueueTimeout { waited_ms: 0 },
            BrokerError::QueueFull { depth: 0, bytes: 0 },
            BrokerError::ContextTooLong { estimated: 0, limit: 0 },
            BrokerError::ClusterBusy,
            BrokerError::ShuttingDown,
            BrokerError::Paused,
            BrokerError::Unauthorized,
            BrokerError::UpstreamFailed { attempts: 1, detail: String::new() },
            BrokerError::UpstreamTimeout { attempts: 1, detail: String::new() },
            BrokerError::BodyRead(String::new()),
            BrokerError::CloudNotAllowed { category: String::new(), local: String::new(), forwarded: false },
            BrokerError::CloudFailed { local: String::new(), providers: String::new() },
        ];
        let docs = include_str!("../docs/errors.md");
        let mut seen = std::collections::HashSet::new();
        for e in &all {
            let code = e.code();
            assert!(seen.insert(code), "duplicate code {code}");
            assert!(code.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{code} not snake_case");
            assert!(docs.contains(&format!("`{code}`")), "{code} is missing from docs/errors.md");
        }
    }

    #[test]
    fn rejections_that_never_reached_a_node_say_so() {
        let r = BrokerError::QueueTimeout { waited_ms: 5 }.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["x-corral-forwarded"], "false");
        assert!(r.headers().contains_key("retry-after"));
        let r = BrokerError::UpstreamFailed { attempts: 2, detail: "x".into() }.into_response();
        assert!(
            !r.headers().contains_key("x-corral-forwarded"),
            "a forwarded request must not claim it was not executed"
        );
    }
}
