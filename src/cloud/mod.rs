//! OpenAI-compatible upstreams: cloud providers for fallback, and the answer translation that
//! `kind = "openai"` nodes share with them.
//!
//! Fallback happens only before anything reached the client: when no node can serve the model,
//! every candidate failed before its first byte, or the queue timeout passed. A category that
//! says `cloud = "never"` gets a clear 503 instead, and nothing leaves the building. Providers
//! are tried in the category's order; when all fail, the client hears every provider's reason
//! together with the local one. Keys are read from the OS keyring (`secrets`) per fallback, so
//! a key set with `corral secret set` takes effect at once and never sits in memory for long.

pub mod redact;
pub mod share;
pub mod translate;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Bytes;
use axum::response::Response;
use futures_util::StreamExt;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use serde_json::Value;
use tokio::time::Instant;

use crate::config::{CategoryConfig, CloudPermission, ProviderConfig};
use crate::error::BrokerError;
use crate::proxy::{BodyError, BodyStream, RelayParts, Shared, Source};
use crate::telemetry::Trace;
use redact::Redactor;
use translate::{Audience, Native, Reply};

/// Largest non-streamed answer read whole for translation.
const MAX_WHOLE_ANSWER: usize = 64 * 1024 * 1024;

/// The URL of `path` (`/chat/completions`) on an OpenAI-compatible server whose base is given
/// with or without its `/v1`.
pub fn openai_url(base: &url::Url, path: &str) -> url::Url {
    let mut url = base.clone();
    let prefix = base.path().trim_end_matches('/');
    let (path, query) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
    if prefix.ends_with("/v1") {
        url.set_path(&format!("{prefix}{path}"));
    } else {
        url.set_path(&format!("{prefix}/v1{path}"));
    }
    url.set_query(query);
    url
}

/// The model a provider is asked for: the map's entry for the local name (with or without
/// `:latest`), else its `"*"` entry, else the name itself.
pub fn provider_model<'a>(p: &'a ProviderConfig, model: &'a str) -> &'a str {
    let bare = model.strip_suffix(":latest").unwrap_or(model);
    let tagged = crate::config::model_key(model);
    p.model_map
        .get(model)
        .or_else(|| p.model_map.get(bare))
        .or_else(|| p.model_map.get(tagged.as_ref()))
        .or_else(|| p.model_map.get("*"))
        .map_or(bare, String::as_str)
}

/// Whether a local failure is one that cloud fallback answers.
pub fn is_trigger(e: &BrokerError) -> bool {
    matches!(
        e,
        BrokerError::ModelNotFound(_)
            | BrokerError::NoHealthyNode { .. }
            | BrokerError::NoNodeReachable { .. }
            | BrokerError::QueueTimeout { .. }
            | BrokerError::QueueFull { .. }
            | BrokerError::ClusterBusy
            | BrokerError::UpstreamFailed { .. }
            | BrokerError::UpstreamTimeout { .. }
    )
}

/// Endpoints a provider can answer.
pub fn can_fall_back(path: &str) -> bool {
    Native::of(path).is_some() || matches!(path, "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings")
}

/// HTTP clients per connect timeout: providers differ in how long a connect may take.
#[derive(Debug, Default)]
pub struct Clients(Mutex<HashMap<u64, reqwest::Client>>);

impl Clients {
    fn get(&self, connect_ms: u64) -> Result<reqwest::Client, String> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&connect_ms) {
            return Ok(c.clone());
        }
        let c = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(connect_ms))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build an HTTP client ({e})"))?;
        map.insert(connect_ms, c.clone());
        Ok(c)
    }
}

/// What the fallback needs to know about the request.
#[derive(Debug)]
pub struct Request<'a> {
    pub path: &'a str,
    pub body: &'a Bytes,
    pub model: &'a str,
    pub category: &'a CategoryConfig,
    pub request_id: &'a str,
    pub local_attempts: u32,
}

