//! Cloud fallback: provider policy only. When to fall back, which provider, which model,
//! whether to redact; the exchange itself goes through `upstream` like any node's, and the
//! answer comes back as an `upstream::Answer` that the proxy relays and records like any other.
//!
//! Fallback happens only before anything reached the client: when no node can serve the model,
//! every candidate failed before its first byte, or the queue timeout passed. A category that
//! says `cloud = "never"` gets a clear 503 instead, and nothing leaves the building. Keys are
//! read from the OS keyring (`secrets`) per fallback, so a key set with `corral secret set`
//! takes effect at once and never sits in memory for long; a provider's error text is never
//! passed on with the key in it.
//!
//! Providers are tried in the category's order, and what a provider's failure means decides
//! what happens next (`ProviderError::next`):
//! - a refusal any provider would give (400 invalid request, content filter, context length;
//!   422) is the answer: the client gets it as it is, status and error code kept (in Ollama's
//!   shape for Ollama's endpoints), and the next provider sees nothing;
//! - 401, 403, 404 (this provider's key or model) and connect failures or timeouts: the next
//!   provider at once;
//! - a 5xx, or a connection broken before the first byte: once more on the same provider after
//!   200-500 ms (jittered), then the next;
//! - 429 is "busy": the next provider at once, and the provider sits out its `Retry-After`
//!   (`retry-after-ms` or `Retry-After` seconds; 1 s when it gives none, at most 60 s) in later
//!   fallbacks too, as long as another provider can be tried. The hold-offs live in `Clients`,
//!   which lives as long as the broker. Only when every other provider failed is a held-off one
//!   waited for, and only when its wait ends before the request's queue deadline (its queue
//!   timeout counted from when it was handed to the cluster); at most `MAX_WAITS` times.
//!
//! When no provider answers, the client hears every provider's reason together with the local
//! one (`cloud_failed`, or `cloud_rate_limited` when every provider was rate-limiting), with a
//! `Retry-After` of the shortest hold-off where a provider was rate-limiting.

pub mod share;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::time::Instant;

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
    #[error("{0}")]
    Refused(Refusal),
    #[error("{0}")]
    Answer(String),
    #[error("redaction failed ({0})")]
    Redact(String),
}

impl ProviderError {
    /// Whether the provider may have received the request: not when it failed before anything
    /// was sent (no key, a bad URL, no connection).
    fn reached(&self) -> bool {
        match self {
            Self::Translate(_)
            | Self::Key(_)
            | Self::KeyLookup(_)
            | Self::BadUrl(_)
            | Self::Client(_)
            | Self::Redact(_)
            | Self::Send(SendError::Connect(_)) => false,
            Self::Send(_) | Self::Refused(_) | Self::Answer(_) => true,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::Translate(_) => "untranslatable_request",
            Self::Key(e) => e.code(),
            Self::KeyLookup(_) => "keyring_unavailable",
            Self::BadUrl(_) => "bad_provider_url",
            Self::Client(_) => "client_failed",
            Self::Send(_) => "provider_unreachable",
            Self::Refused(r) if r.status == 429 => "provider_rate_limited",
            Self::Refused(_) => "provider_refused",
            Self::Answer(_) => "provider_answer_broken",
            Self::Redact(_) => "redaction_failed",
        }
    }

    /// What this failure means for the rest of the chain (see the module's doc).
    fn next(&self) -> Next {
        match self {
            Self::Refused(r) => match r.status {
                // Out of credit is not over in a second.
                429 if r.code.as_deref() == Some("insufficient_quota") => Next::HoldOff(MAX_HOLD_OFF),
                429 => Next::HoldOff(r.retry_after.unwrap_or(DEFAULT_HOLD_OFF).min(MAX_HOLD_OFF)),
                400 | 422 if !r.is_about_the_provider() => Next::Answer,
                500..=599 => Next::Retry,
                _ => Next::MoveOn,
            },
            Self::Send(SendError::Failed(_) | SendError::BodyFailed(_)) => Next::Retry,
            _ => Next::MoveOn,
        }
    }
}

/// What one provider's failure means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Another provider would refuse it too: its refusal is the client's answer.
    Answer,
    /// Busy: go on at once, and keep it out of the chain for this long.
    HoldOff(Duration),
    /// Perhaps a blip: once more on the same provider after a short pause, then go on.
    Retry,
    /// This provider cannot (its key, its model, unreachable, too slow): go on.
    MoveOn,
}

