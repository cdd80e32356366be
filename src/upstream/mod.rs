//! Talking to one upstream: an HTTP server Corral sends to, whether a node of the cluster or a
//! cloud provider, in the dialect it speaks (Ollama's native API or the OpenAI-compatible
//! `/v1`).
//!
//! This is the one place that knows dialects: `Dialect::of` is the only match on a node's
//! `kind`, `Upstream::url` the only way a request path becomes an upstream URL, and `send` /
//! `first_chunk` the only code that applies the connect and first-byte timeouts. Callers
//! (the proxy's retry loop, the cloud fallback, the probes) decide *what* to send and what an
//! answer means; this module only says how. The per-dialect probes and translations live in
//! `ollama.rs` and `openai.rs`, the Ollama <-> Chat Completions translation in `translate.rs`.
//!
//! It must not judge outcomes or touch node state: it returns what happened and the caller
//! records it.

pub mod assemble;
pub mod client;
mod h1;
pub mod lifecycle;
pub mod ollama;
pub mod openai;
pub mod probe;
pub mod translate;

use std::time::Duration;

use axum::body::Bytes;
use futures_util::{FutureExt, StreamExt, TryFutureExt};
use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use crate::config::NodeKind;
use crate::node::Node;

/// The API an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Ollama's own API: requests go as they came.
    Ollama,
    /// An OpenAI-compatible `/v1` (llama.cpp server, vLLM, LM Studio, cloud providers):
    /// Ollama-native requests are translated to Chat Completions and back.
    Openai,
}

impl Dialect {
    /// The dialect of a configured node kind. The only match on `NodeKind` in the crate.
    pub fn of(kind: NodeKind) -> Self {
        match kind {
            NodeKind::Ollama => Self::Ollama,
            NodeKind::Openai => Self::Openai,
        }
    }
}

/// One upstream: where it is and what it speaks. Borrowed, so building one per request costs
/// nothing (a node's base URL is parsed once, when the node is added).
#[derive(Debug, Clone, Copy)]
pub struct Upstream<'a> {
    pub base: &'a url::Url,
    pub dialect: Dialect,
}

impl<'a> Upstream<'a> {
    pub fn node(node: &'a Node) -> Self {
        Self { base: &node.base_url, dialect: Dialect::of(node.config.kind) }
    }

    /// A cloud provider: always OpenAI-compatible.
    pub fn provider(base: &'a url::Url) -> Self {
        Self { base, dialect: Dialect::Openai }
    }

    pub fn is_openai(&self) -> bool {
        self.dialect == Dialect::Openai
    }

    /// The upstream's URL for a request path (with its query), from the parsed base URL: no
    /// re-parsing of the host per request. A base path (`http://host/ollama`) is kept as a
    /// prefix. For OpenAI-compatible upstreams a `/v1/...` path is joined so that `/v1`
    /// appears once, whether the base is given with it (`https://api.openai.com/v1`) or not.
    ///
    /// The result never leaves the base path: `.` and `..` segments (also percent-encoded,
    /// which a URL parser resolves just the same) are dropped and a backslash (which it reads
    /// as `/`) is sent encoded. The proxy refuses such paths before they get here
    /// ([`path_escapes`]); this is the second lock.
    pub fn url(&self, path_and_query: &str) -> url::Url {
        let mut url = self.base.clone();
        let (path, query) = path_and_query.split_once('?').map_or((path_and_query, None), |(p, q)| (p, Some(q)));
        let prefix = self.base.path().trim_end_matches('/');
        let path = match (self.dialect, path.strip_prefix("/v1")) {
            (Dialect::Openai, Some(rest)) if prefix.ends_with("/v1") && (rest.is_empty() || rest.starts_with('/')) => {
                rest
            }
            _ => path,
        };
        let path = path.replace('\\', "%5C");
        let kept: Vec<&str> = path.split('/').filter(|seg| !is_dot_segment(seg)).collect();
        url.set_path(&format!("{prefix}{}", kept.join("/")));
        url.set_query(query);
        url
    }

