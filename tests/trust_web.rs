//! Issue 12, findings 5, 6 and 11 (and the `?token=` and UI-header parts of 12): a web page, a
//! remote client or a crafted path cannot turn the broker against its owner. Each test is the
//! exploit as it was reported; each failed before the fix.
mod common;

use std::time::Duration;

use common::{cluster, TOKEN};
use corral::config::{ListenerConfig, Origin};
use reqwest::{header, Method};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn chat_body() -> Value {
    json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hello"}], "stream": false})
}

async fn code_of(r: reqwest::Response) -> String {
    r.json::<Value>().await.map(|v| v["code"].as_str().unwrap_or_default().to_string()).unwrap_or_default()
}

/// One HTTP/1.1 request written byte for byte, so the path reaches the broker exactly as
/// typed (reqwest, like every URL parser, would resolve `..` before sending). The answer's
/// status and body.
async fn raw(addr: std::net::SocketAddr, method: &str, target: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.expect("answered").expect("read");
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn a_rebinding_host_on_a_loopback_listener_gets_403_for_tags_and_chat() {
    let c = cluster(1).start().await;
    let evil = "evil.example:11400";
    let r = c.client.get(c.url("/api/tags")).header(header::HOST, evil).send().await.expect("answer");
    assert_eq!(r.status(), 403, "a DNS-rebound page must not read the model list");
    assert_eq!(code_of(r).await, "forbidden_host");
    let r =
        c.client.post(c.url("/api/chat")).header(header::HOST, evil).json(&chat_body()).send().await.expect("answer");
    assert_eq!(r.status(), 403, "nor chat");
    assert_eq!(c.sims[0].inference_count(), 0, "the node never saw the rebound chat");
    for ok in ["localhost:11400", "127.0.0.1:11400", "[::1]:11400"] {
        let r = c.client.get(c.url("/api/tags")).header(header::HOST, ok).send().await.expect("answer");
        assert_eq!(r.status(), 200, "{ok} is a loopback name, as in Ollama");
    }
}

#[tokio::test]
async fn a_cross_site_origin_gets_403_and_ollamas_default_origins_pass() {
    let c =
        cluster(1).config(|cfg| cfg.listeners[0].allowed_origins = vec!["https://chat.example".into()]).start().await;
    let ask = |origin: &'static str| {
        c.client.post(c.url("/api/chat")).header(header::ORIGIN, origin).json(&chat_body()).send()
    };
    let r = ask("https://evil.example").await.expect("answer");
    assert_eq!(r.status(), 403, "a cross-site page must not chat");
    assert_eq!(code_of(r).await, "forbidden_origin");
    let r = ask("null").await.expect("answer");
    assert_eq!(r.status(), 403, "nor a sandboxed frame");
    assert_eq!(c.sims[0].inference_count(), 0, "no cross-site chat reached the node");
    for ok in ["http://localhost:3000", "http://127.0.0.1:8080", "tauri://localhost", "https://chat.example"] {
        assert_eq!(
            ask(ok).await.expect("answer").status(),
            200,
            "{ok} is allowed (Ollama's defaults + allowed_origins)"
        );
    }
}

#[tokio::test]
async fn a_text_plain_chat_gets_415_and_json_or_no_type_pass() {
    let c = cluster(1).start().await;
    let body = chat_body().to_string();
    // A page on an allowed origin (a local dev server) doing a no-cors fetch: no preflight,
    // so the content type is the only thing that tells it from a real client.
    let r = c
        .client
        .post(c.url("/api/chat"))
        .header(header::CONTENT_TYPE, "text/plain;charset=UTF-8")
        .header(header::ORIGIN, "http://localhost:3000")
        .header("sec-fetch-mode", "no-cors")
        .body(body.clone())
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 415, "what a no-cors fetch sends");
    assert_eq!(code_of(r).await, "unsupported_media_type");
    let r = c
        .client
        .post(c.url("/api/pull"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "same-site")
        .body(json!({"model": "qwen3:4b"}).to_string())
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 415, "what a form sends");
    assert_eq!(c.sims[0].count("/api/pull"), 0);
    assert_eq!(c.sims[0].inference_count(), 0);
    let r = c.client.post(c.url("/api/chat")).body(body.clone()).send().await.expect("answer");
    assert_eq!(r.status(), 200, "no Content-Type at all is fine (many clients; Ollama takes it)");
    let r = c
        .client
        .post(c.url("/api/chat"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200, "`curl -d` labels JSON as a form; no browser sent it, so it runs, as on Ollama");
}

