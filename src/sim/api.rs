//! The simulated node's HTTP surface: Ollama's routes, `/v1`, and the `/_sim` control endpoint.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use super::text::{self, Completion};
use super::{Faults, Pace, Received, Shared};

const BUSY: &str = "server busy, please try again.  maximum pending requests exceeded";
const MAX_BODY: usize = 64 * 1024 * 1024;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// Paths that run (simulated) inference and so are subject to faults and admission.
pub(super) fn is_inference(path: &str) -> bool {
    matches!(
        path,
        "/api/chat"
            | "/api/generate"
            | "/api/embed"
            | "/api/embeddings"
            | "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Generate,
    V1Chat,
    V1Completion,
}

impl Kind {
    fn is_v1(self) -> bool {
        matches!(self, Kind::V1Chat | Kind::V1Completion)
    }
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return native_error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"),
    };
    let path = parts.uri.path().to_string();
    let method = parts.method.clone();
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let model = parsed
        .as_ref()
        .and_then(|v| v.get("model").or_else(|| v.get("name")))
        .and_then(Value::as_str)
        .map(str::to_string);
    if !path.starts_with("/_sim") {
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        s.received.lock().unwrap_or_else(|p| p.into_inner()).push(Received {
            method: method.to_string(),
            path: path.clone(),
            model: model.clone(),
            host: header("host"),
            request_id: header("x-request-id"),
            bearer: header("authorization").and_then(|a| a.strip_prefix("Bearer ").map(str::to_string)),
            body: s.spec.cloud.then(|| String::from_utf8_lossy(&body).into_owned()),
        });
    }
    if s.spec.cloud && !path.starts_with("/v1/") && !path.starts_with("/_sim") {
        return v1_error(StatusCode::NOT_FOUND, &format!("Invalid URL ({method} {path})"));
    }
    if let (Some(key), true) = (&s.spec.api_key, path.starts_with("/v1/")) {
        let sent = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
        if sent != Some(format!("Bearer {key}").as_str()) {
            return v1_error(StatusCode::UNAUTHORIZED, "Incorrect API key provided.");
        }
    }

    if path == "/api/version" && method == Method::GET {
        return version(&s);
    }
    if s.flapped_down.load(Ordering::Acquire) && !path.starts_with("/_sim") {
        return native_error(StatusCode::INTERNAL_SERVER_ERROR, "simulated flap: node is failing");
    }

    match (method.clone(), path.as_str()) {
        (Method::GET | Method::HEAD, "/") => (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "Ollama is running").into_response(),
        (Method::GET, "/api/tags") => axum::Json(json!({ "models": s.models().iter().map(|m| tag_entry(m)).collect::<Vec<_>>() })).into_response(),
        (Method::GET, "/api/ps") => ps(&s),
        (Method::GET, "/v1/models") => axum::Json(json!({
            "object": "list",
            // Ollama says `llama3.2:latest`; OpenAI-compatible servers name models without tags.
            "data": s.models().iter().map(|m| if s.spec.cloud { m.strip_suffix(":latest").unwrap_or(m) } else { m }).map(|m| json!({"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "library"})).collect::<Vec<_>>(),
        }))
        .into_response(),
        (Method::POST, "/api/show") => show(&s, &body),
        (Method::POST, "/api/chat") => inference(s, Kind::Chat, body).await,
        (Method::POST, "/api/generate") => inference(s, Kind::Generate, body).await,
        (Method::POST, "/v1/chat/completions") => inference(s, Kind::V1Chat, body).await,
        (Method::POST, "/v1/completions") => inference(s, Kind::V1Completion, body).await,
        (Method::POST, "/api/embed" | "/api/embeddings" | "/v1/embeddings") => embed(s, &path, body).await,
        (Method::POST, "/api/pull") => pull(s, &body).await,
        (Method::DELETE, "/api/delete") => match model {
            Some(m) if s.remove_model(&m) => StatusCode::OK.into_response(),
            Some(m) => native_error(StatusCode::NOT_FOUND, &format!("model '{m}' not found")),
            None => native_error(StatusCode::BAD_REQUEST, "model is required"),
        },
        (Method::POST, "/api/copy") => {
            let field = |k: &str| parsed.as_ref().and_then(|v| v.get(k)).and_then(Value::as_str).map(str::to_string);
            match (field("source"), field("destination")) {
                (Some(src), Some(dst)) if s.serves(&src) => {
                    s.add_model(&dst);
                    StatusCode::OK.into_response()
                }
                (Some(src), Some(_)) => native_error(StatusCode::NOT_FOUND, &format!("model '{src}' not found")),
                _ => native_error(StatusCode::BAD_REQUEST, "source and destination are required"),
            }
        }
        (Method::POST, "/api/create") => match model {
            Some(m) => {
                s.add_model(&m);
                let lines = ["{\"status\":\"reading model metadata\"}", "{\"status\":\"writing manifest\"}", "{\"status\":\"success\"}"];
                (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], lines.join("\n") + "\n").into_response()
            }
            None => native_error(StatusCode::BAD_REQUEST, "model is required"),
        },
        (Method::POST, "/api/push") => match model {
            Some(m) if s.serves(&m) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], "{\"status\":\"success\"}\n").into_response(),
            Some(m) => native_error(StatusCode::NOT_FOUND, &format!("model '{m}' not found")),
            None => native_error(StatusCode::BAD_REQUEST, "model is required"),
        },
        (Method::GET, "/_sim/faults") => axum::Json(s.faults().clone()).into_response(),
        (Method::POST | Method::PUT, "/_sim/faults") => match serde_json::from_slice::<Faults>(&body) {
            Ok(f) => {
                *s.faults() = f;
                StatusCode::NO_CONTENT.into_response()
            }
            Err(e) => native_error(StatusCode::BAD_REQUEST, &format!("bad faults: {e}")),
        },
        (Method::GET, "/_sim/received") => axum::Json(s.received.lock().unwrap_or_else(|p| p.into_inner()).clone()).into_response(),
        (Method::GET, "/_sim/stats") => axum::Json(json!({
            "running": s.running.load(Ordering::Acquire),
            "queued": s.queued.load(Ordering::Acquire),
            "completed": s.completed.load(Ordering::Acquire),
            "streaming": s.streaming.load(Ordering::Acquire),
            "cancelled": s.cancelled.load(Ordering::Acquire),
        }))
        .into_response(),
        (Method::POST, "/_sim/reset") => {
            *s.faults() = Faults::default();
            s.received.lock().unwrap_or_else(|p| p.into_inner()).clear();
            s.flapped_down.store(false, Ordering::Release);
            StatusCode::NO_CONTENT.into_response()
        }
        (Method::POST, "/_sim/down") => down(s, &body),
        _ => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain")], "404 page not found").into_response(),
    }
}

