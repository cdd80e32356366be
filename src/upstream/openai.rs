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

use super::probe::{self, ProbeError};
use super::translate::{self, Audience, Native, Reply};
use super::{get_json, BodyError, BodyStream, Inventory, Upstream};

/// Largest non-streamed answer read whole for translation.
const MAX_WHOLE_ANSWER: usize = 64 * 1024 * 1024;

pub(super) async fn liveness(up: &Upstream<'_>, client: &reqwest::Client, timeout: Duration) -> Result<(), ProbeError> {
    match probe::exchange(client.get(up.url("/health")), timeout).await {
        Err(ProbeError::Status { status: 404, .. }) => probe::exchange(client.get(up.url("/v1/models")), timeout).await,
        other => other,
    }
}

pub(super) async fn readiness(
    up: &Upstream<'_>,
    client: &reqwest::Client,
    model: &str,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let m = model.strip_suffix(":latest").unwrap_or(model);
    let body = json!({"model": m, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1});
    probe::exchange(client.post(up.url("/v1/chat/completions")).json(&body), timeout).await
}

/// Time to first token: a streamed one-token chat, timed to its first SSE event with text
/// (`delta.content` or `delta.reasoning_content` / `reasoning`) or a `finish_reason`.
pub(super) async fn first_token(
    up: &Upstream<'_>,
    client: &reqwest::Client,
    model: &str,
    timeout: Duration,
) -> Result<probe::FirstToken, ProbeError> {
    let m = model.strip_suffix(":latest").unwrap_or(model);
    let body = json!({"model": m, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": true});
    probe::first_token(client.post(up.url("/v1/chat/completions")).json(&body), timeout, is_content).await
}

fn is_content(line: &[u8]) -> bool {
    let text = String::from_utf8_lossy(line);
    let Some(data) = text.trim().strip_prefix("data:").map(str::trim) else { return false };
    if data == "[DONE]" {
        return true;
    }
    let Ok(v) = serde_json::from_str::<Value>(data) else { return false };
    let choice = &v["choices"][0];
    let said = |k: &str| choice["delta"][k].as_str().is_some_and(|t| !t.is_empty());
    said("content") || said("reasoning_content") || said("reasoning") || !choice["finish_reason"].is_null()
}

pub(super) async fn inventory(up: &Upstream<'_>, client: &reqwest::Client, timeout: Duration) -> Inventory {
    let Some(v) = get_json(client, up.url("/v1/models"), timeout).await else { return Inventory::default() };
    let names = models_as_tags(&v)["models"].as_array().map(|a| {
        a.iter().filter_map(|m| m["name"].as_str()).map(str::to_string).take(super::MAX_MODELS).collect::<Vec<_>>()
    });
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

/// The name an OpenAI-compatible server is asked for: Ollama's default registry, namespace
/// and `:latest` tag dropped (such servers name models without them), the client's case kept
/// (they compare names exactly).
fn upstream_name(model: &str) -> &str {
    let key = crate::config::model_key(model);
    let short_len = key.strip_suffix(":latest").unwrap_or(&key).len();
    let tagged_latest = key.ends_with(":latest") && model.len() >= ":latest".len() && {
        let tail = &model[model.len() - ":latest".len()..];
        tail.eq_ignore_ascii_case(":latest")
    };
    let end = if tagged_latest { model.len() - ":latest".len() } else { model.len() };
    // The short name is the tail of the client's spelling (prefixes are only ever dropped).
    model.get(end.saturating_sub(short_len)..end).unwrap_or(model)
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
        if let Some(answer) = answered_here(path, model) {
            return Err(Refusal { status: StatusCode::OK, body: answer });
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
        let upstream_model = upstream_name(model);
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

/// Ollama routes an OpenAI-compatible server has no counterpart for but that have a right
/// answer without one: `/api/version` (Corral's own version, in Ollama's shape),
/// `/api/status` (such a server has no Ollama cloud) and `/api/show` when nothing better is
/// known (the proxy asks the server itself first, [`show`]).
fn answered_here(path: &str, model: &str) -> Option<Value> {
    Some(match path {
        "/api/version" => json!({ "version": env!("CARGO_PKG_VERSION") }),
        "/api/status" => json!({ "cloud": { "disabled": true, "source": "none" } }),
        "/api/show" => show_response(model, None, None),
        _ => return None,
    })
}

/// Ollama's `ShowResponse` for `model` on an OpenAI-compatible server, from what the server
/// says of it: its `/v1/models` entry (vLLM's `max_model_len`, llama.cpp's `meta`) and, where
/// there is one, llama.cpp's `/props` (`n_ctx`, chat template capabilities, modalities).
/// `None` when the server does not list the model. The context length found is also what
/// the answer's `parameters` (`num_ctx`) and `model_info` say.
pub async fn show(up: &Upstream<'_>, client: &reqwest::Client, model: &str, timeout: Duration) -> Option<Value> {
    let (models, props) =
        tokio::join!(get_json(client, up.url("/v1/models"), timeout), get_json(client, up.url("/props"), timeout));
    let wanted = crate::config::model_key(model);
    let entry = models?
        .get("data")
        .and_then(Value::as_array)?
        .iter()
        .find(|m| m["id"].as_str().is_some_and(|id| crate::config::model_key(id) == wanted))?
        .clone();
    Some(show_response(model, Some(&entry), props.as_ref()))
}

/// The context length an OpenAI-compatible server runs `model` with, from a `show` answer.
pub fn show_context_length(show: &Value) -> Option<u64> {
    show["model_info"].as_object()?.iter().find(|(k, _)| k.ends_with(".context_length")).and_then(|(_, v)| v.as_u64())
}

/// A `ShowResponse` from a `/v1/models` entry and llama.cpp's `/props`, either or both absent.
/// Capabilities say only what is known: `completion` always, `tools` and `vision` when the
/// server says so.
fn show_response(model: &str, entry: Option<&Value>, props: Option<&Value>) -> Value {
    let meta = entry.and_then(|e| e.get("meta"));
    let num = |v: Option<&Value>| v.and_then(Value::as_u64).filter(|&n| n > 0);
    let context = num(props.and_then(|p| p.pointer("/default_generation_settings/n_ctx")))
        .or_else(|| num(entry.and_then(|e| e.get("max_model_len"))))
        .or_else(|| num(meta.and_then(|m| m.get("n_ctx_train"))));
    let params = num(meta.and_then(|m| m.get("n_params")));
    let mut capabilities = vec!["completion"];
    let template = props.and_then(|p| p["chat_template"].as_str()).unwrap_or_default();
    let caps_tools = props.and_then(|p| p.pointer("/chat_template_caps/supports_tools")).and_then(Value::as_bool);
    if caps_tools.unwrap_or(template.contains("tools")) {
        capabilities.push("tools");
    }
    if props.and_then(|p| p.pointer("/modalities/vision")).and_then(Value::as_bool) == Some(true) {
        capabilities.push("vision");
    }
    let mut info = serde_json::Map::new();
    info.insert("general.architecture".into(), json!("openai-compatible"));
    if let Some(n) = params {
        info.insert("general.parameter_count".into(), json!(n));
    }
    if let Some(n) = context {
        info.insert("openai-compatible.context_length".into(), json!(n));
    }
    let modified = entry
        .and_then(|e| e["created"].as_i64())
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut show = json!({
        "modelfile": format!("# served by an OpenAI-compatible server through Corral\nFROM {model}\n"),
        "details": {
            "parent_model": "", "format": if props.is_some() { "gguf" } else { "" }, "family": "",
            "families": null, "parameter_size": params.map(parameter_size).unwrap_or_default(),
            "quantization_level": "",
        },
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": modified,
    });
    if let Some(n) = context {
        show["parameters"] = json!(format!("num_ctx {n}"));
    }
    show
}

/// Ollama's `parameter_size` ("1.2B", "7.6B", "135M").
fn parameter_size(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n => n.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_is_made_from_what_llama_cpp_says() {
        let entry =
            json!({"id": "qwen3", "created": 1_700_000_000, "meta": {"n_ctx_train": 40960, "n_params": 596_049_920}});
        let props = json!({
            "default_generation_settings": {"n_ctx": 8192},
            "chat_template": "{% if tools %}...{% endif %}",
            "modalities": {"vision": false},
        });
        let s = show_response("qwen3", Some(&entry), Some(&props));
        assert_eq!(s["capabilities"], json!(["completion", "tools"]), "{s}");
        assert_eq!(show_context_length(&s), Some(8192), "the context it runs with, not the trained one");
        assert_eq!(s["parameters"], "num_ctx 8192");
        assert_eq!(s["details"]["parameter_size"], "596M");
        assert_eq!(s["details"]["format"], "gguf");
        let vllm = show_response("m", Some(&json!({"id": "m", "max_model_len": 32768})), None);
        assert_eq!(show_context_length(&vllm), Some(32768));
        assert_eq!(vllm["capabilities"], json!(["completion"]), "only what is known");
        let bare = show_response("m", None, None);
        assert!(bare["model_info"].is_object() && bare.get("parameters").is_none(), "{bare}");
    }

    #[test]
    fn upstream_names_drop_ollamas_defaults_and_keep_the_clients_case() {
        assert_eq!(upstream_name("llama3.2"), "llama3.2");
        assert_eq!(upstream_name("llama3.2:latest"), "llama3.2");
        assert_eq!(upstream_name("registry.ollama.ai/library/Qwen3:LATEST"), "Qwen3");
        assert_eq!(upstream_name("Qwen/Qwen2.5-7B-Instruct"), "Qwen/Qwen2.5-7B-Instruct");
        assert_eq!(upstream_name("qwen3:0.6b"), "qwen3:0.6b");
    }
}
