//! Ollama's native API <-> OpenAI-compatible Chat Completions, both ways, streaming included.
//!
//! Used for `kind = "openai"` nodes (llama.cpp server, vLLM, LM Studio) and for cloud providers,
//! so an Ollama client gets Ollama answers whatever answered it. Requests: `/api/chat`,
//! `/api/generate` become `/chat/completions`; `/api/embed`, `/api/embeddings` become
//! `/embeddings`. Answers come back in the shape the client asked for: one JSON document, or
//! NDJSON lines translated event by event from the upstream's SSE as they arrive (never
//! buffered whole), ending with Ollama's `done: true` line carrying the token counts.
//!
//! `/v1/*` requests need no translation; `Reply::passthrough` still parses their answers when
//! placeholders from redaction must be restored.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::redact::Restorer;

/// An Ollama endpoint that can be served by an OpenAI-compatible upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Native {
    Chat,
    Generate,
    Embed,
    /// The older single-prompt `/api/embeddings`.
    Embeddings,
}

impl Native {
    pub fn of(path: &str) -> Option<Self> {
        Some(match path {
            "/api/chat" => Self::Chat,
            "/api/generate" => Self::Generate,
            "/api/embed" => Self::Embed,
            "/api/embeddings" => Self::Embeddings,
            _ => return None,
        })
    }

    /// Path under the upstream's `/v1` base.
    pub fn upstream_path(self) -> &'static str {
        match self {
            Self::Chat | Self::Generate => "/chat/completions",
            Self::Embed | Self::Embeddings => "/embeddings",
        }
    }
}

/// Who will read the translated request: local servers take llama.cpp's extra sampling
/// options; cloud APIs reject fields they do not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    Node,
    Cloud,
}

/// The request as the upstream takes it, and what is needed to translate its answer.
#[derive(Debug, Clone)]
pub struct Translated {
    pub body: Value,
    pub stream: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TranslateError(pub String);

fn bad(msg: impl Into<String>) -> TranslateError {
    TranslateError(msg.into())
}

/// Translate an Ollama request body for `api` into the OpenAI-compatible request, naming
/// `upstream_model`.
pub fn request(
    api: Native,
    req: &Value,
    upstream_model: &str,
    audience: Audience,
) -> Result<Translated, TranslateError> {
    let obj = req.as_object().ok_or_else(|| bad("the body must be a JSON object"))?;
    match api {
        Native::Embed | Native::Embeddings => {
            let input = match api {
                Native::Embed => obj.get("input").cloned().ok_or_else(|| bad("\"input\" is required"))?,
                _ => obj.get("prompt").cloned().ok_or_else(|| bad("\"prompt\" is required"))?,
            };
            if !(input.is_string() || input.as_array().is_some_and(|a| a.iter().all(Value::is_string))) {
                return Err(bad("\"input\" must be a string or a list of strings"));
            }
            let mut body = json!({ "model": upstream_model, "input": input });
            if let Some(d) = obj.get("dimensions").filter(|d| d.is_u64()) {
                body["dimensions"] = d.clone();
            }
            Ok(Translated { body, stream: false })
        }
        Native::Chat | Native::Generate => {
            refuse_unmappable(obj)?;
            let messages = match api {
                Native::Chat => chat_messages(obj.get("messages"))?,
                _ => generate_messages(obj)?,
            };
            // Ollama streams unless told not to.
            let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(true);
            let mut body = Map::new();
            body.insert("model".into(), json!(upstream_model));
            body.insert("messages".into(), Value::Array(messages));
            body.insert("stream".into(), json!(stream));
            if stream {
                body.insert("stream_options".into(), json!({ "include_usage": true }));
            }
            if let Some(tools) = obj.get("tools").filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
                body.insert("tools".into(), tools.clone());
            }
            match obj.get("format") {
                Some(Value::String(f)) if f == "json" => {
                    body.insert("response_format".into(), json!({ "type": "json_object" }));
                }
                Some(schema @ Value::Object(_)) => {
                    body.insert(
                        "response_format".into(),
                        json!({ "type": "json_schema", "json_schema": { "name": "response", "schema": schema } }),
                    );
                }
                _ => {}
            }
            if let Some(opts) = obj.get("options").and_then(Value::as_object) {
                options(opts, &mut body, audience);
            }
            think_and_logprobs(obj, &mut body, audience);
            Ok(Translated { body: Value::Object(body), stream })
        }
    }
}

/// Fields of Ollama's `GenerateRequest` that Chat Completions cannot carry: refused with a
/// reason, never dropped without a word.
fn refuse_unmappable(obj: &Map<String, Value>) -> Result<(), TranslateError> {
    if obj.get("raw").and_then(Value::as_bool) == Some(true) {
        return Err(bad("\"raw\": true (a prompt without the chat template) cannot be sent to an OpenAI-compatible server's chat completions; send it to an Ollama node, or use /v1/completions"));
    }
    if obj.get("suffix").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
        return Err(bad("\"suffix\" (fill-in-the-middle) cannot be sent to an OpenAI-compatible server's chat completions; send it to an Ollama node"));
    }
    Ok(())
}

