//! Browser defences: who may call a listener, judged by `Host`, by `Origin` and by body type.
//!
//! A web page reaches a loopback server without its user's say in two ways. DNS rebinding: its
//! own domain is re-pointed at 127.0.0.1, the browser thinks it is same-origin, and the request
//! arrives with `Host: evil.example`. Cross-site "simple" requests: a form post or a no-cors
//! `fetch` needs no CORS preflight as long as its body is `text/plain`, form-encoded or
//! multipart, and it carries the page's `Origin`.
//!
//! The proxy listener applies Ollama's own rules (ollama/ollama `server/routes.go`
//! `allowedHostsMiddleware`, `envconfig.AllowedOrigins`), so a client sees the same behaviour
//! in front of Corral as in front of one Ollama: on a loopback bind, `Host` must be an IP that
//! is loopback, private or unspecified, or `localhost`, or end in `.localhost`, `.local` or
//! `.internal`; an `Origin` must be the request's own (`http(s)://` + Host), one of Ollama's
//! defaults, or listed in the listener's `allowed_origins`. JSON endpoints refuse the three body
//! types a form can send. The admin listener is stricter: loopback names and its own bind
//! address only, and no `Origin` but its own.
//!
//! CORS is Ollama's too (`cors.New` in `routes.go`, gin-contrib/cors): on the proxy listener an
//! allowed cross-origin `Origin` (Ollama's defaults or `allowed_origins`) gets its preflight
//! (`OPTIONS`) answered 204 with the methods and headers Ollama allows, plus Corral's own
//! request headers, and every answer carries `Access-Control-Allow-Origin` echoing it. Any
//! other origin gets no CORS header and the 403 above. The admin listener sends no CORS header
//! at all: no other origin may read its answers.

use std::net::{IpAddr, SocketAddr};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};

use crate::config::ListenerConfig;
use crate::error::BrokerError;

/// Ollama's default allowed origins (`envconfig.AllowedOrigins` without `OLLAMA_ORIGINS`).
pub const DEFAULT_ORIGINS: &[&str] = &[
    "http://localhost",
    "https://localhost",
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1",
    "https://127.0.0.1",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://0.0.0.0",
    "https://0.0.0.0",
    "http://0.0.0.0:*",
    "https://0.0.0.0:*",
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
];

/// Request headers a cross-origin page may send: Ollama's `AllowHeaders` (its own and the
/// openai SDK's), then Corral's own request headers.
const ALLOW_HEADERS: &str = "Authorization, Content-Type, User-Agent, Accept, X-Requested-With, OpenAI-Beta, \
x-stainless-arch, x-stainless-async, x-stainless-custom-poll-interval, x-stainless-helper-method, x-stainless-lang, \
x-stainless-os, x-stainless-package-version, x-stainless-poll-helper, x-stainless-retry-count, x-stainless-runtime, \
x-stainless-runtime-version, x-stainless-timeout, X-Request-Id, X-Corral-Category, X-Corral-Node, X-Corral-Session, \
X-Corral-Queue-Timeout";

/// gin-contrib/cors' `DefaultConfig` methods, which Ollama keeps.
const ALLOW_METHODS: &str = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS";

/// Response headers a page may read: Corral's own (which node answered, how many attempts).
const EXPOSE_HEADERS: &str = "X-Request-Id, X-Corral-Request-Id, X-Corral-Node, X-Corral-Attempts, X-Corral-Fallback, \
X-Corral-Forwarded, X-Corral-Context-Warning, X-Corral-Missing-Nodes";

/// How long a browser may cache a preflight answer (gin-contrib/cors' default, 12 hours).
const MAX_AGE_SECS: &str = "43200";

/// The body types a cross-site form or no-cors `fetch` may send without a preflight.
const FORM_TYPES: [&str; 3] = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"];

/// A client-sent value for an error message: at most 100 characters.
fn bounded(s: &str) -> String {
    s.chars().take(100).collect()
}

/// The name part of a `Host` value, lowercased, without port or IPv6 brackets.
pub fn hostname(host: &str) -> String {
    let h = host.trim();
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default().to_ascii_lowercase();
    }
    if h.parse::<IpAddr>().is_ok() {
        return h.to_ascii_lowercase();
    }
    h.rsplit_once(':').map_or(h, |(name, _)| name).to_ascii_lowercase()
}

fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_private(),
        IpAddr::V6(v6) => v6.is_unique_local(),
    }
}

/// Ollama's `allowedHost` rule for a server bound to loopback: an IP that is loopback, private
/// or unspecified, or a name that only this machine or its LAN can mean.
pub fn loopback_host_allowed(host: &str) -> bool {
    // `127.0.0.1:11434` (nearly every local client's `Host`) in one parse, without the copy.
    if let Ok(addr) = host.trim().parse::<std::net::SocketAddr>() {
        let ip = addr.ip();
        return ip.is_loopback() || ip.is_unspecified() || is_private(ip);
    }
    let name = hostname(host);
    if let Ok(ip) = name.parse::<IpAddr>() {
        return ip.is_loopback() || ip.is_unspecified() || is_private(ip);
    }
    name.is_empty()
        || name == "localhost"
        || [".localhost", ".local", ".internal"].iter().any(|tld| name.ends_with(tld))
}

