//! The proxy listener's routes: one table, [`ROUTES`], of every method and path it serves,
//! with the kind of endpoint each is and a one-line summary.
//!
//! The classifier ([`classify`], on every request) and the OpenAPI description
//! (`proxy::openapi`) both read this table and nothing else, so a route cannot be served
//! without being described, nor described without being served. Classification is a linear
//! scan over the table: a few dozen comparisons of a method and a string, no allocation.
//! Rows never overlap (no two match the same request), so their order does not change the
//! answer; exact paths come first only because they are the common ones.
//!
//! A new proxy route is added here, as one row per method, and nowhere else: the endpoint kind
//! says how `proxy::serve` answers it (answered here, merged, fanned out or forwarded).

use http::Method;

/// What kind of endpoint a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET|HEAD /`: answered by the broker.
    Root,
    /// `GET /openapi.json`: this listener's OpenAPI description, answered by the broker.
    OpenApi,
    /// `GET /.well-known/corral` and `GET /status` (`proxy::discover`): answered by the broker
    /// before the client key check.
    Discovery,
    /// Needs a node that has the request's model.
    Model,
    /// Any serving node will do (`/api/version`).
    AnyNode,
    /// Merged across nodes.
    Tags,
    Ps,
    V1Models,
    /// `GET /v1/models/{model}` (the openai SDK's `models.retrieve`): answered from the merged
    /// list, like Ollama answers it from its own.
    V1Model,
    /// Pull, delete, copy, create: sent to the nodes named in `X-Corral-Node`, or all.
    ModelOp,
    /// `HEAD|POST /api/blobs/{digest}`: to the nodes a following create goes to.
    Blob,
}

impl Endpoint {
    /// Answered by the broker itself from what it knows: no node, no body, no record (clients
    /// poll these), and served while the broker is paused.
    pub fn is_local(self) -> bool {
        matches!(self, Endpoint::Root | Endpoint::OpenApi | Endpoint::Discovery)
    }
}

/// One method on one path of the proxy listener.
#[derive(Debug)]
pub struct Route {
    pub method: Method,
    /// The path as an OpenAPI template. A `{param}` (only ever last) matches the rest of the
    /// request's path, whatever it holds (`/` included; Ollama's digests and model names may).
    pub path: &'static str,
    pub endpoint: Endpoint,
    pub summary: &'static str,
}

impl Route {
    fn matches(&self, method: &Method, path: &str) -> bool {
        self.method == *method
            && match self.path.split_once('{') {
                Some((prefix, _)) => path.starts_with(prefix),
                None => path == self.path,
            }
    }
}

const fn route(method: Method, path: &'static str, endpoint: Endpoint, summary: &'static str) -> Route {
    Route { method, path, endpoint, summary }
}

use Endpoint::*;

/// Every route of the proxy listener: the classifier and the OpenAPI description read this.
/// Add a new route here (one row per method).
pub static ROUTES: &[Route] = &[
    route(Method::POST, "/api/chat", Model, "Chat with a model (Ollama); NDJSON stream unless `stream: false`"),
    route(
        Method::POST,
        "/api/generate",
        Model,
        "Generate from a prompt (Ollama); NDJSON stream unless `stream: false`",
    ),
    route(Method::POST, "/v1/chat/completions", Model, "Chat Completions (OpenAI); SSE when `stream: true`"),
    route(Method::POST, "/api/embed", Model, "Embeddings of one or more inputs (Ollama)"),
    route(Method::POST, "/api/embeddings", Model, "Embedding of one prompt (Ollama, legacy)"),
    route(Method::POST, "/v1/embeddings", Model, "Embeddings (OpenAI)"),
    route(Method::POST, "/v1/completions", Model, "Completions (OpenAI); SSE when `stream: true`"),
    route(Method::POST, "/v1/responses", Model, "Responses (OpenAI), passed to a node as it came"),
    route(Method::POST, "/v1/messages", Model, "Messages (Anthropic), passed to a node as it came"),
    route(Method::POST, "/api/show", Model, "A model's details, from a node that has it"),
    route(Method::POST, "/api/push", Model, "Push a model to a registry, from a node that has it"),
    route(Method::GET, "/", Root, "Liveness: `Ollama is running`"),
    route(Method::HEAD, "/", Root, "Liveness, head only"),
    route(Method::GET, "/api/version", AnyNode, "A serving node's Ollama version, else Corral's"),
    route(Method::HEAD, "/api/version", AnyNode, "A serving node's Ollama version, head only"),
    route(Method::GET, "/api/status", AnyNode, "A serving node's own status"),
    route(Method::GET, "/api/tags", Tags, "The models of every serving node, merged"),
    route(Method::HEAD, "/api/tags", Tags, "The merged model list, head only"),
    route(Method::GET, "/api/ps", Ps, "The models loaded on every serving node, merged"),
    route(Method::HEAD, "/api/ps", Ps, "The merged list of loaded models, head only"),
    route(Method::GET, "/v1/models", V1Models, "The models of every serving node, merged (OpenAI)"),
    route(Method::HEAD, "/v1/models", V1Models, "The merged model list (OpenAI), head only"),
    route(Method::POST, "/api/pull", ModelOp, "Pull a model onto the nodes in `X-Corral-Node`, or all"),
    route(Method::POST, "/api/create", ModelOp, "Create a model on the nodes in `X-Corral-Node`, or all"),
    route(Method::POST, "/api/copy", ModelOp, "Copy a model on the nodes that have it"),
    route(Method::DELETE, "/api/delete", ModelOp, "Delete a model from the nodes that have it"),
    route(Method::GET, "/openapi.json", OpenApi, "This document: the proxy listener's OpenAPI 3.1 description"),
    route(
        Method::GET,
        "/.well-known/corral",
        Discovery,
        "Discovery: name, version, the proxy, /v1 and admin URLs as seen by the caller, the APIs spoken",
    ),
    route(
        Method::GET,
        "/status",
        Discovery,
        "Whether a request could start now, per model (a snapshot, not a reservation), queue by origin, request_origin",
    ),
    // Rows with a trailing `{param}` match by prefix: keep them after the exact ones.
    route(Method::POST, "/api/blobs/{digest}", Blob, "Upload a blob for a following create"),
    route(Method::HEAD, "/api/blobs/{digest}", Blob, "Whether the nodes have a blob"),
    route(Method::GET, "/v1/models/{model}", V1Model, "One model of the merged list (OpenAI)"),
    route(Method::HEAD, "/v1/models/{model}", V1Model, "One model of the merged list (OpenAI), head only"),
];

