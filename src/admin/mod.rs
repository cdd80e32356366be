//! The admin listener: JSON API for operators, the CLI and the UI (loopback by default).
//!
//! Everything but `GET /healthz` and the UI's static files needs the bearer token
//! (`Authorization: Bearer <token>`, compared in constant time; `?token=` only on the event
//! stream, `GET /admin/events`, for `EventSource`, which cannot set headers). Before the token,
//! every request, public ones included, must name the listener by one of its own names
//! (loopback names or its bind address: a DNS-rebinding page sends its own domain) and carry no
//! `Origin` but the listener's own (no cross-origin calls, whatever the token), so a web page
//! can neither read the UI's API nor drive it blind. Changes go draft -> validate -> swap: a node or
//! category edit is applied to a copy of the running config, the whole copy is validated, and
//! only then swapped in, so the broker never runs a config that `corral config check` would
//! refuse. In-flight requests are never dropped by a change: a removed node's requests hold
//! their own handle and finish.
//!
//! Every route is declared once, in [`ROUTES`]: method, path, who may call it, and the handler.
//! [`router`] is built from that table and nothing else, and the tests walk the same table, so a
//! route cannot be added without the token check or without the test that proves it. One
//! module per resource holds the handlers; this one holds only the state, the table, the token
//! check and the draft -> validate -> swap step they share.

mod brokers;
mod categories;
mod charts;
mod config;
mod drill;
mod error;
mod events;
mod fleet_keys;
mod latency;
mod models;
mod nodes;
mod openapi;
mod providers;
mod requests;
mod secrets;
mod settings;
mod status;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use http::{header, Method};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::openapi::schema;
use crate::state::Shared;
use openapi::{query, says};

pub use drill::Drills;
pub use error::AdminError;
pub use latency::Latencies;
pub use openapi::{document, Doc};
pub use requests::parse_since;

#[derive(Clone)]
pub struct AdminState {
    pub shared: Arc<Shared>,
    pub token: Arc<String>,
    /// The drill running now, if any (`POST /admin/drill`): one at a time.
    pub drills: Drills,
    /// The last latency test result per node and model (`/admin/latency`).
    pub latency: Latencies,
    /// The fleet this broker is one of (`[store] url` on PostgreSQL); `None` alone.
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Answers without the token: only the liveness check and the UI's static files.
    Public,
    /// Needs the token; without it the answer is 401 `unauthorized`.
    Protected,
}

/// Routes `method` on a path to its handler (`|m| on(m, handler)`): the method comes from the
/// table row, so the row and the wiring cannot disagree.
type Wire = fn(MethodFilter) -> MethodRouter<AdminState>;

/// One method on one path. [`ROUTES`] is the only list of them.
pub struct Route {
    pub method: Method,
    /// axum's path syntax: `{name}` for a segment, `{*file}` for the rest.
    pub path: &'static str,
    pub access: Access,
    /// What `GET /openapi.json` says of it.
    pub doc: Doc,
    wire: Wire,
}

const fn public(method: Method, path: &'static str, wire: Wire, doc: Doc) -> Route {
    Route { method, path, access: Access::Public, doc, wire }
}

const fn protected(method: Method, path: &'static str, wire: Wire, doc: Doc) -> Route {
    Route { method, path, access: Access::Protected, doc, wire }
}