/// Ollama's `think` and `logprobs` in Chat Completions' words. `think: "high"` (a level) is
/// `reasoning_effort`; `think: true|false` on a local server is llama.cpp's and vLLM's
/// `chat_template_kwargs.enable_thinking` (templates that think, such as Qwen3's, honour it), and
/// has no counterpart in a cloud API (there it is not sent; `unmapped` names it). `logprobs`
/// and `top_logprobs` are the same fields in both APIs.
fn think_and_logprobs(obj: &Map<String, Value>, body: &mut Map<String, Value>, audience: Audience) {
    match obj.get("think") {
        Some(Value::String(level)) if !level.is_empty() => {
            body.insert("reasoning_effort".into(), json!(level));
        }
        Some(Value::Bool(on)) if audience == Audience::Node => {
            body.insert("chat_template_kwargs".into(), json!({ "enable_thinking": on }));
        }
        _ => {}
    }
    if obj.get("logprobs").and_then(Value::as_bool) == Some(true) {
        body.insert("logprobs".into(), json!(true));
        if let Some(n) = obj.get("top_logprobs").and_then(Value::as_u64).filter(|&n| n > 0) {
            body.insert("top_logprobs".into(), json!(n));
        }
    }
}

/// Fields of an Ollama chat or generate request that reach an OpenAI-compatible upstream as
/// nothing: `think: true|false` for a cloud API. Named in `X-Corral-Dropped`.
pub fn unmapped(req: &Value, audience: Audience) -> Vec<&'static str> {
    let mut out = Vec::new();
    if audience == Audience::Cloud && req.get("think").is_some_and(Value::is_boolean) {
        out.push("think");
    }
    out
}

fn options(opts: &Map<String, Value>, body: &mut Map<String, Value>, audience: Audience) {
    for key in ["temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"] {
        if let Some(v) = opts.get(key).filter(|v| v.is_number()) {
            body.insert(key.into(), v.clone());
        }
    }
    match opts.get("stop") {
        Some(s @ Value::String(_)) => {
            body.insert("stop".into(), json!([s]));
        }
        Some(Value::Array(a)) if !a.is_empty() => {
            body.insert("stop".into(), Value::Array(a.clone()));
        }
        _ => {}
    }
    // num_predict: -1 (and -2) mean "no limit" in Ollama.
    if let Some(n) = opts.get("num_predict").and_then(Value::as_i64).filter(|&n| n > 0) {
        body.insert("max_tokens".into(), json!(n));
    }
    if audience == Audience::Node {
        for (from, to) in [("top_k", "top_k"), ("min_p", "min_p"), ("repeat_penalty", "repeat_penalty")] {
            if let Some(v) = opts.get(from).filter(|v| v.is_number()) {
                body.insert(to.into(), v.clone());
            }
        }
    }
}

/// Ollama sends images as bare base64; OpenAI takes data URLs. The type is read off the magic.
fn image_part(b64: &str) -> Value {
    let mime = match b64.get(..6).unwrap_or("") {
        s if s.starts_with("iVBOR") => "image/png",
        s if s.starts_with("/9j/") => "image/jpeg",
        s if s.starts_with("R0lGOD") => "image/gif",
        s if s.starts_with("UklGR") => "image/webp",
        _ => "image/png",
    };
    json!({ "type": "image_url", "image_url": { "url": format!("data:{mime};base64,{b64}") } })
}

fn content_with_images(text: &str, images: Option<&Value>) -> Value {
    match images.and_then(Value::as_array).filter(|a| !a.is_empty()) {
        None => json!(text),
        Some(imgs) => {
            let mut parts = vec![json!({ "type": "text", "text": text })];
            parts.extend(imgs.iter().filter_map(Value::as_str).map(image_part));
            Value::Array(parts)
        }
    }
}

fn chat_messages(messages: Option<&Value>) -> Result<Vec<Value>, TranslateError> {
    let list = match messages {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("\"messages\" must be a list")),
    };
    let mut out = Vec::with_capacity(list.len());
    // Ollama's history has no tool-call ids; OpenAI requires them. Calls get ids in order and
    // the tool results that follow answer them in the same order.
    let mut pending: VecDeque<String> = VecDeque::new();
    let mut next_id = 0;
    for (i, m) in list.iter().enumerate() {
        let m = m.as_object().ok_or_else(|| bad(format!("messages[{i}] must be an object")))?;
        let role =
            m.get("role").and_then(Value::as_str).ok_or_else(|| bad(format!("messages[{i}].role is required")))?;
        let text = match m.get("content") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(bad(format!("messages[{i}].content must be a string"))),
        };
        match role {
            "assistant" => {
                let mut msg = json!({ "role": "assistant", "content": text });
                if let Some(calls) = m.get("tool_calls").and_then(Value::as_array).filter(|c| !c.is_empty()) {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            let f = c.get("function").cloned().unwrap_or(Value::Null);
                            let id = c.get("id").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| {
                                next_id += 1;
                                format!("call_{next_id}")
                            });
                            pending.push_back(id.clone());
                            let args = match f.get("arguments") {
                                Some(Value::String(s)) => s.clone(),
                                Some(v) => v.to_string(),
                                None => "{}".into(),
                            };
                            json!({ "id": id, "type": "function", "function": { "name": f.get("name").cloned().unwrap_or(json!("")), "arguments": args } })
                        })
                        .collect();
                    msg["tool_calls"] = Value::Array(calls);
                }
                out.push(msg);
            }
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .or_else(|| pending.pop_front())
                    .unwrap_or_else(|| "call_0".into());
                out.push(json!({ "role": "tool", "content": text, "tool_call_id": id }));
            }
            "system" | "user" | "developer" => {
                out.push(json!({ "role": role, "content": content_with_images(text, m.get("images")) }));
            }
            other => {
                return Err(bad(format!("messages[{i}].role \"{other}\" is not one of system, user, assistant, tool")))
            }
        }
    }
    Ok(out)
}

