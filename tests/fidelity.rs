//! Fidelity to Ollama's API (ollama/ollama `server/routes.go` at fb307609): model names
//! resolved as Ollama resolves them, Ollama's error wording, routes Ollama has that Corral
//! answers itself or refuses by name, and `/api/show` / `/api/version` / dropped fields on an
//! OpenAI-compatible node. Each test is named in docs/compatibility.md's `## Routes`.

mod common;

use common::{cluster, ndjson};
use corral::config::{CategoryConfig, CloudPermission, NodeConfig, NodeKind, ProviderConfig};
use corral::sim::{SimNode, SimSpec};
use serde_json::{json, Value};

/// A sim speaking only `/v1` (a llama.cpp server, say), with `models`.
async fn openai_sim(models: &[&str]) -> SimNode {
    let spec = SimSpec { models: models.iter().map(|m| m.to_string()).collect(), cloud: true, ..SimSpec::default() };
    SimNode::start(spec).await.expect("openai sim starts")
}

/// A broker whose only node is the OpenAI-compatible `node`.
async fn openai_only(node: &SimNode) -> common::Cluster {
    let url = node.url();
    let c = cluster(0)
        .config(move |cfg| {
            cfg.nodes = vec![NodeConfig { name: "llama".into(), url, kind: NodeKind::Openai, ..NodeConfig::default() }]
        })
        .start()
        .await;
    c.learn_models().await;
    c
}

async fn json_of(r: reqwest::Response) -> Value {
    r.json().await.expect("a JSON body")
}

#[tokio::test]
async fn model_names_are_resolved_as_ollama_resolves_them() {
    let c = cluster(1).models(0, &["llama3.2"]).start().await;
    c.learn_models().await;
    for name in ["Llama3.2", "llama3.2:LATEST", "registry.ollama.ai/library/llama3.2:latest", "library/llama3.2"] {
        let r = c
            .post("/api/chat", json!({"model": name, "messages": [{"role": "user", "content": "hi"}], "stream": false}))
            .await;
        assert_eq!(r.status(), 200, "{name} is llama3.2:latest to Ollama, so to Corral too");
        assert_eq!(r.headers()["x-corral-node"], "n0");
    }
    let sent: Vec<String> = c.sims[0].received().into_iter().filter_map(|r| r.model).collect();
    assert!(sent.contains(&"Llama3.2".to_string()), "the node gets the client's spelling and resolves it: {sent:?}");
}

#[tokio::test]
async fn a_missing_model_is_reported_in_ollamas_words() {
    let c = cluster(1).start().await;
    c.learn_models().await;
    let r = c.chat("qwen9", false).await;
    assert_eq!(r.status(), 404);
    let v = json_of(r).await;
    assert_eq!(v["code"], "model_not_found");
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(msg.starts_with("model 'qwen9' not found"), "Ollama's CLI and clients match on this: {msg}");
}

#[tokio::test]
async fn routes_corral_does_not_serve_are_refused_by_name() {
    let c = cluster(1).start().await;
    c.learn_models().await;
    let before = c.sims[0].received().len();
    for (method, path) in [("GET", "/api/nope"), ("GET", "/api/chat"), ("PUT", "/v1/models")] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let r = c.client.request(m, c.url(path)).send().await.expect("answer");
        assert_eq!(r.status(), 404, "{method} {path}");
        assert!(
            r.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap_or("").contains("json"),
            "never a bare page"
        );
        let v = json_of(r).await;
        assert_eq!(v["code"], "unknown_route");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(&format!("{method} {path}")), "names the route: {msg}");
        assert!(msg.contains("docs/compatibility.md"), "points to the table: {msg}");
    }
    for (method, path) in [
        ("POST", "/api/me"),
        ("POST", "/api/signout"),
        ("DELETE", "/api/user/keys/abc"),
        ("POST", "/api/experimental/web_search"),
        ("GET", "/api/experimental/model-recommendations"),
        ("POST", "/v1/audio/transcriptions"),
    ] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let r = c.client.request(m, c.url(path)).json(&json!({})).send().await.expect("answer");
        assert_eq!(r.status(), 501, "{method} {path} is Ollama's, not Corral's");
        let v = json_of(r).await;
        assert_eq!(v["code"], "route_not_served");
        assert!(v["error"].as_str().unwrap_or_default().contains(&format!("{method} {path}")), "{v}");
    }
    let after: Vec<String> =
        c.sims[0].received()[before..].iter().map(|r| format!("{} {}", r.method, r.path)).collect();
    assert!(
        after.iter().all(|r| r == "GET /api/version" || r.starts_with("GET /api/ps") || r.starts_with("GET /api/tags")),
        "none reached a node but probes: {after:?}"
    );
}