/// Every route of the admin listener. `router()` builds from this table only, and
/// `GET /openapi.json` describes this table only: a new route is a new row here.
pub const ROUTES: &[Route] = &[
    public(Method::GET, "/healthz", |m| on(m, status::healthz), says("Liveness: `{\"status\": \"ok\"}`, no token")),
    // The UI's static files: no data in them; every call they make needs the token.
    public(Method::GET, "/", |m| on(m, crate::ui::root), says("Redirects to the UI").answers(307, "")),
    public(Method::GET, "/ui/", |m| on(m, crate::ui::index), says("The UI").answers(200, "text/html")),
    public(Method::GET, "/ui/{*file}", |m| on(m, crate::ui::asset), says("The UI's files").answers(200, "*/*")),
    protected(
        Method::GET,
        "/openapi.json",
        |m| on(m, openapi::serve),
        says("This document: the admin API in OpenAPI 3.1"),
    ),
    protected(
        Method::GET,
        "/help",
        |m| on(m, status::help),
        says("Self-description: endpoints, headers, limits, queue rules"),
    ),
    protected(
        Method::GET,
        "/metrics",
        |m| on(m, status::metrics),
        says("Prometheus metrics").answers(200, "application/openmetrics-text"),
    ),
    protected(Method::GET, "/admin/status", |m| on(m, status::status), says("Nodes, in-flight, queue, recent stats")),
    protected(
        Method::GET,
        "/admin/accepting",
        |m| on(m, status::get_accepting),
        says("Whether new requests are taken"),
    ),
    protected(
        Method::PUT,
        "/admin/accepting",
        |m| on(m, status::put_accepting),
        says("Pause or resume: paused, new requests get 503 `paused`").takes(schema::<status::Accepting>),
    ),
    protected(Method::GET, "/admin/nodes", |m| on(m, nodes::list), says("Every node with its state")),
    protected(
        Method::POST,
        "/admin/nodes",
        |m| on(m, nodes::add),
        says("Add a node").takes(schema::<crate::config::NodeConfig>).answers(201, "application/json"),
    ),
    protected(Method::GET, "/admin/nodes/{name}", |m| on(m, nodes::get), says("One node with its state")),
    protected(
        Method::PATCH,
        "/admin/nodes/{name}",
        |m| on(m, nodes::patch),
        says("Change a node: enabled, draining, weight, max_concurrency").takes(schema::<nodes::NodePatch>),
    ),
    protected(
        Method::DELETE,
        "/admin/nodes/{name}",
        |m| on(m, nodes::delete),
        says("Remove a node; its running requests finish").answers(204, ""),
    ),
    protected(
        Method::POST,
        "/admin/nodes/{name}/test",
        |m| on(m, nodes::test),
        says("Latency test of one node: a ping, or a model's first token")
            .takes(schema::<nodes::TestAsk>)
            .gives(schema::<latency::Measured>),
    ),
    protected(
        Method::POST,
        "/admin/drill",
        |m| on(m, drill::drill),
        says("Rehearse failover: take a node out, send a batch per category").takes(schema::<drill::Ask>),
    ),
    protected(Method::GET, "/admin/categories", |m| on(m, categories::list), says("Every category")),
    protected(Method::PUT, "/admin/categories", |m| on(m, categories::put_all), says("Replace every category")),
    protected(Method::GET, "/admin/categories/{name}", |m| on(m, categories::get), says("One category")),
    protected(Method::PUT, "/admin/categories/{name}", |m| on(m, categories::put), says("Add or replace a category")),
    protected(
        Method::DELETE,
        "/admin/categories/{name}",
        |m| on(m, categories::delete),
        says("Remove a category").answers(204, ""),
    ),
    protected(
        Method::GET,
        "/admin/brokers",
        |m| on(m, brokers::list),
        says("The fleet's brokers: address, version, config version, last seen, load, keeper, gone")
            .gives(schema::<brokers::Brokers>),
    ),
    protected(Method::GET, "/admin/providers", |m| on(m, providers::list), says("Every cloud provider")),
    protected(Method::PUT, "/admin/providers", |m| on(m, providers::put_all), says("Replace every cloud provider")),
    protected(
        Method::POST,
        "/admin/providers/{name}/test",
        |m| on(m, providers::test),
        says("Test a provider's key and base URL"),
    ),
    protected(Method::GET, "/admin/secrets", |m| on(m, secrets::list), says("Secret names (never values)")),
    protected(
        Method::PUT,
        "/admin/secrets/{name}",
        |m| on(m, secrets::put),
        says("Store a secret in the OS keyring").takes(schema::<secrets::PutBody>).answers(204, ""),
    ),
    protected(
        Method::DELETE,
        "/admin/secrets/{name}",
        |m| on(m, secrets::delete),
        says("Delete a secret").answers(204, ""),
    ),
    protected(
        Method::POST,
        "/admin/secrets/{name}/bind",
        |m| on(m, secrets::bind),
        says("Bind a key to the origin it may be sent to").takes(schema::<secrets::BindBody>),
    ),
    protected(Method::GET, "/admin/settings", |m| on(m, settings::get), says("Listeners, admin, health, breaker, ...")),
    protected(
        Method::PUT,
        "/admin/settings",
        |m| on(m, settings::put),
        says("Change settings: any subset of the sections").takes(schema::<settings::SettingsPatch>),
    ),
    protected(
        Method::GET,
        "/admin/client-keys",
        |m| on(m, settings::list_keys),
        says("Every client key: listeners, last use, quota window, and in a fleet its usage over every broker"),
    ),
    protected(
        Method::POST,
        "/admin/client-keys",
        |m| on(m, settings::create),
        says("Create a client key for listeners").takes(schema::<settings::NewKey>).answers(201, "application/json"),
    ),
    protected(Method::DELETE, "/admin/client-keys/{name}", |m| on(m, settings::revoke), says("Revoke a client key")),
    protected(
        Method::GET,
        "/admin/config/export",
        |m| on(m, config::export),
        says("The config to share, never secrets").answers(200, "application/toml"),
    ),
    protected(
        Method::POST,
        "/admin/config/import",
        |m| on(m, config::import),
        says("Import a TOML config: preview, and unless a dry run, the swap").asks(query::<config::ImportQuery>),
    ),
    protected(
        Method::POST,
        "/admin/config/save",
        |m| on(m, config::save),
        says("Write the config in force to its file"),
    ),
    protected(
        Method::GET,
        "/admin/requests",
        |m| on(m, requests::list),
        says("Request records, newest first, filtered and paged").asks(query::<requests::RequestsQuery>),
    ),
    protected(
        Method::GET,
        "/admin/requests/summary",
        |m| on(m, requests::summary),
        says("Counts, errors, latency and tokens by group").asks(query::<requests::SummaryQuery>),
    ),
    protected(Method::GET, "/admin/requests/{id}", |m| on(m, requests::get), says("One request with its attempts")),
    protected(
        Method::GET,
        "/admin/charts/series",
        |m| on(m, charts::series),
        says("Every live chart's numbers").asks(query::<charts::SeriesQuery>),
    ),
    protected(
        Method::GET,
        "/admin/charts/{file}",
        |m| on(m, charts::chart),
        says("One chart (`{chart}.svg`) of the recent past")
            .asks(query::<charts::ChartQuery>)
            .answers(200, "image/svg+xml"),
    ),
    protected(
        Method::GET,
        "/admin/events",
        |m| on(m, events::events),
        says("What changed, as server-sent events (`?token=` allowed here)").answers(200, "text/event-stream"),
    ),
    protected(Method::GET, "/admin/models", |m| on(m, models::matrix), says("Which node has which model")),
    protected(
        Method::POST,
        "/admin/models/pull",
        |m| on(m, models::pull_model),
        says("Pull a model, NDJSON progress per node")
            .takes(schema::<models::PullRequest>)
            .answers(200, "application/x-ndjson"),
    ),
    protected(
        Method::POST,
        "/admin/models/delete",
        |m| on(m, models::delete),
        says("Delete a model from nodes").takes(schema::<models::DeleteRequest>),
    ),
    protected(
        Method::POST,
        "/admin/models/copy",
        |m| on(m, models::copy),
        says("Copy a model on nodes").takes(schema::<models::CopyRequest>),
    ),
    protected(
        Method::GET,
        "/admin/latency",
        |m| on(m, latency::list),
        says("The last latency test per node and model"),
    ),
    protected(
        Method::POST,
        "/admin/latency",
        |m| on(m, latency::run),
        says("Run latency tests").takes(schema::<latency::Ask>),
    ),
];

