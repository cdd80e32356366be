//! The simulator against Ollama's own types: every JSON key the sim sends must be a field of the
//! Ollama type it plays (tests/data/ollama_fields.txt, taken from Ollama's api/types.go), and
//! every field Ollama always sends must be there. Plus the behaviour behind those fields:
//! keep_alive and expires_at, embed dimensions/truncate/empty input, scripted tool calls and
//! thinking in both dialects, a bad `format`, and a pull of a name the registry lacks.

use std::collections::{BTreeSet, HashMap};

use corral::sim::{SimNode, SimSpec};
use serde_json::{json, Value};

/// Type name -> (every field, the fields always sent).
fn ollama_fields() -> HashMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let text = include_str!("data/ollama_fields.txt");
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (name, fields) = line.split_once(':').expect("`Type: fields`");
        let all = fields.split_whitespace().map(|f| f.trim_end_matches('?').to_string()).collect();
        let required = fields.split_whitespace().filter(|f| !f.ends_with('?')).map(str::to_string).collect();
        out.insert(name.trim().to_string(), (all, required));
    }
    out
}

/// `v` has only fields of `types` (joined, as Go's embedding joins them) and all their
/// always-sent ones.
fn conforms(v: &Value, types: &[&str]) {
    let table = ollama_fields();
    let (mut all, mut required) = (BTreeSet::new(), BTreeSet::new());
    for t in types {
        let (a, r) = table.get(*t).unwrap_or_else(|| panic!("{t} is in ollama_fields.txt"));
        all.extend(a.iter().cloned());
        required.extend(r.iter().cloned());
    }
    let keys: BTreeSet<String> = v.as_object().expect("an object").keys().cloned().collect();
    let extra: Vec<_> = keys.difference(&all).collect();
    let missing: Vec<_> = required.difference(&keys).collect();
    assert!(extra.is_empty(), "{types:?}: keys Ollama does not send: {extra:?} in {v}");
    assert!(missing.is_empty(), "{types:?}: fields Ollama always sends are missing: {missing:?} in {v}");
}

async fn node(spec: SimSpec) -> (SimNode, reqwest::Client) {
    (SimNode::start(spec).await.expect("starts"), reqwest::Client::new())
}

async fn post(c: &reqwest::Client, sim: &SimNode, path: &str, body: Value) -> (u16, String) {
    let r = c.post(format!("{}{path}", sim.url())).json(&body).send().await.expect("answer");
    (r.status().as_u16(), r.text().await.expect("body"))
}

async fn post_json(c: &reqwest::Client, sim: &SimNode, path: &str, body: Value) -> Value {
    let (status, text) = post(c, sim, path, body).await;
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).expect("json")
}

async fn get_json(c: &reqwest::Client, sim: &SimNode, path: &str) -> Value {
    c.get(format!("{}{path}", sim.url())).send().await.expect("answer").json().await.expect("json")
}

fn lines(text: &str) -> Vec<Value> {
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("ndjson line")).collect()
}

fn sse(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("sse json"))
        .collect()
}

fn chat_tools() -> Value {
    json!({"model": "llama3.2", "messages": [{"role": "user", "content": "weather in Paris?"}], "think": true,
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}]})
}

fn check_message(m: &Value) {
    conforms(m, &["Message"]);
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        conforms(call, &["ToolCall"]);
        conforms(&call["function"], &["ToolCallFunction"]);
    }
}

#[tokio::test]
async fn chat_and_generate_answer_in_ollamas_fields_streamed_or_not() {
    let (sim, c) = node(SimSpec::default()).await;
    let chat = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false});
    let whole = post_json(&c, &sim, "/api/chat", chat).await;
    conforms(&whole, &["ChatResponse", "Metrics"]);
    check_message(&whole["message"]);
    let (_, text) =
        post(&c, &sim, "/api/chat", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}))
            .await;
    for l in lines(&text) {
        conforms(&l, &["ChatResponse", "Metrics"]);
        check_message(&l["message"]);
    }
    let gen = json!({"model": "llama3.2", "prompt": "hi", "stream": false, "think": true});
    conforms(&post_json(&c, &sim, "/api/generate", gen).await, &["GenerateResponse", "Metrics"]);
    let (_, text) = post(&c, &sim, "/api/generate", json!({"model": "llama3.2", "prompt": "hi"})).await;
    lines(&text).iter().for_each(|l| conforms(l, &["GenerateResponse", "Metrics"]));
}

