//! One JSON answer made from an Ollama node's stream.
//!
//! A non-streamed Ollama answer sends nothing until the whole answer is generated, so its first
//! byte is its last: a first-token deadline could not tell a node that is slow to start from
//! one that writes a long answer. Corral therefore asks Ollama nodes for a stream even when the
//! client asked for `"stream": false`, and makes the single JSON itself, the way Ollama's own
//! handlers make it (`server/routes.go`, `ChatHandler`/`writeChatResponse` and
//! `GenerateHandler` at fb30760996871fa9460115c753afd2c60d4ab0f7): the last chunk, with the
//! text (`message.content` / `response`) and `thinking` of every chunk joined, the tool calls
//! and log probabilities of every chunk gathered, field order kept and strings encoded as Go's
//! `encoding/json` encodes them (`<`, `>`, `&` as `\u003c`...). An error line in the stream is
//! what Ollama would have answered with status 500.

use std::ops::Range;
use std::time::Duration;

use axum::body::Bytes;
use futures_util::StreamExt;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Answer, BodyStream};

/// Most bytes of stream read to make one answer: far above any real answer, it bounds a node
/// that streams without end.
const MAX_STREAM_BYTES: usize = 64 * 1024 * 1024;

/// Which of Ollama's generating endpoints the stream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Generate,
    /// `/v1/chat/completions`: Ollama's OpenAI layer, streamed as SSE.
    V1Chat,
}

impl Api {
    pub fn of(path: &str) -> Option<Self> {
        match path.split('?').next().unwrap_or(path) {
            "/api/chat" => Some(Self::Chat),
            "/api/generate" => Some(Self::Generate),
            "/v1/chat/completions" => Some(Self::V1Chat),
            _ => None,
        }
    }

    /// The request body asking for a stream instead of one JSON (`/v1` also asks for the usage
    /// event, which the one JSON carries).
    pub fn streamed_body(self, body: &[u8]) -> Option<Bytes> {
        match self {
            Self::Chat | Self::Generate => streamed_body(body),
            Self::V1Chat => streamed_v1_body(body),
        }
    }

    /// The content type of the one JSON, as Ollama sends it.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Chat | Self::Generate => "application/json; charset=utf-8",
            Self::V1Chat => "application/json",
        }
    }
}