/// Longest a provider's `Retry-After` keeps it out of the chain.
const MAX_HOLD_OFF: Duration = Duration::from_secs(60);
/// How long a 429 that names no wait keeps a provider out.
const DEFAULT_HOLD_OFF: Duration = Duration::from_secs(1);
/// The pause before the one retry of a provider's 5xx or broken connection, in ms; drawn anew
/// each time so that requests that failed together do not come back together.
const RETRY_BACKOFF_MS: std::ops::RangeInclusive<u64> = 200..=500;
/// Most times one request waits for a rate-limited provider's `Retry-After` to pass.
const MAX_WAITS: usize = 2;

/// A provider's error answer as it gave it: status, words (the key masked), OpenAI's `type`,
/// `param` and `code` when it sent them, and its `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
    pub kind: Option<String>,
    pub param: Option<String>,
    /// `content_filter`, `context_length_exceeded`, `rate_limit_exceeded`, ...
    pub code: Option<String>,
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {} {}", self.status, self.message)?;
        if let Some(code) = &self.code {
            write!(f, " (code {code})")?;
        }
        Ok(())
    }
}

impl Refusal {
    /// A 400 that is about this provider, not the request: another may well take it.
    fn is_about_the_provider(&self) -> bool {
        matches!(self.code.as_deref(), Some("model_not_found" | "invalid_api_key"))
    }

    /// The refusal as the client's answer: OpenAI's error object on `/v1`, Ollama's
    /// `{"error", "code"}` on its native endpoints; status and `Retry-After` kept.
    fn answer(&self, native: bool, sent_at: Instant) -> Answer {
        let body = if native {
            let mut v = json!({ "error": self.message });
            if let Some(code) = &self.code {
                v["code"] = json!(code);
            }
            v
        } else {
            json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
        };
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
        if let Some(wait) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
        }
        Answer {
            status: StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST),
            headers,
            first: Some(Bytes::from(body.to_string())),
            body: futures_util::stream::empty().boxed(),
            sent_at,
            whole: true,
        }
    }
}

/// A wait in whole seconds, rounded up, at least 1 (what `Retry-After` can say).
fn whole_seconds(wait: Duration) -> u64 {
    wait.as_millis().div_ceil(1000).max(1) as u64
}

/// How long an answer asks not to be sent more: `retry-after-ms` (OpenAI, Azure), else
/// `Retry-After` in seconds. An HTTP-date is not read (the default wait applies).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let read = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = read("retry-after-ms").and_then(|v| v.parse::<f64>().ok()).filter(|ms| ms.is_finite()) {
        return Some(Duration::from_millis(ms.max(0.0) as u64));
    }
    read(header::RETRY_AFTER.as_str()).and_then(|v| v.parse::<u64>().ok()).map(Duration::from_secs)
}