fn version(s: &Shared) -> Response {
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
        return native_error(StatusCode::INTERNAL_SERVER_ERROR, "simulated probe failure");
    }
    axum::Json(json!({ "version": s.spec.version })).into_response()
}

fn native_error(status: StatusCode, msg: &str) -> Response {
    (status, axum::Json(json!({ "error": msg }))).into_response()
}

/// OpenAI-shaped error, as Ollama's `/v1` middleware writes it.
fn v1_error(status: StatusCode, msg: &str) -> Response {
    let etype = match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::NOT_FOUND => "not_found_error",
        _ => "api_error",
    };
    (status, axum::Json(json!({ "error": { "message": msg, "type": etype, "param": null, "code": null } })))
        .into_response()
}

fn digest(model: &str) -> String {
    let mut r = text::SplitMix::new(text::hash(&[model]));
    (0..4).map(|_| format!("{:016x}", r.next_u64())).collect()
}

fn model_size(model: &str) -> u64 {
    if is_embedding_model(model) {
        274_302_450
    } else {
        2_019_393_189 + (text::hash(&[model]) % 1_000_000)
    }
}

fn is_embedding_model(model: &str) -> bool {
    model.contains("embed")
}

fn details(model: &str) -> Value {
    let family = if is_embedding_model(model) { "nomic-bert" } else { "llama" };
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": if is_embedding_model(model) { "137M" } else { "3.2B" },
        "quantization_level": if is_embedding_model(model) { "F16" } else { "Q4_K_M" },
    })
}

fn tag_entry(model: &str) -> Value {
    let name = crate::config::normalize_model(model);
    json!({
        "name": name,
        "model": name,
        "modified_at": "2026-10-01T12:00:00.000000000Z",
        "size": model_size(model),
        "digest": digest(&name),
        "details": details(model),
    })
}