/// A `/v1` body (not asking for a stream) asking for one, with its usage event.
fn streamed_v1_body(body: &[u8]) -> Option<Bytes> {
    const STREAMED: &[u8] = br#"true,"stream_options":{"include_usage":true}"#;
    if top_level_value(body, b"stream_options").is_none() {
        match top_level_value(body, b"stream") {
            Some((start, end)) if &body[start..end] == b"false" => {
                return Some(Bytes::from([&body[..start], STREAMED, &body[end..]].concat()));
            }
            None => {
                let open = body.iter().position(|&b| b == b'{')?;
                let rest = &body[open + 1..];
                let empty = rest.iter().all(|b| b.is_ascii_whitespace() || *b == b'}');
                let sep: &[u8] = if empty { b"" } else { b"," };
                return Some(Bytes::from([&body[..=open], br#""stream":"#, STREAMED, sep, rest].concat()));
            }
            Some(_) => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if v.get("stream").and_then(serde_json::Value::as_bool) == Some(true) {
        return None;
    }
    v["stream"] = serde_json::Value::Bool(true);
    v["stream_options"] = serde_json::json!({ "include_usage": true });
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// Why no single answer could be made; nothing has reached the client, so every one of these
/// leaves the request free to go to another node.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AssembleError {
    /// The node put `{"error": ...}` in the stream: Ollama's non-streamed answer would have
    /// been a 500 with it.
    #[error("{0}")]
    Node(String),
    #[error("the stream broke off before its last chunk ({0})")]
    Cut(String),
    #[error("the stream ended without its last chunk")]
    NoEnd,
    #[error("node sent nothing for {0} ms mid-answer")]
    Stalled(u128),
    #[error("a chunk is not Ollama's JSON ({0})")]
    Malformed(String),
    #[error("the answer passed {MAX_STREAM_BYTES} bytes")]
    TooLarge,
}

/// `body` (a JSON object whose top-level `"stream"` is `false`) asking for a stream instead.
/// The client's bytes are kept but for that one value; a key spelled with escapes falls back
/// to rewriting the object.
pub fn streamed_body(body: &[u8]) -> Option<Bytes> {
    if let Some((start, end)) = top_level_value(body, b"stream") {
        if &body[start..end] == b"false" {
            let mut out = Vec::with_capacity(body.len() + 1);
            out.extend_from_slice(&body[..start]);
            out.extend_from_slice(b"true");
            out.extend_from_slice(&body[end..]);
            return Some(Bytes::from(out));
        }
    }
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    (v.get("stream")? == &serde_json::Value::Bool(false)).then_some(())?;
    v["stream"] = serde_json::Value::Bool(true);
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// The byte range of the value of top-level `key` (spelled without escapes) in a JSON object.
fn top_level_value(body: &[u8], key: &[u8]) -> Option<(usize, usize)> {
    let (mut depth, mut i) = (0usize, 0usize);
    while i < body.len() {
        match body[i] {
            b'"' => {
                let start = i + 1;
                let end = string_end(body, start)?;
                i = end + 1;
                if depth == 1 && &body[start..end] == key {
                    let colon = skip_ws(body, i);
                    if body.get(colon) == Some(&b':') {
                        let v = skip_ws(body, colon + 1);
                        let e = v + body[v..].iter().position(|b| !b.is_ascii_alphanumeric())?;
                        return Some((v, e));
                    }
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

fn string_end(body: &[u8], mut i: usize) -> Option<usize> {
    while i < body.len() {
        match body[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn skip_ws(body: &[u8], mut i: usize) -> usize {
    while body.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// Read the rest of `answer` (an NDJSON stream whose first chunk is here) and make the one
/// JSON Ollama would have sent; `idle` bounds the silence between chunks.
pub async fn collect(mut answer: Answer, api: Api, idle: Duration) -> Result<Bytes, AssembleError> {
    let mut joined = match api {
        Api::V1Chat => Joined::Sse(SseAssembler::default()),
        native => Joined::Lines(Assembler::new(native)),
    };
    if let Some(first) = answer.first.take() {
        joined.push(&first)?;
    }
    let body: &mut BodyStream = &mut answer.body;
    loop {
        match tokio::time::timeout(idle, body.next()).await {
            Err(_) => return Err(AssembleError::Stalled(idle.as_millis())),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(AssembleError::Cut(e.to_string())),
            Ok(Some(Ok(chunk))) => joined.push(&chunk)?,
        }
    }
    joined.finish().map(Bytes::from)
}

/// A node asked for a stream that answered one JSON instead (an older Ollama, a proxy in
/// front of it): the whole of it, read within the same bounds as a stream (`idle` between
/// chunks, [`MAX_STREAM_BYTES`] in all) and checked to be one JSON value, so a cut or garbled
/// answer is the node's failure, not a client's 200.
pub async fn collect_json(mut answer: Answer, idle: Duration) -> Result<Bytes, AssembleError> {
    let mut out = Vec::new();
    if let Some(first) = answer.first.take() {
        out.extend_from_slice(&first);
    }
    loop {
        if out.len() > MAX_STREAM_BYTES {
            return Err(AssembleError::TooLarge);
        }
        match tokio::time::timeout(idle, answer.body.next()).await {
            Err(_) => return Err(AssembleError::Stalled(idle.as_millis())),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(AssembleError::Cut(e.to_string())),
            Ok(Some(Ok(chunk))) => out.extend_from_slice(&chunk),
        }
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(&out).map_err(|e| AssembleError::Malformed(e.to_string()))?;
    Ok(Bytes::from(out))
}

/// An answer being joined from Ollama's NDJSON or its OpenAI layer's SSE.
enum Joined {
    Lines(Assembler),
    Sse(SseAssembler),
}

impl Joined {
    fn push(&mut self, chunk: &[u8]) -> Result<(), AssembleError> {
        match self {
            Self::Lines(a) => a.push(chunk),
            Self::Sse(a) => a.push(chunk),
        }
    }
    fn finish(self) -> Result<Vec<u8>, AssembleError> {
        match self {
            Self::Lines(a) => a.finish(),
            Self::Sse(a) => a.finish(),
        }
    }
}

/// One `chat.completion.chunk` event, as far as the answer needs it.
#[derive(Deserialize)]
struct SseChunk<'a> {
    #[serde(borrow, default)]
    id: std::borrow::Cow<'a, str>,
    #[serde(default)]
    created: i64,
    #[serde(borrow, default)]
    model: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    system_fingerprint: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    choices: Vec<SseChoice<'a>>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct SseChoice<'a> {
    #[serde(borrow)]
    delta: Option<SseDelta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    logprobs: Option<SseLogprobs<'a>>,
}

#[derive(Deserialize)]
struct SseDelta<'a> {
    #[serde(borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct SseLogprobs<'a> {
    #[serde(borrow)]
    content: Option<Vec<&'a RawValue>>,
}

/// The `chat.completion` being joined from Ollama's OpenAI-layer stream, as Ollama's
/// `ToChatCompletion` writes it (`openai/openai.go`): `id`, `object`, `created`, `model`,
/// `system_fingerprint`, one choice with the whole message, `usage`.
#[derive(Debug, Default)]
pub struct SseAssembler {
    id: String,
    created: i64,
    model: String,
    fingerprint: String,
    content: String,
    reasoning: String,
    tool_calls: Vec<String>,
    logprobs: Vec<String>,
    finish_reason: Option<String>,
    usage: Option<String>,
    done: bool,
    partial: Vec<u8>,
    read: usize,
}

impl SseAssembler {
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), AssembleError> {
        self.read += chunk.len();
        if self.read > MAX_STREAM_BYTES {
            return Err(AssembleError::TooLarge);
        }
        self.partial.extend_from_slice(chunk);
        while let Some(nl) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=nl).collect();
            self.line(line.trim_ascii())?;
        }
        Ok(())
    }

    fn line(&mut self, line: &[u8]) -> Result<(), AssembleError> {
        let Some(data) = line.strip_prefix(b"data:") else { return Ok(()) };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.done = true;
            return Ok(());
        }
        let c: SseChunk<'_> = serde_json::from_slice(data).map_err(|e| AssembleError::Malformed(e.to_string()))?;
        if let Some(e) = c.error {
            let v: serde_json::Value = serde_json::from_str(e.get()).unwrap_or_default();
            let m = v["message"].as_str().map_or_else(|| e.get().to_string(), str::to_string);
            return Err(AssembleError::Node(m));
        }
        if self.id.is_empty() {
            (self.id, self.model, self.fingerprint) =
                (c.id.into_owned(), c.model.into_owned(), c.system_fingerprint.into_owned());
        }
        self.created = c.created;
        for choice in c.choices {
            if let Some(d) = choice.delta {
                self.content.push_str(d.content.as_deref().unwrap_or_default());
                self.reasoning.push_str(d.reasoning.as_deref().unwrap_or_default());
                self.tool_calls.extend(d.tool_calls.iter().flatten().map(|r| r.get().to_string()));
            }
            if let Some(f) = choice.finish_reason {
                self.finish_reason = Some(f.into_owned());
            }
            let lp = choice.logprobs.and_then(|l| l.content).unwrap_or_default();
            self.logprobs.extend(lp.iter().map(|r| r.get().to_string()));
        }
        if let Some(u) = c.usage {
            self.usage = Some(u.get().to_string());
        }
        Ok(())
    }

    /// The one `chat.completion`, in Go's field order, ending in a newline as Go's
    /// `json.Encoder` ends it.
    pub fn finish(self) -> Result<Vec<u8>, AssembleError> {
        if !self.done || self.finish_reason.is_none() {
            return Err(AssembleError::NoEnd);
        }
        let mut message = format!(r#"{{"role":"assistant","content":{}"#, go_string(&self.content));
        if !self.reasoning.is_empty() {
            message += &format!(r#","reasoning":{}"#, go_string(&self.reasoning));
        }
        if !self.tool_calls.is_empty() {
            message += &format!(r#","tool_calls":[{}]"#, self.tool_calls.join(","));
        }
        message.push('}');
        let finish = self.finish_reason.as_deref().map_or_else(|| "null".to_string(), go_string);
        let logprobs = match self.logprobs.is_empty() {
            true => String::new(),
            false => format!(r#","logprobs":{{"content":[{}]}}"#, self.logprobs.join(",")),
        };
        let usage =
            self.usage.unwrap_or_else(|| r#"{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}"#.into());
        let out = format!(
            r#"{{"id":{},"object":"chat.completion","created":{},"model":{},"system_fingerprint":{},"choices":[{{"index":0,"message":{message},"finish_reason":{finish}{logprobs}}}],"usage":{usage}}}"#,
            go_string(&self.id),
            self.created,
            go_string(&self.model),
            go_string(&self.fingerprint),
        ) + "\n";
        Ok(out.into_bytes())
    }
}

/// What one line of an Ollama stream says, borrowed from the line (also read by the proxy to
/// follow a stream it may continue).
#[derive(Deserialize)]
pub(crate) struct Line<'a> {
    #[serde(borrow)]
    pub message: Option<LineText<'a>>,
    #[serde(borrow)]
    pub response: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    pub thinking: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    pub logprobs: Option<Vec<&'a RawValue>>,
    #[serde(borrow)]
    pub error: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub done: bool,
}

/// A line's `message`.
#[derive(Deserialize)]
pub(crate) struct LineText<'a> {
    #[serde(borrow)]
    pub content: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    pub thinking: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    pub tool_calls: Option<Vec<&'a RawValue>>,
}

/// The answer so far: joined text, gathered lists, and the last line as it came.
#[derive(Debug)]
pub struct Assembler {
    api: Api,
    content: String,
    thinking: String,
    tool_calls: Vec<String>,
    logprobs: Vec<String>,
    last: Option<Vec<u8>>,
    /// The shape of `last` when [`plain_line`] read it: the next line is first tried against it.
    shape: Option<Shape>,
    /// Where the values of the line being followed sit (swapped into `shape` when it fits).
    spare: Vec<Range<usize>>,
    /// A line not yet ended by `\n`.
    partial: Vec<u8>,
    read: usize,
}

impl Assembler {
    pub fn new(api: Api) -> Self {
        Self {
            api,
            content: String::new(),
            thinking: String::new(),
            tool_calls: Vec::new(),
            logprobs: Vec::new(),
            last: None,
            shape: None,
            spare: Vec::new(),
            partial: Vec::new(),
            read: 0,
        }
    }

    /// Take one chunk of the stream (any cut: lines may span chunks).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), AssembleError> {
        self.read += chunk.len();
        if self.read > MAX_STREAM_BYTES {
            return Err(AssembleError::TooLarge);
        }
        let mut rest = chunk;
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            if self.partial.is_empty() {
                self.line(&rest[..nl])?;
            } else {
                let mut l = std::mem::take(&mut self.partial);
                l.extend_from_slice(&rest[..nl]);
                self.line(&l)?;
                l.clear();
                self.partial = l;
            }
            rest = &rest[nl + 1..];
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    fn line(&mut self, line: &[u8]) -> Result<(), AssembleError> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        if let Some(plain) = self.plain(line) {
            self.content.push_str(plain.text);
            self.thinking.push_str(plain.thinking);
            let last = self.last.get_or_insert_with(Vec::new);
            last.clear();
            last.extend_from_slice(line);
            return Ok(());
        }
        let parsed: Line<'_> = serde_json::from_slice(line).map_err(|e| AssembleError::Malformed(e.to_string()))?;
        if let Some(e) = parsed.error {
            return Err(AssembleError::Node(e.into_owned()));
        }
        match (self.api, &parsed.message) {
            (Api::Chat, Some(m)) => {
                self.content.push_str(m.content.as_deref().unwrap_or_default());
                self.thinking.push_str(m.thinking.as_deref().unwrap_or_default());
                self.tool_calls.extend(m.tool_calls.iter().flatten().map(|r| r.get().to_string()));
            }
            _ => {
                self.content.push_str(parsed.response.as_deref().unwrap_or_default());
                self.thinking.push_str(parsed.thinking.as_deref().unwrap_or_default());
            }
        }
        self.logprobs.extend(parsed.logprobs.iter().flatten().map(|r| r.get().to_string()));
        drop(parsed);
        // One buffer for the last line, reused: no allocation per line.
        let last = self.last.get_or_insert_with(Vec::new);
        last.clear();
        last.extend_from_slice(line);
        Ok(())
    }

    /// `line` read without serde: by the shape of the line before it when it has that shape
    /// (most lines of a stream), else by [`plain_line`], whose shape is then kept for the next.
    fn plain<'a>(&mut self, line: &'a [u8]) -> Option<Plain<'a>> {
        if let (Some(shape), Some(last)) = (&mut self.shape, &self.last) {
            if let Some(plain) = shape.follow(last, line, &mut self.spare) {
                std::mem::swap(&mut shape.values, &mut self.spare);
                return Some(plain);
            }
        }
        let mut shape = self.shape.take().unwrap_or_default();
        let plain = plain_line(self.api, line, &mut shape)?;
        self.shape = Some(shape);
        Some(plain)
    }

    /// The one JSON: the last line with the joined text and gathered lists put in.
    pub fn finish(mut self) -> Result<Vec<u8>, AssembleError> {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line)?;
        }
        let last = self.last.take().ok_or(AssembleError::NoEnd)?;
        if let Some(answer) = self.spliced(&last) {
            return Ok(answer);
        }
        self.rebuilt(&last)
    }

    /// The answer for the common stream, made by putting the joined text in place of the last
    /// line's: no thinking, tool calls or logprobs anywhere, and a last line [`plain_line`]
    /// reads, ending the stream, naming the text and no `thinking`, with no byte Go's encoder
    /// would write otherwise in a key (`<`, `>`, `&`, U+2028, U+2029). Then it is byte for byte
    /// what [`Self::rebuilt`] makes (a test holds them to it), without taking the line apart
    /// into owned fields and writing them back: that was a tenth of a proxied chat's
    /// instructions (callgrind, issue 16).
    fn spliced(&self, last: &[u8]) -> Option<Vec<u8>> {
        let simple = self.thinking.is_empty() && self.tool_calls.is_empty() && self.logprobs.is_empty();
        if !simple || !matches!(self.api, Api::Chat | Api::Generate) {
            return None;
        }
        if last.iter().any(|&b| matches!(b, b'<' | b'>' | b'&' | 0xE2)) {
            return None;
        }
        // The shape is the last line's when that line was read plainly (see `Assembler::plain`).
        let shape = self.shape.as_ref()?;
        let at = shape.text_at().filter(|_| shape.done && shape.thinking.is_none())?;
        let mut out = Vec::with_capacity(last.len() + self.content.len() + 16);
        out.extend_from_slice(&last[..at.start]);
        out.extend_from_slice(go_string(&self.content).as_bytes());
        out.extend_from_slice(&last[at.end..]);
        Some(out)
    }

    /// The answer made from the last line's fields, each value kept as the node wrote it, the
    /// text, thinking, tool calls and logprobs put in where Ollama's encoder puts them.
    fn rebuilt(self, last: &[u8]) -> Result<Vec<u8>, AssembleError> {
        let mut fields = Ordered::parse(last)?;
        if fields.get("done") != Some("true") {
            return Err(AssembleError::NoEnd);
        }
        let logprobs = (!self.logprobs.is_empty()).then(|| format!("[{}]", self.logprobs.join(",")));
        match self.api {
            Api::Chat => {
                let mut message = match fields.get("message") {
                    Some(m) => Ordered::parse(m.as_bytes())?,
                    None => Ordered(Vec::new()),
                };
                message.set("content", Some(go_string(&self.content)), &["role"]);
                let thinking = (!self.thinking.is_empty()).then(|| go_string(&self.thinking));
                message.set("thinking", thinking, &["role", "content"]);
                if !self.tool_calls.is_empty() {
                    let calls = format!("[{}]", self.tool_calls.join(","));
                    message.set("tool_calls", Some(calls), &["role", "content", "thinking", "images"]);
                }
                fields.set("message", Some(message.to_json()), &["model", "remote_model", "remote_host", "created_at"]);
                let before = ["model", "remote_model", "remote_host", "created_at", "message", "done", "done_reason"];
                fields.set("logprobs", logprobs, &[&before[..], &["_debug_info"]].concat());
            }
            Api::Generate | Api::V1Chat => {
                fields.set(
                    "response",
                    Some(go_string(&self.content)),
                    &["model", "remote_model", "remote_host", "created_at"],
                );
                let thinking = (!self.thinking.is_empty()).then(|| go_string(&self.thinking));
                fields.set("thinking", thinking, &["model", "remote_model", "remote_host", "created_at", "response"]);
                let before = [
                    "model",
                    "remote_model",
                    "remote_host",
                    "created_at",
                    "response",
                    "thinking",
                    "done",
                    "done_reason",
                    "context",
                    "tool_calls",
                    "_debug_info",
                ];
                fields.set("logprobs", logprobs, &before);
            }
        }
        Ok(fields.to_json().into_bytes())
    }
}

/// `line` (one JSON object) with `n` added to its whole-number field `key`, order and every
/// other byte of meaning kept; `None` when it has no such field.
pub fn add_to_field(line: &[u8], key: &str, n: i64) -> Option<Vec<u8>> {
    let mut fields = Ordered::parse(line).ok()?;
    let now: i64 = fields.get(key)?.trim().parse().ok()?;
    fields.set(key, Some((now + n).to_string()), &[]);
    Some(fields.to_json().into_bytes())
}

/// What a plain stream line adds to the answer (where it sits, and the rest the last line's
/// splice needs, is the line's [`Shape`]).
#[derive(Debug, PartialEq)]
struct Plain<'a> {
    text: &'a str,
    thinking: &'a str,
}

/// The common line of an Ollama stream (`{"model":"…","created_at":"…","message":{"role":
/// "assistant","content":"…"},"done":false}`, or `"response":"…"` for generate) read in one
/// pass, without serde: serde's borrowed struct read was a fifth of the broker's instructions
/// for a 16-token non-streamed chat (callgrind, issue 16). Only a strict subset is taken: no
/// whitespace, no escapes, no arrays, objects one level deep, a known field at most once, no
/// `error`. Anything else is `None` and goes to serde, which reads it or says why not, so every
/// line taken here is one serde reads the same way. The line's shape goes to `shape` (left
/// unspecified when `None`).
fn plain_line<'a>(api: Api, line: &'a [u8], shape: &mut Shape) -> Option<Plain<'a>> {
    let line = std::str::from_utf8(line).ok()?;
    shape.values.clear();
    (shape.text, shape.thinking) = (None, None);
    let mut scan = Scan { b: line.as_bytes(), at: 0, s: line, values: &mut shape.values };
    let (mut text, mut thinking, mut message, mut done) = (None, None, false, false);
    let mut done_true = false;
    scan.eat(b'{')?;
    if scan.eat(b'}').is_none() {
        loop {
            let key = scan.string()?;
            scan.eat(b':')?;
            match (api, key) {
                (Api::Chat, "message") if !message => {
                    message = true;
                    scan.eat(b'{')?;
                    if scan.eat(b'}').is_none() {
                        loop {
                            let key = scan.string()?;
                            scan.eat(b':')?;
                            match key {
                                "content" if text.is_none() => {
                                    shape.text = Some(scan.values.len());
                                    text = Some(scan.value_string()?);
                                }
                                "thinking" if thinking.is_none() => {
                                    shape.thinking = Some(scan.values.len());
                                    thinking = Some(scan.value_string()?);
                                }
                                "content" | "thinking" | "tool_calls" => return None,
                                _ => scan.scalar()?,
                            }
                            if scan.eat(b',').is_none() {
                                scan.eat(b'}')?;
                                break;
                            }
                        }
                    }
                }
                (Api::Generate | Api::V1Chat, "response") if text.is_none() => {
                    shape.text = Some(scan.values.len());
                    text = Some(scan.value_string()?);
                }
                (Api::Generate | Api::V1Chat, "thinking") if thinking.is_none() => {
                    shape.thinking = Some(scan.values.len());
                    thinking = Some(scan.value_string()?);
                }
                (_, "done") if !done => {
                    done = true;
                    done_true = scan.word(b"true").is_some();
                    if !done_true {
                        scan.word(b"false")?;
                    }
                }
                (_, "message" | "response" | "thinking" | "done" | "error" | "logprobs") => return None,
                _ => scan.value()?,
            }
            if scan.eat(b',').is_none() {
                scan.eat(b'}')?;
                break;
            }
        }
    }
    shape.done = done_true;
    (scan.at == scan.b.len()).then(|| Plain { text: text.unwrap_or_default(), thinking: thinking.unwrap_or_default() })
}

/// Where a line's string values sit, so the lines after it are read by comparing bytes: an
/// Ollama stream's lines differ only in their values (`created_at`, the token), so a line that
/// is byte for byte its predecessor outside them has its predecessor's keys, structure, numbers
/// and flags, and reading it is finding where each value ends. That read took four in five of
/// the instructions [`plain_line`] spent per line (callgrind, issue 16).
#[derive(Debug, Default)]
struct Shape {
    /// Each string value's text (quotes excluded), in line order.
    values: Vec<Range<usize>>,
    /// Which value is the text, and which the thinking (named even when empty).
    text: Option<usize>,
    thinking: Option<usize>,
    /// `"done":true`.
    done: bool,
}

impl Shape {
    /// The text's string in the line, quotes included, when the line has one.
    fn text_at(&self) -> Option<Range<usize>> {
        self.text.and_then(|i| self.values.get(i)).map(|r| r.start - 1..r.end + 1)
    }

    /// `line` read as [`plain_line`] reads it, when it is `prev` (the line this shape was taken
    /// from) but for its string values, each a plain string (no escape or control character:
    /// what [`Scan::string`] takes) of valid UTF-8. The values' places go to `next`. `None`
    /// when `line` differs in anything else; then [`plain_line`] reads it.
    fn follow<'a>(&self, prev: &[u8], line: &'a [u8], next: &mut Vec<Range<usize>>) -> Option<Plain<'a>> {
        next.clear();
        let (mut p, mut q) = (0, 0);
        let (mut text, mut thinking) = ("", "");
        for (i, v) in self.values.iter().enumerate() {
            // The bytes up to the value, its opening quote included.
            let fixed = prev.get(p..v.start)?;
            if line.get(q..q + fixed.len())? != fixed {
                return None;
            }
            q += fixed.len();
            let n = plain_run(&line[q..]);
            if line.get(q + n) != Some(&b'"') {
                return None;
            }
            let value = &line[q..q + n];
            if Some(i) == self.text {
                text = std::str::from_utf8(value).ok()?;
            } else if Some(i) == self.thinking {
                thinking = std::str::from_utf8(value).ok()?;
            } else if !value.is_ascii() {
                std::str::from_utf8(value).ok()?;
            }
            next.push(q..q + n);
            (p, q) = (v.end, q + n);
        }
        if line.get(q..)? != prev.get(p..)? {
            return None;
        }
        // Each value is valid UTF-8 and every other byte is `prev`'s, cut at ASCII quotes.
        Some(Plain { text, thinking })
    }
}

/// A strict reader over one line for [`plain_line`]: each step is `None` where serde must look.
struct Scan<'a, 'v> {
    b: &'a [u8],
    at: usize,
    s: &'a str,
    /// Where each string value read so far sits (its shape, see [`Shape`]).
    values: &'v mut Vec<Range<usize>>,
}

impl<'a> Scan<'a, '_> {
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.at) == Some(&c)).then(|| self.at += 1)
    }

    /// A string without escapes or control characters, its text borrowed.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let end = start + plain_run(&self.b[start..]);
        if self.b.get(end) != Some(&b'"') {
            return None;
        }
        self.at = end + 1;
        self.s.get(start..end)
    }

    /// A string that is a value, not a key: its place is noted in the line's shape.
    fn value_string(&mut self) -> Option<&'a str> {
        let text = self.string()?;
        self.values.push(self.at - 1 - text.len()..self.at - 1);
        Some(text)
    }

    fn boolean(&mut self) -> Option<()> {
        self.word(b"true").or_else(|| self.word(b"false"))
    }

    fn word(&mut self, w: &[u8]) -> Option<()> {
        self.b[self.at..].starts_with(w).then(|| self.at += w.len())
    }

    /// A number as JSON spells it: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let _ = self.eat(b'-');
        let digits = |s: &mut Self| {
            let n = s.b[s.at..].iter().take_while(|c| c.is_ascii_digit()).count();
            s.at += n;
            n
        };
        match self.b.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                digits(self);
            }
            _ => return None,
        }
        if self.eat(b'.').is_some() && digits(self) == 0 {
            return None;
        }
        if matches!(self.b.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            let _ = self.eat(b'+').or_else(|| self.eat(b'-'));
            if digits(self) == 0 {
                return None;
            }
        }
        Some(())
    }

    /// A string, number, `true`, `false` or `null`.
    fn scalar(&mut self) -> Option<()> {
        match self.b.get(self.at)? {
            b'"' => self.value_string().map(drop),
            b't' | b'f' => self.boolean(),
            b'n' => self.word(b"null"),
            _ => self.number(),
        }
    }

    /// A scalar, or an object of scalars.
    fn value(&mut self) -> Option<()> {
        if self.eat(b'{').is_none() {
            return self.scalar();
        }
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.string()?;
            self.eat(b':')?;
            self.scalar()?;
            if self.eat(b',').is_none() {
                return self.eat(b'}');
            }
        }
    }
}