/// Answer `req` from the category's providers after the cluster failed with `local`, or say
/// why not. The response carries `X-Corral-Fallback`.
pub async fn fall_back(
    shared: &Shared,
    req: Request<'_>,
    local: BrokerError,
    trace: &mut Option<Trace>,
) -> Result<Response, BrokerError> {
    let config = shared.config();
    if req.category.cloud == CloudPermission::Never || req.category.providers.is_empty() {
        // A model nobody here has is a 404 whatever the category: clearer than "no cloud".
        if config.providers.is_empty() || matches!(local, BrokerError::ModelNotFound(_)) {
            return Err(local);
        }
        return Err(BrokerError::CloudNotAllowed {
            category: req.category.name.clone(),
            local: local.to_string(),
            forwarded: local.forwarded(),
        });
    }
    let parsed: Value = serde_json::from_slice(req.body).map_err(|e| BrokerError::MalformedJson(e.to_string()))?;
    let mut failures = Vec::new();
    for name in &req.category.providers {
        let Some(p) = config.providers.iter().find(|p| &p.name == name) else {
            failures.push(format!("{name}: no such provider"));
            continue;
        };
        match try_provider(shared, p, &req, &parsed, trace).await {
            Ok(resp) => {
                tracing::warn!(request_id = %req.request_id, provider = %p.name, category = %req.category.name, local = %local, "answered by a cloud provider");
                return Ok(resp);
            }
            Err(why) => {
                tracing::warn!(request_id = %req.request_id, provider = %p.name, error = %why, "cloud provider failed");
                failures.push(format!("{}: {why}", p.name));
            }
        }
    }
    Err(BrokerError::CloudFailed { local: local.to_string(), providers: failures.join("; ") })
}

async fn try_provider(
    shared: &Shared,
    p: &ProviderConfig,
    req: &Request<'_>,
    parsed: &Value,
    trace: &mut Option<Trace>,
) -> Result<Response, String> {
    let model = provider_model(p, req.model);
    let native = Native::of(req.path);
    let (mut body, stream, upstream_path) = match native {
        Some(api) => {
            let t = translate::request(api, parsed, model, Audience::Cloud).map_err(|e| e.0)?;
            (t.body, t.stream, api.upstream_path().to_string())
        }
        None => {
            let mut body = parsed.clone();
            body["model"] = Value::String(model.to_string());
            let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
            (body, stream, req.path.trim_start_matches("/v1").to_string())
        }
    };
    let restorer = if req.category.redact {
        let r = Redactor::redact_request(&mut body);
        tracing::debug!(request_id = %req.request_id, provider = %p.name, masked = r.masked(), "redacted before sending");
        Some(r.restorer())
    } else {
        None
    };
    let key = provider_key(p).await?;
    let base = url::Url::parse(&p.base_url).map_err(|e| format!("bad base_url ({e})"))?;
    let url = openai_url(&base, &upstream_path);
    let client = shared.cloud_clients.get(p.connect_timeout_ms)?;
    let mut request = client.post(url).json(&body).header("x-request-id", req.request_id);
    if let Some(k) = &key {
        request = request.bearer_auth(k);
    }
    drop(key);
    let first_byte = Duration::from_millis(p.first_byte_timeout_ms);
    let sent_at = Instant::now();
    let resp = match tokio::time::timeout(first_byte, request.send()).await {
        Err(_) => return Err(format!("no answer within {} ms", first_byte.as_millis())),
        Ok(Err(e)) if e.is_connect() => return Err(format!("cannot connect ({})", crate::proxy::root_cause(&e))),
        Ok(Err(e)) => return Err(format!("request failed ({})", crate::proxy::root_cause(&e))),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if !status.is_success() {
        let text = crate::proxy::read_small(resp, Duration::from_secs(2)).await;
        let msg = translate::native_error(text.as_bytes());
        return Err(format!("HTTP {} {}", status.as_u16(), msg["error"].as_str().unwrap_or("").trim()));
    }
    let reply = match (native, restorer) {
        (Some(api), r) => Some(Reply::native(api, req.model, sent_at, r)),
        (None, Some(r)) => Some(Reply::passthrough(req.model, sent_at, r)),
        (None, None) => None,
    };
    let remaining = first_byte.saturating_sub(sent_at.elapsed());
    let (content_type, mut upstream) = answer_body(resp, reply, stream, remaining).await?;
    let first = match tokio::time::timeout(remaining, upstream.next()).await {
        Err(_) => return Err(format!("headers but no body within {} ms", first_byte.as_millis())),
        Ok(Some(Err(e))) => return Err(format!("body failed before the first byte ({e})")),
        Ok(Some(Ok(b))) => Some(b),
        Ok(None) => None,
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, content_type);
    if let Some(t) = trace.as_mut() {
        t.mark_dispatched();
        t.mark_first_byte();
        t.row.fallback = Some(p.name.clone());
        t.row.attempts = i64::from(req.local_attempts) + 1;
    }
    let parts =
        RelayParts { status: StatusCode::OK, headers, upstream, first, source: Source::Provider(p.name.clone()) };
    let mut response = parts.into_response(trace.take(), req.request_id, shared.config().proxy.idle_timeout());
    if let Ok(v) = HeaderValue::from_str(&p.name) {
        response.headers_mut().insert("x-corral-fallback", v);
    }
    Ok(response)
}

/// A provider's API key from the keyring (read per use, off the async workers); `None` for a
/// provider that takes no key.
async fn provider_key(p: &ProviderConfig) -> Result<Option<String>, String> {
    if p.secret.is_empty() {
        return Ok(None);
    }
    let name = p.secret.clone();
    let got = tokio::task::spawn_blocking(move || crate::secrets::get(&name))
        .await
        .map_err(|e| format!("keyring lookup failed ({e})"))?;
    got.map(Some).map_err(|e| format!("API key: {e}"))
}

/// One tiny request to a provider with its key (the UI's "test" button). Returns the model
/// that answered.
pub async fn probe(shared: &Shared, p: &ProviderConfig) -> Result<String, String> {
    let model =
        p.model_map.get("*").or_else(|| p.model_map.values().next()).cloned().unwrap_or_else(|| "gpt-4o-mini".into());
    let body =
        serde_json::json!({ "model": model, "messages": [{ "role": "user", "content": "ping" }], "max_tokens": 1 });
    let key = provider_key(p).await?;
    let base = url::Url::parse(&p.base_url).map_err(|e| format!("bad base_url ({e})"))?;
    let client = shared.cloud_clients.get(p.connect_timeout_ms)?;
    let mut req = client.post(openai_url(&base, "/chat/completions")).json(&body);
    if let Some(k) = &key {
        req = req.bearer_auth(k);
    }
    let resp = tokio::time::timeout(Duration::from_millis(p.first_byte_timeout_ms), req.send())
        .await
        .map_err(|_| format!("no answer within {} ms", p.first_byte_timeout_ms))?
        .map_err(|e| format!("cannot reach it ({})", crate::proxy::root_cause(&e)))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(model);
    }
    let text = crate::proxy::read_small(resp, Duration::from_secs(2)).await;
    Err(format!(
        "HTTP {} {}",
        status.as_u16(),
        translate::native_error(text.as_bytes())["error"].as_str().unwrap_or("").trim()
    ))
}