    /// [`Upstream::url`] as the `http::Uri` a request is sent to.
    pub fn uri(&self, path_and_query: &str) -> Result<http::Uri, http::uri::InvalidUri> {
        match self.plain_join(path_and_query) {
            Some(joined) => http::Uri::try_from(joined),
            None => http::Uri::try_from(self.url(path_and_query).as_str()),
        }
    }

    /// The common case of [`Upstream::url`] without its round trip through the URL parser
    /// (a clone, five strings and a re-parse of the path per forwarded request, issue 16): a
    /// base without path, query or fragment and a path of letters, digits, `/`, `_` and `-`,
    /// which holds nothing a parser would resolve, encode or read as a query, so `url` would
    /// append it as it is. Anything else is `None` and takes the full way.
    fn plain_join(&self, path_and_query: &str) -> Option<String> {
        let base = self.base;
        let plain_base = base.path() == "/" && base.query().is_none() && base.fragment().is_none();
        (plain_base && path_and_query.starts_with('/') && plain_path(path_and_query)).then(|| {
            let origin = &base[..url::Position::BeforePath];
            let mut joined = String::with_capacity(origin.len() + path_and_query.len());
            joined.push_str(origin);
            joined.push_str(path_and_query);
            joined
        })
    }
}

/// Whether `path` is made of letters, digits, `/`, `_` and `-` only: no byte a URL parser
/// resolves, decodes, encodes or splits on.
fn plain_path(path: &str) -> bool {
    path.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-'))
}

/// Whether a path segment is `.` or `..`, also percent-encoded (`%2e`, `.%2E`): a URL parser
/// resolves all of them.
fn is_dot_segment(seg: &str) -> bool {
    // Read dot by dot, without the two strings a lowercase-and-replace made per segment of
    // every forwarded request's path.
    let (mut rest, mut dots) = (seg.as_bytes(), 0);
    while !rest.is_empty() {
        rest = match rest {
            [b'.', more @ ..] => more,
            [b'%', b'2', e, more @ ..] if e.eq_ignore_ascii_case(&b'e') => more,
            _ => return false,
        };
        dots += 1;
        if dots > 2 {
            return false;
        }
    }
    dots > 0
}

/// Whether a request path could climb out of the base path it is joined to, or mean something
/// else to a server behind that decodes it again: a dot segment (raw or percent-encoded), a
/// backslash, an encoded `/` or `\`, a double-encoded dot or separator, or an encoded NUL.
pub fn path_escapes(path: &str) -> bool {
    // Letters, digits, `/`, `_` and `-` hold no dot, percent or backslash: nothing to look for
    // (the common path, without the lowercase copy).
    if plain_path(path) {
        return false;
    }
    let lower = path.to_ascii_lowercase();
    lower.contains('\\')
        || ["%2f", "%5c", "%00", "%252e", "%252f", "%255c"].iter().any(|e| lower.contains(e))
        || lower.split('/').any(is_dot_segment)
}

/// An answer's body as it arrives: bytes, or why it broke off.
pub type BodyStream = futures_util::stream::BoxStream<'static, Result<Bytes, BodyError>>;

/// Why an answer's body broke off.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("{}", root_cause(.0))]
    Http(#[from] reqwest::Error),
    /// The upstream's answer could not be translated (an OpenAI-compatible stream that ended
    /// early or carried an error event).
    #[error("{0}")]
    Translate(String),
}

/// Why an exchange produced no answer to relay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("no answer within {0} ms")]
    NoAnswer(u128),
    #[error("headers but no body within {0} ms")]
    NoBody(u128),
    #[error("cannot connect ({0})")]
    Connect(String),
    #[error("request failed ({0})")]
    Failed(String),
    #[error("body failed before the first byte ({0})")]
    BodyFailed(String),
}

impl SendError {
    /// The verdict on the upstream for this failure.
    pub fn outcome(&self) -> crate::outcome::Outcome {
        use crate::outcome::Outcome;
        match self {
            Self::NoAnswer(_) | Self::NoBody(_) => Outcome::Silent,
            Self::Connect(_) => Outcome::ConnectFailed,
            Self::Failed(_) | Self::BodyFailed(_) => Outcome::Failed,
        }
    }
}

