//! The proxy listener: Ollama's API and the OpenAI-compatible `/v1` API in front of the cluster.
//!
//! A request is classified by endpoint from the one table of served routes (`routes`, which
//! `GET /openapi.json` describes too), read (bounded by `proxy.max_body_bytes`), given a
//! category, and then either answered by the broker itself (`GET /`, `GET /openapi.json`), fanned out to every
//! serving node and merged (`/api/tags`, `/api/ps`, `/v1/models`), or forwarded to one node
//! chosen by the category's policy (`forward`). Broker-made errors go through `BrokerError`;
//! every response carries `X-Request-Id`.
//!
//! Before any of that, `gate` screens the request: `Host` and `Origin` (`browser`, Ollama's own
//! rules), a path that could climb out of a node's base path (400 `bad_path`), the client key,
//! the right to run model operations (`model_ops`, an operator's right: a `remote` listener
//! refuses them unless it grants it), and the body type of JSON endpoints (415 for the types a
//! cross-site form can send).

pub mod browser;
mod context;
pub mod degrade;
pub mod discover;
mod fanout;
mod forward;
pub mod idempotency;
pub mod limits;
mod openapi;
mod peek;
mod readahead;
mod relay;
mod resume;
pub mod routes;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, HeaderValue, Method};

use crate::config::{Config, ListenerConfig};
use crate::error::BrokerError;
use crate::state::Shared;
use crate::telemetry::{status_for, Trace};

pub use forward::Outbound;
pub use peek::{Named, Peek};
use routes::{classify, Endpoint};

/// Header names the request path reads or sets on every request, made once. A `&str` name is
/// parsed, lower-cased and searched for among the standard names on each use: a few thousand
/// instructions a request over a dozen uses (callgrind, issue 16).
pub(crate) mod names {
    use http::HeaderName;

    pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    pub static X_CORRAL_REQUEST_ID: HeaderName = HeaderName::from_static("x-corral-request-id");
    pub static X_CORRAL_ATTEMPTS: HeaderName = HeaderName::from_static("x-corral-attempts");
    pub static X_CORRAL_NODE: HeaderName = HeaderName::from_static("x-corral-node");
    pub static X_CORRAL_CATEGORY: HeaderName = HeaderName::from_static("x-corral-category");
    pub static X_CORRAL_QUEUE_TIMEOUT: HeaderName = HeaderName::from_static("x-corral-queue-timeout");
    pub static X_CORRAL_SESSION: HeaderName = HeaderName::from_static("x-corral-session");
    pub static X_CORRAL_ESTIMATE_MS: HeaderName = HeaderName::from_static("x-corral-estimate-ms");
    pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
    pub static SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");
    pub static SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");
}

/// Per-listener state: the shared broker plus what this socket says about its clients.
#[derive(Clone, Debug)]
pub struct ProxyState {
    pub shared: Arc<Shared>,
    pub listener: Arc<ListenerConfig>,
    /// Names of recent requests and their answers, shared by every listener.
    pub idempotency: Arc<idempotency::Idempotency>,
}

/// The client key a request authenticated with (its name), kept in the request's extensions
/// for scoping what requests may share.
#[derive(Debug, Clone)]
struct ClientName(Option<String>);

pub fn router(state: ProxyState) -> axum::Router {
    axum::Router::new().fallback(entry).with_state(state)
}

/// Every request: CORS (`browser::cors`) around the handler.
///
/// The handler's future is boxed where it is made, once: it is about 10 KB (every await point
/// of the path below it), and a future is copied whole each time it is moved, which axum and
/// `cors` would do several times; boxed, each of those moves copies a pointer (callgrind: 20 KB
/// of memcpy per request less).
async fn entry(State(state): State<ProxyState>, req: Request) -> Response {
    let listener = Arc::clone(&state.listener);
    browser::cors(&listener, req, |req| Box::pin(handle(state, req))).await
}

/// Whether a request changes what the nodes hold (pull, delete, create, copy, push, blobs):
/// an operator's right, granted per listener by `model_ops`.
fn is_model_op(method: &Method, path: &str) -> bool {
    matches!(path, "/api/pull" | "/api/create" | "/api/copy" | "/api/push" | "/api/delete")
        || (path.starts_with("/api/blobs/") && (method == Method::POST || method == Method::HEAD))
}

/// Why Corral does not serve a route Ollama has (ollama/ollama `server/routes.go`,
/// `GenerateRoutes`), if that is what `method path` is.
fn not_served(method: &Method, path: &str) -> Option<&'static str> {
    let account = "it acts for one Ollama install's ollama.com account, and a cluster has no single account";
    Some(match (method.as_str(), path) {
        ("POST", "/api/me" | "/api/signout") => account,
        ("DELETE", p) if p.starts_with("/api/user/keys/") => account,
        ("POST", "/api/experimental/web_search" | "/api/experimental/web_fetch") => {
            "Ollama sends it to ollama.com signed with its own key; call a node directly or ollama.com"
        }
        ("GET", "/api/experimental/model-recommendations") => "it describes one Ollama install; ask a node directly",
        ("POST", "/v1/audio/transcriptions") => {
            "its body is a multipart form, and Corral routes by the JSON body's model; call a node directly"
        }
        _ => return None,
    })
}

