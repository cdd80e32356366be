//! The simulated node on its own: wire format and the live control endpoint.

mod common;

use std::time::Duration;

use common::{eventually, ndjson};
use corral::sim::{SimNode, SimSpec};
use serde_json::{json, Value};

async fn node() -> (SimNode, reqwest::Client) {
    (SimNode::start(SimSpec::default()).await.expect("starts"), reqwest::Client::new())
}

#[tokio::test]
async fn control_endpoint_scripts_statuses_then_recovers() {
    let (sim, c) = node().await;
    let r = c
        .post(format!("{}/_sim/faults", sim.url()))
        .json(&json!({"script": [{"status": 500, "times": 2}]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 204);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = c
            .post(format!("{}/api/generate", sim.url()))
            .json(&json!({"model": "llama3.2", "prompt": "x", "stream": false}))
            .send()
            .await
            .expect("answer");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, vec![500, 500, 200], "2 x 500 then ok");
    let received: Vec<Value> =
        c.get(format!("{}/_sim/received", sim.url())).send().await.expect("answer").json().await.expect("json");
    assert_eq!(received.len(), 3, "control requests are not recorded");
    assert_eq!(received[0]["model"], "llama3.2");
    let r = c.post(format!("{}/_sim/faults", sim.url())).json(&json!({"cut_aftr": 1})).send().await.expect("answer");
    assert_eq!(r.status(), 400, "a typo in a fault is refused, not ignored");
}

#[tokio::test]
async fn down_for_stops_listening_then_comes_back() {
    let (sim, c) = node().await;
    let r = c.post(format!("{}/_sim/down", sim.url())).json(&json!({"for_ms": 300})).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    assert!(
        eventually(Duration::from_secs(5), || std::net::TcpStream::connect(sim.addr()).is_err()).await,
        "the port stops accepting"
    );
    assert!(
        eventually(Duration::from_secs(10), || std::net::TcpStream::connect(sim.addr()).is_ok()).await,
        "and comes back"
    );
    let r = reqwest::Client::new().get(format!("{}/api/version", sim.url())).send().await.expect("answer");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn flapping_alternates_every_n_probes() {
    let (sim, c) = node().await;
    sim.update_faults(|f| f.flap_every = Some(2));
    let mut probes = Vec::new();
    for _ in 0..6 {
        probes.push(c.get(format!("{}/api/version", sim.url())).send().await.expect("answer").status().as_u16());
    }
    assert_eq!(probes, vec![200, 200, 500, 500, 200, 200]);
}

#[tokio::test]
async fn unknown_model_and_missing_model_are_worded_like_ollama() {
    let (sim, c) = node().await;
    let r = c.post(format!("{}/api/chat", sim.url())).json(&json!({"model": "x"})).send().await.expect("answer");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "model \"x\" not found, try pulling it first");
    let r = c.post(format!("{}/api/chat", sim.url())).json(&json!({})).send().await.expect("answer");
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "model is required");
    let r = c
        .post(format!("{}/v1/chat/completions", sim.url()))
        .json(&json!({"model": "x", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn structured_output_is_json_the_format_or_response_format_describes() {
    let (sim, c) = node().await;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "kind": {"enum": ["cat", "dog"]},
            "home": {"type": ["object", "null"], "properties": {"city": {"type": "string"}}},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age"]
    });
    let post = |path: &str, body: Value| c.post(format!("{}{path}", sim.url())).json(&body).send();
    let msgs = json!([{"role": "user", "content": "describe a pet"}]);
    // Native chat, whole and streamed (the stream's pieces join into the same JSON).
    let whole: Value =
        post("/api/chat", json!({"model": "llama3.2", "messages": msgs, "format": schema, "stream": false}))
            .await
            .expect("answer")
            .json()
            .await
            .expect("json");
    let content = whole["message"]["content"].as_str().expect("content");
    let v: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("not JSON ({e}): {content}"));
    assert!(v["name"].as_str().is_some_and(|n| !n.is_empty()), "{v}");
    assert_eq!(
        (&v["age"], &v["kind"], &v["ok"], &v["home"]["city"].is_string()),
        (&json!(1), &json!("cat"), &json!(true), &true),
        "{v}"
    );
    assert_eq!(v["tags"].as_array().map(Vec::len), Some(2), "minItems: {v}");
    let r = post("/api/chat", json!({"model": "llama3.2", "messages": msgs, "format": schema})).await.expect("answer");
    let lines = ndjson(&r.text().await.expect("body"));
    assert!(lines.len() > 3, "streamed in pieces: {lines:?}");
    let joined: String = lines.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
    assert_eq!(joined, content, "the pieces join into the same answer");
    // "json": any JSON object; generate too.
    let g: Value =
        post("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "format": "json", "stream": false}))
            .await
            .expect("answer")
            .json()
            .await
            .expect("json");
    let v: Value = serde_json::from_str(g["response"].as_str().expect("response")).expect("a JSON object");
    assert!(v.is_object(), "{v}");
    // OpenAI's response_format on /v1.
    let rf = json!({"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}});
    let o: Value = post("/v1/chat/completions", json!({"model": "llama3.2", "messages": msgs, "response_format": rf}))
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    let v: Value =
        serde_json::from_str(o["choices"][0]["message"]["content"].as_str().expect("content")).expect("JSON");
    assert_eq!(v["age"], 1, "{v}");
    // No format: words, not JSON.
    let plain: Value = post("/api/chat", json!({"model": "llama3.2", "messages": msgs, "stream": false}))
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert!(serde_json::from_str::<Value>(plain["message"]["content"].as_str().unwrap_or("")).is_err());
}

#[tokio::test]
async fn a_body_of_the_wrong_shape_gets_ollamas_binding_error() {
    let (sim, c) = node().await;
    for (path, body, want) in [
        ("/api/chat", json!({"model": "llama3.2", "messages": "hi"}), json!({"error": "json: cannot unmarshal string into Go struct field ChatRequest.messages of type []api.Message"})),
        ("/api/generate", json!({"model": "llama3.2", "prompt": 5}), json!({"error": "json: cannot unmarshal number into Go struct field GenerateRequest.prompt of type string"})),
        ("/v1/chat/completions", json!({"model": "llama3.2", "messages": "hi"}), json!("json: cannot unmarshal string into Go struct field ChatCompletionRequest.messages of type []openai.Message")),
        ("/v1/chat/completions", json!({"model": "llama3.2"}), json!("[] is too short - 'messages'")),
        ("/v1/chat/completions", json!({"model": "llama3.2", "messages": []}), json!("[] is too short - 'messages'")),
    ] {
        let r = c.post(format!("{}{path}", sim.url())).json(&body).send().await.expect("answer");
        assert_eq!(r.status(), 400, "{path} {body}");
        let v: Value = r.json().await.expect("json");
        match path.starts_with("/v1") {
            true => assert_eq!(v["error"]["message"], want, "{path} {body}: {v}"),
            false => assert_eq!(v, want, "{path} {body}"),
        }
    }
    let r = c.post(format!("{}/api/chat", sim.url())).json(&json!({"model": "llama3.2"})).send().await.expect("answer");
    assert_eq!(r.status(), 200, "no messages natively loads the model, as Ollama does");
}

#[tokio::test]
async fn generate_stream_has_ollama_final_chunk() {
    let (sim, c) = node().await;
    let r = c
        .post(format!("{}/api/generate", sim.url()))
        .json(&json!({"model": "llama3.2", "prompt": "hi", "options": {"num_predict": 3}}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let lines = ndjson(&r.text().await.expect("body"));
    assert_eq!(lines.len(), 4, "three tokens and the final chunk");
    let last = &lines[3];
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "length");
    assert_eq!(last["eval_count"], 3);
    assert!(last["context"].is_array());
    assert!(lines.iter().all(|l| l["created_at"].as_str().is_some_and(|t| t.ends_with('Z'))));
}

#[tokio::test]
async fn v1_stream_includes_usage_when_asked() {
    let (sim, c) = node().await;
    let r = c
        .post(format!("{}/v1/chat/completions", sim.url()))
        .json(&json!({"model": "llama3.2", "stream": true, "max_tokens": 2, "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("answer");
    let text = r.text().await.expect("body");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"));
    let usage: Value =
        serde_json::from_str(events[events.len() - 2].trim_start_matches("data: ")).expect("usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    assert_eq!(usage["choices"], json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sim_records_the_most_requests_it_held_at_once() {
    let spec = SimSpec { ttft: Duration::from_millis(300), parallel: 2, ..SimSpec::default() };
    let (sim, c) = (SimNode::start(spec).await.expect("starts"), reqwest::Client::new());
    assert_eq!(sim.max_in_flight(), 0, "nothing asked yet");
    let ask = || {
        c.post(format!("{}/api/generate", sim.url()))
            .json(&json!({"model": "llama3.2", "prompt": "x", "stream": false}))
            .send()
    };
    let (a, b, d) = tokio::join!(ask(), ask(), ask());
    for r in [a, b, d] {
        assert_eq!(r.expect("answer").status(), 200);
    }
    assert_eq!(sim.max_in_flight(), 3, "two generating and one waiting for a slot count as held");
    let _ = ask().await.expect("answer");
    assert_eq!(sim.max_in_flight(), 3, "a later lone request keeps the maximum");
}
