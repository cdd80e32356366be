//! Cloud fallback: provider policy only. When to fall back, which provider, which model,
//! whether to redact; the exchange itself goes through `upstream` like any node's, and the
//! answer comes back as an `upstream::Answer` that the proxy relays and records like any other.
//!
//! Fallback happens only before anything reached the client: when no node can serve the model,
//! every candidate failed before its first byte, or the queue timeout passed. A category that
//! says `cloud = "never"` gets a clear 503 instead, and nothing leaves the building. Providers
//! are tried in the category's order; when all fail, the client hears every provider's reason
//! together with the local one. Keys are read from the OS keyring (`secrets`) per fallback, so
//! a key set with `corral secret set` takes effect at once and never sits in memory for long;
//! a provider's error text is never passed on with the key in it.

pub mod share;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Bytes;
use http::{header, HeaderMap, StatusCode};
use serde_json::Value;

use crate::config::{CategoryConfig, CloudPermission, Config, ProviderConfig};
use crate::error::BrokerError;
use crate::redact::{self, Redactor, Restorer};
use crate::upstream::openai;
use crate::upstream::translate::{self, Audience, Native, Reply};
use crate::upstream::{self, Answer, SendError, Upstream};

/// Why one provider did not answer.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{0}")]
    Translate(String),
    #[error("API key: {0}")]
    Key(#[from] crate::secrets::SecretError),
    #[error("keyring lookup failed ({0})")]
    KeyLookup(String),
    #[error("bad base_url ({0})")]
    BadUrl(#[from] url::ParseError),
    #[error("cannot build an HTTP client ({0})")]
    Client(String),
    #[error("{0}")]
    Send(#[from] SendError),
    #[error("HTTP {status} {message}")]
    Refused { status: u16, message: String },
    #[error("{0}")]
    Answer(String),
    #[error("redaction failed ({0})")]
    Redact(String),
}

impl ProviderError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Translate(_) => "untranslatable_request",
            Self::Key(e) => e.code(),
            Self::KeyLookup(_) => "keyring_unavailable",
            Self::BadUrl(_) => "bad_provider_url",
            Self::Client(_) => "client_failed",
            Self::Send(_) => "provider_unreachable",
            Self::Refused { .. } => "provider_refused",
            Self::Answer(_) => "provider_answer_broken",
            Self::Redact(_) => "redaction_failed",
        }
    }
}

/// A provider's refusal in words, with anything that looks like the key sent masked: an
/// echoing server must not hand the key back to whoever reads the error (a client, the UI's
/// test button, a log).
fn refused(status: u16, message: &str, key: Option<&str>) -> ProviderError {
    ProviderError::Refused { status, message: mask_key(message, key) }
}