/// A request that got its answer's head in time, and how long is left for its first byte.
#[derive(Debug)]
pub struct Sent {
    pub response: reqwest::Response,
    pub sent_at: Instant,
    pub first_byte: Duration,
}

impl Sent {
    /// What is left of the first-byte allowance.
    pub fn remaining(&self) -> Duration {
        self.first_byte.saturating_sub(self.sent_at.elapsed())
    }
}

/// Send `request` (to a cloud provider); its head must arrive within `first_byte`.
pub async fn send(request: reqwest::RequestBuilder, first_byte: Duration) -> Result<Sent, SendError> {
    let exchange = request.send().map_err(|e| {
        if e.is_connect() {
            SendError::Connect(root_cause(&e))
        } else {
            SendError::Failed(root_cause(&e))
        }
    });
    within_first_byte(first_byte, exchange).await
}

/// Send `request` to a node through the request path's client; its head must arrive within
/// `first_byte`.
///
/// Plain functions over combinators, not `async fn`s: an `async fn` keeps each argument twice
/// in its future (as passed and as bound), so the request and the exchange around it were held
/// two and three times over; this future sits inside every proxied request's, which is made
/// and copied whole once per request (issue 16).
pub fn send_to_node<'a>(
    client: &'a client::NodeClient,
    request: client::NodeRequest,
    first_byte: Duration,
) -> impl std::future::Future<Output = Result<Sent, SendError>> + 'a {
    let exchange = client.send(request).map_err(|e| match e {
        client::ExchangeError::Connect(why) => SendError::Connect(why),
        client::ExchangeError::Failed(why) => SendError::Failed(why),
    });
    within_first_byte(first_byte, exchange)
}

/// The one first-byte timeout around an exchange, whichever client makes it; the clock starts
/// when the exchange is made (it is awaited at once).
fn within_first_byte<F>(first_byte: Duration, exchange: F) -> impl std::future::Future<Output = Result<Sent, SendError>>
where
    F: std::future::Future<Output = Result<reqwest::Response, SendError>>,
{
    let sent_at = Instant::now();
    tokio::time::timeout(first_byte, exchange).map(move |answer| match answer {
        Err(_) => Err(SendError::NoAnswer(first_byte.as_millis())),
        Ok(Err(e)) => Err(e),
        Ok(Ok(response)) => Ok(Sent { response, sent_at, first_byte }),
    })
}

/// An answer ready to relay: head, the first chunk of its body (already here, so a retry is
/// no longer possible after this), and the rest of the body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub first: Option<Bytes>,
    pub body: BodyStream,
    /// When the request left, for time-to-first-byte.
    pub sent_at: Instant,
    /// `first` is the whole body and `body` ends at once: a document the broker made whole
    /// (assembled from a stream, or read whole), sent with its length in one frame.
    pub whole: bool,
}

/// Wait for the first chunk of `body` within what is left of `sent`'s first-byte allowance.
pub async fn first_chunk(
    status: StatusCode,
    headers: HeaderMap,
    mut body: BodyStream,
    sent_at: Instant,
    within: Duration,
    first_byte: Duration,
) -> Result<Answer, SendError> {
    let first = match tokio::time::timeout(within, body.next()).await {
        Err(_) => return Err(SendError::NoBody(first_byte.as_millis())),
        Ok(Some(Err(e))) => return Err(SendError::BodyFailed(e.to_string())),
        Ok(Some(Ok(b))) => Some(b),
        Ok(None) => None,
    };
    Ok(Answer { status, headers, first, body, sent_at, whole: false })
}

/// A response body as a `BodyStream`, untouched.
pub fn raw_body(resp: reqwest::Response) -> BodyStream {
    resp.bytes_stream().map(|r| r.map_err(BodyError::from)).boxed()
}

/// The error's innermost cause, which is the useful one ("Connection refused").
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The first 4 KiB of a (small, usually error) body, waiting at most `within`.
pub async fn read_small(resp: reqwest::Response, within: Duration) -> String {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            out.extend_from_slice(&chunk);
            if out.len() > 4096 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
    out.truncate(4096);
    String::from_utf8_lossy(&out).into_owned()
}

