//! The simulated node's Ollama API: `GET /`, `/api/version`, `/api/tags`, `/api/ps`,
//! `/api/show`, chat and generate, embed and embeddings, and the model operations (pull, copy,
//! create, delete, push), in Ollama's own wire format.
//!
//! Answers are worded as Ollama words them: errors are `{"error": "..."}`, streams are NDJSON
//! ending in a `done: true` line with durations and counts, timestamps are RFC 3339. The
//! model catalogue (sizes, digests, details) is derived from the model's name, so it is the
//! same on every node and every run. Generation itself is in `inference`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::{header, Method, StatusCode};
use serde_json::{json, Value};

use super::inference::{embed, inference, Answer, Chunk, Kind};
use super::router::{not_found, Incoming};
use super::Shared;

/// Ollama's routes, `/api/version` aside (the router answers it before the flap check).
pub(super) async fn route(s: Arc<Shared>, call: Incoming) -> Response {
    match (call.method.clone(), call.path.as_str()) {
        (Method::GET | Method::HEAD, "/") => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "Ollama is running").into_response()
        }
        (Method::GET, "/api/tags") => {
            axum::Json(json!({ "models": s.models().iter().map(|m| tag_entry(&s, m)).collect::<Vec<_>>() }))
                .into_response()
        }
        (Method::GET, "/api/ps") => ps(&s),
        // `GET` is the liveness probe, answered in `router`; `HEAD` only says the same.
        (Method::HEAD, "/api/version") => axum::Json(json!({ "version": s.spec.version })).into_response(),
        // Ollama's `StatusHandler`: whether its cloud models are disabled and by what
        // (`none`, `env`, `config`, `both`).
        (Method::GET, "/api/status") => {
            axum::Json(json!({ "cloud": { "disabled": false, "source": "none" } })).into_response()
        }
        (Method::POST, "/api/show") => show(&s, &call.body),
        (Method::POST, "/api/chat") => inference(s, Kind::Chat, call.body).await,
        (Method::POST, "/api/generate") => inference(s, Kind::Generate, call.body).await,
        (Method::POST, "/api/embed" | "/api/embeddings") => embed(s, &call.path, call.body).await,
        (Method::POST, "/api/pull") => super::pull::pull(s, &call.body).await,
        (Method::DELETE, "/api/delete") => delete(&s, call.model),
        (Method::POST, "/api/copy") => copy(&s, call.json.as_ref()),
        (Method::POST, "/api/create") => create(&s, call.model, call.json.as_ref()),
        (Method::HEAD, p) if p.starts_with("/api/blobs/") => has_blob(&s, p),
        (Method::POST, p) if p.starts_with("/api/blobs/") => put_blob(&s, p),
        (Method::POST, "/api/push") => push(&s, call.model),
        _ => not_found(),
    }
}

/// The liveness probe: counts probes to drive `flap_every`, and fails when told to.
pub(super) fn version(s: &Shared) -> Response {
    let n = s.probes.fetch_add(1, Ordering::AcqRel);
    let (fail, flap) = {
        let f = s.faults();
        (f.fail_probes, f.flap_every)
    };
    let down = match flap {
        Some(k) if k > 0 => (n / k) % 2 == 1,
        _ => false,
    };
    s.flapped_down.store(down, Ordering::Release);
    if fail || down {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "simulated probe failure");
    }
    axum::Json(json!({ "version": s.spec.version })).into_response()
}

/// Ollama's error body: `{"error": "<sentence>"}`.
pub(super) fn error(status: StatusCode, msg: &str) -> Response {
    (status, axum::Json(json!({ "error": msg }))).into_response()
}

pub(super) fn is_embedding_model(model: &str) -> bool {
    model.contains("embed")
}

/// One `/api/tags` entry: the held model's size, manifest digest and details (a copy's are its
/// source's).
fn tag_entry(s: &Shared, model: &str) -> Value {
    let name = crate::config::normalize_model(model);
    let origin = s.origin(&name);
    let facts = origin.facts();
    json!({
        "name": name,
        "model": name,
        "modified_at": "2026-10-01T12:00:00.000000000Z",
        "size": facts.size(),
        "digest": origin.digest(),
        "details": facts.details(),
    })
}

/// `/api/ps`: the loaded models whose `keep_alive` has not run out (those that have are
/// unloaded now), each with the time it will unload.
fn ps(s: &Shared) -> Response {
    let now = time::OffsetDateTime::now_utc();
    let mut expires = s.expires.lock().unwrap_or_else(|p| p.into_inner());
    let mut loaded = s.loaded.lock().unwrap_or_else(|p| p.into_inner());
    loaded.retain(|m| expires.get(m).is_none_or(|t| *t > now));
    expires.retain(|m, _| loaded.contains(m));
    let models: Vec<Value> = loaded
        .iter()
        .map(|m| {
            let origin = s.origin(m);
            let size = origin.facts().size();
            let until = expires.get(m).copied().unwrap_or(now + time::Duration::minutes(5));
            json!({
                "name": m, "model": m, "size": size, "digest": origin.digest(), "details": origin.facts().details(),
                "expires_at": rfc3339(until), "size_vram": size, "context_length": 4096,
            })
        })
        .collect();
    axum::Json(json!({ "models": models })).into_response()
}