/// `text` without the key (whole, or any 8-character run of it: an echo that cut, quoted or
/// re-encoded part of it), without bearer tokens and `sk-` style keys, and at most 300
/// characters long.
pub fn mask_key(text: &str, key: Option<&str>) -> String {
    const MARK: &str = "[redacted key]";
    let mut out = text.trim().to_string();
    if let Some(k) = key.filter(|k| k.len() >= 4) {
        out = out.replace(k, MARK);
        let chars: Vec<char> = k.chars().collect();
        if chars.len() >= 8 {
            for w in chars.windows(8) {
                let piece: String = w.iter().collect();
                if out.contains(&piece) {
                    out = out.replace(&piece, MARK);
                }
            }
        }
    }
    let words: Vec<String> = out
        .split(' ')
        .map(|w| {
            let bare = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
            let keyish = (bare.starts_with("sk-") || bare.starts_with("sk_")) && bare.len() >= 12;
            if keyish {
                MARK.to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    let mut out = words.join(" ");
    let mut from = 0;
    while let Some(rel) = out[from..].find("Bearer ") {
        let start = from + rel + "Bearer ".len();
        let end = out[start..].find([' ', '"', '\'', ',']).map_or(out.len(), |e| start + e);
        out.replace_range(start..end, MARK);
        from = start + MARK.len();
    }
    if out.chars().count() > 300 {
        out = out.chars().take(300).collect::<String>() + "...";
    }
    out
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

/// Whether one of `category`'s providers maps `model` by name (with or without `:latest`), not
/// just through its `"*"` entry.
fn mapped_by_a_provider(config: &Config, category: &CategoryConfig, model: &str) -> bool {
    let bare = model.strip_suffix(":latest").unwrap_or(model);
    let tagged = crate::config::model_key(model);
    config
        .providers
        .iter()
        .filter(|p| category.providers.contains(&p.name))
        .any(|p| [model, bare, tagged.as_ref()].iter().any(|m| p.model_map.contains_key(*m)))
}

/// `/api/show` while the cluster cannot answer it, for a category that may use the cloud:
/// Ollama's `ShowResponse` of a remote model (`remote_model`, `remote_host`, as Ollama shows
/// its own cloud models), so clients that ask show before they chat (llama-index,
/// `ollama run`) keep working through an outage. `None` where the category may not use the
/// cloud, or no provider takes the model. Returns the provider's name with the answer.
pub fn show(config: &Config, category: &CategoryConfig, model: &str, local: &BrokerError) -> Option<(String, Value)> {
    if category.cloud == CloudPermission::Never {
        return None;
    }
    if matches!(local, BrokerError::ModelNotFound(_)) && !mapped_by_a_provider(config, category, model) {
        return None;
    }
    let p = category.providers.iter().find_map(|n| config.providers.iter().find(|p| &p.name == n))?;
    let modified_at =
        time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    let answer = serde_json::json!({
        "modelfile": "",
        "parameters": "",
        "template": "{{ .Prompt }}",
        "details": {
            "parent_model": "", "format": "", "family": "", "families": null,
            "parameter_size": "", "quantization_level": "",
        },
        "model_info": {},
        "capabilities": ["completion"],
        "remote_model": provider_model(p, model),
        "remote_host": crate::config::redacted_url(&p.base_url),
        "modified_at": modified_at,
    });
    Some((p.name.clone(), answer))
}

/// HTTP clients per connect timeout: providers differ in how long a connect may take.
#[derive(Debug, Default)]
pub struct Clients(Mutex<HashMap<u64, reqwest::Client>>);

impl Clients {
    fn get(&self, connect_ms: u64) -> Result<reqwest::Client, ProviderError> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&connect_ms) {
            return Ok(c.clone());
        }
        let c = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(connect_ms))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ProviderError::Client(e.to_string()))?;
        map.insert(connect_ms, c.clone());
        Ok(c)
    }
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

/// What the fallback needs to know about the request.
#[derive(Debug)]
pub struct Request<'a> {
    pub path: &'a str,
    pub body: &'a Bytes,
    pub model: &'a str,
    pub category: &'a CategoryConfig,
    pub request_id: &'a str,
}

/// A provider's answer, up to its first byte.
pub struct Fallback {
    pub provider: String,
    pub answer: Answer,
}

/// Answer `req` from the category's providers after the cluster failed with `local`, or say
/// why not.
pub async fn fall_back(
    config: &Config,
    clients: &Clients,
    req: Request<'_>,
    local: BrokerError,
) -> Result<Fallback, BrokerError> {
    // A model no node has goes to the cloud only where a provider names it: a typo must never
    // turn into a paid call with the organisation's key.
    if matches!(local, BrokerError::ModelNotFound(_)) && !mapped_by_a_provider(config, req.category, req.model) {
        return Err(local);
    }
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
    let bytes = if req.category.redact { redact::text_bytes(&parsed) } else { 0 };
    if bytes > req.category.redact_max_bytes {
        return Err(BrokerError::RedactTooLarge {
            category: req.category.name.clone(),
            bytes,
            limit: req.category.redact_max_bytes,
            local: local.to_string(),
            forwarded: local.forwarded(),
        });
    }
    let mut failures = Vec::new();
    for name in &req.category.providers {
        let Some(p) = config.providers.iter().find(|p| &p.name == name) else {
            failures.push(format!("{name}: no such provider"));
            continue;
        };
        match try_provider(clients, p, &req, &parsed).await {
            Ok(answer) => {
                tracing::warn!(request_id = %req.request_id, provider = %p.name, category = %req.category.name, local = %local, "answered by a cloud provider");
                return Ok(Fallback { provider: p.name.clone(), answer });
            }
            Err(why) => {
                tracing::warn!(request_id = %req.request_id, provider = %p.name, error = %why, code = why.code(), "cloud provider failed");
                failures.push(format!("{}: {why}", p.name));
            }
        }
    }
    Err(BrokerError::CloudFailed { local: local.to_string(), providers: failures.join("; ") })
}

