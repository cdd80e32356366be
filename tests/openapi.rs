//! `GET /openapi.json` on both listeners: served routes = documented routes.
//!
//! Against a running broker with sims: each document parses as OpenAPI 3.1; every documented
//! (method, path) is served (sent, with sample path values, it is not the listener's answer
//! for an unknown route, nor 405); every row of the route table the listener dispatches by is
//! documented, and nothing else is; and paths nobody documented are not served.

mod common;

use std::collections::BTreeSet;

use common::{cluster, Cluster, TOKEN};
use reqwest::Method;
use serde_json::Value;

type Ops = BTreeSet<(String, String)>;

/// The (METHOD, path template) pairs a document describes.
fn operations(doc: &Value) -> Ops {
    let mut out = Ops::new();
    for (path, item) in doc["paths"].as_object().expect("paths is an object") {
        for method in item.as_object().expect("a path item").keys() {
            out.insert((method.to_uppercase(), path.clone()));
        }
    }
    out
}

/// A concrete path for a template, with sample values that name nothing that exists where
/// the method would change it (a node that is not there cannot be deleted).
fn concrete(path: &str) -> String {
    path.replace("{digest}", "sha256:0000000000000000000000000000000000000000000000000000000000000000")
        .replace("{model}", "llama3.2")
        .replace("{file}", "index.html")
        .replace("{name}", "no-such-name")
        .replace("{id}", "no-such-id")
}

fn check_version(doc: &Value, which: &str) {
    let v = doc["openapi"].as_str().unwrap_or_default();
    assert!(v.starts_with("3.1"), "the {which} document is OpenAPI 3.1, not {v:?}");
    assert!(doc["info"]["title"].is_string(), "the {which} document has a title");
}

async fn fetch(req: reqwest::RequestBuilder) -> Value {
    let r = req.send().await.expect("the listener answers");
    assert_eq!(r.status(), 200, "GET /openapi.json");
    assert_eq!(r.headers()["content-type"], "application/json");
    r.json().await.expect("the document is JSON")
}

/// What the proxy answered to `method path`: status, the broker's error code (if any) and
/// whether it marked the answer as made without forwarding.
async fn proxy_send(c: &Cluster, method: &Method, path: &str) -> (u16, Option<String>, bool) {
    let mut req = c.client.request(method.clone(), c.url(path));
    if *method == Method::POST || *method == Method::DELETE {
        // Malformed on purpose: classified and read, then refused before any node is asked,
        // so model operations change nothing.
        req = req.header("content-type", "application/json").body("{");
    }
    let r = req.send().await.expect("the proxy answers");
    let status = r.status().as_u16();
    let local = r.headers().get("x-corral-forwarded").is_some_and(|v| v == "false");
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (status, body["code"].as_str().map(str::to_string), local)
}

/// The proxy's answer means "no such route" (its 404 `unknown_route`, or for a head request,
/// which has no body, a 404 it made itself).
fn proxy_unknown(method: &Method, (status, code, local): &(u16, Option<String>, bool)) -> bool {
    match code.as_deref() {
        Some(code) => code == "unknown_route",
        None => *method == Method::HEAD && *status == 404 && *local,
    }
}

#[tokio::test]
async fn the_proxy_serves_what_it_documents_and_documents_what_it_serves() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    let doc = fetch(c.client.get(c.url("/openapi.json"))).await;
    check_version(&doc, "proxy");
    let documented = operations(&doc);
    let table: Ops = corral::proxy::routes::ROUTES.iter().map(|r| (r.method.to_string(), r.path.to_string())).collect();
    assert_eq!(documented, table, "the document lists exactly the rows of the table the proxy classifies by");
    for (m, p) in &documented {
        let method = Method::from_bytes(m.as_bytes()).expect("a method");
        let answer = proxy_send(&c, &method, &concrete(p)).await;
        assert!(!proxy_unknown(&method, &answer), "{m} {p} is documented but not served: {answer:?}");
        assert_ne!(answer.0, 405, "{m} {p}");
    }
    for (m, p) in [
        ("GET", "/api/nope"),
        ("GET", "/api/chat"),
        ("PUT", "/api/tags"),
        ("POST", "/v1/nope"),
        ("GET", "/openapi.yaml"),
        ("HEAD", "/api/status"),
    ] {
        let method = Method::from_bytes(m.as_bytes()).expect("a method");
        assert!(!documented.contains(&(m.to_string(), p.to_string())), "{m} {p} is a probe of what is not served");
        let answer = proxy_send(&c, &method, p).await;
        assert!(proxy_unknown(&method, &answer), "{m} {p} is not documented, yet answered {answer:?}");
    }
}