/// The admin router, built from [`ROUTES`] only. Protected routes sit behind one
/// `route_layer`, so a protected path answers 401 without the token whatever the method.
pub fn router(state: AdminState) -> Router {
    let (mut public, mut protected) = (Router::new(), Router::new());
    for route in ROUTES {
        // `Method::GET` and friends always convert; the router test builds this for every row.
        let filter = MethodFilter::try_from(route.method.clone()).expect("a standard HTTP method");
        let wired = (route.wire)(filter);
        match route.access {
            Access::Public => public = public.route(route.path, wired),
            Access::Protected => protected = protected.route(route.path, wired),
        }
    }
    let protected = protected.route_layer(axum::middleware::from_fn_with_state(state.clone(), require_token));
    public.merge(protected).layer(axum::middleware::from_fn_with_state(state.clone(), own_site_only)).with_state(state)
}

/// The admin listener answers only under its own names and to its own origin.
async fn own_site_only(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    use crate::proxy::browser;
    let host = browser::host_of(req.headers(), req.uri()).unwrap_or_default();
    let bind = state.shared.config().admin.addr.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
    if !browser::admin_host_allowed(host, bind) {
        return AdminError::ForbiddenHost(host.chars().take(100).collect()).into_response();
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("\u{fffd}");
        if !browser::same_origin(origin, host) {
            return AdminError::ForbiddenOrigin(origin.chars().take(100).collect()).into_response();
        }
    }
    next.run(req).await
}