/// The provider's request body (translated from Ollama's API, or `/v1` with the model
/// mapped), whether it streams, and its `/v1` path.
fn provider_request(
    p: &ProviderConfig,
    req: &Request<'_>,
    parsed: &Value,
) -> Result<(Value, bool, String), ProviderError> {
    let model = provider_model(p, req.model);
    Ok(match Native::of(req.path) {
        Some(api) => {
            let t =
                translate::request(api, parsed, model, Audience::Cloud).map_err(|e| ProviderError::Translate(e.0))?;
            (t.body, t.stream, format!("/v1{}", api.upstream_path()))
        }
        None => {
            let mut body = parsed.clone();
            body["model"] = Value::String(model.to_string());
            let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
            (body, stream, req.path.to_string())
        }
    })
}

async fn try_provider(
    clients: &Clients,
    p: &ProviderConfig,
    req: &Request<'_>,
    parsed: &Value,
) -> Result<Answer, ProviderError> {
    let (body, stream, path) = provider_request(p, req, parsed)?;
    let (body, restorer) = if req.category.redact { redacted(body, req, p).await? } else { (body, None) };
    let key = provider_key(p).await?;
    let base = url::Url::parse(&p.base_url)?;
    let client = clients.get(p.connect_timeout_ms)?;
    let mut request =
        client.post(Upstream::provider(&base).url(&path)).json(&body).header("x-request-id", req.request_id);
    if let Some(k) = &key {
        request = request.bearer_auth(k);
    }
    let first_byte = Duration::from_millis(p.first_byte_timeout_ms);
    let sent = upstream::send(request, first_byte).await?;
    let status = sent.response.status();
    if !status.is_success() {
        let text = upstream::read_small(sent.response, Duration::from_secs(2)).await;
        let msg = translate::native_error(text.as_bytes());
        return Err(refused(status.as_u16(), msg["error"].as_str().unwrap_or(""), key.as_deref()));
    }
    let reply = match (Native::of(req.path), restorer) {
        (Some(api), r) => Some(Reply::native(api, req.model, sent.sent_at, r)),
        (None, Some(r)) => Some(Reply::passthrough(req.model, sent.sent_at, r)),
        (None, None) => None,
    };
    let remaining = sent.remaining();
    let sent_at = sent.sent_at;
    let (content_type, body) = openai::answer_body(sent.response, reply, stream, remaining)
        .await
        .map_err(|e| ProviderError::Answer(mask_key(&e, key.as_deref())))?;
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, content_type);
    Ok(upstream::first_chunk(StatusCode::OK, headers, body, sent_at, remaining, first_byte).await?)
}

/// `body` with its PII masked, and the restorer for the answer. The scan is linear but may
/// cover up to `redact_max_bytes` of text, so it runs off the async workers: the admin API and
/// other requests keep being served meanwhile.
async fn redacted(
    body: Value,
    req: &Request<'_>,
    p: &ProviderConfig,
) -> Result<(Value, Option<Restorer>), ProviderError> {
    let (body, r) = tokio::task::spawn_blocking(move || {
        let mut body = body;
        let r = Redactor::redact_request(&mut body);
        (body, r)
    })
    .await
    .map_err(|e| ProviderError::Redact(e.to_string()))?;
    tracing::debug!(request_id = %req.request_id, provider = %p.name, masked = r.masked(), "redacted before sending");
    Ok((body, Some(r.restorer())))
}