#[tokio::test]
async fn version_and_status_pass_to_an_ollama_node_and_head_is_like_get() {
    let c = cluster(1).spec(0, |s| s.version = "0.12.3".into()).start().await;
    let v = json_of(c.client.get(c.url("/api/version")).send().await.expect("answer")).await;
    assert_eq!(v["version"], "0.12.3", "the node's own version");
    let r = c.client.head(c.url("/api/version")).send().await.expect("answer");
    assert_eq!(r.status(), 200, "HEAD /api/version as Ollama answers it");
    let r = c.client.head(c.url("/api/tags")).send().await.expect("answer");
    assert_eq!(r.status(), 200, "HEAD /api/tags");
    let v = json_of(c.client.get(c.url("/api/status")).send().await.expect("answer")).await;
    assert_eq!(v["cloud"]["source"], "none", "the node's StatusResponse: {v}");
    assert_eq!(c.sims[0].count("/api/status"), 1);
}

#[tokio::test]
async fn version_is_corrals_own_when_no_node_answers() {
    let c = cluster(1).start().await;
    c.sims[0].stop();
    let r = c.client.get(c.url("/api/version")).send().await.expect("answer");
    assert_eq!(r.status(), 200, "clients check the version before anything else");
    assert_eq!(json_of(r).await["version"], env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn show_version_and_status_work_with_an_openai_kind_node_only() {
    let node = openai_sim(&["tiny"]).await;
    let c = openai_only(&node).await;
    for body in [json!({"model": "tiny"}), json!({"name": "tiny:latest"}), json!({"model": "Tiny"})] {
        let r = c.post("/api/show", body.clone()).await;
        assert_eq!(r.status(), 200, "ollama.show() and llama-index need show: {body}");
        assert_eq!(r.headers()["x-corral-node"], "llama");
        let v = json_of(r).await;
        assert!(v["capabilities"].as_array().is_some_and(|c| c.contains(&json!("completion"))), "{v}");
        assert!(v["details"].is_object() && v["model_info"].is_object(), "ShowResponse's shape: {v}");
    }
    let r = c.post("/api/show", json!({"model": "absent"})).await;
    assert_eq!(r.status(), 404, "a model no node has is still not found");
    let v = json_of(c.client.get(c.url("/api/version")).send().await.expect("answer")).await;
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "an OpenAI-compatible node has no Ollama version");
    assert_eq!(c.client.head(c.url("/api/version")).send().await.expect("answer").status(), 200);
    let v = json_of(c.client.get(c.url("/api/status")).send().await.expect("answer")).await;
    assert_eq!(v["cloud"]["disabled"], true, "such a node has no Ollama cloud: {v}");
}

#[tokio::test]
async fn responses_and_messages_pass_to_an_ollama_node_and_its_route_404_is_untouched() {
    let c = cluster(1).models(0, &["llama3.2"]).start().await;
    c.learn_models().await;
    for path in ["/v1/responses", "/v1/messages"] {
        let r = c.post(path, json!({"model": "llama3.2", "input": "hi"})).await;
        assert_eq!(r.status(), 404, "this sim has no {path}: the node's own answer");
        assert_eq!(r.headers()["content-type"], "text/plain", "{path}: the node's own content type");
        assert_eq!(r.text().await.expect("text"), "404 page not found", "passed through untouched");
        assert_eq!(c.sims[0].count(path), 1, "{path} reached the node");
    }
    assert_eq!(c.chat("llama3.2", false).await.status(), 200, "a route 404 never makes a node forget the model");
}

#[tokio::test]
async fn raw_and_suffix_are_refused_on_an_openai_node_never_dropped() {
    let node = openai_sim(&["tiny"]).await;
    let c = openai_only(&node).await;
    for (field, body) in [
        ("raw", json!({"model": "tiny", "prompt": "[INST] hi [/INST]", "raw": true, "stream": false})),
        ("suffix", json!({"model": "tiny", "prompt": "def f(", "suffix": "return x", "stream": false})),
    ] {
        let r = c.post("/api/generate", body).await;
        assert_eq!(r.status(), 400, "{field}");
        let msg = json_of(r).await["error"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(&format!("\"{field}\"")), "the refusal names {field}: {msg}");
    }
    assert_eq!(node.count("/v1/chat/completions"), 0, "nothing was generated without them");
}

#[tokio::test]
async fn think_and_logprobs_are_translated_for_an_openai_node() {
    let node = openai_sim(&["tiny"]).await;
    let c = openai_only(&node).await;
    let body =
        json!({"model": "tiny", "prompt": "hi", "think": false, "logprobs": true, "top_logprobs": 2, "stream": false});
    assert_eq!(c.post("/api/generate", body).await.status(), 200);
    let r = c
        .post("/api/chat", json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "think": "high"}))
        .await;
    assert_eq!(r.status(), 200);
    assert!(ndjson(&r.text().await.expect("text")).last().is_some_and(|l| l["done"] == true));
    let sent: Vec<Value> = node
        .received()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .filter_map(|r| r.body.and_then(|b| serde_json::from_str(&b).ok()))
        .collect();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0]["chat_template_kwargs"]["enable_thinking"], false, "think: false, llama.cpp's way: {}", sent[0]);
    assert_eq!((sent[0]["logprobs"].clone(), sent[0]["top_logprobs"].clone()), (json!(true), json!(2)));
    assert_eq!(sent[1]["reasoning_effort"], "high", "a think level is reasoning_effort: {}", sent[1]);
}

