//! The simulated node's OpenAI-compatible API: `/v1/models`, `/v1/chat/completions`,
//! `/v1/completions` and `/v1/embeddings`, as Ollama's `/v1` layer (or, with `SimSpec::cloud`,
//! a cloud provider) answers them.
//!
//! Errors are OpenAI-shaped (`{"error": {"message", "type", ...}}`), streams are SSE events
//! ending in `data: [DONE]`, with a usage event when `stream_options.include_usage` asks for
//! one. Generation itself is in `inference`.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use serde_json::{json, Value};

use super::inference::{embed, inference, Answer, Chunk, Kind};
use super::router::{not_found, Incoming};
use super::Shared;

pub(super) async fn route(s: Arc<Shared>, call: Incoming) -> Response {
    match (call.method.clone(), call.path.as_str()) {
        (Method::GET, "/v1/models") => models(&s),
        (Method::GET, p) if p.starts_with("/v1/models/") => model(&s, &p["/v1/models/".len()..]),
        (Method::POST, "/v1/chat/completions") => inference(s, Kind::V1Chat, call.body).await,
        (Method::POST, "/v1/completions") => inference(s, Kind::V1Completion, call.body).await,
        (Method::POST, "/v1/embeddings") => embed(s, &call.path, call.body).await,
        _ => not_found(),
    }
}