/// A provider's API key from the keyring (read per use, off the async workers); `None` for a
/// provider that takes no key. Only a provider key bound to this provider's origin is ever
/// read: a provider that names a client key, the admin token, or a key stored for another
/// origin gets an error saying so, and sends nothing.
async fn provider_key(p: &ProviderConfig) -> Result<Option<String>, ProviderError> {
    if p.secret.is_empty() {
        return Ok(None);
    }
    let (name, url) = (p.secret.clone(), p.base_url.clone());
    let got = tokio::task::spawn_blocking(move || crate::secrets::provider_key(&name, &url))
        .await
        .map_err(|e| ProviderError::KeyLookup(e.to_string()))?;
    Ok(Some(got?))
}

/// Claim keyring entries from before namespaces for the config the broker started with (a
/// file a person wrote; never a config changed by an import): each becomes a provider key bound
/// to the origin of the providers that name it, or a client key. Failures are logged: a key
/// left unclaimed is unusable by a provider, which fails closed.
pub async fn claim_legacy_keys(config: &Config) {
    let providers: Vec<(String, String)> = config
        .providers
        .iter()
        .filter(|p| !p.secret.is_empty())
        .map(|p| (p.secret.clone(), p.base_url.clone()))
        .collect();
    let clients: Vec<String> = config.listeners.iter().flat_map(|l| l.api_keys.iter().cloned()).collect();
    if providers.is_empty() && clients.is_empty() {
        return;
    }
    match tokio::task::spawn_blocking(move || crate::secrets::claim(&providers, &clients)).await {
        Ok(Ok(claimed)) if !claimed.is_empty() => tracing::info!(secrets = ?claimed, "keyring entries claimed"),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, code = e.code(), "keyring entries not claimed"),
        Err(e) => tracing::warn!(error = %e, "keyring claim failed"),
    }
}

/// One tiny request to a provider with its key (the UI's "test" button). Returns the model
/// that answered.
pub async fn probe(clients: &Clients, p: &ProviderConfig) -> Result<String, ProviderError> {
    let model =
        p.model_map.get("*").or_else(|| p.model_map.values().next()).cloned().unwrap_or_else(|| "gpt-4o-mini".into());
    let body =
        serde_json::json!({ "model": model, "messages": [{ "role": "user", "content": "ping" }], "max_tokens": 1 });
    let key = provider_key(p).await?;
    let base = url::Url::parse(&p.base_url)?;
    let client = clients.get(p.connect_timeout_ms)?;
    let mut req = client.post(Upstream::provider(&base).url("/v1/chat/completions")).json(&body);
    if let Some(k) = &key {
        req = req.bearer_auth(k);
    }
    let sent = upstream::send(req, Duration::from_millis(p.first_byte_timeout_ms)).await?;
    let status = sent.response.status();
    if status.is_success() {
        return Ok(model);
    }
    let text = upstream::read_small(sent.response, Duration::from_secs(2)).await;
    let msg = translate::native_error(text.as_bytes());
    Err(refused(status.as_u16(), msg["error"].as_str().unwrap_or(""), key.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_error_never_echoes_the_key_sent() {
        let e = refused(401, "invalid key sk-secret-123 for org", Some("sk-secret-123"));
        assert_eq!(e.to_string(), "HTTP 401 invalid key [redacted key] for org");
        assert_eq!(refused(500, "boom", None).to_string(), "HTTP 500 boom");
        let partial = refused(401, "got \"sk-secret-12\" (truncated)", Some("sk-secret-123456"));
        assert!(!partial.to_string().contains("secret-1"), "a partial echo is masked too: {partial}");
        let bearer = refused(401, "Authorization: Bearer abc.def-ghi was rejected", Some("zzzz"));
        assert!(!bearer.to_string().contains("abc.def"), "any bearer token is masked: {bearer}");
        let other = refused(401, "your key sk-proj-abcdefghijkl is wrong", None);
        assert!(!other.to_string().contains("abcdefghijkl"), "keys of the usual shape are masked: {other}");
        assert!(refused(500, &"x".repeat(5000), None).to_string().len() < 400, "error text is bounded");
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