#[tokio::test]
async fn show_tags_ps_embed_and_pull_answer_in_ollamas_fields() {
    let (sim, c) = node(SimSpec::default()).await;
    let show = post_json(&c, &sim, "/api/show", json!({"model": "llama3.2"})).await;
    conforms(&show, &["ShowResponse"]);
    conforms(&show["details"], &["ModelDetails"]);
    assert!(show["capabilities"].as_array().expect("capabilities").contains(&json!("tools")));
    assert!(show["template"].as_str().expect("template").contains(".Tools"), "a tools-capable template");
    let tags = get_json(&c, &sim, "/api/tags").await;
    conforms(&tags, &["ListResponse"]);
    for m in tags["models"].as_array().expect("models") {
        conforms(m, &["ListModelResponse"]);
        conforms(&m["details"], &["ModelDetails"]);
    }
    let embed = post_json(&c, &sim, "/api/embed", json!({"model": "nomic-embed-text", "input": ["a", "b"]})).await;
    conforms(&embed, &["EmbedResponse"]);
    let ps = get_json(&c, &sim, "/api/ps").await;
    conforms(&ps, &["ProcessResponse"]);
    let loaded = ps["models"].as_array().expect("models");
    assert_eq!(loaded.len(), 1, "the embedding model is loaded: {ps}");
    conforms(&loaded[0], &["ProcessModelResponse"]);
    let (_, text) = post(&c, &sim, "/api/pull", json!({"model": "qwen2.5:7b"})).await;
    lines(&text).iter().for_each(|l| conforms(l, &["ProgressResponse"]));
}

#[tokio::test]
async fn ps_expires_at_honours_keep_alive_and_zero_unloads() {
    let (sim, c) = node(SimSpec::default()).await;
    let gen = |keep: Value| json!({"model": "llama3.2", "prompt": "hi", "stream": false, "keep_alive": keep});
    post_json(&c, &sim, "/api/generate", gen(json!("1h"))).await;
    let ps = get_json(&c, &sim, "/api/ps").await;
    let at = ps["models"][0]["expires_at"].as_str().expect("expires_at").to_string();
    let stamp = |m: i64| {
        let t = time::OffsetDateTime::now_utc() + time::Duration::minutes(m);
        t.format(&time::format_description::well_known::Rfc3339).expect("formats")[..16].to_string()
    };
    let (lo, hi) = (stamp(59), stamp(61));
    assert!(lo.as_str() <= &at[..16] && &at[..16] <= hi.as_str(), "keep_alive 1h: {at} not in {lo}..{hi}");
    post_json(&c, &sim, "/api/generate", gen(json!(-1))).await;
    let ps = get_json(&c, &sim, "/api/ps").await;
    assert!(ps["models"][0]["expires_at"].as_str().expect("expires_at").starts_with("23"), "forever: {ps}");
    let unload = json!({"model": "llama3.2", "keep_alive": 0});
    let r = post_json(&c, &sim, "/api/generate", unload).await;
    assert_eq!(r["done_reason"], "unload");
    conforms(&r, &["GenerateResponse", "Metrics"]);
    assert_eq!(get_json(&c, &sim, "/api/ps").await["models"], json!([]), "keep_alive 0 unloads");
}