/// The model a request body names, read by `peek::Peek` without building the body's tree
/// (memory stays the body's own size). Hostile bodies (nesting past serde_json's depth limit,
/// invalid UTF-8 anywhere, a field given twice) stop here with a 400 instead of travelling to a
/// node; the bytes forwarded are still the client's own.
pub fn model_of(body: &[u8]) -> Result<(String, Option<bool>, Peek), BrokerError> {
    let peek = Peek::read(body).map_err(BrokerError::MalformedJson)?;
    // Older clients name the model `name` (`/api/show`, `/api/pull`, `/api/delete`);
    // `/api/copy` names it `source`.
    let mut model = None;
    for (key, named) in ["model", "name", "source"].into_iter().zip(&peek.names) {
        match named {
            peek::Named::Absent => continue,
            peek::Named::Text(m) if !m.is_empty() => {
                model = Some(m.clone());
                break;
            }
            peek::Named::Text(_) => return Err(BrokerError::MissingModel),
            peek::Named::Other(kind) => {
                return Err(BrokerError::MalformedJson(format!("\"{key}\" must be a string, not {kind}")))
            }
        }
    }
    let model = model.ok_or(BrokerError::MissingModel)?;
    check_model_name(&model)?;
    Ok((model, peek.stream, peek))
}

/// `model_of`, with a large body read on the blocking pool: reading megabytes through takes
/// milliseconds, and on the async thread one upload would stall every other connection (the
/// admin listener's included; `corral serve` runs a single-threaded runtime on small machines).
async fn model_of_body(body: &axum::body::Bytes) -> Result<(String, Option<bool>, Peek), BrokerError> {
    if body.len() <= 256 * 1024 {
        return model_of(body);
    }
    let body = body.clone();
    match tokio::task::spawn_blocking(move || model_of(&body)).await {
        Ok(read) => read,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(BrokerError::ShuttingDown),
    }
}

/// Longest model name accepted (Ollama's own names are far shorter: host/namespace/model:tag).
const MODEL_NAME_MAX: usize = 256;

/// A model name fit to route, record and log: bounded, no control characters.
fn check_model_name(model: &str) -> Result<(), BrokerError> {
    if model.len() > MODEL_NAME_MAX {
        return Err(BrokerError::BadModelName(format!("longer than {MODEL_NAME_MAX} bytes ({} bytes)", model.len())));
    }
    if model.chars().any(char::is_control) {
        return Err(BrokerError::BadModelName("it holds control characters".into()));
    }
    Ok(())
}

/// The bearer token a request carries (`Authorization: Bearer <key>`).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    crate::server::bearer_token(headers).map(str::as_bytes)
}

/// Check the client key on a listener that names `api_keys`; the key is for Corral, never for
/// a node, so it is removed once checked.
fn authenticate(state: &ProxyState, headers: &mut HeaderMap) -> Result<Option<String>, BrokerError> {
    if state.listener.api_keys.is_empty() {
        return Ok(None);
    }
    let client = bearer(headers)
        .and_then(|b| state.shared.client_keys.check(&state.listener.api_keys, b))
        .ok_or(BrokerError::Unauthorized)?;
    headers.remove(header::AUTHORIZATION);
    Ok(Some(client))
}

/// The client's own `X-Request-Id`, kept only when sane (visible ASCII, at most 128 bytes). It
/// is echoed and recorded beside Corral's id, never used as one.
fn client_request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(&names::X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
}

async fn handle(state: ProxyState, req: Request) -> Response {
    // Corral's own id keys the record; the client's is echoed beside it. Version 7 (time
    // first) so the store's primary key grows at its end instead of at a random page per row.
    let id = uuid::Uuid::now_v7().to_string();
    let client_id = client_request_id(req.headers());
    // Discovery (`/.well-known/corral`, `/status`) answers before the client key: see `discover`.
    let (mut response, attempts) = match discover::answer(&state, &req) {
        Some(answer) => (answer, None),
        None => admitted(&state, req, &id, client_id.clone()).await,
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(client_id.as_deref().unwrap_or(&id)) {
        h.insert(&names::X_REQUEST_ID, v);
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert(&names::X_CORRAL_REQUEST_ID, v);
    }
    if let Some(n) = attempts.filter(|&n| n > 0) {
        h.insert(&names::X_CORRAL_ATTEMPTS, HeaderValue::from(n));
    }
    response
}

/// A request past discovery: its client key checked, then served with its record.
async fn admitted(
    state: &ProxyState,
    mut req: Request,
    id: &str,
    client_id: Option<String>,
) -> (Response, Option<u32>) {
    match authenticate(state, req.headers_mut()) {
        Ok(client) => {
            if let Some(refused) = client.as_deref().and_then(|name| over_quota(state, &req, name)) {
                let e = BrokerError::from(refused);
                let trace = state.shared.telemetry.begin(id, req.uri().path(), origin_name(state), client_id);
                trace.finish("client_error", Some(e.status().as_u16()), Some(e.code()));
                return (e.into_response(), None);
            }
            tracing::debug!(request_id = %id, client = client.as_deref().unwrap_or(""), "admitted");
            req.extensions_mut().insert(ClientName(client));
            traced(state, req, id, client_id).await
        }
        // Counted always; recorded only at a bounded rate, so unauthenticated traffic cannot
        // fill the store.
        Err(e) if !state.shared.telemetry.note_unauthenticated() => (e.into_response(), None),
        Err(e) => {
            let trace = state.shared.telemetry.begin(id, req.uri().path(), origin_name(state), client_id);
            trace.finish("client_error", Some(e.status().as_u16()), Some(e.code()));
            (e.into_response(), None)
        }
    }
}

/// Count the request against its client key's quota; the refusal when it is used up. Requests
/// Corral answers itself (`GET /`, `/api/version`) are not counted.
fn over_quota(state: &ProxyState, req: &Request, client: &str) -> Option<crate::quota::Refusal> {
    if classify(req.method(), req.uri().path()).is_some_and(Endpoint::is_local) {
        return None;
    }
    state.shared.telemetry.quotas().admit(client, crate::quota::now_s()).err()
}

fn origin_name(state: &ProxyState) -> &'static str {
    match state.listener.origin {
        crate::config::Origin::Local => "local",
        crate::config::Origin::Remote => "remote",
    }
}

