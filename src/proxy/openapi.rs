//! The proxy listener's OpenAPI 3.1 description (`GET /openapi.json`), built from
//! [`routes::ROUTES`](super::routes::ROUTES), the table the classifier serves from.
//!
//! Every row becomes one operation with its summary, the Corral request headers (on what goes
//! to a node), the Corral response headers and the broker's error body
//! (`{"error", "code", "forwarded"}`). Ollama's and OpenAI's bodies are Ollama's and OpenAI's:
//! they are described for reference (the fields Corral reads: `model`, `messages`, `stream`,
//! `options`), and passed on as they came. Built once, on first ask.

use std::sync::OnceLock;

use axum::response::Response;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ComponentsBuilder, Content, InfoBuilder, OpenApiBuilder, Paths, ResponseBuilder};
use utoipa::ToSchema;

use super::routes::{Endpoint, Route, ROUTES};
use crate::openapi::{self as doc, Components};

/// A chat or completion message, for reference.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of Ollama's and OpenAI's shape, never built: bodies pass as they came
struct Message {
    role: String,
    content: String,
}

/// Ollama's request body, for reference: Corral reads `model` (or `name`, `source`) to route,
/// `stream`, and applies the category's limits to `options` and `keep_alive`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description, never built
struct OllamaRequest {
    model: String,
    /// `/api/chat`.
    messages: Option<Vec<Message>>,
    /// `/api/generate`, `/api/embeddings`.
    prompt: Option<String>,
    /// `/api/embed`: a string or a list of them.
    input: Option<serde_json::Value>,
    /// Ollama streams NDJSON unless this is `false`.
    stream: Option<bool>,
    /// `num_predict`, `num_ctx`, `temperature`, ...
    options: Option<serde_json::Value>,
    keep_alive: Option<serde_json::Value>,
}

/// OpenAI's request body, for reference: Corral reads `model` to route and `stream`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description, never built
struct OpenAiRequest {
    model: String,
    /// `/v1/chat/completions`, `/v1/messages`.
    messages: Option<Vec<Message>>,
    /// `/v1/completions`.
    prompt: Option<serde_json::Value>,
    /// `/v1/embeddings`, `/v1/responses`.
    input: Option<serde_json::Value>,
    /// Server-sent events when `true`.
    stream: Option<bool>,
    max_tokens: Option<u32>,
    temperature: Option<f64>,
}

/// An error Corral made (not a node's own): its sentence, its stable code (docs/errors.md) and
/// whether the request had been sent anywhere. A stream that fails midway ends with a last
/// NDJSON line `{"error", "code"}` instead.
#[derive(ToSchema)]
#[allow(dead_code)] // the shape `BrokerError::body` writes; described, not built
struct BrokerErrorBody {
    error: String,
    code: String,
    forwarded: bool,
    /// `model_not_found`: the closest names the cluster knows.
    did_you_mean: Option<Vec<String>>,
}

/// Request headers Corral reads on what goes to a node (CONTRACT.md "Request headers").
const REQUEST_HEADERS: &[(&str, &str)] = &[
    ("X-Corral-Category", "The category to serve the request in (else the listener's, the model's, `default`)"),
    ("X-Corral-Session", "Sticky key: the `sticky` policy keeps a session on one node"),
    ("X-Corral-Queue-Timeout", "How long the request may wait for a node, in ms"),
    ("X-Request-Id", "The client's id: echoed, and recorded beside Corral's own"),
    ("Idempotency-Key", "A duplicate joins the running request instead of running twice"),
];

/// Response headers Corral sets on every answer.
const ANSWER_HEADERS: &[(&str, &str)] = &[
    ("X-Request-Id", "The client's id when it sent one, else Corral's"),
    ("X-Corral-Request-Id", "Corral's own id: the key of the request's record"),
];

/// Response headers Corral sets on what went to a node (CONTRACT.md "Response headers").
const RESPONSE_HEADERS: &[(&str, &str)] = &[
    ("X-Corral-Node", "The node that served"),
    ("X-Corral-Attempts", "How many nodes were tried"),
    ("X-Corral-Fallback", "The cloud provider that answered, when one did"),
    ("X-Corral-Degraded", "The model that answered instead, when a degrade chain was used"),
    ("X-Corral-Estimate-Ms", "fastest-finish's estimate of the request's time"),
    ("X-Corral-Clamped", "Which request limits were applied"),
    ("X-Corral-Context-Warning", "The prompt fills more than 85% of the model's context"),
    ("X-Corral-Fallback-Model", "The provider's model that answered, with X-Corral-Fallback"),
    ("X-Corral-Dropped", "Request fields the provider's API has no place for"),
];

/// The document, rendered once.
pub(super) fn response() -> Response {
    static DOC: OnceLock<Vec<u8>> = OnceLock::new();
    doc::respond(DOC.get_or_init(|| doc::render(&document())))
}