/// Whether `origin` may call a proxy listener reached as `host`: its own origin, one of
/// Ollama's defaults, or a pattern in `extra` (`*` matches anything, as in `OLLAMA_ORIGINS`).
pub fn origin_allowed(origin: &str, host: Option<&str>, extra: &[String]) -> bool {
    let o = origin.trim().to_ascii_lowercase();
    if host.is_some_and(|h| same_origin(&o, h)) {
        return true;
    }
    DEFAULT_ORIGINS
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .any(|p| p == "*" || super::glob(&p.to_ascii_lowercase(), &o))
}

/// Whether `origin` is the origin of a request to `host` itself (a page the server served).
pub fn same_origin(origin: &str, host: &str) -> bool {
    let (o, h) = (origin.trim().to_ascii_lowercase(), host.trim().to_ascii_lowercase());
    !h.is_empty() && (o == format!("http://{h}") || o == format!("https://{h}"))
}

/// The admin listener's names: loopback ones, its bind address, and any IP literal when it is
/// bound to all addresses (a rebinding page always comes with a domain name, never an IP).
pub fn admin_host_allowed(host: &str, bind: Option<IpAddr>) -> bool {
    let name = hostname(host);
    if name.is_empty() || name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || Some(ip) == bind || bind.is_some_and(|b| b.is_unspecified()),
        Err(_) => false,
    }
}

/// The `Host` a request was sent to: the header, else the URI's authority (HTTP/2).
pub fn host_of<'a>(headers: &'a HeaderMap, uri: &'a http::Uri) -> Option<&'a str> {
    match headers.get(header::HOST) {
        // A Host that is not text is nobody's name: it fails every check below.
        Some(v) => Some(v.to_str().unwrap_or("\u{fffd}")),
        None => uri.authority().map(http::uri::Authority::as_str),
    }
}

/// The proxy listener's `Host` and `Origin` rules.
pub(super) fn screen(listener: &ListenerConfig, headers: &HeaderMap, uri: &http::Uri) -> Result<(), BrokerError> {
    let host = host_of(headers, uri);
    let loopback = listener.addr.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback());
    if let Some(h) = host.filter(|h| loopback && !loopback_host_allowed(h)) {
        return Err(BrokerError::ForbiddenHost { host: bounded(h) });
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let o = origin.to_str().unwrap_or("\u{fffd}");
        if !origin_allowed(o, host, &listener.allowed_origins) {
            return Err(BrokerError::ForbiddenOrigin { origin: bounded(o) });
        }
    }
    Ok(())
}

/// CORS for the proxy listener, as Ollama answers it. A request with no `Origin`, or with the
/// request's own, is no CORS request and passes untouched; a foreign origin that is not
/// allowed passes on to `screen`'s 403 with no CORS header. For an allowed origin, `OPTIONS`
/// is a preflight answered here (after the `Host` check, so a rebinding page learns nothing),
/// and every other answer gets `Access-Control-Allow-Origin` echoing the origin. A plain call
/// around the handler, not a middleware layer: no boxed future or service clone per request.
pub(super) async fn cors<F>(listener: &ListenerConfig, req: Request, next: impl FnOnce(Request) -> F) -> Response
where
    F: std::future::Future<Output = Response>,
{
    // Most requests carry no `Origin`: they pass with nothing read or allocated.
    let Some(origin) = req.headers().get(header::ORIGIN) else { return next(req).await };
    let host = host_of(req.headers(), req.uri());
    let o = origin.to_str().unwrap_or("\u{fffd}");
    if host.is_some_and(|h| same_origin(o, h)) || !origin_allowed(o, host, &listener.allowed_origins) {
        return next(req).await;
    }
    let origin = origin.clone();
    let mut response = if req.method() == Method::OPTIONS {
        match screen(listener, req.headers(), req.uri()) {
            Err(e) => e.into_response(),
            Ok(()) => preflight(),
        }
    } else {
        next(req).await
    };
    let h = response.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSE_HEADERS));
    response
}

/// The answer to an allowed origin's preflight: 204 with the methods and headers allowed.
fn preflight() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(ALLOW_METHODS));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static(ALLOW_HEADERS));
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(MAX_AGE_SECS));
    h.insert(header::VARY, HeaderValue::from_static("Access-Control-Request-Method, Access-Control-Request-Headers"));
    r
}

