//! Discovery: what a client or an agent that has just found a Corral may ask it before it
//! sends an inference. `GET /.well-known/corral` (RFC 8615's well-known prefix) says what this
//! is: name, version, `/help`'s schema version, the proxy, `/v1` and admin URLs as the caller
//! reaches them, and the APIs spoken. `GET /status` says whether a request could start now:
//! accepting or paused, per model whether a healthy node serving it has a free slot, the queue
//! by origin, and how this very request was classified (`request_origin`, from the listener
//! that accepted it: the check for a tunnel or reverse-proxy setup).
//!
//! Both answer without a client key and are answered by the broker itself (never forwarded,
//! never recorded, answered while paused). What they must not do: reveal a node's URL or name,
//! the config, or a secret. On a listener with `api_keys`, a caller without a valid key gets
//! the public part only (no version, no model list): a keyed listener is usually the one
//! facing the Internet, and its `/api/version` and `/api/tags` need the key too. The admin URL
//! is given only to a `local` listener's callers, and only when the admin listener answers
//! under the name the caller used (`browser::admin_host_allowed`'s rules): a remote caller is
//! never told where the operator's API is. `/status` is a snapshot, not a reservation: a free
//! slot now may be taken by another request a moment later, and the answer says so.

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::header;
use serde_json::{json, Value};

use super::ProxyState;
use crate::config::Origin;

/// The version of `/help`'s shape (its field names and what they mean), apart from Corral's
/// own version: it changes only when a client reading `/help` would have to change.
pub const HELP_SCHEMA: &str = "1";

/// The APIs the proxy listener speaks: Ollama's native API, OpenAI's Chat Completions family
/// (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`), and the
/// Responses and Anthropic Messages endpoints Ollama serves (`/v1/responses`, `/v1/messages`),
/// passed to a node as they came.
pub const APIS: [&str; 4] = ["ollama", "openai", "openai-responses", "anthropic-messages"];

/// The paths this module answers on the proxy listener (`GET` only).
pub const PATHS: [&str; 2] = ["/.well-known/corral", "/status"];