/// Serve an admitted request with its record.
async fn traced(state: &ProxyState, req: Request, id: &str, client_id: Option<String>) -> (Response, Option<u32>) {
    // `GET /` and `HEAD /` are clients checking the server is up, `/openapi.json` a client
    // reading the description: not worth a record each.
    // Upstreams see the client's id when it sent one, so its trace continues there.
    let upstream_id = client_id.clone().unwrap_or_else(|| id.to_string());
    let path = req.uri().path().to_string();
    let local = classify(req.method(), &path).is_some_and(Endpoint::is_local);
    let mut trace = (!local).then(|| state.shared.telemetry.begin(id, &path, origin_name(state), client_id));
    if let Some(t) = trace.as_mut() {
        t.continue_from(req.headers());
        t.for_client(req.extensions().get::<ClientName>().and_then(|c| c.0.clone()));
    }
    let (response, attempts) = match serve(state, req, &upstream_id, &mut trace).await {
        Ok(r) => (r, None),
        Err((e, attempts)) => (failed(&state.shared, &mut trace, e, attempts), Some(attempts)),
    };
    settle(&mut trace, &response);
    (response, attempts)
}

/// The response for a request that failed with `e` after `attempts`, its record finished.
fn failed(shared: &Shared, trace: &mut Option<Trace>, e: BrokerError, attempts: u32) -> Response {
    let e = explained(shared, trace.as_ref().map(|t| t.row.category.as_str()), e);
    if let Some(mut t) = trace.take() {
        t.row.attempts = i64::from(attempts);
        t.finish(status_for(e.status().as_u16()), Some(e.status().as_u16()), Some(e.code()));
    }
    e.into_response()
}

/// Answers that did not go through a relay (merged, fanned out, the node's own 404) end here.
fn settle(trace: &mut Option<Trace>, response: &Response) {
    if let Some(t) = trace.take() {
        let status = response.status().as_u16();
        t.finish(status_for(status), Some(status), None);
    }
}

/// A `model_not_found` from below, completed with what the cluster knows: the closest names
/// any node lists (whatever its health now) or the request's category may send to a provider
/// ("did you mean"), and the nodes that are down and never listed their models.
fn explained(shared: &Shared, category: Option<&str>, e: BrokerError) -> BrokerError {
    let BrokerError::ModelNotFound { model, refused_by, .. } = e else { return e };
    let config = shared.config();
    let cat = category.and_then(|c| config.category(c)).filter(|c| c.may_fall_back());
    let mapped = config
        .providers
        .iter()
        .filter(|p| cat.is_some_and(|c| c.providers.contains(&p.name)))
        .flat_map(|p| p.model_map.keys().map(String::as_str));
    let known = crate::catalog::known_models(&shared.registry, mapped);
    let did_you_mean = crate::catalog::closest(&model, &known);
    BrokerError::ModelNotFound { did_you_mean, unlisted: crate::catalog::unlisted(&shared.registry), model, refused_by }
}

async fn serve(
    state: &ProxyState,
    req: Request,
    id: &str,
    trace: &mut Option<Trace>,
) -> Result<Response, (BrokerError, u32)> {
    let shared = &state.shared;
    let config = shared.config();
    let (parts, body) = req.into_parts();
    let endpoint = gate(state, &parts).map_err(|e| (e, 0))?;
    if let Some(answer) = answered_here(endpoint) {
        return Ok(answer);
    }
    if !shared.accepting() {
        return Err((BrokerError::Paused, 0));
    }
    let body = read_body(&parts.headers, body, config.proxy.max_body_bytes, config.proxy.body_read_timeout())
        .await
        .map_err(|e| (e, 0))?;
    let mut asked = Asked::read(state, &config, endpoint, &parts, &body, trace).await.map_err(|e| (e, 0))?;
    let body = limited(&config, &mut asked, parts.uri.path(), body).map_err(|e| (e, 0))?;
    let claim = match idempotency_ask(state, &config, &parts, &asked, &body, trace) {
        Some(ask) => state.idempotency.claim(ask, tokio::time::Instant::now()),
        None => idempotency::Claim::Untracked,
    };
    match claim {
        idempotency::Claim::Untracked => execute(state, endpoint, parts, body, asked, id, trace).await,
        idempotency::Claim::Follow(f) => f.response().await.map_err(|e| (e, 0)),
        idempotency::Claim::Replay(r) => Ok(r),
        idempotency::Claim::Refused(e) => Err((e, 0)),
        idempotency::Claim::Lead(lead, f) => {
            // On its own task: the first client leaving does not cancel what a retry may join.
            let (state, id, mut trace) = (state.clone(), id.to_string(), trace.take());
            state.shared.tasks.clone().spawn(async move {
                let response = match execute(&state, endpoint, parts, body, asked, &id, &mut trace).await {
                    Ok(r) => r,
                    Err((e, attempts)) => {
                        let mut r = failed(&state.shared, &mut trace, e, attempts);
                        if attempts > 0 {
                            r.headers_mut().insert(&names::X_CORRAL_ATTEMPTS, HeaderValue::from(attempts));
                        }
                        r
                    }
                };
                settle(&mut trace, &response);
                lead.run(response, &state.shared.shutdown).await;
            });
            f.response().await.map_err(|e| (e, 0))
        }
    }
}

