//! The UI's static files (Svelte, built into `ui/dist` and embedded by `build.rs`), served by
//! the admin listener so a browser against `corral serve` and the desktop window load the same
//! app. The files hold no data; every call they make to the admin API carries the token, which
//! the page reads from its URL fragment (`/ui/#token=...`, never sent to a server) or asks for.
//!
//! Every page and file goes out with a Content-Security-Policy (scripts, styles, data only from
//! this origin; no plugins; no framing, `frame-ancestors 'none'` and `X-Frame-Options: DENY`
//! for older browsers, so no other page can overlay the UI and click for the user),
//! `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`. Styles may be inline
//! (Svelte's `style=` attributes, the charts' SVG); scripts never are.

use axum::extract::Path;
use axum::response::{Html, IntoResponse, Redirect, Response};
use http::{header, HeaderValue, StatusCode};

/// The UI's Content-Security-Policy.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; \
form-action 'self'; frame-ancestors 'none'";

/// `r` with the UI's security headers.
fn guarded(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    r
}

mod assets {
    include!(concat!(env!("OUT_DIR"), "/ui_assets.rs"));
}

const NOT_BUILT: &str = "<!doctype html><meta charset=utf-8><title>Corral</title>\
<body style=\"font-family:sans-serif;max-width:40em;margin:3em auto\"><h1>Corral</h1>\
<p>This binary was built without its UI. Build it with <code>npm --prefix ui ci &amp;&amp; npm --prefix ui run build</code>, \
then rebuild Corral (<code>./scripts/run</code> does both). The admin API works without it: see <code>GET /help</code>.</p>";

fn find(path: &str) -> Option<&'static [u8]> {
    assets::ASSETS.iter().find(|(p, _)| *p == path).map(|(_, b)| *b)
}

/// Whether this binary carries a built UI.
pub fn is_built() -> bool {
    find("index.html").is_some()
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" => "application/json",
        "woff2" => "font/woff2",
        _ => "application/octet-stream",
    }
}

pub async fn root() -> Response {
    guarded(Redirect::temporary("/ui/").into_response())
}

pub async fn index() -> Response {
    guarded(match find("index.html") {
        Some(b) => ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], b)
            .into_response(),
        None => Html(NOT_BUILT).into_response(),
    })
}

pub async fn asset(Path(file): Path<String>) -> Response {
    match find(&file) {
        // Vite names assets by content hash: they never change under the same name.
        Some(b) if file.starts_with("assets/") => guarded(
            (
                [
                    (header::CONTENT_TYPE, content_type(&file)),
                    (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
                ],
                b,
            )
                .into_response(),
        ),
        Some(b) => guarded(([(header::CONTENT_TYPE, content_type(&file))], b).into_response()),
        None if file.is_empty() || file == "index.html" => index().await,
        None => guarded((StatusCode::NOT_FOUND, "no such file in the UI").into_response()),
    }
}
