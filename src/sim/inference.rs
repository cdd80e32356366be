//! Simulated inference, shared by the Ollama and OpenAI dialects: request checks, faults,
//! admission, pacing and the generation stream; the dialects only word the answer.
//!
//! Admission mirrors Ollama's scheduler: `parallel` requests run at once, up to `max_queue` more
//! wait, and past that the node answers 503 "server busy". A generation yields its chunks at the
//! node's pace (time to first token, then one token per interval), honours cut and hang faults,
//! and counts itself cancelled if the client drops it before the end, as Ollama stops
//! generating then. Text is deterministic for a seed (`text`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::ollama::{self, is_embedding_model};
use super::openai;
use super::text::{self, Completion};
use super::{Pace, Shared};

const BUSY: &str = "server busy, please try again.  maximum pending requests exceeded";

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
pub(super) enum Kind {
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

/// An error in the request's dialect.
fn error(v1: bool, status: StatusCode, msg: &str) -> Response {
    if v1 {
        openai::error(status, msg)
    } else {
        ollama::error(status, msg)
    }
}

/// Chat, generate, and their `/v1` twins: check, pass the fault gate, wait for a slot, answer.
pub(super) async fn inference(s: Arc<Shared>, kind: Kind, body: Bytes) -> Response {
    let (req, model) = match check(&s, kind, &body) {
        Ok(checked) => checked,
        Err((status, msg)) => return error(kind.is_v1(), status, &msg),
    };
    let pace = match fault_gate(&s, kind.is_v1()).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Some(running) = admit(&s).await else {
        return error(kind.is_v1(), StatusCode::SERVICE_UNAVAILABLE, BUSY);
    };
    let keep = keep_alive(&req);
    let load = s.load(&model, keep);
    if s.spec.load_ms > 0 && load >= Duration::from_millis(s.spec.load_ms) {
        tokio::time::sleep(load).await;
    }
    // Ollama's preload: a native request with nothing to answer only loads the model, or, with
    // `keep_alive: 0`, unloads it.
    let nothing_to_say = match kind {
        Kind::Generate => req.get("prompt").and_then(Value::as_str).is_none_or(str::is_empty),
        Kind::Chat => req.get("messages").and_then(Value::as_array).is_none_or(|m| m.is_empty()),
        _ => false,
    };
    if nothing_to_say {
        drop(running);
        return ollama::preloaded(kind, &model, keep == Some(KeepAlive::For(Duration::ZERO)));
    }
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(!kind.is_v1());
    let answer = Answer::new(&s, kind, model, &req, load, pace);
    if !pace.ttft.is_zero() {
        tokio::time::sleep(pace.ttft).await;
    }
    if stream {
        streamed(s, &answer, running)
    } else {
        whole(s, &answer, running).await
    }
}

/// The request as JSON and the model it names, or the status and sentence Ollama would answer.
fn check(s: &Shared, kind: Kind, body: &Bytes) -> Result<(Value, String), (StatusCode, String)> {
    let req: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return Err((StatusCode::BAD_REQUEST, "request body must be a JSON object".into())),
        Err(e) if body.is_empty() => return Err((StatusCode::BAD_REQUEST, format!("missing request body: {e}"))),
        Err(e) => return Err((StatusCode::BAD_REQUEST, e.to_string())),
    };
    if let Some(why) = misshapen(kind, &req) {
        return Err((StatusCode::BAD_REQUEST, why));
    }
    let Some(model) = req.get("model").and_then(Value::as_str).map(str::to_string) else {
        return Err((StatusCode::BAD_REQUEST, "model is required".into()));
    };
    if !s.serves(&model) {
        return Err((StatusCode::NOT_FOUND, format!("model \"{model}\" not found, try pulling it first")));
    }
    if let Some(msg) = bad_format(kind, &req) {
        // Ollama finds out when the runner is asked, so it is a 500, not a 400.
        return Err((StatusCode::INTERNAL_SERVER_ERROR, msg));
    }
    if is_embedding_model(&model) {
        let what = if matches!(kind, Kind::Chat | Kind::V1Chat) { "chat" } else { "generate" };
        return Err((StatusCode::BAD_REQUEST, format!("\"{model}\" does not support {what}")));
    }
    Ok((req, model))
}