#[tokio::test]
async fn a_cloud_fallback_says_which_fields_it_could_not_send() {
    let cloud = openai_sim(&["gpt-4o-mini"]).await;
    let base_url = format!("{}/v1", cloud.url());
    let c = cluster(1)
        .models(0, &["llama3.2"])
        .config(move |cfg| {
            cfg.providers = vec![ProviderConfig {
                name: "cloudsim".into(),
                base_url,
                model_map: [("llama3.2".to_string(), "gpt-4o-mini".to_string())].into(),
                ..ProviderConfig::default()
            }];
            cfg.categories[0] = CategoryConfig {
                cloud: CloudPermission::OnFailure,
                providers: vec!["cloudsim".into()],
                ..cfg.categories[0].clone()
            };
        })
        .start()
        .await;
    c.learn_models().await;
    c.sims[0].stop();
    let body =
        json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "think": true, "stream": false});
    let r = c.post("/api/chat", body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    assert_eq!(r.headers()["x-corral-dropped"], "think", "a cloud API has no on/off for thinking: said, not hidden");
}

#[tokio::test]
async fn ollamas_routes_pass_to_an_ollama_node() {
    let c = cluster(1).models(0, &["llama3.2", "nomic-embed-text"]).start().await;
    c.learn_models().await;
    let chat = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]});
    for (path, body) in [
        ("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "stream": false})),
        ("/api/embed", json!({"model": "nomic-embed-text", "input": ["a", "b"]})),
        ("/api/embeddings", json!({"model": "nomic-embed-text", "prompt": "a"})),
        ("/v1/chat/completions", chat),
        ("/v1/completions", json!({"model": "llama3.2", "prompt": "hi"})),
        ("/v1/embeddings", json!({"model": "nomic-embed-text", "input": "a"})),
        ("/api/copy", json!({"source": "llama3.2", "destination": "mine"})),
        ("/api/create", json!({"model": "made", "from": "llama3.2", "stream": false})),
        ("/api/push", json!({"model": "llama3.2", "stream": false})),
    ] {
        let r = c.post(path, body).await;
        assert!(r.status().is_success(), "{path}: {}", r.status());
        assert_eq!(c.sims[0].count(path), 1, "{path} reached the node as it came");
    }
}

#[tokio::test]
async fn native_inference_is_translated_for_an_openai_node() {
    let node = openai_sim(&["tiny"]).await;
    let c = openai_only(&node).await;
    let v = json_of(c.post("/api/generate", json!({"model": "tiny", "prompt": "hi", "stream": false})).await).await;
    assert_eq!((v["done"].clone(), v["response"].is_string()), (json!(true), true), "{v}");
    let v = json_of(c.post("/api/embed", json!({"model": "tiny", "input": ["a"]})).await).await;
    assert!(v["embeddings"][0].is_array(), "{v}");
    let v = json_of(c.post("/api/embeddings", json!({"model": "tiny", "prompt": "a"})).await).await;
    assert!(v["embedding"].is_array(), "{v}");
    let r = c.post("/v1/completions", json!({"model": "tiny", "prompt": "hi"})).await;
    assert_eq!(r.status(), 200, "/v1 goes as it came");
    assert_eq!((node.count("/v1/chat/completions"), node.count("/v1/embeddings")), (1, 2));
}

/// A non-streamed answer is one document of known length: Ollama (Go's `net/http`, one write)
/// sends it with `Content-Length`, and so does Corral, on the native API and on `/v1`; a
/// stream is still sent as it arrives, chunked.
#[tokio::test]
async fn a_whole_answer_has_its_length_and_a_stream_is_chunked() {
    let c = cluster(1).models(0, &["llama3.2"]).start().await;
    c.learn_models().await;
    let asks = [
        ("/api/chat", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false})),
        ("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "stream": false})),
        ("/v1/chat/completions", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]})),
        ("/api/chat", json!({"model": "llama3.2", "messages": [{"role": "nobody", "content": "hi"}], "stream": false})),
    ];
    for (path, body) in asks {
        let r = c.post(path, body.clone()).await;
        let (status, headers) = (r.status(), r.headers().clone());
        let text = r.bytes().await.expect("body");
        assert!(headers.get("transfer-encoding").is_none(), "{path} {body}: not chunked ({status})");
        let length = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        assert_eq!(length, Some(text.len()), "{path} {body}: Content-Length is the body's length ({status})");
    }
    let r = c.chat("llama3.2", true).await;
    assert_eq!(r.headers().get("transfer-encoding").map(|v| v.as_bytes()), Some(&b"chunked"[..]));
    assert!(r.headers().get("content-length").is_none(), "a stream's length is not known when it starts");
    assert!(!ndjson(&r.text().await.expect("body")).is_empty(), "and it streams");
}