/// A JSON endpoint's body type, for requests a browser sent: anything but what a form or a
/// no-cors `fetch` can send without a preflight. Only browsers are held to it (they mark
/// themselves with `Origin` or `Sec-Fetch-*`): `curl -d` sends a form type too, and Ollama,
/// like Corral, takes the body as JSON whatever it is labelled.
pub(super) fn json_body(headers: &HeaderMap) -> Result<(), BrokerError> {
    let from_browser = headers.contains_key(header::ORIGIN)
        || headers.contains_key(&super::names::SEC_FETCH_MODE)
        || headers.contains_key(&super::names::SEC_FETCH_SITE);
    if !from_browser {
        return Ok(());
    }
    let Some(v) = headers.get(header::CONTENT_TYPE) else { return Ok(()) };
    let text = v.to_str().unwrap_or_default();
    let essence = text.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if FORM_TYPES.contains(&essence.as_str()) {
        return Err(BrokerError::UnsupportedMediaType { content_type: bounded(text) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_follow_ollamas_rule() {
        for ok in [
            "127.0.0.1:11400",
            "localhost:11400",
            "[::1]:11400",
            "LOCALHOST",
            "10.0.0.5",
            "0.0.0.0:1",
            "gpu.local",
            "a.localhost:3",
            "192.168.1.2:80",
            "[fd00::1]:1",
            " 127.0.0.1:8080 ",
            "",
        ] {
            assert!(loopback_host_allowed(ok), "{ok} names this machine");
        }
        for bad in [
            "evil.example:11400",
            "127.0.0.1.evil.example",
            "8.8.8.8:80",
            "[2001:db8::1]:80",
            "[fe80::1%1]:80",
            "localhost.evil.example",
            "\u{fffd}",
        ] {
            assert!(!loopback_host_allowed(bad), "{bad} is someone else's name");
        }
    }

    #[test]
    fn origins_are_ollamas_defaults_the_listeners_list_or_the_requests_own() {
        let none: &[String] = &[];
        assert!(origin_allowed("http://localhost:3000", None, none));
        assert!(origin_allowed("tauri://localhost", None, none));
        assert!(origin_allowed("vscode-webview://abc", None, none));
        assert!(origin_allowed("http://gpu.lan:11400", Some("gpu.lan:11400"), none), "same origin");
        assert!(!origin_allowed("https://evil.example", Some("127.0.0.1:11400"), none));
        assert!(!origin_allowed("null", None, none), "sandboxed frames and file redirects send null");
        assert!(!origin_allowed("chrome-extension://abc", None, none), "extensions are not in Ollama's defaults");
        let extra = vec!["https://chat.example".to_string(), "http://*.lan:3000".to_string()];
        assert!(origin_allowed("https://chat.example", None, &extra));
        assert!(origin_allowed("http://box.lan:3000", None, &extra));
        assert!(!origin_allowed("https://chat.example.evil", None, &extra));
        assert!(origin_allowed("https://anything", None, &["*".to_string()]));
    }

    #[test]
    fn the_admin_listener_knows_only_its_own_names() {
        let lo = Some("127.0.0.1".parse().expect("ip"));
        assert!(admin_host_allowed("127.0.0.1:11402", lo));
        assert!(admin_host_allowed("localhost:11402", lo));
        assert!(admin_host_allowed("[::1]:11402", lo));
        assert!(!admin_host_allowed("evil.example:11402", lo));
        assert!(!admin_host_allowed("10.0.0.5:11402", lo), "not its bind address");
        assert!(admin_host_allowed("10.0.0.5:11402", Some("10.0.0.5".parse().expect("ip"))));
        assert!(admin_host_allowed("10.0.0.5:11402", Some("0.0.0.0".parse().expect("ip"))));
        assert!(!admin_host_allowed("admin.example:11402", Some("0.0.0.0".parse().expect("ip"))));
        assert!(same_origin("http://127.0.0.1:11402", "127.0.0.1:11402"));
        assert!(!same_origin("http://localhost:11402", "127.0.0.1:11402"), "another origin, though the same machine");
        assert!(!same_origin("http://127.0.0.1:11402", ""));
    }

    #[test]
    fn form_body_types_are_refused_and_json_or_none_pass() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, http::HeaderValue::from_static(v));
            h.insert("sec-fetch-mode", http::HeaderValue::from_static("no-cors"));
            h
        };
        assert!(json_body(&HeaderMap::new()).is_ok());
        assert!(json_body(&with("application/json")).is_ok());
        assert!(json_body(&with("application/json; charset=utf-8")).is_ok());
        for bad in [
            "text/plain",
            "Text/Plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            assert_eq!(json_body(&with(bad)).map_err(|e| e.code()), Err("unsupported_media_type"), "{bad}");
        }
        let mut curl = HeaderMap::new();
        curl.insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/x-www-form-urlencoded"));
        assert!(json_body(&curl).is_ok(), "`curl -d` is no browser: its JSON runs as on Ollama");
    }
}