async fn require_token(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let from_header = crate::server::bearer_token(req.headers()).map(str::to_string);
    // Only the event stream takes the token in its URL: `EventSource` cannot send headers, and
    // a URL ends up in logs and history, so nothing that changes state may be opened by one.
    let stream = req.method() == Method::GET && req.uri().path() == "/admin/events";
    let from_query = req.uri().query().filter(|_| stream).and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    let given = from_header.or(from_query).unwrap_or_default();
    if bool::from(given.as_bytes().ct_eq(state.token.as_bytes())) {
        next.run(req).await
    } else {
        AdminError::Unauthorized.into_response()
    }
}

/// Validate `next` as a whole: every problem, each with its path.
fn validate(next: &Config) -> Result<(), AdminError> {
    let problems = next.validate();
    if !problems.is_empty() {
        return Err(AdminError::Invalid(problems.into_iter().map(|(p, m)| format!("{p}: {m}")).collect()));
    }
    Ok(())
}

/// Change the config in force: `change` edits a copy of it under the edit lock, so two edits
/// at once are applied one after the other, each on the other's result (none is lost); then
/// the whole is validated, written into the config file (when the broker has one: an edit
/// must survive the next reload) and swapped in. A file that cannot be written changes nothing.
fn edit<T>(s: &AdminState, change: impl FnOnce(&mut Config) -> Result<T, AdminError>) -> Result<T, AdminError> {
    let _one_at_a_time = s.shared.edit_lock();
    let mut next = Config::clone(&s.shared.config());
    let out = change(&mut next)?;
    validate(&next)?;
    s.shared.persist(&next)?;
    s.shared.apply(next);
    Ok(out)
}