fn generate_messages(obj: &Map<String, Value>) -> Result<Vec<Value>, TranslateError> {
    let mut out = Vec::new();
    match obj.get("system") {
        Some(Value::String(s)) if !s.is_empty() => out.push(json!({ "role": "system", "content": s })),
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(_) => return Err(bad("\"system\" must be a string")),
    }
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => return Err(bad("\"prompt\" must be a string")),
    };
    out.push(json!({ "role": "user", "content": content_with_images(prompt, obj.get("images")) }));
    Ok(out)
}

/// Token counts an upstream reported (`usage`), or counted from the stream when it did not.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    prompt: Option<u64>,
    completion: Option<u64>,
}

/// A tool call being assembled from streamed fragments.
#[derive(Debug, Default)]
struct PartialCall {
    name: String,
    arguments: String,
}

/// Translates one answer back, whole or event by event.
#[derive(Debug)]
pub struct Reply {
    shape: Shape,
    /// The model name the answer carries: the one the client asked for, echoed back as Ollama
    /// does, or the one that answered instead (a cloud provider's).
    model: String,
    sent_at: Instant,
    first_token_at: Option<Instant>,
    restore: Option<Restorer>,
    /// Extra restorers for `/v1` answers with several choices.
    restore_by_choice: HashMap<u64, Restorer>,
    /// Restorers for streamed `/v1` tool-call arguments, by (choice, call index).
    restore_calls: BTreeMap<(u64, u64), Restorer>,
    sse: Vec<u8>,
    usage: Usage,
    deltas: u64,
    finish: Option<String>,
    calls: BTreeMap<u64, PartialCall>,
    finished: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Native(Native),
    /// A `/v1` answer relayed as it is, but for placeholders restored.
    V1,
}

impl Reply {
    pub fn native(api: Native, client_model: &str, sent_at: Instant, restore: Option<Restorer>) -> Self {
        Self::new(Shape::Native(api), client_model, sent_at, restore)
    }

    pub fn passthrough(client_model: &str, sent_at: Instant, restore: Restorer) -> Self {
        Self::new(Shape::V1, client_model, sent_at, Some(restore))
    }

    fn new(shape: Shape, model: &str, sent_at: Instant, restore: Option<Restorer>) -> Self {
        Self {
            shape,
            model: model.to_string(),
            sent_at,
            first_token_at: None,
            restore,
            restore_by_choice: HashMap::new(),
            restore_calls: BTreeMap::new(),
            sse: Vec::new(),
            usage: Usage::default(),
            deltas: 0,
            finish: None,
            calls: BTreeMap::new(),
            finished: false,
        }
    }