/// A provider's error answer read into a `Refusal`, with anything that looks like the key sent
/// masked in every string: an echoing server must not hand the key back to whoever reads the
/// error (a client, the UI's test button, a log).
fn refused(status: u16, body: &str, retry_after: Option<Duration>, key: Option<&str>) -> ProviderError {
    let message = translate::native_error(body.as_bytes())["error"].as_str().unwrap_or("").to_string();
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let field = |name: &str| match v.get("error").and_then(|e| e.get(name)) {
        Some(Value::String(s)) => Some(mask_key(s, key)),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    ProviderError::Refused(Refusal {
        status,
        message: mask_key(&message, key),
        kind: field("type"),
        param: field("param"),
        code: field("code"),
        retry_after,
    })
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
    if matches!(local, BrokerError::ModelNotFound { .. }) && !mapped_by_a_provider(config, category, model) {
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

/// What the fallback keeps between requests: HTTP clients per connect timeout (providers
/// differ in how long a connect may take), and which providers asked, with a 429, not to be
/// sent more until when (by provider name).
#[derive(Debug)]
pub struct Clients {
    http: Mutex<HashMap<u64, reqwest::Client>>,
    held: Mutex<HashMap<String, Instant>>,
    /// Jitter for the retry pause.
    rng: Mutex<SmallRng>,
}

impl Default for Clients {
    fn default() -> Self {
        Self { http: Mutex::default(), held: Mutex::default(), rng: Mutex::new(SmallRng::from_entropy()) }
    }
}

impl Clients {
    /// Keep `provider` out of the chain for `wait` (it answered 429); a longer hold-off it
    /// already has stands.
    pub fn hold_off(&self, provider: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let entry = held.entry(provider.to_string()).or_insert(until);
        *entry = (*entry).max(until);
    }

    /// What is left of `provider`'s hold-off, if it is sitting one out.
    pub fn held_off(&self, provider: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|_, until| *until > now);
        held.get(provider).map(|until| until.duration_since(now))
    }

    /// The pause before retrying a provider once.
    fn backoff(&self) -> Duration {
        Duration::from_millis(self.rng.lock().unwrap_or_else(|p| p.into_inner()).gen_range(RETRY_BACKOFF_MS))
    }

    fn get(&self, connect_ms: u64) -> Result<reqwest::Client, ProviderError> {
        let mut map = self.http.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&connect_ms) {
            return Ok(c.clone());
        }
        // Redirects are never followed: the key is bound to one origin, and the prompt must
        // not go where a 3xx points either (the key would not, the body would).
        let c = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
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
        BrokerError::ModelNotFound { .. }
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
    /// The end of the request's queue timeout: a rate-limited provider is waited for only
    /// when its `Retry-After` ends before this.
    pub deadline: Instant,
}

/// A provider's answer, up to its first byte: what it produced, or its refusal of a request
/// any provider would refuse (a 4xx, passed on as it is).
pub struct Fallback {
    pub provider: String,
    /// The model the provider was asked for (`provider_model`), which the answer names.
    pub model: String,
    pub answer: Answer,
}

/// Why one provider gave the request no answer, and whether it is busy (rate-limited).
struct Unserved {
    why: String,
    busy: bool,
    /// The provider may have received the request.
    reached: bool,
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
    if matches!(local, BrokerError::ModelNotFound { .. }) && !mapped_by_a_provider(config, req.category, req.model) {
        return Err(local);
    }
    if req.category.cloud == CloudPermission::Never || req.category.providers.is_empty() {
        // A model nobody here has is a 404 whatever the category: clearer than "no cloud".
        if config.providers.is_empty() || matches!(local, BrokerError::ModelNotFound { .. }) {
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
    // One entry per provider, in the category's order: its last reason.
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut busy: Vec<&ProviderConfig> = Vec::new();
    // Whether the request reached anything: a node before, or a provider here.
    let mut forwarded = local.forwarded();
    for name in &req.category.providers {
        if failures.iter().any(|(n, _)| n == name) {
            continue;
        }
        let Some(p) = config.providers.iter().find(|p| &p.name == name) else {
            failures.push((name.clone(), "no such provider".into()));
            continue;
        };
        if let Some(left) = clients.held_off(&p.name) {
            // Busy a moment ago: skipped while another can be tried.
            failures.push((p.name.clone(), format!("rate-limited, held off for {} s more", whole_seconds(left))));
            busy.push(p);
            continue;
        }
        match serve_from(clients, p, &req, &parsed, &local).await {
            Ok(fb) => return Ok(fb),
            Err(u) => {
                failures.push((p.name.clone(), u.why));
                forwarded |= u.reached;
                if u.busy {
                    busy.push(p);
                }
            }
        }
    }
    if let Some(fb) = wait_for_busy(clients, &mut busy, &mut failures, &mut forwarded, &req, &parsed, &local).await {
        return Ok(fb);
    }
    let retry_after = busy.iter().filter_map(|p| clients.held_off(&p.name)).min().map(whole_seconds);
    let providers = failures.iter().map(|(n, why)| format!("{n}: {why}")).collect::<Vec<_>>().join("; ");
    let local = local.to_string();
    if !busy.is_empty() && busy.len() == failures.len() {
        return Err(BrokerError::CloudRateLimited { local, providers, retry_after: retry_after.unwrap_or(1) });
    }
    Err(BrokerError::CloudFailed { local, providers, retry_after, forwarded })
}

/// Nothing else can serve it: wait for the rate-limited provider that is free soonest, when
/// that is before the request's queue deadline (at most `MAX_WAITS` times). Failures update
/// `failures` (and `forwarded`, when a provider may have received it); a provider that fails
/// other than busy leaves `busy`.
async fn wait_for_busy(
    clients: &Clients,
    busy: &mut Vec<&ProviderConfig>,
    failures: &mut [(String, String)],
    forwarded: &mut bool,
    req: &Request<'_>,
    parsed: &Value,
    local: &BrokerError,
) -> Option<Fallback> {
    for _ in 0..MAX_WAITS {
        let soonest = busy.iter().map(|p| (*p, clients.held_off(&p.name).unwrap_or_default())).min_by_key(|(_, w)| *w);
        let Some((p, wait)) = soonest else { break };
        if Instant::now() + wait > req.deadline {
            break;
        }
        tracing::debug!(request_id = %req.request_id, provider = %p.name, wait_ms = wait.as_millis() as u64, "waiting for a rate-limited provider");
        tokio::time::sleep(wait).await;
        match serve_from(clients, p, req, parsed, local).await {
            Ok(fb) => return Some(fb),
            Err(u) => {
                *forwarded |= u.reached;
                if let Some(entry) = failures.iter_mut().find(|(n, _)| *n == p.name) {
                    entry.1 = u.why;
                }
                if !u.busy {
                    busy.retain(|q| q.name != p.name);
                }
            }
        }
    }
    None
}

/// One provider's go at the request: its answer (or its refusal of a request any provider
/// would refuse), else why not. A 5xx or a connection broken before the first byte is tried
/// once more after a short pause; a 429 puts the provider on hold.
async fn serve_from(
    clients: &Clients,
    p: &ProviderConfig,
    req: &Request<'_>,
    parsed: &Value,
    local: &BrokerError,
) -> Result<Fallback, Unserved> {
    let model = provider_model(p, req.model).to_string();
    let mut retried = false;
    loop {
        let sent_at = Instant::now();
        let why = match try_provider(clients, p, req, parsed).await {
            Ok(answer) => {
                tracing::warn!(request_id = %req.request_id, provider = %p.name, category = %req.category.name, local = %local, "answered by a cloud provider");
                return Ok(Fallback { provider: p.name.clone(), model, answer });
            }
            Err(why) => why,
        };
        tracing::warn!(request_id = %req.request_id, provider = %p.name, error = %why, code = why.code(), retried, "cloud provider failed");
        match (why.next(), &why) {
            (Next::Answer, ProviderError::Refused(r)) => {
                tracing::info!(request_id = %req.request_id, provider = %p.name, status = r.status, code = ?r.code, "a cloud provider refused the request; the client gets its refusal");
                let answer = r.answer(Native::of(req.path).is_some(), sent_at);
                return Ok(Fallback { provider: p.name.clone(), model, answer });
            }
            (Next::HoldOff(wait), _) => {
                clients.hold_off(&p.name, wait);
                let why = format!("{why} (held off for {} s)", whole_seconds(wait));
                return Err(Unserved { why, busy: true, reached: true });
            }
            (Next::Retry, _) if !retried => {
                retried = true;
                tokio::time::sleep(clients.backoff()).await;
            }
            (Next::Retry, _) => {
                return Err(Unserved { why: format!("{why} (also on a retry)"), busy: false, reached: why.reached() })
            }
            _ => return Err(Unserved { why: why.to_string(), busy: false, reached: why.reached() }),
        }
    }
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
        let wait = retry_after(sent.response.headers());
        let text = match redirect_note(&sent.response) {
            Some(note) => note,
            None => upstream::read_small(sent.response, Duration::from_secs(2)).await,
        };
        return Err(refused(status.as_u16(), &text, wait, key.as_deref()));
    }
    // The answer names the model that produced it: the provider's, not the one asked for.
    let model = provider_model(p, req.model);
    let reply = match (Native::of(req.path), restorer) {
        (Some(api), r) => Some(Reply::native(api, model, sent.sent_at, r)),
        (None, Some(r)) => Some(Reply::passthrough(model, sent.sent_at, r)),
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

/// What to say of a provider's 3xx, which is not followed: where it pointed (bounded).
fn redirect_note(response: &reqwest::Response) -> Option<String> {
    if !response.status().is_redirection() {
        return None;
    }
    let to = response.headers().get(header::LOCATION).and_then(|l| l.to_str().ok()).unwrap_or("nowhere");
    let to: String = to.chars().take(200).collect();
    Some(format!("redirected to {to}; redirects are not followed: set base_url to where the provider answers"))
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
    let wait = retry_after(sent.response.headers());
    let text = upstream::read_small(sent.response, Duration::from_secs(2)).await;
    Err(refused(status.as_u16(), &text, wait, key.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_error_never_echoes_the_key_sent() {
        let refused = |status, body: &str, key| refused(status, body, None, key);
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
        let echoed =
            r#"{"error":{"message":"bad","type":"sk-secret-123","param":"sk-secret-123","code":"sk-secret-123"}}"#;
        let ProviderError::Refused(r) = refused(400, echoed, Some("sk-secret-123")) else { panic!("a refusal") };
        for field in [&r.kind, &r.param, &r.code] {
            assert_eq!(field.as_deref(), Some("[redacted key]"), "every field passed on is masked");
        }
    }

    fn refusal(status: u16, code: Option<&str>, retry_after: Option<u64>) -> ProviderError {
        let body = json!({ "error": { "message": "m", "type": "invalid_request_error", "param": null, "code": code } });
        refused(status, &body.to_string(), retry_after.map(Duration::from_secs), None)
    }

    #[test]
    fn each_failure_says_what_the_chain_does_next() {
        assert_eq!(refusal(400, Some("content_filter"), None).next(), Next::Answer, "any provider would refuse it");
        assert_eq!(refusal(400, Some("context_length_exceeded"), None).next(), Next::Answer);
        assert_eq!(refusal(400, None, None).next(), Next::Answer);
        assert_eq!(refusal(422, None, None).next(), Next::Answer);
        assert_eq!(refusal(400, Some("model_not_found"), None).next(), Next::MoveOn, "this provider's model");
        for status in [401, 403, 404, 408, 413] {
            assert_eq!(refusal(status, None, None).next(), Next::MoveOn, "{status}: another provider may take it");
        }
        for status in [500, 502, 503] {
            assert_eq!(refusal(status, None, None).next(), Next::Retry, "{status}: once more on the same provider");
        }
        assert_eq!(ProviderError::Send(SendError::Failed("reset".into())).next(), Next::Retry);
        assert_eq!(ProviderError::Send(SendError::BodyFailed("reset".into())).next(), Next::Retry);
        assert_eq!(ProviderError::Send(SendError::Connect("refused".into())).next(), Next::MoveOn);
        assert_eq!(
            ProviderError::Send(SendError::NoAnswer(5)).next(),
            Next::MoveOn,
            "a timeout is not waited for twice"
        );
        assert_eq!(refusal(429, None, Some(5)).next(), Next::HoldOff(Duration::from_secs(5)));
        assert_eq!(refusal(429, None, None).next(), Next::HoldOff(DEFAULT_HOLD_OFF), "1 s when it names no wait");
        assert_eq!(refusal(429, None, Some(3600)).next(), Next::HoldOff(MAX_HOLD_OFF), "capped");
        assert_eq!(refusal(429, Some("insufficient_quota"), None).next(), Next::HoldOff(MAX_HOLD_OFF));
        assert_eq!(refusal(429, None, None).code(), "provider_rate_limited");
    }

    #[test]
    fn a_refusal_reaches_the_client_in_its_dialect_with_status_code_and_wait() {
        use futures_util::FutureExt;
        let ProviderError::Refused(r) = refusal(400, Some("content_filter"), Some(2)) else { panic!("a refusal") };
        let body = |a: Answer| serde_json::from_slice::<Value>(a.first.as_deref().unwrap_or(b"")).expect("json");
        let native = r.answer(true, Instant::now());
        assert_eq!(
            (native.status, native.headers["retry-after"].clone()),
            (StatusCode::BAD_REQUEST, "2".parse().unwrap())
        );
        assert_eq!(body(native), json!({ "error": "m", "code": "content_filter" }), "Ollama's shape, with the code");
        let mut v1 = r.answer(false, Instant::now());
        assert!(v1.body.next().now_or_never().flatten().is_none(), "the whole refusal is in the first chunk");
        assert_eq!(
            body(v1),
            json!({ "error": { "message": "m", "type": "invalid_request_error", "param": null, "code": "content_filter" } }),
            "OpenAI's shape as the provider sent it"
        );
    }

    #[test]
    fn retry_after_is_read_in_milliseconds_or_seconds() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            pairs
                .iter()
                .map(|(k, v)| (http::HeaderName::from_static(k), HeaderValue::from_static(v)))
                .collect::<HeaderMap>()
        };
        assert_eq!(retry_after(&headers(&[("retry-after", "7")])), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "1500"), ("retry-after", "2")])),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")])), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
        assert_eq!((whole_seconds(Duration::from_millis(1500)), whole_seconds(Duration::ZERO)), (2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_off_runs_out_and_a_longer_one_stands() {
        let c = Clients::default();
        c.hold_off("p", Duration::from_secs(5));
        c.hold_off("p", Duration::from_secs(1));
        assert_eq!(c.held_off("p"), Some(Duration::from_secs(5)), "the longer wait stands");
        assert_eq!(c.held_off("q"), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(c.held_off("p"), None, "over once its Retry-After has passed");
        for _ in 0..50 {
            assert!(RETRY_BACKOFF_MS.contains(&(c.backoff().as_millis() as u64)), "the retry pause stays bounded");
        }
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