/// The endpoint `method path` is for, or `None` when the proxy does not serve it.
pub fn classify(method: &Method, path: &str) -> Option<Endpoint> {
    ROUTES.iter().find(|r| r.matches(method, path)).map(|r| r.endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The classifier as it was before the table: one `match`, kept as the oracle.
    fn by_match(method: &Method, path: &str) -> Option<Endpoint> {
        let get = method == Method::GET || method == Method::HEAD;
        let post = method == Method::POST;
        Some(match path {
            "/" if get => Root,
            "/openapi.json" if method == Method::GET => OpenApi,
            "/.well-known/corral" | "/status" if method == Method::GET => Discovery,
            "/api/version" if get => AnyNode,
            "/api/status" if method == Method::GET => AnyNode,
            "/api/tags" if get => Tags,
            "/api/ps" if get => Ps,
            "/v1/models" if get => V1Models,
            "/api/chat" | "/api/generate" | "/api/embed" | "/api/embeddings" | "/api/show" if post => Model,
            "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" if post => Model,
            "/v1/responses" | "/v1/messages" if post => Model,
            "/api/push" if post => Model,
            "/api/pull" | "/api/create" | "/api/copy" if post => ModelOp,
            "/api/delete" if method == Method::DELETE => ModelOp,
            p if p.starts_with("/api/blobs/") && (post || method == Method::HEAD) => Blob,
            p if p.starts_with("/v1/models/") && get => V1Model,
            _ => return None,
        })
    }

    const METHODS: [&str; 8] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4_000, failure_persistence: None, ..ProptestConfig::default() })]

        /// The table classifies every request line as the `match` did.
        #[test]
        fn the_table_classifies_like_the_match_it_replaced(
            method in prop::sample::select(METHODS.to_vec()),
            path in prop_oneof![
                "/[ -~]{0,40}",
                "/(api|v1)/[a-z/._%-]{0,30}",
                "/api/blobs/[a-z0-9:./%]{0,40}",
                "/v1/models/?[a-z0-9:./]{0,20}",
                prop::sample::select(ROUTES.iter().map(|r| r.path.split('{').next().unwrap_or("/").to_string()).collect::<Vec<_>>()),
            ],
        ) {
            let m = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
            prop_assert_eq!(classify(&m, &path), by_match(&m, &path), "{} {}", method, path);
        }
    }

    #[test]
    fn every_row_is_reached_and_no_two_rows_match_the_same_request() {
        for (i, r) in ROUTES.iter().enumerate() {
            let sample = r.path.replace("{digest}", "sha256:ab").replace("{model}", "llama3.2");
            let hits: Vec<usize> = (0..ROUTES.len()).filter(|&j| ROUTES[j].matches(&r.method, &sample)).collect();
            assert_eq!(hits, [i], "{} {} is matched by rows {hits:?}", r.method, r.path);
            assert_eq!(classify(&r.method, &sample), Some(r.endpoint), "{} {}", r.method, r.path);
        }
    }
}