/// The answer to an endpoint the broker answers itself ([`Endpoint::is_local`]), paused or not.
fn answered_here(endpoint: Endpoint) -> Option<Response> {
    Some(match endpoint {
        Endpoint::Root => {
            (http::StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "Ollama is running")
                .into_response()
        }
        Endpoint::OpenApi => openapi::response(),
        _ => return None,
    })
}

/// The body with the category's request limits applied (`limits`); what was clamped goes in
/// `asked.clamped`, for `X-Corral-Clamped`.
fn limited(
    config: &Config,
    asked: &mut Asked,
    path: &str,
    body: axum::body::Bytes,
) -> Result<axum::body::Bytes, BrokerError> {
    let Some(cat) = config.category(&asked.category) else { return Ok(body) };
    match limits::apply(&cat.limits, &cat.name, path, &body)? {
        Some(applied) => {
            asked.clamped = (!applied.clamped.is_empty()).then(|| applied.clamped.join(", "));
            Ok(applied.body)
        }
        None => Ok(body),
    }
}

/// Idempotent endpoints: a second run would compute the same thing again.
fn deduplicated(path: &str) -> bool {
    matches!(
        path,
        "/api/chat"
            | "/api/generate"
            | "/api/embed"
            | "/api/embeddings"
            | "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/responses"
            | "/v1/messages"
    )
}

/// The name a request is deduplicated under, when it carries one and its category keeps
/// names (`proxy::idempotency`).
fn idempotency_ask(
    state: &ProxyState,
    config: &Config,
    parts: &http::request::Parts,
    asked: &Asked,
    body: &[u8],
    trace: &Option<Trace>,
) -> Option<idempotency::Ask> {
    let path = parts.uri.path();
    let cat = config.category(&asked.category)?;
    let window = cat.idempotency_window().filter(|_| parts.method == Method::POST && deduplicated(path))?;
    let explicit = parts
        .headers
        .get(&names::IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 256 && v.bytes().all(|b| b.is_ascii_graphic()));
    let key = match explicit {
        Some(k) => idempotency::Key::Explicit(k.to_string()),
        None => idempotency::Key::RequestId(client_request_id(&parts.headers)?),
    };
    let client = parts.extensions.get::<ClientName>().and_then(|c| c.0.clone()).unwrap_or_default();
    let path_and_query = parts.uri.path_and_query().map_or(path, |p| p.as_str());
    Some(idempotency::Ask {
        scope: format!("{}/{client}", origin_name(state)),
        key,
        fingerprint: idempotency::fingerprint(&parts.method, path_and_query, body),
        id: trace.as_ref().map(|t| t.row.id.clone())?,
        window,
        replay: cat.replay_finished,
    })
}

/// Serve a request that was read and classified: answered here, fanned out, or forwarded.
///
/// The rare paths (fan-outs, unload, degrade, fallback) are awaited boxed: an async fn's
/// future is as large as its largest await point and is copied whole each time it is made and
/// moved, so the forwarding path carries a pointer for them, not their kilobytes.
async fn execute(
    state: &ProxyState,
    endpoint: Endpoint,
    parts: http::request::Parts,
    body: axum::body::Bytes,
    asked: Asked,
    id: &str,
    trace: &mut Option<Trace>,
) -> Result<Response, (BrokerError, u32)> {
    let shared = &state.shared;
    let config = shared.config();
    let path = parts.uri.path().to_string();
    if let Some(answer) = answered_without_forwarding(shared, endpoint, &parts, &asked, &body, trace).await {
        return answer.map_err(|e| (e, 0));
    }
    // Only a body with no text can be a load or unload: a chat is not parsed a second time.
    let lifecycle = asked.textless.then(|| crate::upstream::lifecycle::Lifecycle::of(&path, &body)).flatten();
    if let (Some(crate::upstream::lifecycle::Lifecycle::Unload), Some(model)) = (lifecycle, asked.model.as_deref()) {
        // `ollama stop`: every node holding the model lets it go, not just one.
        return Box::pin(fanout::unload(shared, &path, body, model)).await.map_err(|e| (e, 0));
    }
    let cat = config.category(&asked.category);
    // Kept for a cloud fallback: the body is shared, not copied.
    let fallback_body = body.clone();
    let may_fall_back = lifecycle.is_none() && crate::cloud::can_fall_back(&path);
    let out = outbound(state, parts, body, id, &asked, cat, may_fall_back);
    // Kept for the degrade chain, only where there is one (a load is not degraded).
    let spare = cat
        .filter(|c| (!c.degrade.is_empty() || c.static_answer.is_some()) && lifecycle.is_none())
        .map(|_| out.clone());
    // The fallback may wait for a rate-limited provider only within the request's queue timeout.
    let deadline = tokio::time::Instant::now() + asked.queue_timeout;
    let mut response = match forward::forward(shared, out, trace).await {
        Ok(r) => r,
        Err((local, attempts)) => {
            let spare = spare.filter(|_| degrade::is_trigger(&local));
            let first = cat.is_some_and(|c| c.degrade_order == crate::config::DegradeOrder::BeforeCloud);
            if let Some(r) = Box::pin(degrade::serve(shared, spare.as_ref().filter(|_| first), trace)).await {
                r
            } else {
                let failed = Failed { path: &path, body: &fallback_body, id, deadline, may_fall_back };
                let local = (local, attempts);
                match Box::pin(otherwise(shared, &config, cat, asked.model.as_deref(), failed, local, trace)).await {
                    Ok(r) => r,
                    Err(e) => match Box::pin(degrade::serve(shared, spare.as_ref().filter(|_| !first), trace)).await {
                        Some(r) => r,
                        None => degrade::static_answer(shared, spare.as_ref(), trace).ok_or(e)?,
                    },
                }
            }
        }
    };
    if let Some(w) = asked.context_warning.and_then(|w| HeaderValue::from_str(&w).ok()) {
        response.headers_mut().insert("x-corral-context-warning", w);
    }
    if let Some(c) = asked.clamped.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert("x-corral-clamped", c);
    }
    Ok(response)
}