/// The client's body from an OpenAI-compatible upstream's successful answer: translated (or
/// restored) when `reply` says so, event by event for streams, whole otherwise.
pub(crate) async fn answer_body(
    resp: reqwest::Response,
    reply: Option<Reply>,
    stream: bool,
    within: Duration,
) -> Result<(HeaderValue, BodyStream), String> {
    let upstream_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let Some(mut reply) = reply else {
        let ct = upstream_type.unwrap_or(HeaderValue::from_static("application/json"));
        return Ok((ct, resp.bytes_stream().map(|r| r.map_err(BodyError::from)).boxed()));
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
        let chunk = chunk.map_err(|e| format!("the answer broke off ({})", crate::proxy::root_cause(&e)))?;
        if out.len() + chunk.len() > limit {
            return Err(format!("the answer is larger than {limit} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// An SSE body translated as it arrives; ends when the answer is complete, or with the reason
/// it is not.
pub(crate) fn translate_stream(
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
    fn urls_take_the_base_with_or_without_v1() {
        let a = url::Url::parse("http://127.0.0.1:8080").expect("url");
        assert_eq!(openai_url(&a, "/chat/completions").as_str(), "http://127.0.0.1:8080/v1/chat/completions");
        let b = url::Url::parse("https://api.openai.com/v1/").expect("url");
        assert_eq!(openai_url(&b, "/embeddings").as_str(), "https://api.openai.com/v1/embeddings");
        let c = url::Url::parse("https://dashscope.aliyuncs.com/compatible-mode/v1").expect("url");
        assert_eq!(
            openai_url(&c, "/chat/completions").as_str(),
            "https://dashscope.aliyuncs.com/compatible-mode/v1/chat/completions"
        );
    }

    #[test]
    fn models_are_mapped_by_name_tag_or_wildcard() {
        let mut p = ProviderConfig::default();
        p.model_map.insert("llama3.1:8b".into(), "gpt-4o-mini".into());
        p.model_map.insert("qwen".into(), "qwen-plus".into());
        assert_eq!(provider_model(&p, "llama3.1:8b"), "gpt-4o-mini");
        assert_eq!(provider_model(&p, "qwen:latest"), "qwen-plus");
        assert_eq!(provider_model(&p, "gpt-4o"), "gpt-4o", "unmapped names pass as they are");
        p.model_map.insert("*".into(), "gpt-4o-mini".into());
        assert_eq!(provider_model(&p, "anything"), "gpt-4o-mini");
    }
}