    /// The content type of what `feed`/`whole` produce.
    pub fn content_type(&self, stream: bool) -> &'static str {
        match (self.shape, stream) {
            (Shape::V1, true) => "text/event-stream",
            (Shape::Native(_), true) => "application/x-ndjson",
            (_, false) => "application/json; charset=utf-8",
        }
    }

    fn restore_text(&mut self, choice: u64, text: &str) -> String {
        if choice == 0 {
            match self.restore.as_mut() {
                Some(r) => r.push(text),
                None => text.to_string(),
            }
        } else {
            match &self.restore {
                Some(base) => self.restore_by_choice.entry(choice).or_insert_with(|| base.fresh()).push(text),
                None => text.to_string(),
            }
        }
    }

    fn flush_text(&mut self, choice: u64) -> String {
        let r = if choice == 0 { self.restore.as_mut() } else { self.restore_by_choice.get_mut(&choice) };
        r.map(Restorer::finish).unwrap_or_default()
    }

    /// A whole (non-streamed) answer.
    pub fn whole(&mut self, body: &[u8]) -> Result<Bytes, TranslateError> {
        let mut v: Value =
            serde_json::from_slice(body).map_err(|e| bad(format!("the upstream's answer is not JSON ({e})")))?;
        let out = match self.shape {
            Shape::V1 => {
                if let Some(choices) = v.get_mut("choices").and_then(Value::as_array_mut) {
                    for c in choices {
                        for key in ["message", "text"] {
                            restore_in(c, key, self.restore.as_ref());
                        }
                    }
                }
                v
            }
            Shape::Native(api @ (Native::Embed | Native::Embeddings)) => self.embeddings(api, &v)?,
            Shape::Native(api) => {
                let choice = v
                    .get("choices")
                    .and_then(|c| c.get(0))
                    .ok_or_else(|| bad("the upstream's answer has no choices"))?;
                let message = choice.get("message").cloned().unwrap_or(Value::Null);
                let raw = message.get("content").and_then(Value::as_str).unwrap_or("");
                let mut text = self.restore_text(0, raw);
                text.push_str(&self.flush_text(0));
                self.finish = choice.get("finish_reason").and_then(Value::as_str).map(str::to_string);
                self.read_usage(&v);
                let calls = message.get("tool_calls").and_then(Value::as_array).map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            let f = c.get("function");
                            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or("");
                            let args = f.and_then(|f| f.get("arguments")).and_then(Value::as_str).unwrap_or("{}");
                            ollama_call(name, &restored(self.restore.as_ref(), args))
                        })
                        .collect::<Vec<_>>()
                });
                let mut line = self.chunk(api, &text);
                if let Some(calls) = calls.filter(|c| !c.is_empty()) {
                    line["message"]["tool_calls"] = Value::Array(calls);
                }
                if let Some(t) = reasoning(&message).filter(|t| !t.is_empty()) {
                    set_thinking(api, &mut line, &restored(self.restore.as_ref(), t));
                }
                if let Some(lp) = choice.pointer("/logprobs/content").filter(|l| l.is_array()) {
                    line["logprobs"] = lp.clone();
                }
                self.first_token_at.get_or_insert(Instant::now());
                self.complete(&mut line);
                line
            }
        };
        self.finished = true;
        Ok(Bytes::from(out.to_string()))
    }

    fn embeddings(&self, api: Native, v: &Value) -> Result<Value, TranslateError> {
        let mut data: Vec<&Value> = v
            .get("data")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("the upstream's answer has no \"data\""))?
            .iter()
            .collect();
        data.sort_by_key(|d| d.get("index").and_then(Value::as_u64).unwrap_or(0));
        let vectors: Vec<Value> = data.iter().filter_map(|d| d.get("embedding").cloned()).collect();
        let prompt = v.get("usage").and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64);
        let took = self.sent_at.elapsed().as_nanos() as u64;
        Ok(match api {
            Native::Embeddings => json!({ "embedding": vectors.into_iter().next().unwrap_or(json!([])) }),
            _ => {
                let mut out =
                    json!({ "model": self.model, "embeddings": vectors, "total_duration": took, "load_duration": 0 });
                if let Some(p) = prompt {
                    out["prompt_eval_count"] = json!(p);
                }
                out
            }
        })
    }

    fn read_usage(&mut self, v: &Value) {
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage.prompt = u.get("prompt_tokens").and_then(Value::as_u64).or(self.usage.prompt);
            self.usage.completion = u.get("completion_tokens").and_then(Value::as_u64).or(self.usage.completion);
        }
    }

    /// One streamed Ollama line (not done) with `text`.
    fn chunk(&self, api: Native, text: &str) -> Value {
        let now = now();
        match api {
            Native::Generate => json!({ "model": self.model, "created_at": now, "response": text, "done": false }),
            _ => {
                json!({ "model": self.model, "created_at": now, "message": { "role": "assistant", "content": text }, "done": false })
            }
        }
    }

    /// Turn `line` into the final one: done, why, counts and durations.
    fn complete(&self, line: &mut Value) {
        let total = self.sent_at.elapsed();
        let first = self.first_token_at.map(|t| t.duration_since(self.sent_at)).unwrap_or(total);
        let reason = match self.finish.as_deref() {
            Some("length") => "length",
            _ => "stop",
        };
        line["done"] = json!(true);
        line["done_reason"] = json!(reason);
        line["total_duration"] = json!(total.as_nanos() as u64);
        line["load_duration"] = json!(0);
        line["prompt_eval_count"] = json!(self.usage.prompt.unwrap_or(0));
        line["prompt_eval_duration"] = json!(first.as_nanos() as u64);
        line["eval_count"] = json!(self.usage.completion.unwrap_or(self.deltas));
        line["eval_duration"] = json!(total.saturating_sub(first).as_nanos() as u64);
    }

    /// Translate what arrived of a streamed answer; returns what can be sent now (may be empty).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Bytes, TranslateError> {
        self.sse.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some((end, skip)) = event_end(&self.sse) {
            let event: Vec<u8> = self.sse.drain(..end + skip).take(end).collect();
            let data = sse_data(&event);
            if data.is_empty() {
                continue;
            }
            if data.trim() == "[DONE]" {
                self.end_stream(&mut out);
                continue;
            }
            let v: Value = serde_json::from_str(&data)
                .map_err(|e| bad(format!("the upstream sent an event that is not JSON ({e})")))?;
            if let Some(err) = v.get("error") {
                let msg =
                    err.get("message").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| err.to_string());
                return Err(bad(format!("the upstream reported an error mid-stream: {msg}")));
            }
            self.event(v, &mut out);
        }
        if self.sse.len() > 1 << 20 {
            return Err(bad("the upstream sent more than 1 MiB without ending an event"));
        }
        Ok(Bytes::from(out))
    }

    /// The upstream's body ended. Streams that never said they were done were cut off.
    pub fn end(&mut self) -> Result<Bytes, TranslateError> {
        if self.finished {
            return Ok(Bytes::new());
        }
        if self.finish.is_some() {
            // Some servers end without `[DONE]` once they gave a finish reason.
            let mut out = Vec::new();
            self.end_stream(&mut out);
            return Ok(Bytes::from(out));
        }
        Err(bad("the upstream's stream ended before the answer was complete"))
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn event(&mut self, mut v: Value, out: &mut Vec<u8>) {
        self.read_usage(&v);
        match self.shape {
            Shape::V1 => {
                if let Some(choices) = v.get_mut("choices").and_then(Value::as_array_mut) {
                    for c in choices.iter_mut() {
                        let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                        let finishing = c.get("finish_reason").is_some_and(|f| !f.is_null());
                        for (outer, key) in [("delta", "content"), ("", "text")] {
                            let slot = if outer.is_empty() {
                                c.get_mut(key)
                            } else {
                                c.get_mut(outer).and_then(|d| d.get_mut(key))
                            };
                            if let Some(Value::String(s)) = slot {
                                let mut text = self.restore_text(idx, s);
                                if finishing {
                                    text.push_str(&self.flush_text(idx));
                                }
                                *s = text;
                            }
                        }
                        self.restore_streamed_calls(idx, c, finishing);
                    }
                }
                out.extend_from_slice(format!("data: {v}\n\n").as_bytes());
            }
            Shape::Native(api) => {
                let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else { return };
                let delta = choice.get("delta").cloned().unwrap_or(Value::Null);
                if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                    for c in calls {
                        let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                        let entry = self.calls.entry(idx).or_default();
                        if let Some(f) = c.get("function") {
                            if let Some(n) = f.get("name").and_then(Value::as_str) {
                                entry.name.push_str(n);
                            }
                            if let Some(a) = f.get("arguments").and_then(Value::as_str) {
                                entry.arguments.push_str(a);
                            }
                        }
                    }
                }
                if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                    self.finish = Some(reason.to_string());
                }
                if let Some(t) = reasoning(&delta).filter(|t| !t.is_empty()) {
                    self.deltas += 1;
                    self.first_token_at.get_or_insert(Instant::now());
                    let mut line = self.chunk(api, "");
                    set_thinking(api, &mut line, &restored(self.restore.as_ref(), t));
                    push_line(out, &line);
                }
                let raw = delta.get("content").and_then(Value::as_str).unwrap_or("");
                if !raw.is_empty() {
                    self.deltas += 1;
                    self.first_token_at.get_or_insert(Instant::now());
                    let text = self.restore_text(0, raw);
                    if !text.is_empty() {
                        let mut line = self.chunk(api, &text);
                        if let Some(lp) = choice.pointer("/logprobs/content").filter(|l| l.is_array()) {
                            line["logprobs"] = lp.clone();
                        }
                        push_line(out, &line);
                    }
                }
            }
        }
    }

    /// Placeholders in streamed `/v1` tool-call arguments, put back like the content's: a
    /// fragment's tail that could still grow into one waits for the next, and what waits when
    /// the choice finishes goes out as one more argument fragment of that call.
    fn restore_streamed_calls(&mut self, choice: u64, c: &mut Value, finishing: bool) {
        let Some(base) = &self.restore else { return };
        if let Some(calls) = c.get_mut("delta").and_then(|d| d.get_mut("tool_calls")).and_then(Value::as_array_mut) {
            for call in calls {
                let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                if let Some(Value::String(a)) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) {
                    *a = self.restore_calls.entry((choice, index)).or_insert_with(|| base.fresh()).push(a);
                }
            }
        }
        if !finishing {
            return;
        }
        let mut tails = Vec::new();
        for ((ch, index), r) in self.restore_calls.iter_mut().filter(|((ch, _), _)| *ch == choice) {
            let tail = r.finish();
            if !tail.is_empty() {
                tails.push((*ch, *index, tail));
            }
        }
        for (_, index, tail) in tails {
            let fragment = json!({ "index": index, "function": { "arguments": tail } });
            match c["delta"]["tool_calls"].as_array_mut() {
                Some(calls) => calls.push(fragment),
                None => c["delta"]["tool_calls"] = json!([fragment]),
            }
        }
    }

    fn end_stream(&mut self, out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        self.finished = true;
        match self.shape {
            Shape::V1 => out.extend_from_slice(b"data: [DONE]\n\n"),
            Shape::Native(api) => {
                let rest = self.flush_text(0);
                if !rest.is_empty() {
                    push_line(out, &self.chunk(api, &rest));
                }
                if !self.calls.is_empty() {
                    let restore = self.restore.as_ref();
                    let calls: Vec<Value> =
                        self.calls.values().map(|c| ollama_call(&c.name, &restored(restore, &c.arguments))).collect();
                    let mut line = self.chunk(api, "");
                    line["message"]["tool_calls"] = Value::Array(calls);
                    push_line(out, &line);
                }
                let mut last = self.chunk(api, "");
                self.complete(&mut last);
                push_line(out, &last);
            }
        }
    }
}