#[tokio::test]
async fn the_admin_listener_refuses_a_foreign_host_or_origin_even_with_the_token() {
    let c = cluster(1).start().await;
    let r =
        c.admin(Method::GET, "/admin/status").header(header::HOST, "evil.example:11402").send().await.expect("answer");
    assert_eq!(r.status(), 403, "a rebound page holding the token still gets nothing");
    assert_eq!(code_of(r).await, "forbidden_host");
    let r = c
        .admin(Method::PUT, "/admin/accepting")
        .header(header::ORIGIN, "https://evil.example")
        .json(&json!({"accepting": false}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 403, "no cross-origin calls");
    assert_eq!(code_of(r).await, "forbidden_origin");
    assert!(c.broker.shared().accepting(), "the refused call changed nothing");
    let own = format!("http://{}", c.broker.admin_addr());
    let r = c.admin(Method::GET, "/admin/status").header(header::ORIGIN, own).send().await.expect("answer");
    assert_eq!(r.status(), 200, "the UI's own calls (and the desktop window's) pass");
}

#[tokio::test]
async fn a_token_in_the_url_opens_only_the_event_stream() {
    let c = cluster(1).start().await;
    let r = c
        .client
        .put(c.admin_url(&format!("/admin/accepting?token={TOKEN}")))
        .json(&json!({"accepting": false}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 401, "a change never takes the token from the URL");
    assert!(c.broker.shared().accepting());
    let r = c.client.get(c.admin_url(&format!("/admin/events?token={TOKEN}"))).send().await.expect("answer");
    assert_eq!(r.status(), 200, "EventSource cannot send headers");
}

#[tokio::test]
async fn ui_responses_carry_csp_and_frame_headers() {
    let c = cluster(1).start().await;
    for path in ["/ui/", "/ui/index.html", "/"] {
        let r = c.client.get(c.admin_url(path)).send().await.expect("answer");
        let h = r.headers();
        let csp = h.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: no framing: {csp:?}");
        assert!(csp.contains("script-src 'self'"), "{path}: scripts only from the UI itself: {csp:?}");
        assert_eq!(h.get("x-frame-options").map(|v| v.as_bytes()), Some(&b"DENY"[..]), "{path}");
        assert_eq!(h.get("x-content-type-options").map(|v| v.as_bytes()), Some(&b"nosniff"[..]), "{path}");
    }
}

#[tokio::test]
async fn a_remote_listener_refuses_model_operations_unless_it_grants_them() {
    let c = cluster(1)
        .models(0, &["llama3.2", "qwen3:4b"])
        .config(|cfg| {
            cfg.listeners[0].origin = Origin::Remote;
            cfg.listeners.push(ListenerConfig {
                addr: "127.0.0.1:0".into(),
                origin: Origin::Remote,
                model_ops: Some(true),
                ..ListenerConfig::default()
            });
        })
        .start()
        .await;
    let r = c.client.delete(c.url("/api/delete")).json(&json!({"model": "qwen3:4b"})).send().await.expect("answer");
    assert_eq!(r.status(), 403, "one DELETE from any remote client emptied every node");
    assert_eq!(code_of(r).await, "model_ops_forbidden");
    let r = c.post("/api/pull", json!({"model": "x", "stream": false})).await;
    assert_eq!(r.status(), 403);
    let r = c.client.post(c.url("/api/blobs/sha256:abc")).body("x").send().await.expect("answer");
    assert_eq!(r.status(), 403, "blob uploads are model operations too");
    assert_eq!(c.sims[0].count("/api/delete") + c.sims[0].count("/api/pull"), 0, "the node saw nothing");
    assert!(c.sims[0].models().contains(&"qwen3:4b".to_string()));
    assert_eq!(c.post("/api/chat", chat_body()).await.status(), 200, "inference is still the remote client's right");
    let r =
        c.client.delete(c.url_on(1, "/api/delete")).json(&json!({"model": "qwen3:4b"})).send().await.expect("answer");
    assert_eq!(r.status(), 200, "a listener that grants model_ops runs them");
    assert!(!c.sims[0].models().contains(&"qwen3:4b".to_string()));
}

#[tokio::test]
async fn model_operations_skip_a_draining_node_unless_it_is_named() {
    let c = cluster(2).start().await;
    c.node(1).set_admin(corral::node::Admin::Draining);
    let r = c.post("/api/pull", json!({"model": "qwen3:4b", "stream": false})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(c.sims[0].count("/api/pull"), 1);
    assert_eq!(c.sims[1].count("/api/pull"), 0, "a draining node is left alone");
    let r = c
        .client
        .post(c.url("/api/pull"))
        .header("x-corral-node", "n1")
        .json(&json!({"model": "qwen3:4b", "stream": false}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200, "an operator may still name it");
    assert_eq!(c.sims[1].count("/api/pull"), 1);
}

#[tokio::test]
async fn model_operations_wait_for_their_own_small_limit() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.queue.max_model_ops = 1;
            cfg.categories[0].queue_timeout_ms = 200;
        })
        .start()
        .await;
    let held = c.broker.shared().model_ops.enter(1).await;
    let r = c.post("/api/pull", json!({"model": "qwen3:4b", "stream": false})).await;
    assert_eq!(r.status(), 503, "the one slot is taken");
    assert_eq!(code_of(r).await, "queue_timeout");
    assert_eq!(c.sims[0].count("/api/pull"), 0, "the waiting pull never started");
    drop(held);
    let r = c.post("/api/pull", json!({"model": "qwen3:4b", "stream": false})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(c.broker.shared().model_ops.running(), 0, "the slot is given back when the pull ends");
}

#[tokio::test]
async fn two_hundred_concurrent_tags_reach_each_node_a_few_times_at_most() {
    let c = cluster(2).start().await;
    let before: Vec<usize> = c.sims.iter().map(|s| s.count("/api/tags")).collect();
    let asks = (0..200).map(|_| async { c.client.get(c.url("/api/tags")).send().await.map(|r| r.status().as_u16()) });
    let statuses = futures_util::future::join_all(asks).await;
    assert!(statuses.iter().all(|s| matches!(s, Ok(200))), "every client got the merged list");
    for (i, sim) in c.sims.iter().enumerate() {
        let asked = sim.count("/api/tags") - before[i];
        assert!(asked <= 3, "node {i} was asked {asked} times for 200 clients: the merged answer is shared");
    }
}

#[tokio::test]
async fn a_path_that_climbs_out_of_the_node_base_path_is_refused_and_never_forwarded() {
    let c = cluster(1).config(|cfg| cfg.nodes[0].url.push_str("/ollama")).start().await;
    let addr = c.broker.proxy_addr();
    for target in [
        "/api/blobs/../../../internal/admin",
        "/api/blobs/%2e%2e/%2E%2E/internal/admin",
        "/api/blobs/..%2finternal",
        "/api/blobs/.%2e/internal",
    ] {
        let (status, text) = raw(addr, "POST", target).await;
        assert_eq!(status, 400, "{target}: {text}");
        assert!(text.contains("bad_path"), "{target}: {text}");
    }
    let got = c.sims[0].received();
    assert!(!got.iter().any(|r| r.path.contains("internal")), "the node host never saw an escaped path: {got:?}");
}