/// The answer for a discovery request, or `None` for every other request (it goes on to the
/// client key check and the proxy). `Host` and `Origin` are screened as for any request.
pub(super) fn answer(state: &ProxyState, req: &Request) -> Option<Response> {
    let path = req.uri().path();
    if super::routes::classify(req.method(), path) != Some(super::routes::Endpoint::Discovery) {
        return None;
    }
    if let Err(e) = super::browser::screen(&state.listener, req.headers(), req.uri()) {
        return Some(e.into_response());
    }
    let trusted = state.listener.api_keys.is_empty()
        || super::bearer(req.headers())
            .and_then(|b| state.shared.client_keys.check(&state.listener.api_keys, b))
            .is_some();
    let body = if path == PATHS[0] { well_known(state, req, trusted) } else { status(state, trusted) };
    Some(([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response())
}

/// `GET /.well-known/corral`.
fn well_known(state: &ProxyState, req: &Request, trusted: bool) -> Value {
    let proxy = proxy_url(state, req);
    let host = super::browser::host_of(req.headers(), req.uri()).unwrap_or_default();
    let admin = state.shared.admin_addr().and_then(|a| admin_url(state.listener.origin, host, a));
    json!({
        "name": "corral",
        "version": trusted.then_some(env!("CARGO_PKG_VERSION")),
        "help_schema": HELP_SCHEMA,
        "request_origin": super::origin_name(state),
        "urls": {
            "proxy": proxy,
            "ollama": proxy,
            "v1": format!("{proxy}/v1"),
            "status": format!("{proxy}/status"),
            "openapi": format!("{proxy}/openapi.json"),
            // Only where the caller can reach it; `/help` there needs the admin token.
            "admin": admin,
            "help": admin.as_ref().map(|a| format!("{a}/help")),
        },
        "apis": APIS,
        "auth": {
            "client_key": !state.listener.api_keys.is_empty(),
            "scheme": (!state.listener.api_keys.is_empty()).then_some("Authorization: Bearer <client key>"),
        },
    })
}

/// The proxy's URL as the caller reached it: its `Host` (when it is a plain host name or
/// address with a port), else the listener's own address. `X-Forwarded-Proto: https` (a TLS
/// tunnel or reverse proxy in front) makes it `https`; it only shapes the URL the caller is
/// told, never how the request is classified.
fn proxy_url(state: &ProxyState, req: &Request) -> String {
    let host = super::browser::host_of(req.headers(), req.uri()).filter(|h| plain_host(h));
    let host = match host {
        Some(h) => h.to_string(),
        None => state
            .shared
            .front()
            .0
            .first()
            .map_or_else(|| state.listener.addr.clone(), |u| u.trim_start_matches("http://").to_string()),
    };
    let tls = req.headers().get("x-forwarded-proto").and_then(|v| v.to_str().ok()) == Some("https");
    format!("{}://{host}", if tls { "https" } else { "http" })
}

/// A `Host` fit to echo in a URL: letters, digits and `.-:[]` only, at most 255 bytes.
fn plain_host(host: &str) -> bool {
    !host.is_empty() && host.len() <= 255 && host.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
}

/// The admin listener's URL for a caller that reached the proxy as `host`, when the caller can
/// use it: never through a `remote` listener; through a `local` one, when the admin listener
/// is bound to an address the caller can name (a loopback bind only for a caller that came
/// through a loopback name; a bind to all addresses under the IP literal the caller used;
/// otherwise its own address).
pub fn admin_url(origin: Origin, host: &str, admin: std::net::SocketAddr) -> Option<String> {
    if origin == Origin::Remote {
        return None;
    }
    let name = super::browser::hostname(host);
    let ip = name.parse::<std::net::IpAddr>().ok();
    let loopback_name = name == "localhost" || ip.is_some_and(|i| i.is_loopback());
    let at = |h: String| {
        let h = if h.contains(':') { format!("[{h}]") } else { h };
        Some(format!("http://{h}:{}", admin.port()))
    };
    let bind = admin.ip();
    if bind.is_loopback() {
        return loopback_name.then(|| at(name)).flatten();
    }
    if bind.is_unspecified() {
        return (ip.is_some() || loopback_name).then(|| at(name)).flatten();
    }
    at(bind.to_string())
}

/// `GET /status`: a snapshot of whether a request could start now.
fn status(state: &ProxyState, trusted: bool) -> Value {
    let shared = &state.shared;
    let accepting = shared.accepting();
    let (local, remote) = shared.admission.depth_by_origin();
    let mut out = json!({
        "service": "corral",
        "state": if accepting { "accepting" } else { "paused" },
        "accepting": accepting,
        "request_origin": super::origin_name(state),
        "snapshot": "as of this answer, not a reservation: a free slot now may be taken by another request before yours arrives",
        "at_ms": crate::store::now_ms(),
        "queue": { "local": local, "remote": remote, "total": local + remote },
    });
    if trusted {
        out["models"] = Value::Array(models(shared, accepting));
    } else {
        out["models_hidden"] =
            json!("this listener needs a client key: send Authorization: Bearer <key> to see models");
    }
    out
}

/// Per model any node lists: how many nodes serve it, how many of those take requests now
/// (active, healthy, breaker closed, not held off) and their free slots. Counts only: node
/// names and URLs are the operator's (the admin API has them).
fn models(shared: &crate::state::Shared, accepting: bool) -> Vec<Value> {
    use std::collections::BTreeMap;
    let now = tokio::time::Instant::now();
    // model -> (nodes listing it, nodes ready, free slots on ready nodes)
    let mut seen: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for node in shared.registry.all().iter() {
        let ready = node.is_available() && node.breaker_allows(now) && !node.held_off(now);
        let free = node.slots().saturating_sub(node.in_flight());
        for model in node.models().unwrap_or_default() {
            let e = seen.entry(model).or_default();
            e.0 += 1;
            if ready {
                e.1 += 1;
                e.2 += free;
            }
        }
    }
    seen.into_iter()
        .map(|(model, (nodes, ready, free))| {
            json!({ "model": model, "can_start": accepting && free > 0, "nodes": nodes, "ready_nodes": ready, "free_slots": free })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{admin_url, plain_host};
    use crate::config::Origin;

    #[test]
    fn a_remote_caller_is_never_told_the_admin_url() {
        for admin in ["127.0.0.1:11402", "0.0.0.0:11402", "192.168.1.5:11402"] {
            let a = admin.parse().expect("addr");
            assert_eq!(admin_url(Origin::Remote, "127.0.0.1:11400", a), None, "remote listener, admin at {admin}");
        }
    }

    #[test]
    fn a_local_caller_gets_the_admin_url_only_under_a_name_the_admin_listener_answers() {
        let lo = "127.0.0.1:11402".parse().expect("addr");
        assert_eq!(admin_url(Origin::Local, "127.0.0.1:11400", lo).as_deref(), Some("http://127.0.0.1:11402"));
        assert_eq!(admin_url(Origin::Local, "localhost:11400", lo).as_deref(), Some("http://localhost:11402"));
        assert_eq!(admin_url(Origin::Local, "[::1]:11400", lo).as_deref(), Some("http://[::1]:11402"));
        assert_eq!(
            admin_url(Origin::Local, "box.lan:11400", lo),
            None,
            "a loopback admin is not reachable from the LAN"
        );
        let any = "0.0.0.0:11402".parse().expect("addr");
        assert_eq!(admin_url(Origin::Local, "192.168.1.5:11400", any).as_deref(), Some("http://192.168.1.5:11402"));
        assert_eq!(admin_url(Origin::Local, "box.lan:11400", any), None, "the admin listener refuses domain names");
        let one = "192.168.1.5:11402".parse().expect("addr");
        assert_eq!(admin_url(Origin::Local, "box.lan:11400", one).as_deref(), Some("http://192.168.1.5:11402"));
    }

    #[test]
    fn only_a_plain_host_is_echoed() {
        assert!(plain_host("127.0.0.1:11400") && plain_host("[::1]:1") && plain_host("box.example"));
        assert!(!plain_host("") && !plain_host("a b") && !plain_host("x\"y") && !plain_host("a/b"));
    }
}