/// What Ollama's JSON binding (gin's `ShouldBindJSON` into `api.ChatRequest`,
/// `api.GenerateRequest`, or its openai layer's `ChatCompletionRequest`) says of a body whose
/// `messages` or `prompt` has the wrong type, and the openai layer's check for no messages.
fn misshapen(kind: Kind, req: &Value) -> Option<String> {
    let go_type = |v: &Value| match v {
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::Null => "null",
    };
    let unmarshal = |field: &str, v: &Value, go_struct: &str, want: &str| {
        Some(format!("json: cannot unmarshal {} into Go struct field {go_struct}.{field} of type {want}", go_type(v)))
    };
    match (kind, req.get("messages"), req.get("prompt")) {
        (Kind::Chat, Some(m @ (Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Object(_))), _) => {
            unmarshal("messages", m, "ChatRequest", "[]api.Message")
        }
        (Kind::V1Chat, Some(m @ (Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Object(_))), _) => {
            unmarshal("messages", m, "ChatCompletionRequest", "[]openai.Message")
        }
        (Kind::V1Chat, None | Some(Value::Null), _) => Some("[] is too short - 'messages'".into()),
        (Kind::V1Chat, Some(Value::Array(m)), _) if m.is_empty() => Some("[] is too short - 'messages'".into()),
        (Kind::Generate, _, Some(p @ (Value::Number(_) | Value::Bool(_) | Value::Object(_) | Value::Array(_)))) => {
            unmarshal("prompt", p, "GenerateRequest", "string")
        }
        _ => None,
    }
}