/// A JSON body of the shape the endpoint takes, else 400 `malformed_json`.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, AdminError> {
    serde_json::from_slice(body).map_err(|e| AdminError::BadBody(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{router, Access, AdminState, Shared, ROUTES};
    use axum::body::Body;
    use http::{header, Request, StatusCode};
    use std::sync::Arc;
    use tower::ServiceExt;

    const TOKEN: &str = "router-test-token";

    fn node_client() -> crate::upstream::client::NodeClient {
        crate::upstream::client::NodeClient::new(std::time::Duration::from_secs(1)).expect("client")
    }

    /// A state over an empty cluster with no store: enough for every route to be reached.
    fn state() -> AdminState {
        let config = crate::Config::default();
        let tuning = crate::node::NodeTuning {
            breaker: crate::breaker::BreakerPolicy {
                failures_to_open: 3,
                cooldown: std::time::Duration::from_secs(1),
                trial_requests: 1,
            },
            slow_start: std::time::Duration::ZERO,
            latency_decay: std::time::Duration::from_secs(10),
        };
        let registry = Arc::new(crate::node::Registry::new(&config.nodes, tuning).expect("no nodes to parse"));
        let telemetry = Arc::new(crate::telemetry::Telemetry::new(None, crate::telemetry::Telemetry::bus()));
        let cancel = tokio_util::sync::CancellationToken::new();
        let shared = Shared::new(config, registry, reqwest::Client::new(), node_client(), cancel, telemetry, Some(1));
        AdminState {
            shared: Arc::new(shared),
            token: Arc::new(TOKEN.into()),
            drills: Default::default(),
            latency: Default::default(),
            fleet: None,
        }
    }

    /// A concrete path for a table path: every `{param}` or `{*rest}` segment becomes `x`.
    fn concrete(path: &str) -> String {
        path.split('/').map(|seg| if seg.starts_with('{') { "x" } else { seg }).collect::<Vec<_>>().join("/")
    }

    async fn send(route: &super::Route, auth: Option<&str>) -> (StatusCode, Option<String>) {
        let mut req = Request::builder().method(route.method.clone()).uri(concrete(route.path));
        if let Some(token) = auth {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let r = router(state()).oneshot(req.body(Body::empty()).expect("request")).await.expect("infallible");
        let status = r.status();
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.expect("body");
        let code = serde_json::from_slice::<serde_json::Value>(&body).ok().map(|v| v["code"].to_string());
        (status, code)
    }

    #[tokio::test]
    async fn every_protected_route_in_the_table_the_router_is_built_from_needs_the_token() {
        let protected: Vec<_> = ROUTES.iter().filter(|r| r.access == Access::Protected).collect();
        assert!(protected.len() >= 28, "the table lost routes: {} protected", protected.len());
        for route in protected {
            let (m, p) = (&route.method, route.path);
            let (status, code) = send(route, None).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{m} {p} answered without a token");
            assert_eq!(code.as_deref(), Some("\"unauthorized\""), "{m} {p} without a token");
            let (status, _) = send(route, Some("wrong-token")).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{m} {p} answered a wrong token");
        }
    }

    #[tokio::test]
    async fn only_the_liveness_check_and_the_ui_files_are_public() {
        let public: Vec<_> =
            ROUTES.iter().filter(|r| r.access == Access::Public).map(|r| (r.method.as_str(), r.path)).collect();
        assert_eq!(
            public,
            [("GET", "/healthz"), ("GET", "/"), ("GET", "/ui/"), ("GET", "/ui/{*file}")],
            "a public route serves without the token: anything else must be protected"
        );
        for route in ROUTES.iter().filter(|r| r.access == Access::Public) {
            let (status, _) = send(route, None).await;
            assert_ne!(status, StatusCode::UNAUTHORIZED, "{} {} is public", route.method, route.path);
        }
    }

    #[tokio::test]
    async fn the_token_opens_a_protected_route_as_header_and_the_event_stream_as_query() {
        let status = ROUTES.iter().find(|r| r.path == "/admin/status").expect("status is routed");
        assert_eq!(send(status, Some(TOKEN)).await.0, StatusCode::OK, "the right token in the header");
        let req = Request::get(format!("/admin/status?token={TOKEN}")).body(Body::empty()).expect("request");
        let r = router(state()).oneshot(req).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "a token in the URL opens only the event stream");
        let req = Request::put(format!("/admin/accepting?token={TOKEN}")).body(Body::empty()).expect("request");
        let r = router(state()).oneshot(req).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "never a change");
        let req = Request::get(format!("/admin/events?token={TOKEN}")).body(Body::empty()).expect("request");
        let r = router(state()).oneshot(req).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::OK, "EventSource cannot send headers");
    }

    #[tokio::test]
    async fn a_foreign_host_or_origin_is_refused_before_the_token() {
        let ask = |host: &'static str, origin: Option<&'static str>| {
            let mut req = Request::get("/admin/status").header(header::HOST, host);
            req = req.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
            if let Some(o) = origin {
                req = req.header(header::ORIGIN, o);
            }
            router(state()).oneshot(req.body(Body::empty()).expect("request"))
        };
        assert_eq!(ask("127.0.0.1:11402", None).await.expect("infallible").status(), StatusCode::OK);
        let r = ask("evil.example:11402", None).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "a rebinding page's own domain");
        let r = ask("127.0.0.1:11402", Some("http://127.0.0.1:11402")).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::OK, "the UI's own calls");
        let r = ask("127.0.0.1:11402", Some("http://localhost:3000")).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "no cross-origin calls");
    }

    #[test]
    fn no_method_and_path_is_declared_twice() {
        let mut seen = std::collections::HashSet::new();
        for r in ROUTES {
            assert!(seen.insert((r.method.as_str(), r.path)), "{} {} is in the table twice", r.method, r.path);
        }
    }
}