/// What a request that no local node answered still carries, for the cloud fallback.
struct Failed<'a> {
    path: &'a str,
    body: &'a axum::body::Bytes,
    id: &'a str,
    deadline: tokio::time::Instant,
    may_fall_back: bool,
}

/// The answer for a request no local node answered: a cloud provider's, Corral's own version,
/// a provider's `/api/show`, or the local failure.
async fn otherwise(
    shared: &Arc<Shared>,
    config: &Config,
    cat: Option<&crate::config::CategoryConfig>,
    model: Option<&str>,
    f: Failed<'_>,
    (local, attempts): (BrokerError, u32),
    trace: &mut Option<Trace>,
) -> Result<Response, (BrokerError, u32)> {
    let path = f.path;
    Ok(match (cat, model) {
        // A load or unload generates nothing: never a (billed) cloud call.
        (Some(cat), Some(model)) if f.may_fall_back && crate::cloud::is_trigger(&local) => {
            let req = crate::cloud::Request {
                path,
                body: f.body,
                model,
                category: cat,
                request_id: f.id,
                deadline: f.deadline,
            };
            fall_back(shared, config, req, local, attempts, trace).await.map_err(|e| (e, attempts))?
        }
        // Any node's version will do, and with none Corral's own is the answer.
        _ if path == "/api/version" => return Ok(own_version()),
        (Some(cat), Some(model)) if path == "/api/show" && crate::cloud::is_trigger(&local) => {
            let Some((provider, answer)) = crate::cloud::show(config, cat, model, &local) else {
                return Err((local, attempts));
            };
            let mut r = axum::Json(answer).into_response();
            if let Ok(v) = HeaderValue::from_str(&provider) {
                r.headers_mut().insert("x-corral-fallback", v);
            }
            r
        }
        (_, _) => return Err((local, attempts)),
    })
}

/// What `forward` needs of the request; the headers and body move, nothing is copied.
fn outbound(
    state: &ProxyState,
    parts: http::request::Parts,
    body: axum::body::Bytes,
    id: &str,
    asked: &Asked,
    cat: Option<&crate::config::CategoryConfig>,
    may_fall_back: bool,
) -> Outbound {
    let path = parts.uri.path().to_string();
    Outbound {
        http1: matches!(parts.version, http::Version::HTTP_09 | http::Version::HTTP_10 | http::Version::HTTP_11),
        method: parts.method.clone(),
        path_and_query: parts.uri.path_and_query().map_or(path, |p| p.as_str().to_string()),
        session: parts.headers.get(&names::X_CORRAL_SESSION).and_then(|v| v.to_str().ok()).map(str::to_string),
        headers: parts.headers,
        body,
        model: asked.model.clone(),
        priority: cat.map_or(1, |c| c.priority),
        origin: state.listener.origin,
        category: asked.category.clone(),
        request_id: id.to_string(),
        queue_timeout: asked.queue_timeout,
        stream: asked.stream,
        has_alternative: may_fall_back && cat.is_some_and(|c| c.may_fall_back()),
    }
}

/// Answers made without sending the request to one chosen node: merged lists, fanned-out model
/// operations, and `/api/show` of a model only OpenAI-compatible nodes serve.
async fn answered_without_forwarding(
    shared: &Shared,
    endpoint: Endpoint,
    parts: &http::request::Parts,
    asked: &Asked,
    body: &axum::body::Bytes,
    trace: &mut Option<Trace>,
) -> Option<Result<Response, BrokerError>> {
    let model = asked.model.as_deref();
    Some(match endpoint {
        Endpoint::Tags => Box::pin(fanout::tags(shared)).await,
        Endpoint::Ps => Box::pin(fanout::ps(shared)).await,
        Endpoint::V1Models => Box::pin(fanout::v1_models(shared)).await,
        Endpoint::V1Model => Box::pin(fanout::v1_model(shared, model.unwrap_or_default())).await,
        Endpoint::ModelOp | Endpoint::Blob => {
            let (method, path, headers) = (&parts.method, parts.uri.path(), &parts.headers);
            let op = fanout::ModelOp { method, path, headers, model, wait: asked.queue_timeout };
            Box::pin(fanout::model_op(shared, op, body.clone(), trace)).await
        }
        Endpoint::Model if parts.uri.path() == "/api/show" => Ok(Box::pin(show_on_openai(shared, model?)).await?),
        _ => return None,
    })
}

/// `/api/show` of a model that only OpenAI-compatible nodes serve: Ollama's `ShowResponse`
/// made from what one of them says of the model (`upstream::openai::show`), so `ollama.show()`,
/// llama-index and `ollama run` work. `None` when an Ollama node has it (it answers itself) or
/// the server said nothing (the plan's plainer answer stands).
async fn show_on_openai(shared: &Shared, model: &str) -> Option<Response> {
    let key = crate::config::model_key(model);
    let nodes = shared.registry.all();
    let serving: Vec<&Arc<crate::node::Node>> =
        nodes.iter().filter(|n| n.is_available() && n.serves_key(&key) == Some(true)).collect();
    if serving.iter().any(|n| !crate::upstream::Upstream::node(n).is_openai()) {
        return None;
    }
    let node = serving.first()?;
    let timeout = shared.config().proxy.first_byte_timeout();
    let show =
        crate::upstream::openai::show(&crate::upstream::Upstream::node(node), &shared.client, model, timeout).await?;
    if let Some(n) = crate::upstream::openai::show_context_length(&show) {
        node.learn_context(model, n);
    }
    let mut response = axum::Json(show).into_response();
    if let Ok(v) = HeaderValue::from_str(node.name()) {
        response.headers_mut().insert(&names::X_CORRAL_NODE, v);
    }
    Some(response)
}