/// How many bytes at the start of `b` a JSON string takes as they are: up to the first `"`,
/// `\\` or control character (all of `b` when there is none). Eight bytes at a time, as the
/// strings of a stream line (a model name, a timestamp, a token) are a few words long, too
/// short for a SIMD search to pay for its setup and long enough that a byte loop was a fifth of
/// the line's read (callgrind, issue 16).
fn plain_run(b: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Per byte, the high bit of `(v - k) & !v` is set where the byte is below `k` (at the
    // lowest such byte exactly; a borrow can only mark bytes above a true one).
    let below = |v: u64, k: u64| v.wrapping_sub(ONES * k) & !v & HIGH;
    let mut at = 0;
    while let Some(word) = b.get(at..at + 8) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_le_bytes(bytes);
        let stops = below(x ^ (ONES * u64::from(b'"')), 1) | below(x ^ (ONES * u64::from(b'\\')), 1) | below(x, 0x20);
        if stops != 0 {
            return at + (stops.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + b[at..].iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).unwrap_or(b.len() - at)
}

/// A JSON object's fields in their order, each value as its raw JSON text.
#[derive(Debug)]
struct Ordered(Vec<(String, String)>);

impl Ordered {
    fn parse(json: &[u8]) -> Result<Self, AssembleError> {
        let mut de = serde_json::Deserializer::from_slice(json);
        de.deserialize_map(OrderedVisitor).map_err(|e| AssembleError::Malformed(e.to_string()))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Set `key` to `value` (raw JSON) where it is, or right after the last of `after` that is
    /// there (Go's field order); `None` removes it (`omitempty`).
    fn set(&mut self, key: &str, value: Option<String>, after: &[&str]) {
        let at = self.0.iter().position(|(k, _)| k == key);
        match (at, value) {
            (Some(i), Some(v)) => self.0[i].1 = v,
            (Some(i), None) => {
                self.0.remove(i);
            }
            (None, Some(v)) => {
                let pos = self.0.iter().rposition(|(k, _)| after.contains(&k.as_str())).map_or(0, |i| i + 1);
                self.0.insert(pos, (key.to_string(), v));
            }
            (None, None) => {}
        }
    }

    fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&go_string(k));
            out.push(':');
            out.push_str(v);
        }
        out.push('}');
        out
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = Ordered;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
        let mut fields = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, &RawValue>()? {
            fields.push((k, v.get().to_string()));
        }
        Ok(Ordered(fields))
    }
}

