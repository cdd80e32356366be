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

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("request body must name a model in the \"model\" field")]
    MissingModel,
    #[error("invalid model name: {0}")]
    BadModelName(String),
    #[error("this listener's clients may not use category \"{category}\"; allowed: {allowed}")]
    CategoryNotAllowed { category: String, allowed: String },
    #[error("unknown category \"{name}\"; known categories: {known}")]
    UnknownCategory { name: String, known: String },
    #[error("invalid header {name}: {reason}")]
    BadHeader { name: &'static str, reason: String },
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// Ollama's own words (`model 'x' not found`): its CLI and clients match on "not found".
    /// `did_you_mean`: the closest names the cluster knows (see `catalog`); `unlisted`: nodes
    /// that are down and never listed their models ("gpu1 is down"), which the answer could
    /// not count.
    /// `refused_by`: what the nodes asked said, when the request reached nodes that listed the
    /// model (or whose lists were not known yet) and each answered Ollama's 404 for it; empty
    /// when no node was asked.
    #[error("model '{model}' not found: {}; {}", where_not_found(.unlisted, .refused_by), advice(.did_you_mean))]
    ModelNotFound { model: String, did_you_mean: Vec<String>, unlisted: Vec<String>, refused_by: String },
    /// `X-Corral-Node` (or a model operation) names a node the config does not have.
    #[error("no node named \"{name}\"; nodes: {known}")]
    UnknownNode { name: String, known: String },
    #[error("no route for {method} {path}: neither Ollama nor the OpenAI-compatible /v1 API has it (see docs/compatibility.md for every route Corral serves)")]
    UnknownRoute { method: String, path: String },
    /// A route Ollama has that Corral does not serve, and why.
    #[error("{method} {path} is an Ollama route Corral does not serve: {why} (see docs/compatibility.md)")]
    RouteNotServed { method: String, path: String, why: &'static str },
    #[error("no healthy node can serve model \"{model}\" right now")]
    NoHealthyNode { model: String },
    #[error("no node could be reached for this request ({detail})")]
    NoNodeReachable { detail: String },
    /// Nothing to ask at all: every node is down, disabled or draining (an answer merged from
    /// the nodes, or a model operation with no node named). `nodes` says which is which.
    #[error("no node is up to answer {what}: {nodes}; try again when one is back")]
    NoNodeUp { what: String, nodes: String },
    #[error("the broker's queue is full ({depth} requests, {bytes} bytes waiting); try again shortly")]
    QueueFull { depth: usize, bytes: usize },
    #[error("the prompt is about {estimated} tokens but the model runs with a context of {limit} tokens and the request says \"truncate\": false; shorten it, raise options.num_ctx, or allow truncation")]
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
    #[error("the request body stalled: nothing arrived for {gap_ms} ms after {read} bytes")]
    BodyTimeout { gap_ms: u64, read: usize },
    #[error("too many open connections {scope}; try again shortly")]
    TooManyConnections { scope: &'static str },
    #[error("no local node could serve this request ({local}), and category \"{category}\" does not allow cloud fallback (cloud = \"never\")")]
    CloudNotAllowed { category: String, local: String, forwarded: bool },
    #[error("no local node could serve this request ({local}), and category \"{category}\" redacts what it sends to the cloud, but the request has {bytes} bytes of text, over its redact_max_bytes of {limit}: it was not sent to any cloud provider")]
    RedactTooLarge { category: String, bytes: usize, limit: usize, local: String, forwarded: bool },
    /// `retry_after`: when one of the providers was rate-limiting, the seconds until the first
    /// of them takes requests again (sent as `Retry-After`).
    #[error("no local node could serve this request ({local}), and every cloud provider failed: {providers}")]
    /// `forwarded`: a node or a provider may have received the request.
    CloudFailed { local: String, providers: String, retry_after: Option<u64>, forwarded: bool },
    /// Every provider the category may use answered 429 (or is sitting out an earlier one),
    /// and none took requests again within the request's queue timeout.
    #[error("no local node could serve this request ({local}), and every cloud provider is rate-limiting: {providers}; try again in {retry_after} s")]
    CloudRateLimited { local: String, providers: String, retry_after: u64 },
    /// A loopback listener was asked under a foreign name: a DNS-rebinding web page.
    #[error("Host {host:?} is not a name of this loopback listener; use localhost or 127.0.0.1")]
    ForbiddenHost { host: String },
    /// A web page from an origin the listener does not allow.
    #[error("requests from the web origin {origin:?} are not allowed here; add it to the listener's allowed_origins")]
    ForbiddenOrigin { origin: String },
    /// A JSON endpoint sent a body type a cross-site form can send without asking.
    #[error("Content-Type {content_type:?} is not accepted here; send application/json")]
    UnsupportedMediaType { content_type: String },
    /// Pull, delete, create, copy, push or a blob upload on a listener without `model_ops`.
    #[error(
        "model operations ({path}) are not allowed on this listener; an operator can grant them with model_ops = true"
    )]
    ModelOpsForbidden { path: String },
    /// A path with a `.`/`..` segment or an encoded separator: it could leave a node's base path.
    #[error("the request path has a \".\" or \"..\" segment or an encoded separator; send the plain path")]
    BadPath,
    /// The same `Idempotency-Key` (or `X-Request-Id`) as a request that ran in this category's
    /// window, whose answer is not replayed (`proxy::idempotency`); this one ran nowhere.
    #[error("a request with this idempotency key already ran as {first} and {outcome}; it is not run twice (use a new key for a new request)")]
    DuplicateRequest { first: String, outcome: String },
    /// The same `Idempotency-Key` with another method, path or body.
    #[error("this Idempotency-Key was already used by request {first} for another request (method, path or body differ); use a new key")]
    IdempotencyKeyReused { first: String },
    /// A value over a cap of the category's `limits` with `over_limit = "refuse"`.
    #[error("{field} {asked} is over category \"{category}\"'s limit of {limit}; ask for at most {limit}")]
    OverLimit { category: String, field: String, asked: String, limit: String },
    /// A client key past its `[[quotas]]` for this window (`quota.rs`).
    #[error("client key \"{key}\" has used {used} of its {of} {limit} in this window; try again in {retry_after} s")]
    QuotaExceeded { key: String, limit: &'static str, used: u64, of: u64, retry_after: u64 },
}

impl From<crate::quota::Refusal> for BrokerError {
    fn from(r: crate::quota::Refusal) -> Self {
        Self::QuotaExceeded { key: r.key, limit: r.limit, used: r.used, of: r.of, retry_after: r.retry_after_s }
    }
}

impl BrokerError {
    /// Stable machine-readable code; never change a published one.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "malformed_json",
            Self::MissingModel => "missing_model",
            Self::BadModelName(_) => "bad_model_name",
            Self::CategoryNotAllowed { .. } => "category_not_allowed",
            Self::UnknownCategory { .. } => "unknown_category",
            Self::BadHeader { .. } => "bad_header",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::ModelNotFound { .. } => "model_not_found",
            Self::UnknownNode { .. } => "unknown_node",
            Self::UnknownRoute { .. } => "unknown_route",
            Self::RouteNotServed { .. } => "route_not_served",
            Self::NoHealthyNode { .. } => "no_healthy_node",
            Self::NoNodeReachable { .. } => "no_node_reachable",
            Self::NoNodeUp { .. } => "no_node_up",
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
            Self::BodyTimeout { .. } => "body_read_timeout",
            Self::TooManyConnections { .. } => "too_many_connections",
            Self::CloudNotAllowed { .. } => "cloud_not_allowed",
            Self::RedactTooLarge { .. } => "redact_too_large",
            Self::CloudFailed { .. } => "cloud_failed",
            Self::CloudRateLimited { .. } => "cloud_rate_limited",
            Self::ForbiddenHost { .. } => "forbidden_host",
            Self::ForbiddenOrigin { .. } => "forbidden_origin",
            Self::UnsupportedMediaType { .. } => "unsupported_media_type",
            Self::ModelOpsForbidden { .. } => "model_ops_forbidden",
            Self::BadPath => "bad_path",
            Self::DuplicateRequest { .. } => "duplicate_request",
            Self::IdempotencyKeyReused { .. } => "idempotency_key_reused",
            Self::OverLimit { .. } => "over_limit",
            Self::QuotaExceeded { .. } => "quota_exceeded",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::MalformedJson(_)
            | Self::MissingModel
            | Self::BadModelName(_)
            | Self::UnknownCategory { .. }
            | Self::BadHeader { .. }
            | Self::UnknownNode { .. }
            | Self::BodyRead(_)
            | Self::BadPath
            | Self::OverLimit { .. }
            | Self::ContextTooLong { .. } => StatusCode::BAD_REQUEST,
            Self::ForbiddenHost { .. } | Self::ForbiddenOrigin { .. } | Self::ModelOpsForbidden { .. } => {
                StatusCode::FORBIDDEN
            }
            Self::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::DuplicateRequest { .. } => StatusCode::CONFLICT,
            Self::IdempotencyKeyReused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::CategoryNotAllowed { .. } => StatusCode::FORBIDDEN,
            Self::QueueFull { .. } | Self::CloudRateLimited { .. } | Self::QuotaExceeded { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::BodyTooLarge { .. } | Self::RedactTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ModelNotFound { .. } | Self::UnknownRoute { .. } => StatusCode::NOT_FOUND,
            Self::RouteNotServed { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::NoHealthyNode { .. }
            | Self::NoNodeReachable { .. }
            | Self::NoNodeUp { .. }
            | Self::QueueTimeout { .. }
            | Self::ClusterBusy
            | Self::CloudNotAllowed { .. }
            | Self::Paused
            | Self::TooManyConnections { .. }
            | Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamFailed { .. } | Self::CloudFailed { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    pub fn side(&self) -> Side {
        if matches!(self, Self::QueueFull { .. }) {
            return Side::Broker;
        }
        // Busy upstreams, not a wrong request: the same request may pass later.
        if matches!(self, Self::CloudRateLimited { .. }) {
            return Side::Node;
        }
        // Asking again cannot help: the client has to use another route.
        if matches!(self, Self::RouteNotServed { .. }) {
            return Side::Client;
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
            Self::CloudNotAllowed { forwarded, .. }
            | Self::RedactTooLarge { forwarded, .. }
            | Self::CloudFailed { forwarded, .. } => *forwarded,
            // The provider received it and asked to wait.
            Self::CloudRateLimited { .. } => true,
            // Nodes were asked and said they do not have it.
            Self::ModelNotFound { refused_by, .. } => !refused_by.is_empty(),
            _ => matches!(self, Self::UpstreamFailed { .. } | Self::UpstreamTimeout { .. } | Self::ClusterBusy),
        }
    }

    /// Whether the same request may succeed if the client sends it again later.
    pub fn is_retryable(&self) -> bool {
        matches!(self.side(), Side::Broker | Side::Node)
    }

    /// Seconds a client should wait before sending the request again (`Retry-After`): what a
    /// rate-limiting provider asked for, else 1 for anything retryable.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::CloudRateLimited { retry_after, .. }
            | Self::CloudFailed { retry_after: Some(retry_after), .. }
            | Self::QuotaExceeded { retry_after, .. } => Some(*retry_after),
            _ => self.is_retryable().then_some(1),
        }
    }

    /// A model no node lists, with nothing known yet to suggest instead.
    pub fn model_not_found(model: impl Into<String>) -> Self {
        Self::ModelNotFound {
            model: model.into(),
            did_you_mean: Vec::new(),
            unlisted: Vec::new(),
            refused_by: String::new(),
        }
    }

    /// A model every node asked answered Ollama's 404 for (`refused_by`: "gpu0: HTTP 404 …").
    pub fn model_refused_by_nodes(model: impl Into<String>, refused_by: String) -> Self {
        Self::ModelNotFound { model: model.into(), did_you_mean: Vec::new(), unlisted: Vec::new(), refused_by }
    }

    /// JSON body in Ollama's error shape plus Corral's fields (`did_you_mean` for
    /// `model_not_found`: the names also in the sentence, for programs).
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "error": self.to_string(),
            "code": self.code(),
            "forwarded": self.forwarded(),
        });
        if let Self::ModelNotFound { did_you_mean, .. } = self {
            body["did_you_mean"] = serde_json::json!(did_you_mean);
        }
        if let Self::DuplicateRequest { first, outcome } = self {
            body["first_request_id"] = serde_json::json!(first);
            body["first_outcome"] = serde_json::json!(outcome);
        }
        body
    }
}