/// `/api/version` in Ollama's shape with Corral's own version.
fn own_version() -> Response {
    axum::Json(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") })).into_response()
}

/// Screen a request before anything is read: `Host` and `Origin`, the path, the client key,
/// the endpoint, the right to run model operations and the body type. The client's key is
/// removed from the headers (it is for Corral, never for a node).
fn gate(state: &ProxyState, parts: &http::request::Parts) -> Result<Endpoint, BrokerError> {
    browser::screen(&state.listener, &parts.headers, &parts.uri)?;
    let path = parts.uri.path();
    if crate::upstream::path_escapes(path) {
        return Err(BrokerError::BadPath);
    }
    let Some(endpoint) = classify(&parts.method, path) else {
        let (method, path) = (parts.method.to_string(), path.to_string());
        return Err(match not_served(&parts.method, &path) {
            Some(why) => BrokerError::RouteNotServed { method, path, why },
            None => BrokerError::UnknownRoute { method, path },
        });
    };
    if is_model_op(&parts.method, path) && !state.listener.allows_model_ops() {
        return Err(BrokerError::ModelOpsForbidden { path: path.to_string() });
    }
    if parts.method == Method::POST && !path.starts_with("/api/blobs/") {
        browser::json_body(&parts.headers)?;
    }
    Ok(endpoint)
}

/// What the request asks for, read from its body and headers before anything is sent.
struct Asked {
    model: Option<String>,
    category: String,
    queue_timeout: Duration,
    context_warning: Option<String>,
    /// The body carries no prompt or message text: it may be a bare load or unload.
    textless: bool,
    /// The body's own `stream`, when it says.
    stream: Option<bool>,
    /// What the category's limits lowered ("num_predict=512"), for `X-Corral-Clamped`.
    clamped: Option<String>,
}

impl Asked {
    async fn read(
        state: &ProxyState,
        config: &Config,
        endpoint: Endpoint,
        parts: &http::request::Parts,
        body: &axum::body::Bytes,
        trace: &mut Option<Trace>,
    ) -> Result<Self, BrokerError> {
        let path = parts.uri.path();
        let (model, stream, parsed) = if matches!(endpoint, Endpoint::Model | Endpoint::ModelOp | Endpoint::V1Model) {
            match path.strip_prefix("/v1/models/") {
                Some(m) => {
                    check_model_name(m)?;
                    (Some(m.to_string()), None, None)
                }
                None => model_of_body(body).await.map(|(m, s, v)| (Some(m), s, Some(v)))?,
            }
        } else {
            (None, None, None)
        };
        if let Some(t) = trace.as_mut() {
            t.row.model = model.clone().unwrap_or_default();
            // Ollama's own endpoints stream unless told not to; `/v1` only when asked.
            t.row.streamed = stream.unwrap_or(
                !path.starts_with("/v1/")
                    && matches!(path, "/api/chat" | "/api/generate" | "/api/pull" | "/api/create" | "/api/push"),
            );
        }
        let category = categorize(config, &state.listener, &parts.headers, model.as_deref())?;
        if let Some(t) = trace.as_mut() {
            t.row.category = category.clone();
        }
        let queue_timeout = queue_timeout(config, &state.listener, &category, &parts.headers)?;
        let context_warning = match (model.as_deref(), parsed.as_ref(), config.proxy.context_guard) {
            (Some(m), Some(p), true) => context::check(&state.shared, config, path, m, p)?,
            _ => None,
        };
        let textless = parsed.as_ref().is_some_and(|p| p.chat_text == 0 && p.generate_text == 0);
        Ok(Self { model, category, queue_timeout, context_warning, textless, stream, clamped: None })
    }
}

/// Answer from the category's cloud providers; relayed and recorded like a node's answer,
/// marked `X-Corral-Fallback`.
async fn fall_back(
    shared: &Shared,
    config: &Config,
    req: crate::cloud::Request<'_>,
    local: BrokerError,
    attempts: u32,
    trace: &mut Option<Trace>,
) -> Result<Response, BrokerError> {
    let request_id = req.request_id.to_string();
    let (path, body) = (req.path, req.body);
    let idle = req.category.stream_idle_timeout();
    let fb = crate::cloud::fall_back(config, &shared.cloud_clients, req, local).await?;
    // Only once a provider answered (a refused fallback must not build a tree of a huge body).
    let dropped = match path {
        "/api/chat" | "/api/generate" => serde_json::from_slice::<serde_json::Value>(body)
            .map(|v| crate::upstream::translate::unmapped(&v, crate::upstream::translate::Audience::Cloud).join(", "))
            .unwrap_or_default(),
        _ => String::new(),
    };
    if let Some(t) = trace.as_mut() {
        t.mark_dispatched();
        t.mark_first_byte();
        t.row.fallback = Some(fb.provider.clone());
        t.row.answered_model = Some(fb.model.clone());
        t.row.attempts = i64::from(attempts) + 1;
        // The provider answered, not the node that failed: no node is credited with its time
        // or tokens (the failed attempts are counted in `attempts`).
        t.row.node = None;
    }
    let header = HeaderValue::from_str(&fb.provider).ok();
    let mut response = relay::respond(
        fb.answer,
        relay::Source::Provider(fb.provider),
        trace.take(),
        &request_id,
        idle,
        None,
        readahead::Budget::of(shared),
    );
    if let Some(v) = header {
        response.headers_mut().insert("x-corral-fallback", v);
    }
    if let Ok(v) = HeaderValue::from_str(&fb.model) {
        response.headers_mut().insert("x-corral-fallback-model", v);
    }
    // Fields the provider's API has no place for, said rather than dropped silently.
    if let Some(v) = Some(dropped).filter(|d| !d.is_empty()).and_then(|d| HeaderValue::from_str(&d).ok()) {
        response.headers_mut().insert("x-corral-dropped", v);
    }
    Ok(response)
}

/// `/api/pull` of `model` onto `nodes` (all serving nodes when empty), with per-node progress:
/// what `corral models pull` and the admin API's pull use.
pub async fn pull(shared: &Shared, model: &str, nodes: &[String]) -> Response {
    let body = serde_json::json!({ "model": model, "stream": true });
    model_operation(shared, &Method::POST, "/api/pull", body, model, nodes).await
}

/// A model operation (`/api/pull`, `/api/delete`, `/api/copy`) with Ollama's request `body`,
/// sent to `nodes` (all serving nodes when empty) and answered as the fan-out answers a
/// client's; recorded like a client's, from the admin API's own origin.
pub async fn model_operation(
    shared: &Shared,
    method: &Method,
    path: &str,
    body: serde_json::Value,
    model: &str,
    nodes: &[String],
) -> Response {
    let mut headers = HeaderMap::new();
    if !nodes.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&nodes.join(",")) {
            headers.insert(&names::X_CORRAL_NODE, v);
        }
    }
    let streamed = body.get("stream").and_then(serde_json::Value::as_bool) == Some(true);
    let body = axum::body::Bytes::from(body.to_string());
    let wait = Duration::from_millis(shared.config().category("default").map_or(30_000, |c| c.queue_timeout_ms));
    let id = uuid::Uuid::new_v4().to_string();
    let mut trace = Some(shared.telemetry.begin(&id, path, "admin", None));
    if let Some(t) = trace.as_mut() {
        t.row.model = model.to_string();
        t.row.streamed = streamed;
    }
    let op = fanout::ModelOp { method, path, headers: &headers, model: Some(model), wait };
    match fanout::model_op(shared, op, body, &mut trace).await {
        Ok(r) => r,
        Err(e) => {
            if let Some(t) = trace.take() {
                t.finish(status_for(e.status().as_u16()), Some(e.status().as_u16()), Some(e.code()));
            }
            e.into_response()
        }
    }
}