/// A chat template that takes tools, as Ollama's tools-capable templates do (Ollama gives a
/// model the `tools` capability when its template mentions `.Tools`).
const TOOLS_TEMPLATE: &str = "{{- if .Tools }}<|tools|>{{ range .Tools }}{{ . }}{{ end }}{{ end }}\
{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}{{- range .ToolCalls }}{\"name\": \"{{ .Function.Name }}\", \"arguments\": {{ .Function.Arguments }}}{{ end }}{{ end }}<|assistant|>";

fn show(s: &Shared, body: &Bytes) -> Response {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let Some(model) = v.get("model").or_else(|| v.get("name")).and_then(Value::as_str) else {
        return error(StatusCode::BAD_REQUEST, "model is required");
    };
    if !s.serves(model) {
        return error(StatusCode::NOT_FOUND, &format!("model '{model}' not found"));
    }
    let caps = if is_embedding_model(model) { vec!["embedding"] } else { vec!["completion", "tools"] };
    let facts = s.origin(model).facts();
    axum::Json(json!({
        "license": "simulated model, no license",
        "modelfile": format!("# Modelfile generated by corral sim\nFROM {model}\n"),
        "parameters": "temperature 0.8\nnum_ctx 4096",
        "template": if is_embedding_model(model) { "{{ .Prompt }}" } else { TOOLS_TEMPLATE },
        "details": facts.details(),
        "model_info": { "general.architecture": facts.family, "general.parameter_count": facts.parameter_count, "llama.context_length": 131_072 },
        "capabilities": caps,
        "modified_at": "2026-10-01T12:00:00.000000000Z",
    }))
    .into_response()
}

fn delete(s: &Shared, model: Option<String>) -> Response {
    match model {
        Some(m) if s.remove_model(&m) => StatusCode::OK.into_response(),
        Some(m) => error(StatusCode::NOT_FOUND, &format!("model '{m}' not found")),
        None => error(StatusCode::BAD_REQUEST, "model is required"),
    }
}

fn copy(s: &Shared, req: Option<&Value>) -> Response {
    let field = |k: &str| req.and_then(|v| v.get(k)).and_then(Value::as_str).map(str::to_string);
    match (field("source"), field("destination")) {
        (Some(src), Some(dst)) if s.serves(&src) => {
            s.add_copy(&dst, s.origin(&src));
            StatusCode::OK.into_response()
        }
        // Ollama's `CopyHandler` quotes the source with %q: `model "x" not found`.
        (Some(src), Some(_)) => error(StatusCode::NOT_FOUND, &format!("model {src:?} not found")),
        _ => error(StatusCode::BAD_REQUEST, "source and destination are required"),
    }
}

/// `HEAD /api/blobs/:digest`: 200 when held, else Ollama's 404.
fn has_blob(s: &Shared, path: &str) -> Response {
    let digest = path.trim_start_matches("/api/blobs/");
    if s.blobs.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|d| d == digest) {
        return StatusCode::OK.into_response();
    }
    error(StatusCode::NOT_FOUND, &format!("blob \"{digest}\" not found"))
}

/// `POST /api/blobs/:digest`: 201 when stored, 200 when held already. The digest is taken on
/// trust (Ollama checks it against the body).
fn put_blob(s: &Shared, path: &str) -> Response {
    let digest = path.trim_start_matches("/api/blobs/").to_string();
    let mut blobs = s.blobs.lock().unwrap_or_else(|p| p.into_inner());
    if blobs.contains(&digest) {
        return StatusCode::OK.into_response();
    }
    blobs.push(digest);
    StatusCode::CREATED.into_response()
}

/// `/api/create`: every blob named in `files` must have been uploaded to this node, else the
/// create fails in-stream as Ollama's does when it cannot open the blob.
fn create(s: &Shared, model: Option<String>, req: Option<&Value>) -> Response {
    let files = req.and_then(|v| v.get("files")).and_then(Value::as_object);
    let missing = files
        .into_iter()
        .flatten()
        .filter_map(|(_, d)| d.as_str())
        .find(|d| !s.blobs.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|b| b == d));
    if let (Some(d), Some(_)) = (missing, &model) {
        let e = json!({ "error": format!("open blobs/{}: no such file or directory", d.replace(':', "-")) });
        let body = format!("{{\"status\":\"reading model metadata\"}}\n{e}\n");
        return (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    }
    match model {
        Some(m) => {
            s.add_model(&m);
            let lines = [
                "{\"status\":\"reading model metadata\"}",
                "{\"status\":\"writing manifest\"}",
                "{\"status\":\"success\"}",
            ];
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], lines.join("\n") + "\n").into_response()
        }
        None => error(StatusCode::BAD_REQUEST, "model is required"),
    }
}

fn push(s: &Shared, model: Option<String>) -> Response {
    match model {
        Some(m) if s.serves(&m) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], "{\"status\":\"success\"}\n")
                .into_response()
        }
        Some(m) => error(StatusCode::NOT_FOUND, &format!("model '{m}' not found")),
        None => error(StatusCode::BAD_REQUEST, "model is required"),
    }
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