/// Where the model was looked for: in the nodes' lists ("no configured node lists it (gpu1 is
/// down and has not listed its models yet)"; each entry of `unlisted` says a node and its state,
/// "gpu1 is down"), or, when nodes were asked, what they answered.
fn where_not_found(unlisted: &[String], refused_by: &str) -> String {
    if !refused_by.is_empty() {
        return format!("every node asked answered that it does not have it ({refused_by})");
    }
    match unlisted {
        [] => "no configured node lists it".to_string(),
        [one] => format!("no configured node lists it ({one} and has not listed its models yet)"),
        many => format!("no configured node lists it ({}; none of them has listed its models yet)", many.join(", ")),
    }
}

/// "did you mean llama3.2?" (up to three names), else the way to get the model.
fn advice(did_you_mean: &[String]) -> String {
    did_you_mean_sentence(did_you_mean).unwrap_or_else(|| "pull it onto a node first".to_string())
}

/// "did you mean llama3.2?", "did you mean a, b or c?"; `None` for no names.
pub fn did_you_mean_sentence(names: &[String]) -> Option<String> {
    match names {
        [] => None,
        [one] => Some(format!("did you mean {one}?")),
        [rest @ .., last] => Some(format!("did you mean {} or {last}?", rest.join(", "))),
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
        if let Some(secs) = self.retry_after() {
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// One sample of every variant of an error enum, for tests that must not miss one. Each row is
/// `pattern => sample`; the patterns form a `match` with no wildcard arm, so a new variant
/// fails to compile until it has a row, and each sample is checked to be the variant its
/// pattern names.
#[cfg(test)]
macro_rules! every_variant {
    ($ty:ty { $($pat:pat => $sample:expr),+ $(,)? }) => {{
        #[deny(unreachable_patterns)]
        fn _every_variant_has_a_row(e: &$ty) {
            match e {
                $($pat => {})+
            }
        }
        $(assert!(matches!(&$sample, $pat), "the sample for `{}` is another variant", stringify!($pat));)+
        vec![$($sample),+]
    }};
}
#[cfg(test)]
pub(crate) use every_variant;

/// Panics unless the table under `heading` in docs/errors.md (up to the next heading) has a
/// row for `code` with `status`: `| \`code\` | 404 | ...`.
#[cfg(test)]
pub(crate) fn assert_documented(heading: &str, code: &str, status: StatusCode) {
    let docs = include_str!("../docs/errors.md");
    let section: Vec<&str> = docs
        .lines()
        .skip_while(|l| *l != heading)
        .enumerate()
        .take_while(|(i, l)| *i == 0 || !l.starts_with('#'))
        .map(|(_, l)| l)
        .collect();
    assert!(!section.is_empty(), "docs/errors.md has no heading {heading:?}");
    assert!(code.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{code} is not snake_case");
    let row = format!("| `{code}` | {} |", status.as_u16());
    assert!(
        section.iter().any(|l| l.starts_with(&row)),
        "docs/errors.md, under {heading:?}, has no row starting {row:?}: document the code clients will see"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One value of every variant.
    fn every_broker_error() -> Vec<BrokerError> {
        use BrokerError as E;
        every_variant!(E {
            E::MalformedJson(_) => E::MalformedJson("".into()),
            E::MissingModel => E::MissingModel,
            E::BadModelName(_) => E::BadModelName("".into()),
            E::CategoryNotAllowed { .. } => E::CategoryNotAllowed { category: "".into(), allowed: "".into() },
            E::UnknownCategory { .. } => E::UnknownCategory { name: "".into(), known: "".into() },
            E::BadHeader { .. } => E::BadHeader { name: "x", reason: "".into() },
            E::BodyTooLarge { .. } => E::BodyTooLarge { limit: 1 },
            E::ModelNotFound { .. } => E::model_not_found(""),
            E::UnknownNode { .. } => E::UnknownNode { name: "".into(), known: "".into() },
            E::UnknownRoute { .. } => E::UnknownRoute { method: "".into(), path: "".into() },
            E::RouteNotServed { .. } => E::RouteNotServed { method: "".into(), path: "".into(), why: "" },
            E::NoHealthyNode { .. } => E::NoHealthyNode { model: "".into() },
            E::NoNodeReachable { .. } => E::NoNodeReachable { detail: "".into() },
            E::NoNodeUp { .. } => E::NoNodeUp { what: "".into(), nodes: "".into() },
            E::QueueFull { .. } => E::QueueFull { depth: 0, bytes: 0 },
            E::ContextTooLong { .. } => E::ContextTooLong { estimated: 0, limit: 0 },
            E::QueueTimeout { .. } => E::QueueTimeout { waited_ms: 0 },
            E::ClusterBusy => E::ClusterBusy,
            E::ShuttingDown => E::ShuttingDown,
            E::Paused => E::Paused,
            E::Unauthorized => E::Unauthorized,
            E::UpstreamFailed { .. } => E::UpstreamFailed { attempts: 1, detail: "".into() },
            E::UpstreamTimeout { .. } => E::UpstreamTimeout { attempts: 1, detail: "".into() },
            E::BodyRead(_) => E::BodyRead("".into()),
            E::BodyTimeout { .. } => E::BodyTimeout { gap_ms: 1, read: 0 },
            E::TooManyConnections { .. } => E::TooManyConnections { scope: "" },
            E::CloudNotAllowed { .. } => E::CloudNotAllowed { category: "".into(), local: "".into(), forwarded: false },
            E::RedactTooLarge { .. } => E::RedactTooLarge { category: "".into(), bytes: 2, limit: 1, local: "".into(), forwarded: false },
            E::CloudFailed { .. } => E::CloudFailed { local: "".into(), providers: "".into(), retry_after: None, forwarded: true },
            E::CloudRateLimited { .. } => E::CloudRateLimited { local: "".into(), providers: "".into(), retry_after: 5 },
            E::ForbiddenHost { .. } => E::ForbiddenHost { host: "".into() },
            E::ForbiddenOrigin { .. } => E::ForbiddenOrigin { origin: "".into() },
            E::UnsupportedMediaType { .. } => E::UnsupportedMediaType { content_type: "".into() },
            E::ModelOpsForbidden { .. } => E::ModelOpsForbidden { path: "".into() },
            E::BadPath => E::BadPath,
            E::DuplicateRequest { .. } => E::DuplicateRequest { first: "".into(), outcome: "".into() },
            E::IdempotencyKeyReused { .. } => E::IdempotencyKeyReused { first: "".into() },
            E::OverLimit { .. } => E::OverLimit { category: "".into(), field: "".into(), asked: "".into(), limit: "".into() },
            E::QuotaExceeded { .. } => E::QuotaExceeded { key: "".into(), limit: "requests", used: 1, of: 1, retry_after: 1 },
        })
    }

    #[test]
    fn every_broker_error_is_documented_with_its_status_and_a_unique_code() {
        let mut seen = std::collections::HashSet::new();
        for e in &every_broker_error() {
            assert!(seen.insert(e.code()), "duplicate code {}", e.code());
            assert_documented("# Errors Corral makes", e.code(), e.status());
        }
    }

    #[test]
    fn a_new_code_must_be_in_the_docs_to_pass() {
        let missing = std::panic::catch_unwind(|| {
            assert_documented("# Errors Corral makes", "no_such_code", StatusCode::BAD_REQUEST)
        });
        assert!(missing.is_err(), "an undocumented code is refused");
        let wrong_status = std::panic::catch_unwind(|| {
            assert_documented("# Errors Corral makes", "queue_full", StatusCode::BAD_REQUEST)
        });
        assert!(wrong_status.is_err(), "a code documented with another status is refused");
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

    #[test]
    fn a_model_nobody_lists_says_what_was_meant_and_what_could_not_be_counted() {
        let e = |did_you_mean: &[&str], unlisted: &[&str]| BrokerError::ModelNotFound {
            model: "llama3.3".into(),
            did_you_mean: did_you_mean.iter().map(|s| s.to_string()).collect(),
            unlisted: unlisted.iter().map(|s| s.to_string()).collect(),
            refused_by: String::new(),
        };
        assert_eq!(
            e(&[], &[]).to_string(),
            "model 'llama3.3' not found: no configured node lists it; pull it onto a node first"
        );
        assert_eq!(
            e(&["llama3.2"], &["gpu1 is down"]).to_string(),
            "model 'llama3.3' not found: no configured node lists it (gpu1 is down and has not listed its models yet); did you mean llama3.2?"
        );
        assert_eq!(
            e(&["a", "b", "c"], &["gpu1 is down", "gpu2 is disabled"]).to_string(),
            "model 'llama3.3' not found: no configured node lists it (gpu1 is down, gpu2 is disabled; none of them has listed its models yet); did you mean a, b or c?"
        );
        assert_eq!(e(&["llama3.2"], &[]).body()["did_you_mean"], serde_json::json!(["llama3.2"]));
        assert!(BrokerError::MissingModel.body().get("did_you_mean").is_none(), "only where a model was named");
    }

    #[test]
    fn a_rate_limiting_provider_s_wait_reaches_the_client() {
        let r = BrokerError::CloudRateLimited { local: "x".into(), providers: "p: 429".into(), retry_after: 7 }
            .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "7", "the provider's wait, not a default");
        assert!(!r.headers().contains_key("x-corral-forwarded"), "the provider received it");
        let failed = |retry_after| BrokerError::CloudFailed {
            local: "x".into(),
            providers: "p".into(),
            retry_after,
            forwarded: true,
        };
        assert_eq!(failed(Some(4)).into_response().headers()["retry-after"], "4");
        assert_eq!(failed(None).into_response().headers()["retry-after"], "1", "retryable: the default wait");
        assert_eq!(BrokerError::MissingModel.retry_after(), None, "a wrong request is not worth sending again");
    }
}