/// The most bytes of a node's list (`/api/tags`, `/api/ps`, `/v1/models`, `/props`) Corral
/// reads: a node with a few hundred models answers tens of KiB; a lying one must not fill the
/// broker's memory (90 MB of tags held 550 MB, issue found from outside).
pub(crate) const MAX_LIST_BYTES: usize = 8 << 20;

/// The most models Corral keeps of one node's list.
pub(crate) const MAX_MODELS: usize = 4096;

/// The whole body of `resp` if it is at most `max` bytes; `None` (and a warning naming `url`)
/// when it is larger, or for a failed read.
pub(crate) async fn read_capped(resp: reqwest::Response, max: usize) -> Option<bytes::Bytes> {
    let url = resp.url().clone();
    let too_large = || tracing::warn!(%url, max_bytes = max, "a node's answer is larger than Corral reads: ignored");
    if resp.content_length().is_some_and(|n| n > max as u64) {
        too_large();
        return None;
    }
    let mut out = bytes::BytesMut::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.ok()?;
        if out.len() + chunk.len() > max {
            too_large();
            return None;
        }
        out.extend_from_slice(&chunk);
    }
    Some(out.freeze())
}

/// GET `url` and parse its JSON (at most [`MAX_LIST_BYTES`]) within `timeout`; `None` for any
/// failure, a non-2xx or a larger body.
pub(crate) async fn get_json(client: &reqwest::Client, url: url::Url, timeout: Duration) -> Option<serde_json::Value> {
    let ask = async {
        let resp = client.get(url).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        serde_json::from_slice(&read_capped(resp, MAX_LIST_BYTES).await?).ok()
    };
    tokio::time::timeout(timeout, ask).await.ok().flatten()
}

/// What a deep probe learned of an upstream's models.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Inventory {
    /// Models it has; `None` when it did not say.
    pub models: Option<Vec<String>>,
    /// Models loaded now (`/api/ps`); `None` when it did not say.
    pub loaded: Option<Vec<crate::node::LoadedModel>>,
}