fn models(s: &Shared) -> Response {
    axum::Json(json!({
        "object": "list",
        // Ollama says `llama3.2:latest`; OpenAI-compatible servers name models without tags.
        "data": s.models().iter().map(|m| if s.spec.cloud { m.strip_suffix(":latest").unwrap_or(m) } else { m }).map(|m| json!({"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "library"})).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// `GET /v1/models/{model}` (Ollama's `RetrieveMiddleware` over `ShowHandler`): the model's
/// entry, or a 404 naming it.
fn model(s: &Shared, name: &str) -> Response {
    let wanted = crate::config::normalize_model(name);
    if s.models().contains(&wanted) {
        let id = if s.spec.cloud { name.strip_suffix(":latest").unwrap_or(name) } else { name };
        return axum::Json(json!({"id": id, "object": "model", "created": 1_700_000_000, "owned_by": "library"}))
            .into_response();
    }
    error(StatusCode::NOT_FOUND, &format!("model \"{name}\" not found"))
}

/// OpenAI-shaped error, as Ollama's `/v1` middleware writes it.
pub(super) fn error(status: StatusCode, msg: &str) -> Response {
    error_with(status, msg, None, None)
}

/// OpenAI-shaped error with its `type` (by default the one Ollama's `/v1` layer gives the
/// status) and `code` (`content_filter`, ...; `null` when `None`), as a cloud provider writes it.
pub(super) fn error_with(status: StatusCode, msg: &str, kind: Option<&str>, code: Option<&str>) -> Response {
    let implied = match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::NOT_FOUND => "not_found_error",
        _ => "api_error",
    };
    let etype = kind.unwrap_or(implied);
    (status, axum::Json(json!({ "error": { "message": msg, "type": etype, "param": null, "code": code } })))
        .into_response()
}

/// The body of `/v1/embeddings`.
pub(super) fn embeddings(model: &str, vectors: &[Vec<f32>], tokens: usize) -> Value {
    json!({
        "object": "list",
        "data": vectors.iter().enumerate().map(|(i, e)| json!({ "object": "embedding", "embedding": e, "index": i })).collect::<Vec<_>>(),
        "model": model,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    })
}

/// An answer in OpenAI's words: a completion object, or SSE chunks ending in `[DONE]`.
impl Answer {
    fn usage(&self) -> Value {
        let n = self.completion.tokens.len();
        json!({ "prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n })
    }

    fn created(&self) -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
    }

    fn v1_id(&self) -> String {
        match self.kind {
            Kind::V1Chat => format!("chatcmpl-{}", self.id),
            _ => format!("cmpl-{}", self.id),
        }
    }

    /// `finish_reason`: "tool_calls" when the answer is a tool call (Ollama's `toChatCompletion`).
    fn v1_finish(&self) -> &'static str {
        match (self.finish_reason(), &self.tool_call) {
            ("stop", Some(_)) => "tool_calls",
            (r, _) => r,
        }
    }

    /// OpenAI's tool calls: arguments as a JSON string.
    fn v1_tool_calls(&self) -> Value {
        match &self.tool_call {
            Some((name, args)) => json!([{ "id": format!("call_{}", self.id), "index": 0, "type": "function",
                "function": { "name": name, "arguments": args.to_string() } }]),
            None => Value::Null,
        }
    }

    /// The assistant message of a whole chat completion, with `reasoning` and `tool_calls`.
    fn v1_message(&self, text: &str) -> Value {
        let mut m = json!({ "role": "assistant", "content": text });
        if let Some(t) = &self.thinking {
            m["reasoning"] = json!(t);
        }
        if self.tool_call.is_some() {
            m["tool_calls"] = self.v1_tool_calls();
        }
        m
    }

    /// The whole answer as one completion object (`"stream": false`).
    pub(super) fn v1_whole(&self, text: &str) -> Value {
        match self.kind {
            Kind::V1Chat => json!({
                "id": self.v1_id(), "object": "chat.completion", "created": self.created(), "model": self.model,
                "system_fingerprint": "fp_ollama",
                "choices": [{ "index": 0, "message": self.v1_message(text), "finish_reason": self.v1_finish() }],
                "usage": self.usage(),
            }),
            _ => json!({
                "id": self.v1_id(), "object": "text_completion", "created": self.created(), "model": self.model,
                "system_fingerprint": "fp_ollama",
                "choices": [{ "text": text, "index": 0, "finish_reason": self.finish_reason() }],
                "usage": self.usage(),
            }),
        }
    }

    /// One SSE event per token, the finishing event, the usage event if asked for, `[DONE]`.
    pub(super) fn v1_chunks(&self) -> VecDeque<Chunk> {
        let mut out = VecDeque::new();
        let event = |v: Value| Chunk::Raw(Bytes::from(format!("data: {v}\n\n")));
        let created = self.created();
        if self.kind == Kind::V1Chat && (self.thinking.is_some() || self.tool_call.is_some()) {
            // Ollama's openai layer: the reasoning in a chunk of its own, then the tool call.
            let mut scripted = vec![];
            if let Some(t) = &self.thinking {
                scripted.push(json!({ "role": "assistant", "content": "", "reasoning": t }));
            }
            if self.tool_call.is_some() {
                scripted.push(json!({ "role": "assistant", "content": "", "tool_calls": self.v1_tool_calls() }));
            }
            for delta in scripted {
                out.push_back(event(json!({ "id": self.v1_id(), "object": "chat.completion.chunk", "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [{ "index": 0, "delta": delta, "finish_reason": null }] })));
            }
        }
        for tok in &self.completion.tokens {
            out.push_back(if self.kind == Kind::V1Chat {
                event(json!({ "id": self.v1_id(), "object": "chat.completion.chunk", "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [{ "index": 0, "delta": { "role": "assistant", "content": tok }, "finish_reason": null }] }))
            } else {
                event(json!({ "id": self.v1_id(), "object": "text_completion", "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [{ "text": tok, "index": 0, "finish_reason": null }] }))
            });
        }
        let choice = if self.kind == Kind::V1Chat {
            json!({ "index": 0, "delta": { "role": "assistant", "content": "" }, "finish_reason": self.v1_finish() })
        } else {
            json!({ "text": "", "index": 0, "finish_reason": self.finish_reason() })
        };
        let object = if self.kind == Kind::V1Chat { "chat.completion.chunk" } else { "text_completion" };
        out.push_back(event(json!({ "id": self.v1_id(), "object": object, "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [choice] })));
        if self.include_usage {
            out.push_back(event(json!({ "id": self.v1_id(), "object": object, "created": created, "model": self.model, "system_fingerprint": "fp_ollama", "choices": [], "usage": self.usage() })));
        }
        out.push_back(Chunk::Raw(Bytes::from_static(b"data: [DONE]\n\n")));
        out
    }
}
