//! The OpenAI-compatible dialect (llama.cpp server, vLLM, LM Studio, cloud providers):
//! probes, the plan that turns an Ollama-native request into Chat Completions / Embeddings,
//! and the answer translated back, event by event for streams.
//!
//! Liveness is `/health` (llama.cpp, vLLM), or `/v1/models` where there is none; readiness a
//! 1-token chat; inventory `/v1/models` (there is no `/api/ps`). Such servers load their model
//! at start, so there is no warm-up.

use std::time::Duration;

use axum::body::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::translate::{self, Audience, Native, Reply};
use super::{get_json, get_status, BodyError, BodyStream, Inventory, Upstream};

/// Largest non-streamed answer read whole for translation.
const MAX_WHOLE_ANSWER: usize = 64 * 1024 * 1024;

pub(super) async fn liveness(up: &Upstream<'_>, client: &reqwest::Client, timeout: Duration) -> bool {
    match get_status(client, up.url("/health"), timeout).await {
        Some(StatusCode::NOT_FOUND) => {
            get_status(client, up.url("/v1/models"), timeout).await.is_some_and(|s| s.is_success())
        }
        Some(s) => s.is_success(),
        None => false,
    }
}

pub(super) async fn readiness(up: &Upstream<'_>, client: &reqwest::Client, model: &str, timeout: Duration) -> bool {
    let m = model.strip_suffix(":latest").unwrap_or(model);
    let body = json!({"model": m, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1});
    matches!(
        tokio::time::timeout(timeout, client.post(up.url("/v1/chat/completions")).json(&body).send()).await,
        Ok(Ok(r)) if r.status().is_success()
    )
}

pub(super) async fn inventory(up: &Upstream<'_>, client: &reqwest::Client, timeout: Duration) -> Inventory {
    let Some(v) = get_json(client, up.url("/v1/models"), timeout).await else { return Inventory::default() };
    let names = models_as_tags(&v)["models"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["name"].as_str()).map(str::to_string).collect::<Vec<_>>());
    Inventory { models: Some(names.unwrap_or_default()), loaded: None }
}

/// An OpenAI-style model list in `/api/tags` shape (what an Ollama client can read).
pub fn models_as_tags(v: &Value) -> Value {
    let models: Vec<Value> = v
        .get("data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("id").and_then(Value::as_str))
        .map(|id| {
            json!({
                "name": id, "model": id, "modified_at": "1970-01-01T00:00:00Z", "size": 0, "digest": "",
                "details": { "format": "", "family": "", "parameter_size": "", "quantization_level": "" },
            })
        })
        .collect();
    json!({ "models": models })
}

/// How one request goes to an OpenAI-compatible node: Ollama's native endpoints translated
/// to Chat Completions / Embeddings, `/v1` as it came.
#[derive(Debug)]
pub struct Plan {
    pub url: url::Url,
    pub body: Bytes,
    /// The translated endpoint and whether the client wants a stream; `None` for `/v1`.
    pub native: Option<(Native, bool)>,
    /// The model name the client used, echoed in the answer.
    pub model: String,
}

/// A request the node cannot take, and the answer to give the client instead.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    /// The whole answer, in Ollama's words.
    pub body: Value,
}

impl Plan {
    /// The plan for `path_and_query` with `body` naming `model`, or why there is none (an
    /// endpoint such a server does not have, a body that cannot be translated).
    pub fn new(
        up: &Upstream<'_>,
        node: &str,
        path_and_query: &str,
        model: &str,
        body: &Bytes,
    ) -> Result<Self, Refusal> {
        let refuse = |status: StatusCode, message: String| Refusal { status, body: json!({ "error": message }) };
        let path = path_and_query.split('?').next().unwrap_or("");
        if path_and_query.starts_with("/v1") {
            return Ok(Self { url: up.url(path_and_query), body: body.clone(), native: None, model: model.into() });
        }
        let Some(api) = Native::of(path) else {
            return Err(refuse(
                StatusCode::NOT_IMPLEMENTED,
                format!("node {node} is an OpenAI-compatible server; it has no {path}"),
            ));
        };
        // A bare load or unload: such a server holds its model already; nothing to generate.
        if let Some(l) = super::lifecycle::Lifecycle::of(path, body) {
            return Err(Refusal { status: StatusCode::OK, body: l.answer(path, model) });
        }
        let parsed: Value = serde_json::from_slice(body).map_err(|e| refuse(StatusCode::BAD_REQUEST, e.to_string()))?;
        let upstream_model = model.strip_suffix(":latest").unwrap_or(model);
        let t = translate::request(api, &parsed, upstream_model, Audience::Node)
            .map_err(|e| refuse(StatusCode::BAD_REQUEST, e.0))?;
        Ok(Self {
            url: up.url(&format!("/v1{}", api.upstream_path())),
            body: Bytes::from(t.body.to_string()),
            native: Some((api, t.stream)),
            model: model.into(),
        })
    }
}

/// The client's body from an OpenAI-compatible upstream's successful answer: translated (or
/// restored) when `reply` says so, event by event for streams, whole otherwise.
pub async fn answer_body(
    resp: reqwest::Response,
    reply: Option<Reply>,
    stream: bool,
    within: Duration,
) -> Result<(HeaderValue, BodyStream), String> {
    let upstream_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let Some(mut reply) = reply else {
        let ct = upstream_type.unwrap_or(HeaderValue::from_static("application/json"));
        return Ok((ct, super::raw_body(resp)));
    };
    let ct = HeaderValue::from_static(reply.content_type(stream));
    if !stream {
        let body = tokio::time::timeout(within, read_limited(resp, MAX_WHOLE_ANSWER))
            .await
            .map_err(|_| format!("the answer did not complete within {} ms", within.as_millis()))??;
        let out = reply.whole(&body).map_err(|e| e.0)?;
        return Ok((ct, futures_util::stream::once(async move { Ok(out) }).boxed()));
    }
    Ok((ct, translate_stream(resp.bytes_stream().boxed(), reply)))
}

async fn read_limited(resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("the answer broke off ({})", super::root_cause(&e)))?;
        if out.len() + chunk.len() > limit {
            return Err(format!("the answer is larger than {limit} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// An SSE body translated as it arrives; ends when the answer is complete, or with the reason
/// it is not.
pub fn translate_stream(
    upstream: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    reply: Reply,
) -> BodyStream {
    futures_util::stream::unfold(Some((upstream, reply)), |state| async move {
        let (mut upstream, mut reply) = state?;
        loop {
            match upstream.next().await {
                Some(Ok(chunk)) => match reply.feed(&chunk) {
                    Ok(out) if reply.is_finished() => return Some((Ok(out), None)),
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => return Some((Ok(out), Some((upstream, reply)))),
                    Err(e) => return Some((Err(BodyError::Translate(e.0)), None)),
                },
                Some(Err(e)) => return Some((Err(BodyError::Http(e)), None)),
                None => {
                    return match reply.end() {
                        Ok(out) if out.is_empty() => None,
                        Ok(out) => Some((Ok(out), None)),
                        Err(e) => Some((Err(BodyError::Translate(e.0)), None)),
                    }
                }
            }
        }
    })
    .boxed()
}