impl Upstream<'_> {
    /// Liveness: does it answer its cheapest endpoint with a 2xx in time? If not, why.
    pub async fn liveness(&self, client: &reqwest::Client, timeout: Duration) -> Result<(), probe::ProbeError> {
        match self.dialect {
            Dialect::Ollama => ollama::liveness(self, client, timeout).await,
            Dialect::Openai => openai::liveness(self, client, timeout).await,
        }
    }

    /// Readiness: can it generate one token of `model`? If not, why.
    pub async fn readiness(
        &self,
        client: &reqwest::Client,
        model: &str,
        timeout: Duration,
    ) -> Result<(), probe::ProbeError> {
        match self.dialect {
            Dialect::Ollama => ollama::readiness(self, client, model, timeout).await,
            Dialect::Openai => openai::readiness(self, client, model, timeout).await,
        }
    }

    /// Time to first token of `model`: a streamed one-token generation, timed to its first
    /// content chunk. If it fails, why.
    pub async fn first_token(
        &self,
        client: &reqwest::Client,
        model: &str,
        timeout: Duration,
    ) -> Result<probe::FirstToken, probe::ProbeError> {
        match self.dialect {
            Dialect::Ollama => ollama::first_token(self, client, model, timeout).await,
            Dialect::Openai => openai::first_token(self, client, model, timeout).await,
        }
    }

    /// Which models it has and which are loaded.
    pub async fn inventory(&self, client: &reqwest::Client, timeout: Duration) -> Inventory {
        match self.dialect {
            Dialect::Ollama => ollama::inventory(self, client, timeout).await,
            Dialect::Openai => openai::inventory(self, client, timeout).await,
        }
    }

    /// Preload `model` (Ollama loads on a generate with no prompt); `None` where the dialect
    /// has no preload (OpenAI-compatible servers load their model at start).
    pub async fn warm_up(&self, client: &reqwest::Client, model: &str, timeout: Duration) -> Option<bool> {
        match self.dialect {
            Dialect::Ollama => Some(ollama::warm_up(self, client, model, timeout).await),
            Dialect::Openai => None,
        }
    }

    /// GET an Ollama-shaped metadata document (`/api/tags`, `/api/ps`, `/v1/models`) for a
    /// merged answer: OpenAI-compatible servers list models at `/v1/models` (given back in
    /// `/api/tags` shape) and have no `/api/ps` (an empty list).
    pub async fn metadata(&self, client: &reqwest::Client, path: &str, timeout: Duration) -> Option<serde_json::Value> {
        match (self.dialect, path) {
            (Dialect::Openai, "/api/ps") => Some(serde_json::json!({ "models": [] })),
            (Dialect::Openai, "/api/tags") => {
                get_json(client, self.url("/v1/models"), timeout).await.map(|v| openai::models_as_tags(&v))
            }
            (Dialect::Openai, _) => get_json(client, self.url("/v1/models"), timeout).await,
            (Dialect::Ollama, _) => get_json(client, self.url(path), timeout).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The dot-by-dot reading agrees with lowercasing and replacing `%2e`.
        #[test]
        fn dot_segments_read_as_lowercase_and_replace_did(seg in "[.%2eEx]{0,7}") {
            let reference = { let s = seg.to_ascii_lowercase().replace("%2e", "."); s == "." || s == ".." };
            proptest::prop_assert_eq!(is_dot_segment(&seg), reference, "{}", seg);
        }
    }

    proptest::proptest! {
        /// The short way to a plain path's URI is the full way's answer, for every base a node
        /// or provider can have and any path (the short way takes only some).
        #[test]
        fn a_plain_path_joins_as_the_url_parser_joins_it(
            base in proptest::sample::select(vec![
                "http://127.0.0.1:11434", "http://gpu-1:11434/", "https://u:p@h.example:8443",
                "http://h/ollama/", "http://h/v1", "https://api.example/v1/", "http://h/#f",
                "http://h/?key=1", "http://[::1]:11434", "http://H.Example",
            ]),
            openai in proptest::bool::ANY,
            rooted in proptest::bool::weighted(0.9),
            segments in proptest::collection::vec(proptest::sample::select(vec![
                ".", "..", "%2e", "%2E.", "api", "chat", "V1", "", "a-b_c", "x?y=1", "x#f", "a\\b", "%5C", "a.b",
            ]), 0..6),
        ) {
            let path = format!("{}{}", if rooted { "/" } else { "" }, segments.join("/"));
            let base = url::Url::parse(base).expect("base");
            let up = Upstream { base: &base, dialect: if openai { Dialect::Openai } else { Dialect::Ollama } };
            let full = http::Uri::try_from(up.url(&path).as_str()).map(|u| u.to_string()).map_err(|e| e.to_string());
            let got = up.uri(&path).map(|u| u.to_string()).map_err(|e| e.to_string());
            proptest::prop_assert_eq!(got, full, "{} + {}", base, path);
        }
    }

    proptest::proptest! {
        /// The plain-path shortcut refuses exactly what the full reading refuses.
        #[test]
        fn the_shortcut_refuses_what_the_full_reading_refuses(
            segments in proptest::collection::vec(proptest::sample::select(vec![
                ".", "..", "%2e", "%2E.", "api", "Chat", "", "a-b_c", "%2f", "%5C", "%00", "%252e", "a\\b", "x.y",
            ]), 0..6),
        ) {
            let path = format!("/{}", segments.join("/"));
            let lower = path.to_ascii_lowercase();
            let full = lower.contains('\\')
                || ["%2f", "%5c", "%00", "%252e", "%252f", "%255c"].iter().any(|e| lower.contains(e))
                || lower.split('/').any(is_dot_segment);
            proptest::prop_assert_eq!(path_escapes(&path), full, "{}", path);
        }
    }

    #[test]
    fn the_short_way_is_taken_only_for_plain_paths() {
        let base = url::Url::parse("http://127.0.0.1:11434").expect("base");
        let up = Upstream { base: &base, dialect: Dialect::Ollama };
        assert_eq!(up.plain_join("/api/chat").as_deref(), Some("http://127.0.0.1:11434/api/chat"));
        assert_eq!(
            up.plain_join("/v1/chat/completions").as_deref(),
            Some("http://127.0.0.1:11434/v1/chat/completions")
        );
        for full_way in ["/api/blobs/../x", "/api/%2e%2e/x", "/api\\x", "/api/tags?x=1", "api/chat", "", "/api/show:1"]
        {
            assert_eq!(up.plain_join(full_way), None, "{full_way}");
        }
        let prefixed = url::Url::parse("http://h/ollama/").expect("base");
        assert_eq!(Upstream { base: &prefixed, dialect: Dialect::Ollama }.plain_join("/api/chat"), None);
    }

    #[test]
    fn paths_that_climb_are_refused_and_plain_ones_pass() {
        for bad in [
            "/api/blobs/../../../internal/admin",
            "/api/blobs/%2e%2e/%2E%2E/x",
            "/api/blobs/.%2e/x",
            "/api/./chat",
            "/api/blobs/..",
            "/api/blobs/a%2fb",
            "/api/blobs/a%5Cb",
            "/api/blobs/..\\x",
            "/api/blobs/%252e%252e/x",
        ] {
            assert!(path_escapes(bad), "{bad} must be refused");
        }
        for ok in ["/api/chat", "/api/blobs/sha256:abc", "/v1/models/llama3.2:1b", "/", "/api/blobs/a.b..c"] {
            assert!(!path_escapes(ok), "{ok} is a plain path");
        }
    }

    proptest::proptest! {
        #[test]
        fn a_node_url_never_leaves_the_base_path(tail in "[a./%2eEfF5cC\\\\?]{0,40}") {
            let base = url::Url::parse("http://node.example:8080/ollama/").expect("url");
            for dialect in [Dialect::Ollama, Dialect::Openai] {
                let u = Upstream { base: &base, dialect }.url(&format!("/{tail}"));
                proptest::prop_assert!(
                    u.path() == "/ollama" || u.path().starts_with("/ollama/"),
                    "/{} became {}", tail, u
                );
                proptest::prop_assert_eq!(u.host_str(), Some("node.example"));
            }
        }
    }

    fn at(base: &str, dialect: Dialect, path: &str) -> String {
        let base = url::Url::parse(base).expect("url");
        Upstream { base: &base, dialect }.url(path).to_string()
    }

    #[test]
    fn ollama_urls_keep_base_paths_and_queries() {
        assert_eq!(at("http://10.0.0.5:11434", Dialect::Ollama, "/api/chat"), "http://10.0.0.5:11434/api/chat");
        assert_eq!(
            at("http://gpu.local/ollama/", Dialect::Ollama, "/v1/models?x=1"),
            "http://gpu.local/ollama/v1/models?x=1"
        );
    }

    #[test]
    fn openai_urls_take_the_base_with_or_without_v1() {
        let o = Dialect::Openai;
        assert_eq!(at("http://127.0.0.1:8080", o, "/v1/chat/completions"), "http://127.0.0.1:8080/v1/chat/completions");
        assert_eq!(at("https://api.openai.com/v1/", o, "/v1/embeddings"), "https://api.openai.com/v1/embeddings");
        assert_eq!(
            at("https://dashscope.aliyuncs.com/compatible-mode/v1", o, "/v1/chat/completions"),
            "https://dashscope.aliyuncs.com/compatible-mode/v1/chat/completions"
        );
        assert_eq!(at("http://127.0.0.1:8080/v1", o, "/health"), "http://127.0.0.1:8080/v1/health");
        assert_eq!(at("http://h:1/v1", o, "/v1models"), "http://h:1/v1/v1models", "only a whole /v1 segment is joined");
    }

    #[test]
    fn only_kind_openai_speaks_openai() {
        assert_eq!(Dialect::of(NodeKind::Openai), Dialect::Openai);
        assert_eq!(Dialect::of(NodeKind::Ollama), Dialect::Ollama);
    }
}