fn ps(s: &Shared) -> Response {
    let loaded = s.loaded.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let expires = time::OffsetDateTime::now_utc() + time::Duration::minutes(5);
    let models: Vec<Value> = loaded
        .iter()
        .map(|m| {
            let size = model_size(m);
            json!({
                "name": m, "model": m, "size": size, "digest": digest(m), "details": details(m),
                "expires_at": rfc3339(expires), "size_vram": size, "context_length": 4096,
            })
        })
        .collect();
    axum::Json(json!({ "models": models })).into_response()
}

fn show(s: &Shared, body: &Bytes) -> Response {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return native_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let Some(model) = v.get("model").or_else(|| v.get("name")).and_then(Value::as_str) else {
        return native_error(StatusCode::BAD_REQUEST, "model is required");
    };
    if !s.serves(model) {
        return native_error(StatusCode::NOT_FOUND, &format!("model '{model}' not found"));
    }
    let caps = if is_embedding_model(model) { vec!["embedding"] } else { vec!["completion", "tools"] };
    axum::Json(json!({
        "license": "simulated model, no license",
        "modelfile": format!("# Modelfile generated by corral sim\nFROM {model}\n"),
        "parameters": "temperature 0.8\nnum_ctx 4096",
        "template": "{{ .Prompt }}",
        "details": details(model),
        "model_info": { "general.architecture": details(model)["family"], "general.parameter_count": 3_212_749_888u64, "llama.context_length": 131_072 },
        "capabilities": caps,
        "modified_at": "2026-10-01T12:00:00.000000000Z",
    }))
    .into_response()
}

/// A pull in Ollama's words: manifest, layer progress, verify, write, success. The model is on
/// the node afterwards. Progress lines come at the node's token pace, so bars move visibly.
async fn pull(s: Arc<Shared>, body: &Bytes) -> Response {
    let req = serde_json::from_slice::<Value>(body).ok();
    let model =
        req.as_ref().and_then(|v| v.get("model").or_else(|| v.get("name")).and_then(Value::as_str).map(str::to_string));
    let Some(model) = model else { return native_error(StatusCode::BAD_REQUEST, "model is required") };
    let stream = req.as_ref().and_then(|v| v.get("stream")).and_then(Value::as_bool).unwrap_or(true);
    let pace = {
        let f = s.faults();
        Pace::of(&s.spec, &f)
    };
    let total = model_size(&model);
    let d = digest(&model);
    let mut lines = vec![json!({"status": "pulling manifest"})];
    for step in 0..=10u64 {
        lines.push(json!({"status": format!("pulling {}", &d[..12]), "digest": format!("sha256:{d}"), "total": total, "completed": total * step / 10}));
    }
    lines.extend([
        json!({"status": "verifying sha256 digest"}),
        json!({"status": "writing manifest"}),
        json!({"status": "success"}),
    ]);
    if !stream {
        tokio::time::sleep(pace.per_token * lines.len() as u32).await;
        s.add_model(&model);
        return axum::Json(json!({"status": "success"})).into_response();
    }
    let state = (lines.into_iter(), s, model, pace.per_token, true);
    let body = futures_util::stream::unfold(state, |(mut it, s, model, delay, first)| async move {
        let line = it.next()?;
        if !first {
            tokio::time::sleep(delay).await;
        }
        if line["status"] == "success" {
            s.add_model(&model);
        }
        Some((Ok::<_, Infallible>(Bytes::from(format!("{line}\n"))), (it, s, model, delay, false)))
    });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    r
}