/// Ollama's tool call: arguments as an object, not a JSON string.
/// The reasoning an OpenAI-compatible message or delta carries: `reasoning_content` (llama.cpp,
/// vLLM, DeepSeek) or `reasoning` (OpenRouter, newer vLLM).
fn reasoning(message: &Value) -> Option<&str> {
    message.get("reasoning_content").or_else(|| message.get("reasoning")).and_then(Value::as_str)
}

/// Ollama's place for reasoning: `thinking` beside `response`, or in the chat message.
fn set_thinking(api: Native, line: &mut Value, text: &str) {
    match api {
        Native::Generate => line["thinking"] = json!(text),
        _ => line["message"]["thinking"] = json!(text),
    }
}

fn ollama_call(name: &str, args: &str) -> Value {
    let arguments = serde_json::from_str::<Value>(args).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
    json!({ "function": { "name": name, "arguments": arguments } })
}

/// `text` with placeholders put back, when the request was redacted.
fn restored(restore: Option<&Restorer>, text: &str) -> String {
    restore.map_or_else(|| text.to_string(), |r| r.restore_all(text))
}

fn restore_in(choice: &mut Value, key: &str, restore: Option<&Restorer>) {
    let Some(r) = restore else { return };
    match choice.get_mut(key) {
        Some(Value::String(s)) => *s = r.restore_all(s),
        Some(Value::Object(m)) => {
            if let Some(Value::String(s)) = m.get_mut("content") {
                *s = r.restore_all(s);
            }
            let restore_args = |f: &mut Value| {
                if let Some(Value::String(a)) = f.get_mut("arguments") {
                    *a = r.restore_all(a);
                }
            };
            if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                calls.iter_mut().filter_map(|c| c.get_mut("function")).for_each(restore_args);
            }
            if let Some(f) = m.get_mut("function_call") {
                restore_args(f);
            }
        }
        _ => {}
    }
}