#[tokio::test]
async fn the_proxy_document_names_corral_headers_and_the_error_body() {
    let c = cluster(1).start().await;
    let doc = fetch(c.client.get(c.url("/openapi.json"))).await;
    let chat = &doc["paths"]["/api/chat"]["post"];
    let params: Vec<&str> =
        chat["parameters"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    for h in ["X-Corral-Category", "X-Corral-Session", "X-Corral-Queue-Timeout", "X-Request-Id", "Idempotency-Key"] {
        assert!(params.contains(&h), "/api/chat takes {h}: {params:?}");
    }
    let headers = &chat["responses"]["200"]["headers"];
    for h in [
        "X-Request-Id",
        "X-Corral-Node",
        "X-Corral-Attempts",
        "X-Corral-Fallback",
        "X-Corral-Degraded",
        "X-Corral-Estimate-Ms",
        "X-Corral-Clamped",
    ] {
        assert!(headers.get(h).is_some(), "/api/chat answers with {h}: {headers}");
    }
    assert!(
        chat["responses"]["default"]["headers"].get("X-Corral-Forwarded").is_some(),
        "errors say whether they were forwarded"
    );
    let error = &doc["components"]["schemas"]["BrokerErrorBody"];
    let required: Vec<&str> = error["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert_eq!(required, ["error", "code", "forwarded"], "the broker's error body: {error}");
    let body = &chat["requestBody"]["content"]["application/json"]["schema"]["$ref"];
    assert_eq!(body, "#/components/schemas/OllamaRequest");
}

/// The admin listener's answer to `method path`: status and error code.
async fn admin_send(c: &Cluster, method: &Method, path: &str, token: bool) -> (u16, Option<String>) {
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let mut req = client.request(method.clone(), c.admin_url(path));
    if token {
        req = req.bearer_auth(TOKEN);
    }
    let r = req.send().await.expect("the admin listener answers");
    let status = r.status().as_u16();
    // The event stream never ends: its head is enough.
    if r.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")) {
        return (status, None);
    }
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (status, body["code"].as_str().map(str::to_string))
}

#[tokio::test]
async fn the_admin_listener_serves_what_it_documents_and_documents_what_it_serves() {
    let c = cluster(1).start().await;
    let unauthorized = c.client.get(c.admin_url("/openapi.json")).send().await.expect("answers");
    assert_eq!(unauthorized.status(), 401, "the admin document needs the token, like /help");
    let doc = fetch(c.admin(Method::GET, "/openapi.json")).await;
    check_version(&doc, "admin");
    let documented = operations(&doc);
    let table: Ops = corral::admin::ROUTES.iter().map(|r| (r.method.to_string(), r.path.replace("{*", "{"))).collect();
    assert_eq!(documented, table, "the document lists exactly the rows of the table the router is built from");
    for (m, p) in &documented {
        let method = Method::from_bytes(m.as_bytes()).expect("a method");
        let path = concrete(p);
        let public = doc["paths"][p][m.to_lowercase()]["security"].as_array().is_some_and(Vec::is_empty);
        // Without the token a routed path answers 401 (or, public, its own answer); a path the
        // router does not know answers 404 or 405 whatever the token.
        let (status, code) = admin_send(&c, &method, &path, false).await;
        if public {
            assert!(![401, 404, 405].contains(&status), "{m} {p} is public: {status}");
        } else {
            assert_eq!((status, code.as_deref()), (401, Some("unauthorized")), "{m} {p} is routed behind the token");
        }
        if method == Method::GET {
            let (status, code) = admin_send(&c, &method, &path, true).await;
            let unknown = status == 405 || (status == 404 && code.is_none());
            assert!(!unknown, "GET {p} is documented but its handler is not reached: {status} {code:?}");
        }
    }
    for (m, p) in [("GET", "/admin/nope"), ("GET", "/openapi.yaml"), ("POST", "/healthz"), ("DELETE", "/admin/nodes")] {
        let method = Method::from_bytes(m.as_bytes()).expect("a method");
        assert!(!documented.contains(&(m.to_string(), p.to_string())), "{m} {p} is a probe of what is not served");
        let (status, code) = admin_send(&c, &method, p, true).await;
        assert!(
            [404, 405].contains(&status) && code.is_none(),
            "{m} {p} is not documented, yet answered {status} {code:?}"
        );
    }
}