pub(super) fn now() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// Ollama's preload: a chat or generate with nothing to answer only loads the model.
/// With `keep_alive: 0` it unloads it instead (`done_reason: "unload"`).
pub(super) fn preloaded(kind: Kind, model: &str, unload: bool) -> Response {
    let reason = if unload { "unload" } else { "load" };
    let mut v = json!({ "model": model, "created_at": now(), "done": true, "done_reason": reason });
    v[if kind == Kind::Chat { "message" } else { "response" }] =
        if kind == Kind::Chat { json!({"role": "assistant", "content": ""}) } else { json!("") };
    axum::Json(v).into_response()
}

/// The body of `/api/embed` (many inputs) or the older `/api/embeddings` (one prompt).
pub(super) fn embeddings(
    path: &str,
    model: &str,
    vectors: &[Vec<f32>],
    load: std::time::Duration,
    tokens: usize,
) -> Value {
    if path == "/api/embeddings" {
        return json!({ "embedding": vectors.first().cloned().unwrap_or_default() });
    }
    json!({
        "model": model, "embeddings": vectors,
        "total_duration": load.as_nanos() as u64 + 1_000_000, "load_duration": load.as_nanos() as u64, "prompt_eval_count": tokens,
    })
}

/// An answer in Ollama's words: NDJSON lines, the last one `done: true` with the counts.
impl Answer {
    fn stats(&self) -> Value {
        let n = self.completion.tokens.len() as u64;
        // An unpaced sim says 1 ms per token (1,000 tokens/s): a faster report would not be
        // believed (`speed::MAX_DECODE_TPS`), and no GPU's single stream is much faster.
        let per_token = self.pace.per_token.max(std::time::Duration::from_millis(1));
        let eval = (per_token * n as u32).as_nanos() as u64;
        let prompt_eval = self.pace.ttft.as_nanos() as u64 + 1_000;
        let load = self.load.as_nanos() as u64;
        json!({
            "total_duration": load + prompt_eval + eval,
            "load_duration": load,
            "prompt_eval_count": self.prompt_tokens,
            "prompt_eval_duration": prompt_eval,
            "eval_count": n,
            "eval_duration": eval,
        })
    }

    /// The final line; `whole` says it carries the thinking and tool calls too (not streamed).
    pub(super) fn native_final(&self, content: &str, whole: bool) -> Value {
        let mut v = match self.kind {
            Kind::Chat => {
                json!({ "model": self.model, "created_at": now(), "message": { "role": "assistant", "content": content }, "done_reason": self.finish_reason(), "done": true })
            }
            _ => {
                json!({ "model": self.model, "created_at": now(), "response": content, "done": true, "done_reason": self.finish_reason(), "context": [1, 2, 3] })
            }
        };
        if whole {
            self.add_scripted(&mut v, true, true);
        }
        if let (Some(obj), Value::Object(stats)) = (v.as_object_mut(), self.stats()) {
            obj.extend(stats);
        }
        v
    }

    /// One NDJSON line per token (stamped when sent), then the final line.
    pub(super) fn native_chunks(&self) -> VecDeque<Chunk> {
        let mut out: VecDeque<Chunk> = self
            .completion
            .tokens
            .iter()
            .map(|tok| match self.kind {
                Kind::Chat => Chunk::Line(json!({ "model": self.model, "created_at": "", "message": { "role": "assistant", "content": tok }, "done": false })),
                _ => Chunk::Line(json!({ "model": self.model, "created_at": "", "response": tok, "done": false })),
            })
            .collect();
        // Ollama streams the reasoning first, then the words; a tool call comes in one piece.
        for (thinking, tools) in [(false, true), (true, false)] {
            if (tools && self.tool_call.is_some()) || (thinking && self.thinking.is_some()) {
                let mut v = match self.kind {
                    Kind::Chat => {
                        json!({ "model": self.model, "created_at": "", "message": { "role": "assistant", "content": "" }, "done": false })
                    }
                    _ => json!({ "model": self.model, "created_at": "", "response": "", "done": false }),
                };
                self.add_scripted(&mut v, thinking, tools);
                out.push_front(Chunk::Line(v));
            }
        }
        out.push_back(Chunk::Line(self.native_final("", false)));
        out
    }

    /// Put the thinking (`message.thinking`, or `thinking` beside `response`) and the tool call
    /// (`message.tool_calls[].function{index,name,arguments}`) into a native line.
    fn add_scripted(&self, v: &mut Value, thinking: bool, tools: bool) {
        let target = if self.kind == Kind::Chat { &mut v["message"] } else { v };
        if let (true, Some(t)) = (thinking, &self.thinking) {
            target["thinking"] = json!(t);
        }
        if let (true, Some((name, args))) = (tools, &self.tool_call) {
            let call = json!({ "id": format!("call_{}", self.id), "function": { "index": 0, "name": name, "arguments": args } });
            target["tool_calls"] = json!([call]);
        }
    }
}