/// `"stream": true`: NDJSON lines (native) or SSE events (`/v1`), one per token.
fn streamed(s: Arc<Shared>, answer: &Answer, running: Running) -> Response {
    let pace = answer.pace;
    let chunks = answer.stream_chunks();
    let content_type = if answer.kind.is_v1() { "text/event-stream" } else { "application/x-ndjson" };
    let gen = Gen { s, chunks, sent: 0, pace, finished: false, _running: running };
    let body = Body::from_stream(futures_util::stream::unfold(gen, Gen::next));
    let mut r = Response::new(body);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// `"stream": false`: the whole answer after the time all its tokens take.
async fn whole(s: Arc<Shared>, answer: &Answer, running: Running) -> Response {
    let pace = answer.pace;
    if !pace.per_token.is_zero() {
        tokio::time::sleep(pace.per_token * answer.completion.tokens.len() as u32).await;
    }
    // Ollama writes its own API with gin's `c.JSON`, its OpenAI layer with `json.Encoder`
    // (a newline after, and no charset in the type).
    let v1 = matches!(answer.kind, Kind::V1Chat | Kind::V1Completion);
    let (content_type, end) = if v1 { ("application/json", "\n") } else { ("application/json; charset=utf-8", "") };
    let whole = Bytes::from(answer.whole().to_string() + end);
    let chunks: VecDeque<Chunk> = match pace.cut_after {
        // A cut in a non-streamed answer breaks the body in the middle.
        Some(_) => VecDeque::from([Chunk::Raw(whole.slice(..whole.len() / 2)), Chunk::Raw(Bytes::new())]),
        None => VecDeque::from([Chunk::Raw(whole)]),
    };
    let gen = Gen {
        s,
        chunks,
        sent: 0,
        pace: Pace { per_token: Duration::ZERO, cut_after: pace.cut_after.map(|_| 1), ..pace },
        finished: false,
        _running: running,
    };
    let mut r = Response::new(Body::from_stream(futures_util::stream::unfold(gen, Gen::next)));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// One generated answer, before a dialect words it (`ollama.rs`, `openai.rs`).
pub(super) struct Answer {
    pub(super) kind: Kind,
    pub(super) model: String,
    pub(super) completion: Completion,
    pub(super) prompt_tokens: usize,
    pub(super) load: Duration,
    pub(super) pace: Pace,
    pub(super) id: usize,
    pub(super) include_usage: bool,
    /// Reasoning text, when the request asked to think.
    pub(super) thinking: Option<String>,
    /// A call to the request's first tool (name, arguments), answered instead of words.
    pub(super) tool_call: Option<(String, Value)>,
}

impl Answer {
    fn new(s: &Shared, kind: Kind, model: String, req: &Value, load: Duration, pace: Pace) -> Self {
        let prompt = prompt_text(kind, req);
        let seed = options_i64(req, "seed", "seed").map(|x| x as u64).unwrap_or_else(|| text::hash(&[&model, &prompt]));
        let num_predict = options_i64(req, "num_predict", "max_tokens")
            .or_else(|| options_i64(req, "num_predict", "max_completion_tokens"));
        let (thinking, tool_call) = scripted(kind, req, seed);
        let completion = if tool_call.is_some() {
            text::Completion { tokens: vec![], done_reason: "stop" }
        } else if let Some(schema) = wanted_json(kind, req) {
            let words = text::complete(seed, Some(6)).tokens.concat();
            json_tokens(&json_answer(schema, words.trim(), 0), num_predict)
        } else if s.spec.echo {
            text::Completion { tokens: echo_tokens(&last_user_text(kind, req)), done_reason: "stop" }
        } else {
            let full = text::complete(seed, num_predict);
            match prefill(kind, req) {
                Some(had) => continued(full, &had),
                None => full,
            }
        };
        let include_usage =
            req.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let prompt_tokens = text::count_tokens(&prompt);
        Answer { kind, model, completion, prompt_tokens, load, pace, id, include_usage, thinking, tool_call }
    }

    pub(super) fn finish_reason(&self) -> &'static str {
        self.completion.done_reason
    }

    /// The whole answer as one JSON (`"stream": false`).
    fn whole(&self) -> Value {
        let text: String = self.completion.tokens.concat();
        match self.kind {
            Kind::Chat | Kind::Generate => self.native_final(&text, true),
            Kind::V1Chat | Kind::V1Completion => self.v1_whole(&text),
        }
    }

    /// Every chunk of the streamed answer: NDJSON lines (stamped when sent) or SSE events.
    fn stream_chunks(&self) -> VecDeque<Chunk> {
        match self.kind {
            Kind::Chat | Kind::Generate => self.native_chunks(),
            Kind::V1Chat | Kind::V1Completion => self.v1_chunks(),
        }
    }
}

/// One piece of a streamed answer.
pub(super) enum Chunk {
    /// An NDJSON object whose `created_at` is set when it is sent, as Ollama does.
    Line(Value),
    Raw(Bytes),
}

impl Chunk {
    fn into_bytes(self) -> Bytes {
        match self {
            Chunk::Line(mut v) => {
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("created_at".into(), Value::String(ollama::now()));
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

/// Embeddings for `/api/embed`, `/api/embeddings` and `/v1/embeddings`, through the same
/// faults and admission as generation.
pub(super) async fn embed(s: Arc<Shared>, path: &str, body: Bytes) -> Response {
    let v1 = path.starts_with("/v1");
    let err = |status: StatusCode, msg: &str| error(v1, status, msg);
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
    let load = s.load(&model, keep_alive(&req));
    if !pace.ttft.is_zero() {
        tokio::time::sleep(pace.ttft).await;
    }
    let inputs: Vec<String> = match req.get(if path == "/api/embeddings" { "prompt" } else { "input" }) {
        // Ollama's EmbedHandler: an empty string, an empty list or no input at all embed nothing.
        Some(Value::String(t)) if t.is_empty() => vec![],
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        None if path == "/api/embed" => vec![],
        _ => return err(StatusCode::BAD_REQUEST, "invalid input type"),
    };
    if path == "/api/embed" && inputs.is_empty() {
        return axum::Json(json!({ "model": model, "embeddings": [] })).into_response();
    }
    // `truncate: false` refuses an input longer than the context instead of cutting it.
    if req.get("truncate") == Some(&Value::Bool(false)) && inputs.iter().any(|t| text::count_tokens(t) > EMBED_CTX) {
        return err(StatusCode::BAD_REQUEST, "the input length exceeds the context length");
    }
    let dims = match req.get("dimensions").and_then(Value::as_u64) {
        Some(d) if d > 0 && (d as usize) < s.spec.embedding_dims => d as usize,
        _ => s.spec.embedding_dims,
    };
    let vectors: Vec<Vec<f32>> =
        inputs.iter().map(|t| text::embedding(&model, t, s.spec.embedding_dims)).map(|v| cut(v, dims)).collect();
    let tokens: usize = inputs.iter().map(|t| text::count_tokens(t)).sum();
    s.completed.fetch_add(1, Ordering::AcqRel);
    let body = match path {
        "/api/embeddings" | "/api/embed" => ollama::embeddings(path, &model, &vectors, load, tokens),
        _ => openai::embeddings(&model, &vectors, tokens),
    };
    axum::Json(body).into_response()
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

/// The text of a trailing assistant message (a prefill), which Ollama continues.
fn prefill(kind: Kind, req: &Value) -> Option<String> {
    if !matches!(kind, Kind::Chat | Kind::V1Chat) {
        return None;
    }
    let last = req.get("messages")?.as_array()?.last()?;
    (last.get("role")?.as_str()? == "assistant").then(|| last.get("content")?.as_str().map(str::to_string))?
}

/// Whether a chat body ends with an assistant message.
pub(super) fn ends_with_assistant(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).ok().is_some_and(|v| prefill(Kind::Chat, &v).is_some())
}

/// `full` without the tokens the prefill `had` already: the answer goes on from there, so a
/// continued answer joined to its first part is the answer an uncut node gives.
fn continued(full: text::Completion, had: &str) -> text::Completion {
    let mut said = String::new();
    let mut skip = 0;
    for tok in &full.tokens {
        if had.starts_with(&format!("{said}{tok}")) {
            said.push_str(tok);
            skip += 1;
        } else {
            break;
        }
    }
    text::Completion { tokens: full.tokens[skip..].to_vec(), done_reason: full.done_reason }
}

/// Text of the prompt, for seeding and counting. A trailing assistant message is the answer
/// being continued, not part of the prompt.
fn prompt_text(kind: Kind, req: &Value) -> String {
    match kind {
        Kind::Chat | Kind::V1Chat => req
            .get("messages")
            .and_then(Value::as_array)
            .map(|msgs| {
                let msgs = match prefill(kind, req) {
                    Some(_) => &msgs[..msgs.len() - 1],
                    None => &msgs[..],
                };
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
    let queued = s.queued.fetch_add(1, Ordering::AcqRel) + 1;
    s.peak.fetch_max(queued + s.running.load(Ordering::Acquire), Ordering::AcqRel);
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

    /// Mark a model loaded until `keep_alive` runs out; returns the simulated load time.
    fn load(&self, model: &str, keep: Option<KeepAlive>) -> Duration {
        let name = crate::config::normalize_model(model);
        let until = match keep.unwrap_or(KeepAlive::For(Duration::from_secs(300))) {
            KeepAlive::For(d) => time::OffsetDateTime::now_utc() + d,
            // Go's `time.Now().Add(math.MaxInt64)`: about 292 years on.
            KeepAlive::Forever => time::OffsetDateTime::now_utc() + time::Duration::days(292 * 365),
        };
        self.expires.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), until);
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.contains(&name) {
            Duration::from_micros(100)
        } else {
            loaded.push(name);
            // Never zero: a cold load always shows in `load_duration`.
            Duration::from_millis(self.spec.load_ms).max(Duration::from_millis(1))
        }
    }
}

/// Applies scripted statuses, flapping and hangs; `Some(response)` when a fault answers.
async fn fault_gate(s: &Shared, v1: bool) -> Result<Pace, Response> {
    let (step, pace, hang, text) = {
        let mut f = s.faults();
        (f.next_step(), Pace::of(&s.spec, &f), f.hang, f.script_error.clone())
    };
    if let Some(step) = step.filter(|st| st.status != 200) {
        let code = step.status;
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = match (step.error, v1) {
            (Some(e), true) => openai::error_with(status, &e.message, e.kind.as_deref(), e.code.as_deref()),
            (Some(e), false) => ollama::error(status, &e.message),
            (None, _) => {
                let msg = match text {
                    Some(t) => t,
                    None if code == 503 => BUSY.to_string(),
                    None => format!("simulated failure ({code})"),
                };
                error(v1, status, &msg)
            }
        };
        if let Some(secs) = step.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        return Err(r);
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

/// The context length the sim's embedding models claim (nomic-embed-text's).
const EMBED_CTX: usize = 2048;

/// The first `dims` numbers of a vector, normalised again (Ollama's `dimensions`).
fn cut(mut v: Vec<f32>, dims: usize) -> Vec<f32> {
    if dims >= v.len() {
        return v;
    }
    v.truncate(dims);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::EPSILON);
    v.into_iter().map(|x| x / norm).collect()
}

/// How long a model stays loaded after a request (`keep_alive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeepAlive {
    For(Duration),
    /// A negative duration: never unload.
    Forever,
}

/// `keep_alive` as Ollama's `api.Duration` reads it: a number of seconds or a Go duration
/// string ("5m", "1h30m", "10s"); negative means forever. Anything else: the default.
pub(super) fn keep_alive(req: &Value) -> Option<KeepAlive> {
    let secs = match req.get("keep_alive")? {
        Value::Number(n) => n.as_f64()?,
        Value::String(t) => go_duration(t)?,
        _ => return None,
    };
    Some(if secs < 0.0 { KeepAlive::Forever } else { KeepAlive::For(Duration::from_secs_f64(secs)) })
}

/// Seconds in a Go duration string ("1h30m", "-1s", "250ms", "0").
fn go_duration(t: &str) -> Option<f64> {
    let (sign, mut rest) = match t.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, t),
    };
    if rest == "0" {
        return Some(0.0);
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        total += n * match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit..];
    }
    Some(sign * total)
}

/// Ollama's answer to a `format` that is neither "json" nor a JSON Schema object.
fn bad_format(kind: Kind, req: &Value) -> Option<String> {
    if kind.is_v1() {
        return None;
    }
    match req.get("format")? {
        Value::Null | Value::Object(_) => None,
        Value::String(f) if f.is_empty() || f == "json" => None,
        other => {
            let raw = other.to_string();
            Some(format!("invalid format: {}; expected \"json\" or a valid JSON Schema object", Value::String(raw)))
        }
    }
}

/// What a request scripts beyond words: `thinking` text when it asks to think, and a call to
/// its first tool when it offers tools and is not answering a tool's result.
pub(super) fn scripted(kind: Kind, req: &Value, seed: u64) -> (Option<String>, Option<(String, Value)>) {
    let think = match kind {
        Kind::V1Chat | Kind::V1Completion => req
            .get("reasoning_effort")
            .or_else(|| req.get("reasoning").and_then(|r| r.get("effort")))
            .and_then(Value::as_str)
            .is_some_and(|e| e != "none"),
        _ => match req.get("think") {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(level)) => matches!(level.as_str(), "high" | "medium" | "low"),
            _ => false,
        },
    };
    let thinking = think.then(|| {
        format!("Let me think this through. {}", text::complete(seed ^ 0x7417, Some(8)).tokens.concat().trim())
    });
    let last_is_tool = req
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("tool"));
    let tool = match (kind, last_is_tool) {
        (Kind::Chat | Kind::V1Chat, false) => {
            req.get("tools").and_then(Value::as_array).and_then(|t| t.first()).and_then(tool_call)
        }
        _ => None,
    };
    (thinking, tool)
}

/// A call to `tool` with arguments from its parameters: "sim" for strings, 1 for numbers,
/// true for booleans, the first value of an enum.
fn tool_call(tool: &Value) -> Option<(String, Value)> {
    let f = tool.get("function")?;
    let name = f.get("name")?.as_str()?.to_string();
    let mut args = serde_json::Map::new();
    for (k, p) in f.get("parameters").and_then(|p| p.get("properties")).and_then(Value::as_object).into_iter().flatten()
    {
        let v = match (p.get("enum").and_then(|e| e.get(0)), p.get("type").and_then(Value::as_str)) {
            (Some(first), _) => first.clone(),
            (None, Some("integer" | "number")) => json!(1),
            (None, Some("boolean")) => json!(true),
            (None, Some("array")) => json!([]),
            (None, Some("object")) => json!({}),
            _ => json!("sim"),
        };
        args.insert(k.clone(), v);
    }
    Some((name, Value::Object(args)))
}

/// The JSON a request asks the answer to be (Ollama's `format`: `"json"` or a JSON Schema;
/// OpenAI's `response_format`: `json_object`, or `json_schema` with its `schema`, which Ollama's
/// `/v1` layer turns into `format`): `Some(None)` for any JSON object, `Some(Some(schema))` for
/// one the schema describes, `None` for free text.
fn wanted_json(kind: Kind, req: &Value) -> Option<Option<&Value>> {
    if kind.is_v1() {
        let f = req.get("response_format")?;
        return match f.get("type").and_then(Value::as_str)? {
            "json_object" => Some(None),
            "json_schema" => Some(f.get("json_schema").and_then(|j| j.get("schema"))),
            _ => None,
        };
    }
    match req.get("format")? {
        Value::String(f) if f == "json" => Some(None),
        schema @ Value::Object(_) => Some(Some(schema)),
        _ => None,
    }
}

/// A value `schema` describes, its strings made of `words`: the first of an `enum` or
/// `anyOf`/`oneOf`, 1 for numbers, true for booleans, every property of an object, one item
/// of an array (as many as `minItems` asks, up to 3). Without a schema, `{"response": words}`.
/// Nesting deeper than 8 (or a schema that refers to itself) ends in `null`.
fn json_answer(schema: Option<&Value>, words: &str, depth: usize) -> Value {
    let Some(schema) = schema else { return json!({ "response": words }) };
    if depth > 8 {
        return Value::Null;
    }
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)).or_else(|| schema.get("const")) {
        return first.clone();
    }
    if let Some(first) = ["anyOf", "oneOf"].iter().find_map(|k| schema.get(*k).and_then(|a| a.get(0))) {
        return json_answer(Some(first), words, depth + 1);
    }
    let kind = match schema.get("type") {
        Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        Some(t) => t.as_str(),
        None if schema.get("properties").is_some() => Some("object"),
        None => None,
    };
    match kind {
        Some("object") => {
            let props = schema.get("properties").and_then(Value::as_object);
            let fields = props.into_iter().flatten().map(|(k, p)| (k.clone(), json_answer(Some(p), words, depth + 1)));
            Value::Object(fields.collect())
        }
        Some("array") => {
            let n = schema.get("minItems").and_then(Value::as_u64).unwrap_or(1).clamp(1, 3) as usize;
            Value::Array(vec![json_answer(schema.get("items"), words, depth + 1); n])
        }
        Some("integer" | "number") => json!(1),
        Some("boolean") => json!(true),
        Some("null") => Value::Null,
        _ => Value::String(words.to_string()),
    }
}

/// `value`'s JSON text as a model streams it: a token per word or punctuation run, which joined
/// give the text back exactly. Cut at `num_predict` tokens (`done_reason: "length"`), as a
/// constrained answer that runs out of tokens is cut, mid-JSON.
fn json_tokens(value: &Value, num_predict: Option<i64>) -> text::Completion {
    let text = value.to_string();
    let mut tokens: Vec<String> = text.split_inclusive([' ', ',', ':']).map(str::to_string).collect();
    match num_predict.and_then(|n| usize::try_from(n).ok()).filter(|&n| n < tokens.len()) {
        Some(n) => {
            tokens.truncate(n);
            text::Completion { tokens, done_reason: "length" }
        }
        None => text::Completion { tokens, done_reason: "stop" },
    }
}