fn push_line(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(v.to_string().as_bytes());
    out.push(b'\n');
}

/// End of the first complete SSE event in `buf`: (index of the blank line, its length).
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The `data:` lines of one event, joined (comments and other fields ignored).
fn sse_data(event: &[u8]) -> String {
    let text = String::from_utf8_lossy(event);
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An upstream's error body (`{"error": {"message": ...}}` or `{"error": "..."}`) in
/// Ollama's shape.
pub fn native_error(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let msg = match v.get("error") {
        Some(Value::String(s)) => s.clone(),
        Some(e) => e.get("message").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| e.to_string()),
        None => String::from_utf8_lossy(body).trim().chars().take(500).collect(),
    };
    json!({ "error": msg })
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(b: &[u8]) -> Vec<Value> {
        String::from_utf8_lossy(b).lines().map(|l| serde_json::from_str(l).expect("ndjson line")).collect()
    }

    #[test]
    fn chat_requests_carry_options_system_images_and_tools() {
        let req = json!({
            "model": "llama3.2", "stream": true,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "content": "12C", "tool_name": "weather"},
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}],
            "options": {"temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["\n\n"], "num_predict": 64, "top_k": 40},
            "format": "json",
        });
        let t = request(Native::Chat, &req, "gpt-4o-mini", Audience::Cloud).expect("translates");
        let b = &t.body;
        assert!(t.stream);
        assert_eq!(b["model"], "gpt-4o-mini");
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(b["messages"][1]["content"][1]["image_url"]["url"], "data:image/png;base64,iVBORw0KGgo=");
        assert_eq!(b["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
        assert_eq!(b["messages"][3]["tool_call_id"], b["messages"][2]["tool_calls"][0]["id"]);
        assert_eq!(
            (b["temperature"].clone(), b["top_p"].clone(), b["seed"].clone()),
            (json!(0.2), json!(0.9), json!(7))
        );
        assert_eq!(b["max_tokens"], 64);
        assert_eq!(b["stop"], json!(["\n\n"]));
        assert_eq!(b["response_format"]["type"], "json_object");
        assert!(b.get("top_k").is_none(), "cloud APIs refuse fields they do not know");
        let node = request(Native::Chat, &req, "tiny", Audience::Node).expect("translates");
        assert_eq!(node.body["top_k"], 40, "local servers take llama.cpp's sampling options");
    }

    #[test]
    fn generate_becomes_a_system_and_a_user_message_and_unlimited_predict_is_dropped() {
        let req =
            json!({"model": "m", "system": "sys", "prompt": "hi", "stream": false, "options": {"num_predict": -1}});
        let t = request(Native::Generate, &req, "m", Audience::Node).expect("translates");
        assert!(!t.stream);
        assert_eq!(
            t.body["messages"],
            json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}])
        );
        assert!(t.body.get("max_tokens").is_none());
        assert!(t.body.get("stream_options").is_none());
    }

    #[test]
    fn bad_shapes_are_named() {
        for (api, req, says) in [
            (Native::Chat, json!({"messages": "hi"}), "must be a list"),
            (Native::Chat, json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (Native::Chat, json!({"messages": [{"role": "wizard", "content": "x"}]}), "wizard"),
            (Native::Generate, json!({"prompt": 5}), "prompt"),
            (Native::Embed, json!({"input": [1, 2]}), "list of strings"),
        ] {
            let e = request(api, &req, "m", Audience::Cloud).expect_err("refused");
            assert!(e.0.contains(says), "{e} should say {says}");
        }
    }

    #[test]
    fn a_whole_answer_becomes_ollamas_with_counts_and_tool_calls() {
        let mut r = Reply::native(Native::Chat, "llama3.2", Instant::now(), None);
        let body = json!({
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "ok",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
        });
        let out: Value = serde_json::from_slice(&r.whole(body.to_string().as_bytes()).expect("ok")).expect("json");
        assert_eq!(out["model"], "llama3.2");
        assert_eq!(out["message"]["content"], "ok");
        assert_eq!(out["message"]["tool_calls"][0]["function"]["arguments"]["city"], "Oslo");
        assert_eq!((out["done"].clone(), out["done_reason"].clone()), (json!(true), json!("stop")));
        assert_eq!((out["prompt_eval_count"].clone(), out["eval_count"].clone()), (json!(11), json!(3)));
        let mut g = Reply::native(Native::Generate, "m", Instant::now(), None);
        let body = json!({"choices": [{"finish_reason": "length", "message": {"content": "abc"}}]});
        let out: Value = serde_json::from_slice(&g.whole(body.to_string().as_bytes()).expect("ok")).expect("json");
        assert_eq!((out["response"].clone(), out["done_reason"].clone()), (json!("abc"), json!("length")));
    }

    #[test]
    fn sse_becomes_ndjson_event_by_event_even_when_events_are_split() {
        let events = [
            r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
            "data: [DONE]",
        ];
        let wire: String = events.iter().map(|e| format!("{e}\n\n")).collect();
        for split in [1, 7, 50, wire.len()] {
            let mut r = Reply::native(Native::Chat, "m", Instant::now(), None);
            let mut out = Vec::new();
            for piece in wire.as_bytes().chunks(split) {
                out.extend_from_slice(&r.feed(piece).expect("feeds"));
            }
            out.extend_from_slice(&r.end().expect("complete"));
            let got = lines(&out);
            let text: String = got.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
            assert_eq!(text, "Hello", "split {split}");
            let last = got.last().expect("a final line");
            assert_eq!(last["done"], true);
            assert_eq!((last["prompt_eval_count"].clone(), last["eval_count"].clone()), (json!(5), json!(2)));
            assert_eq!(got.iter().filter(|l| l["done"] == true).count(), 1);
        }
    }

    #[test]
    fn a_stream_cut_before_its_end_is_an_error_not_a_done_line() {
        let mut r = Reply::native(Native::Generate, "m", Instant::now(), None);
        let out = r.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n").expect("feeds");
        assert_eq!(lines(&out)[0]["response"], "a");
        assert!(r.end().is_err());
        let mut r = Reply::native(Native::Chat, "m", Instant::now(), None);
        let e = r.feed(b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n").expect_err("upstream error");
        assert!(e.0.contains("overloaded"));
    }

    #[test]
    fn streamed_tool_calls_are_assembled_from_fragments() {
        let mut r = Reply::native(Native::Chat, "m", Instant::now(), None);
        let wire = concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"weather\",\"arguments\":\"{\\\"ci\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"ty\\\":\\\"Oslo\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let got = lines(&r.feed(wire.as_bytes()).expect("feeds"));
        let call = got.iter().find_map(|l| l["message"]["tool_calls"].get(0).cloned()).expect("a tool call line");
        assert_eq!(call["function"], json!({"name": "weather", "arguments": {"city": "Oslo"}}));
    }

    fn restorer_for(text: &str) -> (String, Restorer) {
        let mut r = crate::redact::Redactor::new([text]);
        let masked = r.redact(text);
        (masked, r.restorer())
    }

    #[test]
    fn tool_call_arguments_get_their_placeholders_restored_whole() {
        let (masked, r) = restorer_for("li.wei@example.com");
        assert_eq!(masked, "[EMAIL_1]");
        let answer = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "mail", "arguments": "{\"to\":\"[EMAIL_1]\"}"}}]}}]});
        let body = answer.to_string();
        let mut native = Reply::native(Native::Chat, "m", Instant::now(), Some(r.fresh()));
        let out: Value = serde_json::from_slice(&native.whole(body.as_bytes()).expect("translates")).expect("json");
        assert_eq!(out["message"]["tool_calls"][0]["function"]["arguments"]["to"], "li.wei@example.com");
        let mut v1 = Reply::passthrough("m", Instant::now(), r);
        let out: Value = serde_json::from_slice(&v1.whole(body.as_bytes()).expect("relays")).expect("json");
        assert_eq!(
            out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"to\":\"li.wei@example.com\"}"
        );
    }

    #[test]
    fn streamed_tool_call_arguments_split_inside_a_placeholder_are_restored() {
        let (_, r) = restorer_for("li.wei@example.com");
        let events = [
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"mail\",\"arguments\":\"{\\\"to\\\":\\\"[EMA\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"IL_1]\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        ];
        for (shape, mut reply) in [
            ("native", Reply::native(Native::Chat, "m", Instant::now(), Some(r.fresh()))),
            ("v1", Reply::passthrough("m", Instant::now(), r.fresh())),
        ] {
            let mut out = Vec::new();
            for e in events {
                out.extend_from_slice(&reply.feed(e.as_bytes()).expect("translates"));
            }
            let text = String::from_utf8(out).expect("utf-8");
            let args: String = if shape == "native" {
                let call = lines(text.as_bytes()).into_iter().find_map(|l| l["message"]["tool_calls"].get(0).cloned());
                call.expect("a tool call line")["function"]["arguments"].to_string()
            } else {
                text.split("\n\n")
                    .filter_map(|e| e.strip_prefix("data: ").and_then(|d| serde_json::from_str::<Value>(d).ok()))
                    .flat_map(|v| v["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default())
                    .filter_map(|c| c["function"]["arguments"].as_str().map(str::to_string))
                    .collect()
            };
            assert!(args.contains("li.wei@example.com") && !args.contains("EMA"), "{shape}: {args}");
        }
    }

    #[test]
    fn embeddings_both_ways() {
        let t = request(Native::Embed, &json!({"input": ["a", "b"]}), "e", Audience::Cloud).expect("ok");
        assert_eq!(t.body, json!({"model": "e", "input": ["a", "b"]}));
        let answer = json!({"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}], "usage": {"prompt_tokens": 2}});
        let mut r = Reply::native(Native::Embed, "e", Instant::now(), None);
        let out: Value = serde_json::from_slice(&r.whole(answer.to_string().as_bytes()).expect("ok")).expect("json");
        assert_eq!(out["embeddings"], json!([[1.0], [2.0]]));
        assert_eq!(out["prompt_eval_count"], 2);
        let mut r = Reply::native(Native::Embeddings, "e", Instant::now(), None);
        let out: Value = serde_json::from_slice(&r.whole(answer.to_string().as_bytes()).expect("ok")).expect("json");
        assert_eq!(out, json!({"embedding": [1.0]}));
    }

    #[test]
    fn upstream_errors_take_ollamas_shape() {
        assert_eq!(native_error(br#"{"error":{"message":"bad key","type":"auth"}}"#), json!({"error": "bad key"}));
        assert_eq!(native_error(br#"{"error":"nope"}"#), json!({"error": "nope"}));
        assert_eq!(native_error(b"plain text"), json!({"error": "plain text"}));
    }

    #[test]
    fn reasoning_becomes_thinking_and_logprobs_pass_both_ways() {
        let mut r = Reply::native(Native::Chat, "m", Instant::now(), None);
        let body = json!({"choices": [{"message": {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
            "logprobs": {"content": [{"token": "4", "logprob": -0.1, "top_logprobs": []}]}, "finish_reason": "stop"}]});
        let v: Value = serde_json::from_slice(&r.whole(body.to_string().as_bytes()).expect("whole")).expect("json");
        assert_eq!((v["message"]["thinking"].clone(), v["message"]["content"].clone()), (json!("2+2"), json!("4")));
        assert_eq!(v["logprobs"][0]["token"], "4");
        let mut r = Reply::native(Native::Generate, "m", Instant::now(), None);
        let sse = "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let out = lines(&r.feed(sse.as_bytes()).expect("feed"));
        assert_eq!((out[0]["thinking"].clone(), out[0]["response"].clone()), (json!("hm"), json!("")), "{out:?}");
        assert_eq!(out[1]["response"], "ok");
    }

    #[test]
    fn think_maps_where_it_can_and_raw_or_suffix_are_refused() {
        let req = json!({"prompt": "p", "think": true, "logprobs": true, "top_logprobs": 3});
        let node = request(Native::Generate, &req, "m", Audience::Node).expect("node");
        assert_eq!(node.body["chat_template_kwargs"]["enable_thinking"], true);
        assert_eq!((node.body["logprobs"].clone(), node.body["top_logprobs"].clone()), (json!(true), json!(3)));
        let cloud = request(Native::Generate, &req, "m", Audience::Cloud).expect("cloud");
        assert!(cloud.body.get("chat_template_kwargs").is_none(), "a cloud API would refuse it");
        assert_eq!(unmapped(&req, Audience::Cloud), vec!["think"]);
        assert!(unmapped(&req, Audience::Node).is_empty());
        let level =
            request(Native::Chat, &json!({"messages": [], "think": "low"}), "m", Audience::Cloud).expect("level");
        assert_eq!(level.body["reasoning_effort"], "low");
        for bad in [json!({"prompt": "p", "raw": true}), json!({"prompt": "p", "suffix": "s"})] {
            assert!(request(Native::Generate, &bad, "m", Audience::Node).is_err(), "{bad}");
        }
        assert!(
            request(Native::Generate, &json!({"prompt": "p", "raw": false, "suffix": ""}), "m", Audience::Node).is_ok()
        );
    }
}