/// The proxy listener's description, one operation per row of [`ROUTES`].
pub(super) fn document() -> utoipa::openapi::OpenApi {
    let mut schemas = Components::new();
    for add in [doc::schema::<OllamaRequest>, doc::schema::<OpenAiRequest>, doc::schema::<BrokerErrorBody>] {
        add(&mut schemas);
    }
    let mut paths = Paths::new();
    for route in ROUTES {
        if let Some(method) = doc::method(&route.method) {
            paths.add_path_operation(route.path, vec![method], operation(route));
        }
    }
    let key = SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer));
    let components = ComponentsBuilder::new().schemas_from_iter(schemas).security_scheme("client_key", key).build();
    let info = InfoBuilder::new()
        .title("Corral proxy")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "Ollama's API and the OpenAI-compatible /v1 API in front of a cluster of nodes. \
             A listener that names api_keys needs `Authorization: Bearer <client key>`.",
        ))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .paths(paths)
        .components(Some(components))
        // Optional: only listeners with `api_keys` ask for a key.
        .security(Some([SecurityRequirement::default(), SecurityRequirement::new("client_key", Vec::<String>::new())]))
        .build()
}

fn operation(route: &Route) -> Operation {
    let forwarded = !route.endpoint.is_local();
    let mut op = OperationBuilder::new().summary(Some(route.summary)).tag(tag(route.path));
    op = op.parameters(Some(doc::path_parameters(route.path)));
    if forwarded {
        for (name, what) in REQUEST_HEADERS {
            op = op.parameter(header_parameter(name, what));
        }
    }
    if matches!(route.endpoint, Endpoint::ModelOp | Endpoint::Blob) {
        op = op.parameter(header_parameter("X-Corral-Node", "The nodes to run it on, comma-separated; else all"));
    }
    if let Some(body) = request_body(route) {
        op = op.request_body(Some(RequestBodyBuilder::new().content(body.0, body.1).build()));
    }
    let mut ok = ResponseBuilder::new().description(answer(route).0);
    let sent = if forwarded { RESPONSE_HEADERS } else { &[] };
    for (name, what) in ANSWER_HEADERS.iter().chain(sent) {
        ok = ok.header(*name, response_header(what));
    }
    if let Some(media) = answer(route).1 {
        ok = ok.content(media, Content::default());
    }
    let mut error = ResponseBuilder::new()
        .description("An error Corral made: 400, 401, 403, 404, 408, 409, 413, 415, 429, 502, 503, 504")
        .header("X-Corral-Forwarded", response_header("`false`: Corral refused it without sending it anywhere"))
        .header("Retry-After", response_header("Seconds to wait before trying again (429, 503)"))
        .content("application/json", doc::json("BrokerErrorBody"));
    for (name, what) in ANSWER_HEADERS {
        error = error.header(*name, response_header(what));
    }
    op.response("200", ok.build()).response("default", error.build()).build()
}

fn tag(path: &str) -> &'static str {
    match path {
        "/openapi.json" => "corral",
        p if p.starts_with("/v1/") => "openai",
        _ => "ollama",
    }
}

fn response_header(what: &str) -> utoipa::openapi::Header {
    HeaderBuilder::new().schema(doc::string()).description(Some(what)).build()
}

fn header_parameter(name: &str, what: &str) -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .schema(Some(doc::string()))
        .description(Some(what))
        .build()
}

/// The body a route takes: its media type and schema.
fn request_body(route: &Route) -> Option<(&'static str, Content)> {
    match (route.endpoint, route.method.as_str()) {
        (Endpoint::Blob, "POST") => Some(("application/octet-stream", Content::new(Some(doc::string())))),
        (_, "POST" | "DELETE") if route.path.starts_with("/v1/") => {
            Some(("application/json", doc::json("OpenAiRequest")))
        }
        (_, "POST" | "DELETE") => Some(("application/json", doc::json("OllamaRequest"))),
        _ => None,
    }
}

/// What a route answers with: a description and the media type of its body (none for HEAD).
fn answer(route: &Route) -> (&'static str, Option<&'static str>) {
    if route.method == http::Method::HEAD {
        return ("The head of the GET answer", None);
    }
    match route.endpoint {
        Endpoint::Root => ("`Ollama is running`", Some("text/plain")),
        Endpoint::OpenApi => ("This document", Some("application/json")),
        Endpoint::Discovery => ("Answered by Corral, no client key needed (see /help)", Some("application/json")),
        Endpoint::Model if route.path.starts_with("/v1/") => {
            ("The node's answer; server-sent events when streamed", Some("application/json"))
        }
        Endpoint::Model | Endpoint::ModelOp => {
            ("The node's answer; NDJSON lines when streamed", Some("application/json"))
        }
        Endpoint::Tags | Endpoint::Ps | Endpoint::V1Models | Endpoint::V1Model => {
            ("Merged across the serving nodes", Some("application/json"))
        }
        Endpoint::AnyNode | Endpoint::Blob => ("A serving node's answer", Some("application/json")),
    }
}