/// `s` as Go's `encoding/json` writes a string: HTML-safe (`<`, `>`, `&` as `\u003c`, `\u003e`,
/// `\u0026`), U+2028 and U+2029 escaped, other control characters as `\u00xx` but for `\b`,
/// `\f`, `\n`, `\r`, `\t`.
pub fn go_string(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    let mut rest = s;
    // Runs of bytes Go writes as they are go in whole; a token's text is mostly such a run.
    while let Some(at) = rest.bytes().position(|b| b < 0x20 || matches!(b, b'"' | b'\\' | b'<' | b'>' | b'&' | 0xe2)) {
        out.push_str(&rest[..at]);
        let mut chars = rest[at..].chars();
        let Some(c) = chars.next() else { break };
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if (c as u32) < 0x20 || matches!(c, '<' | '>' | '&') => {
                let b = c as u32 as u8;
                out.push_str("\\u00");
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 0xf) as usize] as char);
            }
            // Another character led by 0xE2 (an arrow, a quote mark): as it is.
            c => out.push(c),
        }
        rest = chars.as_str();
    }
    out.push_str(rest);
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a plain read found: the line's text and thinking, and from its shape what the
    /// splice uses.
    #[derive(Debug, PartialEq)]
    struct Read<'a> {
        text: &'a str,
        thinking: &'a str,
        text_at: Option<std::ops::Range<usize>>,
        has_thinking: bool,
        done: bool,
    }

    impl<'a> Read<'a> {
        fn of(plain: Plain<'a>, shape: &Shape) -> Self {
            let (text_at, has_thinking, done) = (shape.text_at(), shape.thinking.is_some(), shape.done);
            Read { text: plain.text, thinking: plain.thinking, text_at, has_thinking, done }
        }
    }

    /// `line` read by [`plain_line`] with no shape before it.
    fn read_alone(api: Api, line: &[u8]) -> Option<Read<'_>> {
        let mut shape = Shape::default();
        let plain = plain_line(api, line, &mut shape)?;
        Some(Read::of(plain, &shape))
    }

    #[test]
    fn a_plain_run_stops_where_a_byte_loop_stops() {
        let stop = |c: u8| c == b'"' || c == b'\\' || c < 0x20;
        let mut cases: Vec<Vec<u8>> = vec![Vec::new(), b"abc".to_vec(), "naïve ünïcode 2026-12-01T00:00:00Z".into()];
        // Every stop byte at every place of a 20-byte run, after other bytes of every kind
        // (below, at and above the stop bytes, and UTF-8 continuation bytes).
        for fill in [b'a', b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xa0, 0xe2, 0xff] {
            for stopper in [b'"', b'\\', 0x00, 0x0a, 0x1f] {
                for at in 0..20 {
                    let mut v = vec![fill; 20];
                    v[at] = stopper;
                    cases.push(v);
                }
            }
            cases.push(vec![fill; 17]);
        }
        for b in &cases {
            let want = b.iter().position(|&c| stop(c)).unwrap_or(b.len());
            assert_eq!(plain_run(b), want, "{b:?}");
        }
    }

    /// What serde's read of `line` adds, as `Assembler::line` takes it.
    fn by_serde(api: Api, line: &[u8]) -> Option<(String, String)> {
        let parsed: Line<'_> = serde_json::from_slice(line).ok()?;
        if parsed.error.is_some() || parsed.logprobs.is_some() {
            return None;
        }
        Some(match (api, &parsed.message) {
            (Api::Chat, Some(m)) if m.tool_calls.is_none() => (
                m.content.as_deref().unwrap_or_default().to_string(),
                m.thinking.as_deref().unwrap_or_default().to_string(),
            ),
            (Api::Chat, Some(_)) => return None,
            _ => (
                parsed.response.as_deref().unwrap_or_default().to_string(),
                parsed.thinking.as_deref().unwrap_or_default().to_string(),
            ),
        })
    }

    #[test]
    fn plain_lines_of_ollama_are_read_without_serde() {
        let chat = br#"{"model":"llama3.2:latest","created_at":"2026-12-01T00:00:00.1Z","message":{"role":"assistant","content":" w0"},"done":false}"#;
        let read = |api, line| read_alone(api, line).map(|p| (p.text, p.thinking, p.done));
        assert_eq!(read(Api::Chat, chat), Some((" w0", "", false)));
        let last = br#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"","thinking":"hm"},"done":true,"done_reason":"stop","total_duration":1000000,"load_duration":-1.5e3,"eval_count":16}"#;
        assert_eq!(read(Api::Chat, last), Some(("", "hm", true)));
        let gen = br#"{"model":"m","created_at":"t","response":"<b>","done":false,"x":{"a":null,"b":0.5}}"#;
        assert_eq!(read(Api::Generate, gen), Some(("<b>", "", false)));
        for (api, line) in [
            (Api::Chat, &br#"{"message":{"content":"a"b"},"done":false}"#[..]),
            (Api::Chat, br#"{"message":{"content":"a","content":"b"},"done":false}"#),
            (Api::Chat, br#"{"message":{"content":"a","tool_calls":[{"function":{}}]},"done":false}"#),
            (Api::Chat, br#"{"message":{"content":"a"},"done":false,"done":true}"#),
            (Api::Chat, br#"{"message":null,"response":"r"}"#),
            (Api::Chat, br#"{"error":"boom"}"#),
            (Api::Chat, br#" {"message":{"content":"a"}}"#),
            (Api::Chat, br#"{"message":{"content":"a"}}x"#),
            (Api::Generate, br#"{"response":"a","context":[1,2,3],"done":true}"#),
            (Api::Generate, br#"{"response":"a","n":01}"#),
            (Api::Generate, b"{\"response\":\"a\x01\"}"),
            (Api::Generate, b"{\"response\":\"\xff\"}"),
        ] {
            assert_eq!(read_alone(api, line), None, "{}", String::from_utf8_lossy(line));
        }
    }

    proptest::proptest! {
        /// Whatever the plain reader takes, serde takes too and reads the same text: a line
        /// made of fields known and unknown, repeated, escaped, nested, null or malformed.
        #[test]
        fn the_plain_reader_agrees_with_serde(
            chat in proptest::bool::ANY,
            fields in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(r#""model":"llama3.2""#),
                    proptest::strategy::Just(r#""message":{"role":"assistant","content":"hi"}"#),
                    proptest::strategy::Just(r#""message":{"content":"a
    b","thinking":"t"}"#),
                    proptest::strategy::Just(r#""message":{"content":null}"#),
                    proptest::strategy::Just(r#""message":{"thinking":"x","images":["a"]}"#),
                    proptest::strategy::Just(r#""message":"no""#),
                    proptest::strategy::Just(r#""response":"r""#),
                    proptest::strategy::Just(r#""response":7"#),
                    proptest::strategy::Just(r#""thinking":"th""#),
                    proptest::strategy::Just(r#""done":false"#),
                    proptest::strategy::Just(r#""done":"true""#),
                    proptest::strategy::Just(r#""eval_count":-0.5E+3"#),
                    proptest::strategy::Just(r#""n":1."#),
                    proptest::strategy::Just(r#""o":{"a":{"b":1}}"#),
                    proptest::strategy::Just(r#""done":true"#),
                    proptest::strategy::Just(r#""k" : 1"#),
                ],
                0..6,
            )
        ) {
            let api = if chat { Api::Chat } else { Api::Generate };
            let line = format!("{{{}}}", fields.join(","));
            if let Some(p) = read_alone(api, line.as_bytes()) {
                let serde = by_serde(api, line.as_bytes());
                proptest::prop_assert_eq!(serde, Some((p.text.to_string(), p.thinking.to_string())), "{}", line);
            }
        }
    }

    /// `line` read by the shape of `prev`, when `prev` has one; the shape it leaves is
    /// `line`'s, as `Assembler::plain` keeps it.
    fn followed<'a>(api: Api, prev: &[u8], line: &'a [u8]) -> Option<Read<'a>> {
        let mut shape = Shape::default();
        plain_line(api, prev, &mut shape)?;
        let mut next = Vec::new();
        let plain = shape.follow(prev, line, &mut next)?;
        shape.values = next;
        Some(Read::of(plain, &shape))
    }

    #[test]
    fn a_line_shaped_as_the_one_before_is_read_by_its_values() {
        let line = |at: &str, text: &str| {
            format!(
                r#"{{"model":"llama3.2","created_at":"{at}","message":{{"role":"assistant","content":"{text}"}},"done":false}}"#
            )
        };
        let first = line("2026-12-01T00:00:00.123456789Z", " The");
        let next = line("2026-12-01T00:00:00.2Z", " quick é");
        let p = followed(Api::Chat, first.as_bytes(), next.as_bytes()).expect("the same shape");
        assert_eq!(p, read_alone(Api::Chat, next.as_bytes()).expect("plain"));
        assert_eq!((p.text, p.done), (" quick é", false));
        // Anything but a plain value differs: the line goes to the full read.
        for other in [
            next.replace("false", "true"),
            next.replace("role", "rolf"),
            next.replace(" quick", r#"\" quick"#),
            next.replace(" quick", "\u{1} quick"),
            next.replace(r#""},"done""#, r#""} ,"done""#),
            next.clone() + " ",
            next[..next.len() - 1].to_string(),
        ] {
            assert_eq!(followed(Api::Chat, first.as_bytes(), other.as_bytes()), None, "{other}");
        }
        let mut bad = next.clone().into_bytes();
        let at = next.find("llama").expect("model");
        bad[at] = 0xff;
        assert_eq!(followed(Api::Chat, first.as_bytes(), &bad), None, "invalid UTF-8 in a value that is not the text");
        let gen = |t: &str| format!(r#"{{"model":"m","created_at":"t","response":"{t}","thinking":"","done":false}}"#);
        let bcd = gen("bcd");
        let p = followed(Api::Generate, gen("a").as_bytes(), bcd.as_bytes()).expect("the same shape");
        let quoted = bcd.find(r#""bcd""#).expect("text");
        assert_eq!((p.text, p.has_thinking, p.text_at), ("bcd", true, Some(quoted..quoted + 5)));
    }

    proptest::proptest! {
        /// Whatever the shape of the line before takes, the full read takes and reads the same
        /// way: lines of known and unknown fields, with any bytes (quotes, backslashes, braces,
        /// digits, control and non-UTF-8 bytes) put in anywhere.
        #[test]
        fn the_shape_reader_agrees_with_the_full_read(
            chat in proptest::bool::ANY,
            fields in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(r#""model":"llama3.2""#),
                    proptest::strategy::Just(r#""created_at":"2026-12-01T00:00:00Z""#),
                    proptest::strategy::Just(r#""message":{"role":"assistant","content":"hi"}"#),
                    proptest::strategy::Just(r#""message":{"content":"a","thinking":"t"}"#),
                    proptest::strategy::Just(r#""response":"r""#),
                    proptest::strategy::Just(r#""thinking":"th""#),
                    proptest::strategy::Just(r#""done":false"#),
                    proptest::strategy::Just(r#""eval_count":-0.5E+3"#),
                    proptest::strategy::Just(r#""o":{"a":"b","c":null}"#),
                ],
                0..6,
            ),
            at in proptest::num::usize::ANY,
            cut in 0usize..4,
            put in proptest::collection::vec(
                proptest::sample::select(vec![b'a', b' ', b'"', b'\\', b'{', b'}', b':', b',', b'0', 0x01, 0xc3, 0xa9, 0xff]),
                0..4,
            ),
        ) {
            let api = if chat { Api::Chat } else { Api::Generate };
            let prev = format!("{{{}}}", fields.join(","));
            let mut line = prev.clone().into_bytes();
            let at = at % (line.len() + 1);
            line.splice(at..(at + cut).min(line.len()), put);
            if let Some(p) = followed(api, prev.as_bytes(), &line) {
                proptest::prop_assert_eq!(Some(p), read_alone(api, &line), "{}", String::from_utf8_lossy(&line));
            }
        }
    }

    fn assemble(api: Api, chunks: &[&str]) -> Result<String, AssembleError> {
        let mut a = Assembler::new(api);
        for c in chunks {
            a.push(c.as_bytes())?;
        }
        a.finish().map(|b| String::from_utf8(b).expect("utf8"))
    }

    /// An Ollama stream of `texts` whose last line (text `last`) carries `extra` fields at the
    /// top level and `extra_in_message` in its message (chat).
    fn stream_of(chat: bool, texts: &[String], last: &str, extra: &[&str], extra_in_message: &[&str]) -> String {
        let text = |t: &str| serde_json::to_string(t).expect("json");
        let mut out = String::new();
        for t in texts {
            out += &if chat {
                format!(
                    r#"{{"model":"m","created_at":"t","message":{{"role":"assistant","content":{}}},"done":false}}"#,
                    text(t)
                )
            } else {
                format!(r#"{{"model":"m","created_at":"t","response":{},"done":false}}"#, text(t))
            };
            out.push('\n');
        }
        let mut top = vec![r#""model":"m""#.to_string(), r#""created_at":"t""#.to_string()];
        if chat {
            let mut message = vec![r#""role":"assistant""#.to_string(), format!(r#""content":{}"#, text(last))];
            message.extend(extra_in_message.iter().map(|f| f.to_string()));
            top.push(format!(r#""message":{{{}}}"#, message.join(",")));
        } else {
            top.push(format!(r#""response":{}"#, text(last)));
        }
        top.push(r#""done":true"#.into());
        top.extend(extra.iter().map(|f| f.to_string()));
        out + "{" + &top.join(",") + "}\n"
    }

    /// The assembler after `stream`, and its last line; `None` for a stream it refuses.
    fn assembled(api: Api, stream: &str) -> Option<(Assembler, Vec<u8>)> {
        let mut a = Assembler::new(api);
        a.push(stream.as_bytes()).ok()?;
        let last = a.last.clone()?;
        Some((a, last))
    }

    proptest::proptest! {
        /// Wherever the splice applies, it makes the very bytes the rebuild makes: texts with
        /// quotes, backslashes, HTML characters, U+2028 and accents; last lines with fields
        /// Corral does not know, keys Go would escape, a thinking, numbers in any spelling.
        #[test]
        fn the_spliced_answer_is_the_rebuilt_one(
            chat in proptest::bool::ANY,
            texts in proptest::collection::vec("[ a-z<>&\"\\\\\u{2028}é\n]{0,4}", 0..5),
            last in "[ a-z<&\"]{0,3}",
            extra in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(r#""done_reason":"stop""#),
                    proptest::strategy::Just(r#""total_duration":5"#),
                    proptest::strategy::Just(r#""load_duration":-1.5e3"#),
                    proptest::strategy::Just(r#""x":{"a":null,"b":0.5}"#),
                    proptest::strategy::Just(r#""k<":1"#),
                    proptest::strategy::Just(r#""é":"ü""#),
                    proptest::strategy::Just(r#""thinking":"th""#),
                    proptest::strategy::Just(r#""eval_count":16"#),
                ],
                0..4,
            ),
            in_message in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(r#""thinking":"""#),
                    proptest::strategy::Just(r#""images":null"#),
                    proptest::strategy::Just(r#""n":1"#),
                ],
                0..2,
            ),
        ) {
            let api = if chat { Api::Chat } else { Api::Generate };
            let stream = stream_of(chat, &texts, &last, &extra, &in_message);
            let Some((a, line)) = assembled(api, &stream) else {
                return Ok(());
            };
            if let Some(spliced) = a.spliced(&line) {
                let rebuilt = a.rebuilt(&line).expect("rebuilt");
                proptest::prop_assert_eq!(String::from_utf8_lossy(&spliced), String::from_utf8_lossy(&rebuilt), "{}", stream);
            }
        }
    }

    #[test]
    fn a_plain_stream_is_spliced_and_anything_more_is_rebuilt() {
        let texts = [" w0".to_string(), " \"w1\" <b>".to_string()];
        let plain = stream_of(true, &texts, "", &[r#""done_reason":"length""#, r#""eval_count":2"#], &[]);
        let (a, line) = assembled(Api::Chat, &plain).expect("a stream");
        let spliced = a.spliced(&line).expect("the common stream is spliced");
        assert_eq!(
            String::from_utf8(spliced).expect("utf8"),
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":" w0 \"w1\" \u003cb\u003e"},"done":true,"done_reason":"length","eval_count":2}"#
        );
        let generate = stream_of(false, &texts, "!", &[], &[]);
        let (a, line) = assembled(Api::Generate, &generate).expect("a stream");
        assert!(a.spliced(&line).is_some(), "{generate}");
        for (api, stream) in [
            (Api::Chat, stream_of(true, &texts, "", &[], &[r#""thinking":"""#])),
            (Api::Chat, stream_of(true, &texts, "", &[r#""k<":1"#], &[])),
            (Api::Chat, stream_of(true, &texts, "", &[r#""x":{"a":"\u003c"}"#], &[])),
            (Api::Generate, stream_of(false, &texts, "", &[r#""thinking":"th""#], &[])),
            (Api::Generate, stream_of(false, &texts, "", &[r#""context":[1,2]"#], &[])),
        ] {
            let (a, line) = assembled(api, &stream).expect("a stream");
            assert!(a.spliced(&line).is_none(), "rebuilt, not spliced: {stream}");
        }
    }

    #[test]
    fn a_chat_stream_becomes_the_last_chunk_with_the_text_joined() {
        let lines = [
            "{\"model\":\"m\",\"created_at\":\"t1\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"hm \"},\"done\":false}\n",
            "{\"model\":\"m\",\"created_at\":\"t2\",\"message\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"done\":false}\n{\"model\":\"m\",\"created_at\":\"t3\",\"message\":{\"role\":\"assistant\",\"content\":\"lo \\u003cb\\u003e\"},\"do",
            "ne\":false}\n{\"model\":\"m\",\"created_at\":\"t4\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":5,\"eval_count\":2}\n",
        ];
        assert_eq!(
            assemble(Api::Chat, &lines).expect("answer"),
            "{\"model\":\"m\",\"created_at\":\"t4\",\"message\":{\"role\":\"assistant\",\"content\":\"Hello \\u003cb\\u003e\",\"thinking\":\"hm \"},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":5,\"eval_count\":2}"
        );
    }

    #[test]
    fn tool_calls_and_logprobs_of_every_chunk_are_gathered() {
        let lines = [
            "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"a\"}}]},\"done\":false,\"logprobs\":[{\"token\":\"x\"}]}\n",
            "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"b\"}}]},\"done\":false}\n",
            "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"logprobs\":[{\"token\":\"y\"}],\"eval_count\":2}\n",
        ];
        let got = assemble(Api::Chat, &lines).expect("answer");
        assert!(got.contains(r#""tool_calls":[{"function":{"name":"a"}},{"function":{"name":"b"}}]"#), "{got}");
        assert!(
            got.contains(r#""done_reason":"stop","logprobs":[{"token":"x"},{"token":"y"}],"eval_count":2"#),
            "{got}"
        );
    }

    #[test]
    fn a_generate_stream_joins_response_and_keeps_context() {
        let lines = [
            "{\"model\":\"m\",\"created_at\":\"a\",\"response\":\"Hi\",\"done\":false}\n",
            "{\"model\":\"m\",\"created_at\":\"b\",\"response\":\" there\",\"thinking\":\"t\",\"done\":false}\n",
            "{\"model\":\"m\",\"created_at\":\"c\",\"response\":\"\",\"done\":true,\"done_reason\":\"stop\",\"context\":[1,2]}",
        ];
        assert_eq!(
            assemble(Api::Generate, &lines).expect("answer"),
            r#"{"model":"m","created_at":"c","response":"Hi there","thinking":"t","done":true,"done_reason":"stop","context":[1,2]}"#
        );
    }

    #[test]
    fn an_error_line_a_missing_end_and_garbage_are_errors() {
        let err = ["{\"model\":\"m\",\"response\":\"a\",\"done\":false}\n{\"error\":\"out of memory\"}\n"];
        assert_eq!(assemble(Api::Generate, &err), Err(AssembleError::Node("out of memory".into())));
        let cut = ["{\"model\":\"m\",\"response\":\"a\",\"done\":false}\n"];
        assert_eq!(assemble(Api::Generate, &cut), Err(AssembleError::NoEnd));
        assert!(matches!(assemble(Api::Chat, &["not json\n"]), Err(AssembleError::Malformed(_))));
        assert_eq!(assemble(Api::Chat, &[]), Err(AssembleError::NoEnd));
    }

    #[test]
    fn only_the_top_level_stream_false_is_turned_into_true() {
        let body = br#"{"model":"m","options":{"stream":false},"stream" : false,"messages":[]}"#;
        assert_eq!(
            &streamed_body(body).expect("rewritten")[..],
            br#"{"model":"m","options":{"stream":false},"stream" : true,"messages":[]}"#
        );
        let escaped = br#"{"model":"m","str\u0065am":false}"#;
        let v: serde_json::Value = serde_json::from_slice(&streamed_body(escaped).expect("rewritten")).expect("json");
        assert_eq!(v["stream"], true);
        assert!(streamed_body(br#"{"model":"m","stream":true}"#).is_none());
        let tricky = br#"{"prompt":"say \"stream\":false","stream":false}"#;
        assert_eq!(
            &streamed_body(tricky).expect("rewritten")[..],
            br#"{"prompt":"say \"stream\":false","stream":true}"#
        );
    }

    #[test]
    fn a_v1_stream_becomes_one_chat_completion() {
        let mut a = SseAssembler::default();
        let events = concat!(
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":5,\"model\":\"m\",\"system_fingerprint\":\"fp_ollama\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":5,\"model\":\"m\",\"system_fingerprint\":\"fp_ollama\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" <there>\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":6,\"model\":\"m\",\"system_fingerprint\":\"fp_ollama\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":6,\"model\":\"m\",\"system_fingerprint\":\"fp_ollama\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n",
            "data: [DONE]\n\n",
        );
        for piece in events.as_bytes().chunks(7) {
            a.push(piece).expect("push");
        }
        assert_eq!(
            String::from_utf8(a.finish().expect("answer")).expect("utf8"),
            "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":6,\"model\":\"m\",\"system_fingerprint\":\"fp_ollama\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hi \\u003cthere\\u003e\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n"
        );
        let mut cut = SseAssembler::default();
        cut.push(&events.as_bytes()[..200]).expect("push");
        assert_eq!(cut.finish(), Err(AssembleError::NoEnd));
    }

    #[test]
    fn a_v1_body_asks_for_a_stream_with_its_usage() {
        let v = |b: &[u8]| -> serde_json::Value {
            serde_json::from_slice(&streamed_v1_body(b).expect("body")).expect("json")
        };
        for body in [
            &br#"{"model":"m","messages":[]}"#[..],
            br#"{"model":"m","stream":false}"#,
            br#" { "model":"m","stream_options":{"include_usage":false}}"#,
        ] {
            let got = v(body);
            assert_eq!(got["stream"], true, "{got}");
            assert_eq!(got["stream_options"]["include_usage"], true, "{got}");
            assert_eq!(got["model"], "m");
        }
        assert!(streamed_v1_body(br#"{"model":"m","stream":true,"stream_options":{}}"#).is_none());
    }

    #[test]
    fn a_count_is_added_to_in_place() {
        let line = br#"{"done":true,"eval_count":20,"eval_duration":5}"#;
        assert_eq!(
            add_to_field(line, "eval_count", 40).expect("count"),
            br#"{"done":true,"eval_count":60,"eval_duration":5}"#
        );
        assert!(add_to_field(br#"{"done":true}"#, "eval_count", 1).is_none());
    }

    #[test]
    fn strings_are_encoded_as_go_encodes_them() {
        assert_eq!(go_string("a<b>&c\"\\\n\u{1}\u{2028}é"), "\"a\\u003cb\\u003e\\u0026c\\\"\\\\\\n\\u0001\\u2028é\"");
    }

    /// `go_string` a character at a time: what the run-by-run writer must agree with.
    fn go_string_by_chars(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\u{2028}' => out.push_str("\\u2028"),
                '\u{2029}' => out.push_str("\\u2029"),
                c if (c as u32) < 0x20 || matches!(c, '<' | '>' | '&') => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out + "\""
    }

    proptest::proptest! {
        /// Runs, escapes, HTML characters, U+2028/2029 and their neighbours led by 0xE2
        /// (U+2027, U+202A, arrows), in any order.
        #[test]
        fn go_string_writes_runs_as_a_char_loop_does(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("plain text".to_string()),
                    proptest::strategy::Just("\u{2028}\u{2029}\u{2027}\u{202a}→".to_string()),
                    proptest::strategy::Just("<>&\"\\".to_string()),
                    "[\\x00-\\x1f]",
                    "\\PC{0,3}",
                ],
                0..8,
            )
        ) {
            let s = parts.concat();
            proptest::prop_assert_eq!(go_string(&s), go_string_by_chars(&s));
        }
    }
}