fn down(s: Arc<Shared>, body: &Bytes) -> Response {
    let for_ms = serde_json::from_slice::<Value>(body).ok().and_then(|v| v.get("for_ms").and_then(Value::as_u64));
    let Some(for_ms) = for_ms else {
        return native_error(StatusCode::BAD_REQUEST, "body must be {\"for_ms\": N}");
    };
    // Go down only once this answer has been handed to the connection: the stream's guard
    // fires when hyper drops the body after writing it.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = rx.await;
        super::stop(&s);
        tokio::time::sleep(Duration::from_millis(for_ms)).await;
        if let Err(e) = super::restart(&s).await {
            tracing::error!(addr = %s.addr, error = %e, "simulated node could not listen again");
        }
    });
    struct FireOnDrop(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for FireOnDrop {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    let guard = FireOnDrop(Some(tx));
    let msg = Bytes::from(format!("{{\"down_for_ms\":{for_ms}}}"));
    let stream = futures_util::stream::once(async move {
        let _keep = guard;
        Ok::<_, Infallible>(msg)
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn now() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// The last user message (or the prompt), which an echoing sim answers with.
fn last_user_text(kind: Kind, req: &Value) -> String {
    match kind {
        Kind::Chat | Kind::V1Chat => req
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|m| m.iter().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user")))
            .map(|m| prompt_text(kind, &json!({ "messages": [m] })))
            .unwrap_or_default(),
        Kind::Generate | Kind::V1Completion => req.get("prompt").and_then(Value::as_str).unwrap_or("").to_string(),
    }
}

fn echo_tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(3).map(|c| c.iter().collect()).collect()
}

/// Text of the prompt, for seeding and counting.
fn prompt_text(kind: Kind, req: &Value) -> String {
    match kind {
        Kind::Chat | Kind::V1Chat => req
            .get("messages")
            .and_then(Value::as_array)
            .map(|msgs| {
                msgs.iter()
                    .filter_map(|m| match m.get("content") {
                        Some(Value::String(s)) => Some(s.clone()),
                        Some(Value::Array(parts)) => Some(
                            parts
                                .iter()
                                .filter_map(|p| p.get("text").and_then(Value::as_str))
                                .collect::<Vec<_>>()
                                .join(" "),
                        ),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default(),
        Kind::Generate | Kind::V1Completion => {
            let system = req.get("system").and_then(Value::as_str).unwrap_or("");
            let prompt = req.get("prompt").and_then(Value::as_str).unwrap_or("");
            format!("{system}{prompt}")
        }
    }
}

/// Holds a generation slot; counts the request as running while alive.
struct Running {
    s: Arc<Shared>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.s.running.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Queued(Arc<Shared>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Ollama's scheduler in miniature: `parallel` at once, `max_queue` waiting, then busy.
async fn admit(s: &Arc<Shared>) -> Option<Running> {
    let waiting = s.queued.load(Ordering::Acquire) + s.running.load(Ordering::Acquire);
    if waiting >= s.spec.parallel + s.spec.max_queue {
        return None;
    }
    s.queued.fetch_add(1, Ordering::AcqRel);
    let q = Queued(Arc::clone(s));
    let permit = Arc::clone(&s.slots_arc()).acquire_owned().await.ok()?;
    drop(q);
    s.running.fetch_add(1, Ordering::AcqRel);
    Some(Running { s: Arc::clone(s), _permit: permit })
}

impl Shared {
    fn slots_arc(&self) -> Arc<tokio::sync::Semaphore> {
        Arc::clone(&self.slots)
    }

    /// Mark a model loaded; returns the simulated load time.
    fn load(&self, model: &str) -> Duration {
        let name = crate::config::normalize_model(model);
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.contains(&name) {
            Duration::from_millis(2)
        } else {
            loaded.push(name);
            Duration::from_millis(850)
        }
    }
}

/// Applies scripted statuses, flapping and hangs; `Some(response)` when a fault answers.
async fn fault_gate(s: &Shared, v1: bool) -> Result<Pace, Response> {
    let (status, pace, hang) = {
        let mut f = s.faults();
        (f.next_status(), Pace::of(&s.spec, &f), f.hang)
    };
    if let Some(code) = status.filter(|c| *c != 200) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let msg = if code == 503 { BUSY.to_string() } else { format!("simulated failure ({code})") };
        return Err(if v1 { v1_error(status, &msg) } else { native_error(status, &msg) });
    }
    if hang {
        std::future::pending::<()>().await;
    }
    Ok(pace)
}

fn options_i64(req: &Value, native: &str, v1: &str) -> Option<i64> {
    req.get("options")
        .and_then(|o| o.get(native))
        .and_then(Value::as_i64)
        .or_else(|| req.get(v1).and_then(Value::as_i64))
}

async fn inference(s: Arc<Shared>, kind: Kind, body: Bytes) -> Response {
    let err = |status: StatusCode, msg: &str| {
        if kind.is_v1() {
            v1_error(status, msg)
        } else {
            native_error(status, msg)
        }
    };
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return err(StatusCode::BAD_REQUEST, "request body must be a JSON object"),
        Err(e) if body.is_empty() => return err(StatusCode::BAD_REQUEST, &format!("missing request body: {e}")),
        Err(e) => return err(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let Some(model) = req.get("model").and_then(Value::as_str).map(str::to_string) else {
        return err(StatusCode::BAD_REQUEST, "model is required");
    };
    if !s.serves(&model) {
        return err(StatusCode::NOT_FOUND, &format!("model \"{model}\" not found, try pulling it first"));
    }
    if is_embedding_model(&model) {
        let what = if matches!(kind, Kind::Chat | Kind::V1Chat) { "chat" } else { "generate" };
        return err(StatusCode::BAD_REQUEST, &format!("\"{model}\" does not support {what}"));
    }
    let pace = match fault_gate(&s, kind.is_v1()).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Some(running) = admit(&s).await else {
        return err(StatusCode::SERVICE_UNAVAILABLE, BUSY);
    };
    let load = s.load(&model);
    // Ollama's preload: a native request with nothing to answer only loads the model.
    let nothing_to_say = match kind {
        Kind::Generate => req.get("prompt").and_then(Value::as_str).is_none_or(str::is_empty),
        Kind::Chat => req.get("messages").and_then(Value::as_array).is_none_or(|m| m.is_empty()),
        _ => false,
    };
    if nothing_to_say {
        let mut v = json!({ "model": model, "created_at": now(), "done": true, "done_reason": "load" });
        v[if kind == Kind::Chat { "message" } else { "response" }] =
            if kind == Kind::Chat { json!({"role": "assistant", "content": ""}) } else { json!("") };
        drop(running);
        return axum::Json(v).into_response();
    }
    let prompt = prompt_text(kind, &req);
    let seed = options_i64(&req, "seed", "seed").map(|x| x as u64).unwrap_or_else(|| text::hash(&[&model, &prompt]));
    let num_predict = options_i64(&req, "num_predict", "max_tokens")
        .or_else(|| options_i64(&req, "num_predict", "max_completion_tokens"));
    let completion = if s.spec.echo {
        text::Completion { tokens: echo_tokens(&last_user_text(kind, &req)), done_reason: "stop" }
    } else {
        text::complete(seed, num_predict)
    };
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(!kind.is_v1());
    let include_usage =
        req.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    let answer =
        Answer { kind, model, completion, prompt_tokens: text::count_tokens(&prompt), load, pace, id, include_usage };

    if !pace.ttft.is_zero() {
        tokio::time::sleep(pace.ttft).await;
    }
    if stream {
        let chunks = answer.stream_chunks();
        let content_type = if kind.is_v1() { "text/event-stream" } else { "application/x-ndjson" };
        let gen = Gen { s: Arc::clone(&s), chunks, sent: 0, pace, finished: false, _running: running };
        let body = Body::from_stream(futures_util::stream::unfold(gen, Gen::next));
        let mut r = Response::new(body);
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        r
    } else {
        if !pace.per_token.is_zero() {
            tokio::time::sleep(pace.per_token * answer.completion.tokens.len() as u32).await;
        }
        let whole = Bytes::from(answer.whole().to_string());
        let chunks: VecDeque<Chunk> = match pace.cut_after {
            // A cut in a non-streamed answer breaks the body in the middle.
            Some(_) => VecDeque::from([Chunk::Raw(whole.slice(..whole.len() / 2)), Chunk::Raw(Bytes::new())]),
            None => VecDeque::from([Chunk::Raw(whole)]),
        };
        let gen = Gen {
            s: Arc::clone(&s),
            chunks,
            sent: 0,
            pace: Pace { per_token: Duration::ZERO, cut_after: pace.cut_after.map(|_| 1), ..pace },
            finished: false,
            _running: running,
        };
        let mut r = Response::new(Body::from_stream(futures_util::stream::unfold(gen, Gen::next)));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
        r
    }
}

struct Answer {
    kind: Kind,
    model: String,
    completion: Completion,
    prompt_tokens: usize,
    load: Duration,
    pace: Pace,
    id: usize,
    include_usage: bool,
}

impl Answer {
    fn stats(&self) -> Value {
        let n = self.completion.tokens.len() as u64;
        let eval = (self.pace.per_token * n as u32).as_nanos() as u64 + n * 1_000;
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

    fn finish_reason(&self) -> &'static str {
        self.completion.done_reason
    }

    fn usage(&self) -> Value {
        let n = self.completion.tokens.len();
        json!({ "prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n })
    }

    fn created(&self) -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
    }

    fn native_final(&self, content: &str) -> Value {
        let mut v = match self.kind {
            Kind::Chat => {
                json!({ "model": self.model, "created_at": now(), "message": { "role": "assistant", "content": content }, "done_reason": self.finish_reason(), "done": true })
            }
            _ => {
                json!({ "model": self.model, "created_at": now(), "response": content, "done": true, "done_reason": self.finish_reason(), "context": [1, 2, 3] })
            }
        };
        if let (Some(obj), Value::Object(stats)) = (v.as_object_mut(), self.stats()) {
            obj.extend(stats);
        }
        v
    }

    fn v1_id(&self) -> String {
        match self.kind {
            Kind::V1Chat => format!("chatcmpl-{}", self.id),
            _ => format!("cmpl-{}", self.id),
        }
    }

    /// The whole answer as one JSON (`"stream": false`).
    fn whole(&self) -> Value {
        let text: String = self.completion.tokens.concat();
        match self.kind {
            Kind::Chat | Kind::Generate => self.native_final(&text),
            Kind::V1Chat => json!({
                "id": self.v1_id(), "object": "chat.completion", "created": self.created(), "model": self.model,
                "system_fingerprint": "fp_ollama",
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": self.finish_reason() }],
                "usage": self.usage(),
            }),
            Kind::V1Completion => json!({
                "id": self.v1_id(), "object": "text_completion", "created": self.created(), "model": self.model,
                "system_fingerprint": "fp_ollama",
                "choices": [{ "text": text, "index": 0, "finish_reason": self.finish_reason() }],
                "usage": self.usage(),
            }),
        }
    }

    /// Every chunk of the streamed answer: NDJSON lines (stamped when sent) or SSE events.
    fn stream_chunks(&self) -> VecDeque<Chunk> {
        let mut out = VecDeque::new();
        let line = Chunk::Line;
        let event = |v: Value| Chunk::Raw(Bytes::from(format!("data: {v}\n\n")));
        let created = self.created();
        for tok in &self.completion.tokens {
            out.push_back(match self.kind {
                Kind::Chat => line(json!({ "model": self.model, "created_at": "", "message": { "role": "assistant", "content": tok }, "done": false })),
                Kind::Generate => line(json!({ "model": self.model, "created_at": "", "response": tok, "done": false })),
                Kind::V1Chat => event(json!({ "id": self.v1_id(), "object": "chat.completion.chunk", "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [{ "index": 0, "delta": { "role": "assistant", "content": tok }, "finish_reason": null }] })),
                Kind::V1Completion => event(json!({ "id": self.v1_id(), "object": "text_completion", "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [{ "text": tok, "index": 0, "finish_reason": null }] })),
            });
        }
        match self.kind {
            Kind::Chat | Kind::Generate => out.push_back(line(self.native_final(""))),
            Kind::V1Chat | Kind::V1Completion => {
                let choice = if self.kind == Kind::V1Chat {
                    json!({ "index": 0, "delta": { "role": "assistant", "content": "" }, "finish_reason": self.finish_reason() })
                } else {
                    json!({ "text": "", "index": 0, "finish_reason": self.finish_reason() })
                };
                let object = if self.kind == Kind::V1Chat { "chat.completion.chunk" } else { "text_completion" };
                out.push_back(event(json!({ "id": self.v1_id(), "object": object, "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [choice] })));
                if self.include_usage {
                    out.push_back(event(json!({ "id": self.v1_id(), "object": object, "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [], "usage": self.usage() })));
                }
                out.push_back(Chunk::Raw(Bytes::from_static(b"data: [DONE]\n\n")));
            }
        }
        out
    }
}

/// One piece of a streamed answer.
enum Chunk {
    /// An NDJSON object whose `created_at` is set when it is sent, as Ollama does.
    Line(Value),
    Raw(Bytes),
}

impl Chunk {
    fn into_bytes(self) -> Bytes {
        match self {
            Chunk::Line(mut v) => {
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("created_at".into(), Value::String(now()));
                }
                Bytes::from(format!("{v}\n"))
            }
            Chunk::Raw(b) => b,
        }
    }
}

/// A generation in progress: yields chunks at the node's pace, honours cut and hang faults,
/// and counts itself cancelled if dropped before the end.
struct Gen {
    s: Arc<Shared>,
    chunks: VecDeque<Chunk>,
    sent: usize,
    pace: Pace,
    finished: bool,
    _running: Running,
}

impl Gen {
    async fn next(mut self) -> Option<(Result<Bytes, std::io::Error>, Gen)> {
        if self.finished {
            return None;
        }
        if self.pace.cut_after == Some(self.sent) {
            // Let the connection flush what was sent before breaking it, so "cut after N"
            // means N chunks arrive.
            tokio::task::yield_now().await;
            self.finished = true;
            return Some((Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "simulated cut")), self));
        }
        if self.pace.hang_after == Some(self.sent) {
            std::future::pending::<()>().await;
        }
        let Some(chunk) = self.chunks.pop_front() else {
            self.finished = true;
            self.s.completed.fetch_add(1, Ordering::AcqRel);
            return None;
        };
        // Tokens after the first come at the node's rate; the final chunk follows the last token.
        // (A zero-length sleep still waits for the timer's next millisecond tick.)
        if self.sent > 0 && !self.chunks.is_empty() && !self.pace.per_token.is_zero() {
            tokio::time::sleep(self.pace.per_token).await;
        }
        self.sent += 1;
        if self.sent == 1 {
            self.s.streaming.fetch_add(1, Ordering::AcqRel);
        }
        Some((Ok(chunk.into_bytes()), self))
    }
}

impl Drop for Gen {
    fn drop(&mut self) {
        if !self.finished {
            self.s.cancelled.fetch_add(1, Ordering::AcqRel);
        }
        if self.sent > 0 {
            self.s.streaming.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

async fn embed(s: Arc<Shared>, path: &str, body: Bytes) -> Response {
    let v1 = path.starts_with("/v1");
    let err = |status: StatusCode, msg: &str| {
        if v1 {
            v1_error(status, msg)
        } else {
            native_error(status, msg)
        }
    };
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return err(StatusCode::BAD_REQUEST, "request body must be a JSON object"),
        Err(e) => return err(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let Some(model) = req.get("model").and_then(Value::as_str).map(str::to_string) else {
        return err(StatusCode::BAD_REQUEST, "model is required");
    };
    if !s.serves(&model) {
        return err(StatusCode::NOT_FOUND, &format!("model \"{model}\" not found, try pulling it first"));
    }
    let pace = match fault_gate(&s, v1).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Some(_running) = admit(&s).await else {
        return err(StatusCode::SERVICE_UNAVAILABLE, BUSY);
    };
    let load = s.load(&model);
    if !pace.ttft.is_zero() {
        tokio::time::sleep(pace.ttft).await;
    }
    let inputs: Vec<String> = match req.get(if path == "/api/embeddings" { "prompt" } else { "input" }) {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => return err(StatusCode::BAD_REQUEST, "invalid input type"),
    };
    let dims = s.spec.embedding_dims;
    let vectors: Vec<Vec<f32>> = inputs.iter().map(|t| text::embedding(&model, t, dims)).collect();
    let tokens: usize = inputs.iter().map(|t| text::count_tokens(t)).sum();
    s.completed.fetch_add(1, Ordering::AcqRel);
    let body = match path {
        "/api/embeddings" => json!({ "embedding": vectors.first().cloned().unwrap_or_default() }),
        "/api/embed" => json!({
            "model": model, "embeddings": vectors,
            "total_duration": load.as_nanos() as u64 + 1_000_000, "load_duration": load.as_nanos() as u64, "prompt_eval_count": tokens,
        }),
        _ => json!({
            "object": "list",
            "data": vectors.iter().enumerate().map(|(i, e)| json!({ "object": "embedding", "embedding": e, "index": i })).collect::<Vec<_>>(),
            "model": model,
            "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
        }),
    };
    axum::Json(body).into_response()
}