#[tokio::test]
async fn embed_honours_dimensions_truncate_and_empty_input() {
    let (sim, c) = node(SimSpec::default()).await;
    let e = |extra: Value| {
        let mut body = json!({"model": "nomic-embed-text"});
        body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        body
    };
    let r = post_json(&c, &sim, "/api/embed", e(json!({"input": "hello", "dimensions": 4}))).await;
    let v: Vec<f64> = serde_json::from_value(r["embeddings"][0].clone()).expect("vector");
    assert_eq!(v.len(), 4);
    assert!((v.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-3, "normalised again: {v:?}");
    for empty in [json!({"input": []}), json!({"input": ""}), json!({})] {
        let r = post_json(&c, &sim, "/api/embed", e(empty)).await;
        assert_eq!(r, json!({"model": "nomic-embed-text", "embeddings": []}));
    }
    let long = "word ".repeat(3000);
    let (status, text) = post(&c, &sim, "/api/embed", e(json!({"input": long, "truncate": false}))).await;
    assert_eq!((status, text.as_str()), (400, r#"{"error":"the input length exceeds the context length"}"#));
    post_json(&c, &sim, "/api/embed", e(json!({"input": long}))).await;
}

#[tokio::test]
async fn tool_calls_and_thinking_in_ollamas_shape() {
    let (sim, c) = node(SimSpec::default()).await;
    let mut body = chat_tools();
    body["stream"] = json!(false);
    let r = post_json(&c, &sim, "/api/chat", body).await;
    check_message(&r["message"]);
    assert!(r["message"]["thinking"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
    let call = &r["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], json!({"city": "sim", "days": 1, "unit": "celsius"}), "arguments are an object");
    let (_, text) = post(&c, &sim, "/api/chat", chat_tools()).await;
    let streamed = lines(&text);
    assert!(streamed.iter().any(|l| l["message"]["thinking"].is_string()));
    assert!(streamed.iter().any(|l| l["message"]["tool_calls"][0]["function"]["name"] == "get_weather"));
    let mut answered = chat_tools();
    answered["messages"].as_array_mut().expect("messages").push(json!({"role": "tool", "content": "sunny"}));
    answered["stream"] = json!(false);
    let r = post_json(&c, &sim, "/api/chat", answered).await;
    assert!(r["message"].get("tool_calls").is_none(), "a tool's result is answered with words: {r}");
    let plain = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false});
    let r = post_json(&c, &sim, "/api/chat", plain).await;
    assert!(r["message"].get("thinking").is_none() && r["message"].get("tool_calls").is_none(), "{r}");
}

#[tokio::test]
async fn tool_calls_and_reasoning_in_ollamas_openai_shape() {
    let (sim, c) = node(SimSpec::default()).await;
    let mut body = chat_tools();
    body.as_object_mut().expect("object").remove("think");
    body["reasoning_effort"] = json!("low");
    body["stream"] = json!(false);
    let r = post_json(&c, &sim, "/v1/chat/completions", body.clone()).await;
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["reasoning"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!((&call["type"], &call["function"]["name"]), (&json!("function"), &json!("get_weather")));
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("a string")).expect("json");
    assert_eq!(args["city"], "sim");
    body["stream"] = json!(true);
    let (_, text) = post(&c, &sim, "/v1/chat/completions", body).await;
    let events = sse(&text);
    assert!(events.iter().any(|e| e["choices"][0]["delta"]["reasoning"].is_string()));
    assert!(events.iter().any(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].is_string()));
    assert_eq!(events.last().expect("events")["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn a_bad_format_fails_as_ollamas_runner_does() {
    let (sim, c) = node(SimSpec::default()).await;
    let with = |f: Value| json!({"model": "llama3.2", "prompt": "hi", "stream": false, "format": f});
    let (status, text) = post(&c, &sim, "/api/generate", with(json!("yaml"))).await;
    assert_eq!(status, 500);
    let err: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(err["error"], r#"invalid format: "\"yaml\""; expected "json" or a valid JSON Schema object"#);
    let (status, _) = post(&c, &sim, "/api/chat", json!({"model": "llama3.2", "messages": [], "format": [1]})).await;
    assert_eq!(status, 500);
    for ok in [json!("json"), json!({"type": "object"}), json!(null), json!("")] {
        assert_eq!(post(&c, &sim, "/api/generate", with(ok.clone())).await.0, 200, "{ok}");
    }
    let unknown = json!({"model": "llama3.2", "prompt": "hi", "stream": false, "no_such_field": 1});
    assert_eq!(post(&c, &sim, "/api/generate", unknown).await.0, 200, "gin ignores unknown fields, so does Ollama");
}

#[tokio::test]
async fn pulling_a_name_the_registry_lacks_fails_as_ollama_does() {
    let spec = SimSpec { registry: Some(vec!["qwen2.5:7b".into()]), ..SimSpec::default() };
    let (sim, c) = node(spec).await;
    let (status, text) = post(&c, &sim, "/api/pull", json!({"model": "no-such-model"})).await;
    assert_eq!(status, 200, "the error comes in the stream");
    let last = lines(&text).pop().expect("lines");
    assert_eq!(last, json!({"error": "pull model manifest: file does not exist"}));
    let (status, text) = post(&c, &sim, "/api/pull", json!({"model": "no-such-model", "stream": false})).await;
    assert_eq!((status, text.as_str()), (500, r#"{"error":"pull model manifest: file does not exist"}"#));
    assert!(!sim.models().iter().any(|m| m.starts_with("no-such-model")));
    let (_, text) = post(&c, &sim, "/api/pull", json!({"model": "qwen2.5:7b"})).await;
    assert_eq!(lines(&text).pop().expect("lines"), json!({"status": "success"}));
}