/// Read the whole body, up to `limit` bytes (413 above). Bytes must keep arriving: a body
/// that sends nothing for `gap` gets 408 (a stalled upload would otherwise hold its memory and
/// its task forever). The buffer is sized once from `Content-Length`, so a large body costs its
/// own size, not a second copy.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    gap: Duration,
) -> Result<axum::body::Bytes, BrokerError> {
    use http_body_util::BodyExt;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BrokerError::BodyTooLarge { limit });
    }
    let mut body = body;
    let mut buf = bytes::BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    loop {
        let frame = match tokio::time::timeout(gap, body.frame()).await {
            Err(_) => return Err(BrokerError::BodyTimeout { gap_ms: gap.as_millis() as u64, read: buf.len() }),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BrokerError::BodyRead(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(BrokerError::BodyTooLarge { limit });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// Category: the header, else the listener's default, else the first category whose model
/// patterns match, else `default`.
fn categorize(
    config: &Config,
    listener: &ListenerConfig,
    headers: &HeaderMap,
    model: Option<&str>,
) -> Result<String, BrokerError> {
    let chosen = chosen_category(config, listener, headers, model)?;
    if !listener.categories.is_empty() && !listener.categories.contains(&chosen) {
        return Err(BrokerError::CategoryNotAllowed { category: chosen, allowed: listener.categories.join(", ") });
    }
    Ok(chosen)
}

fn chosen_category(
    config: &Config,
    listener: &ListenerConfig,
    headers: &HeaderMap,
    model: Option<&str>,
) -> Result<String, BrokerError> {
    let known = || config.categories.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
    if let Some(v) = headers.get(&names::X_CORRAL_CATEGORY) {
        let name = v
            .to_str()
            .map_err(|_| BrokerError::BadHeader { name: "X-Corral-Category", reason: "not visible ASCII".into() })?;
        return match config.category(name) {
            Some(c) => Ok(c.name.clone()),
            None => Err(BrokerError::UnknownCategory { name: name.to_string(), known: known() }),
        };
    }
    if let Some(c) = &listener.category {
        return Ok(c.clone());
    }
    if let Some(m) = model {
        if let Some(c) = config.categories.iter().find(|c| c.models.iter().any(|p| glob(p, m))) {
            return Ok(c.name.clone());
        }
    }
    Ok(config
        .category("default")
        .or(config.categories.first())
        .map(|c| c.name.clone())
        .unwrap_or_else(|| "default".into()))
}

/// How long the request may wait for a node: its header, else its category's; a remote
/// client's wait is capped at `queue.remote_max_wait_ms`.
fn queue_timeout(
    config: &Config,
    listener: &ListenerConfig,
    category: &str,
    headers: &HeaderMap,
) -> Result<Duration, BrokerError> {
    let asked = match headers.get(&names::X_CORRAL_QUEUE_TIMEOUT) {
        Some(v) => {
            v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()).ok_or_else(|| BrokerError::BadHeader {
                name: "X-Corral-Queue-Timeout",
                reason: "must be a whole number of milliseconds".into(),
            })?
        }
        None => config.category(category).map(|c| c.queue_timeout_ms).unwrap_or(30_000),
    };
    let ms = match listener.origin {
        crate::config::Origin::Local => asked,
        crate::config::Origin::Remote => asked.min(config.queue.remote_max_wait_ms),
    };
    Ok(Duration::from_millis(ms))
}

/// Shell-style match with `*` (any run) and `?` (one character).
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A body past the inline limit is read on the blocking pool, on either runtime flavour,
    /// with the same verdicts as inline.
    #[tokio::test(flavor = "current_thread")]
    async fn a_large_body_is_read_off_the_async_thread_alike() {
        let pad = "x".repeat(300 * 1024);
        let good = axum::body::Bytes::from(format!(r#"{{"prompt":"{pad}","model":"llama3.2","stream":false}}"#));
        let (model, stream, _) = model_of_body(&good).await.expect("read");
        assert_eq!((model.as_str(), stream), ("llama3.2", Some(false)));
        let twice = axum::body::Bytes::from(format!(r#"{{"model":"a","prompt":"{pad}","model":"b"}}"#));
        assert!(matches!(model_of_body(&twice).await, Err(BrokerError::MalformedJson(_))));
        let none = axum::body::Bytes::from(format!(r#"{{"prompt":"{pad}"}}"#));
        assert!(matches!(model_of_body(&none).await, Err(BrokerError::MissingModel)));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Classification of any method and path never panics, and what it routes to a node is
        /// always one of Ollama's or OpenAI's paths (anything else is "no route").
        #[test]
        fn any_request_line_is_classified_or_refused(
            method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"]),
            path in prop_oneof!["/[ -~]{0,40}", "/(api|v1)/[a-z/._%-]{0,30}", "/api/blobs/[a-z0-9:./%]{0,40}"],
        ) {
            let m = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
            if let Some(e) = classify(&m, &path) {
                let known = path == "/" || path.starts_with("/api/") || path.starts_with("/v1/");
                prop_assert!(known, "{method} {path} classified as {e:?}");
            }
            let _ = crate::upstream::path_escapes(&path);
        }

        /// Any category header, listener default and model name lands in a configured category
        /// or is refused with a client error; never a panic, never an unknown category.
        #[test]
        fn any_category_header_lands_in_a_known_category_or_is_refused(
            header in "[ -~]{0,24}",
            model in "[ -~]{0,40}",
            restrict in any::<bool>(),
        ) {
            let mut config = Config::default();
            config.categories.push(crate::config::CategoryConfig {
                name: "embedding".into(),
                models: vec!["*embed*".into()],
                ..Default::default()
            });
            let listener = ListenerConfig {
                categories: if restrict { vec!["default".into()] } else { Vec::new() },
                ..ListenerConfig::default()
            };
            let mut h = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(&header) {
                if !header.is_empty() {
                    h.insert("x-corral-category", v);
                }
            }
            match categorize(&config, &listener, &h, Some(&model)) {
                Ok(c) => prop_assert!(config.category(&c).is_some(), "{c} is configured"),
                Err(e) => prop_assert!(e.status().is_client_error(), "{e}"),
            }
        }
    }

    #[test]
    fn glob_matches_like_a_shell() {
        assert!(glob("*embed*", "nomic-embed-text:latest"));
        assert!(glob("llama3.?:*", "llama3.2:1b"));
        assert!(!glob("*embed*", "llama3.2"));
        assert!(glob("*", ""));
        assert!(!glob("a", ""));
    }

    #[test]
    fn endpoints_are_classified_by_method_and_path() {
        assert_eq!(classify(&Method::POST, "/api/chat"), Some(Endpoint::Model));
        assert_eq!(classify(&Method::GET, "/api/chat"), None, "chat is POST only");
        assert_eq!(classify(&Method::HEAD, "/"), Some(Endpoint::Root));
        assert_eq!(classify(&Method::GET, "/api/tags"), Some(Endpoint::Tags));
        assert_eq!(classify(&Method::DELETE, "/api/delete"), Some(Endpoint::ModelOp));
        assert_eq!(classify(&Method::POST, "/api/pull"), Some(Endpoint::ModelOp));
        assert_eq!(classify(&Method::GET, "/nope"), None);
    }

    #[test]
    fn category_comes_from_header_then_listener_then_model() {
        let mut config = Config::default();
        config.categories.push(crate::config::CategoryConfig {
            name: "embedding".into(),
            models: vec!["*embed*".into()],
            ..Default::default()
        });
        let l = ListenerConfig::default();
        let none = HeaderMap::new();
        assert_eq!(categorize(&config, &l, &none, Some("nomic-embed-text")).ok().as_deref(), Some("embedding"));
        assert_eq!(categorize(&config, &l, &none, Some("llama3.2")).ok().as_deref(), Some("default"));
        let mut h = HeaderMap::new();
        h.insert("x-corral-category", HeaderValue::from_static("nope"));
        let err = categorize(&config, &l, &h, None).expect_err("unknown category");
        assert_eq!(err.code(), "unknown_category");
        assert!(err.to_string().contains("default, embedding"), "lists the known ones: {err}");
        let l = ListenerConfig { category: Some("embedding".into()), ..ListenerConfig::default() };
        assert_eq!(categorize(&config, &l, &none, Some("llama3.2")).ok().as_deref(), Some("embedding"));
    }

    #[test]
    fn client_request_ids_are_kept_only_when_sane() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(client_request_id(&h).as_deref(), Some("abc-123"));
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        assert_eq!(client_request_id(&h), None);
    }
}
