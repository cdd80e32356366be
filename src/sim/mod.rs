//! Simulated Ollama nodes: product code, used by tests, benchmarks and `corral demo`.
//!
//! A `SimNode` listens on loopback and answers Ollama's endpoints in Ollama's own wire format
//! (NDJSON streams ending in a `done:true` chunk with durations and counts, OpenAI-compatible
//! `/v1` with SSE ending in `data: [DONE]`, errors worded as Ollama words them). Text is
//! deterministic for a seed. It streams for real, token by token, at the configured rate.
//!
//! Faults are scriptable from Rust (`SimNode::update_faults`) and live over the control
//! endpoint (`/_sim/*`, see docs/sim.md): status sequences ("3 x 500 then ok"), delay to first
//! byte, inter-token delay, cut after N chunks, hang, stop listening and come back, flap.
//! Every request is recorded so tests can assert call counts; streams the client abandoned are
//! counted as cancelled, as Ollama stops generating then.
//!
//! Admission mirrors Ollama's scheduler: `parallel` requests run at once, up to `max_queue` more
//! wait, and past that the node answers 503 "server busy".
//!
//! The HTTP surface, by role: `router` records every request and applies the node-wide checks,
//! then hands it to `ollama` (`/api/*`, `/`), `openai` (`/v1/*`) or `control` (`/_sim/*`);
//! `inference` is the generation both dialects share, `text` the deterministic words.

mod catalog;
mod control;
mod inference;
mod ollama;
mod openai;
mod pull;
mod router;
pub mod text;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// What a simulated node serves and how fast.
#[derive(Debug, Clone)]
pub struct SimSpec {
    pub models: Vec<String>,
    /// Tokens per second while streaming; 0 means as fast as possible.
    pub tps: f64,
    /// Delay before the first byte of an inference answer.
    pub ttft: Duration,
    /// Requests generating at once (OLLAMA_NUM_PARALLEL).
    pub parallel: usize,
    /// Requests allowed to wait beyond `parallel` before "server busy" (OLLAMA_MAX_QUEUE).
    pub max_queue: usize,
    pub version: String,
    pub embedding_dims: usize,
    /// Play an OpenAI-compatible cloud API: only `/v1/*` answers, and request bodies are kept
    /// (`Received::body`) so tests can see exactly what left the building.
    pub cloud: bool,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>` and answers 401 otherwise.
    pub api_key: Option<String>,
    /// Answer with the last user message, streamed in 3-character pieces (to test restoring
    /// placeholders split across chunks).
    pub echo: bool,
    /// The names a pull can find. `None`: every name pulls. With a list, pulling any other name
    /// fails as Ollama's does for a name the registry lacks ("pull model manifest: file does
    /// not exist").
    pub registry: Option<Vec<String>>,
    /// Refuse a chat whose last message is the assistant's (a prefill), as llama.cpp's server
    /// does with thinking on: `/v1/chat/completions` answers 400. Off: a prefill is continued,
    /// as Ollama continues it.
    pub refuse_prefill: bool,
    /// How long a pull of a whole model takes, in ms (progress lines every 60 ms, as Ollama
    /// sends them). 0: eleven steps at the token pace (instant with `tps` 0).
    pub pull_ms: u64,
    /// Models held at an older revision: listed with another digest than on other nodes until
    /// pulled again (a pull brings the current one).
    pub older: Vec<String>,
    /// How long loading a model that is not loaded takes, in ms: the first request for it
    /// waits this long and reports it as `load_duration` (a loaded one reports 0.1 ms).
    pub load_ms: u64,
}

impl Default for SimSpec {
    fn default() -> Self {
        Self {
            models: vec!["llama3.2:latest".into(), "nomic-embed-text:latest".into()],
            tps: 0.0,
            ttft: Duration::ZERO,
            parallel: 4,
            max_queue: 512,
            version: "0.12.6".into(),
            embedding_dims: 16,
            cloud: false,
            api_key: None,
            echo: false,
            registry: None,
            refuse_prefill: false,
            pull_ms: 0,
            older: Vec::new(),
            load_ms: 0,
        }
    }
}

/// One step of a status script: answer `times` inference requests with `status`, optionally
/// with a `Retry-After` header and an error of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    pub status: u16,
    #[serde(default = "one")]
    pub times: u32,
    /// Sent as `Retry-After: <seconds>` (a 429's or 503's "come back later").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// The error this step answers with, instead of the default sentence: written in the
    /// dialect of the endpoint (OpenAI's `{"error": {message, type, param, code}}` on `/v1/*`,
    /// Ollama's `{"error": message}` natively).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
}

impl ScriptStep {
    /// "`times` x `status`", with the default error and no `Retry-After`.
    pub fn new(status: u16, times: u32) -> Self {
        Self { status, times, retry_after: None, error: None }
    }

    /// A provider's content-filter refusal: 400 with OpenAI's `code: "content_filter"`.
    pub fn content_filter(times: u32) -> Self {
        Self {
            error: Some(StepError {
                message: "The response was filtered due to the prompt triggering the content management policy.".into(),
                kind: Some("invalid_request_error".into()),
                code: Some("content_filter".into()),
            }),
            ..Self::new(400, times)
        }
    }

    /// A 429 "rate limit reached", with `Retry-After: retry_after` when given.
    pub fn rate_limited(times: u32, retry_after: Option<u64>) -> Self {
        Self {
            retry_after,
            error: Some(StepError {
                message: "Rate limit reached for requests".into(),
                kind: Some("rate_limit_error".into()),
                code: Some("rate_limit_exceeded".into()),
            }),
            ..Self::new(429, times)
        }
    }
}

/// A scripted step's own error: OpenAI's `message`, `type` and `code` (on `/v1/*`); natively
/// only the message is sent, as Ollama's errors carry nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepError {
    pub message: String,
    /// OpenAI's `type`; by default the one Ollama's `/v1` layer gives the status
    /// (`invalid_request_error` for 400, `not_found_error` for 404, else `api_error`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// OpenAI's `code` (`content_filter`, `context_length_exceeded`, ...); `null` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

fn one() -> u32 {
    1
}

/// Faults applied to inference requests (chat, generate, embed, `/v1/*`), changeable live.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Statuses to answer with, in order, before answering normally ("3 x 500 then ok").
    pub script: VecDeque<ScriptStep>,
    /// Delay to the first byte; overrides the spec's `ttft`.
    pub ttft_ms: Option<u64>,
    /// Delay between tokens; overrides the spec's `tps`.
    pub token_delay_ms: Option<u64>,
    /// Break the connection after this many chunks of the answer.
    pub cut_after: Option<usize>,
    /// Never answer: no status, no bytes.
    pub hang: bool,
    /// Stop sending (but keep the connection) after this many chunks.
    pub hang_after: Option<usize>,
    /// `/api/version` answers 500.
    pub fail_probes: bool,
    /// Alternate between up and failing (everything 500) every N liveness probes.
    pub flap_every: Option<u32>,
    /// The error text scripted statuses answer with (say, llama.cpp's "image input is not
    /// supported"), instead of "simulated failure (<status>)".
    pub script_error: Option<String>,
    /// Pulls fail with this error, as Ollama's do: streamed after the manifest line (the status
    /// stays 200), or 500 when not streamed.
    pub fail_pulls: Option<String>,
    /// How long a whole pull takes (overrides the spec's `pull_ms`).
    pub pull_ms: Option<u64>,
}

impl Faults {
    /// "`times` x `status` then ok".
    pub fn statuses(status: u16, times: u32) -> Self {
        Self { script: VecDeque::from([ScriptStep::new(status, times)]), ..Self::default() }
    }
}

/// What the node received, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub model: Option<String>,
    pub host: Option<String>,
    pub request_id: Option<String>,
    /// The W3C `traceparent` sent, if any (the broker's attempt span when it exports traces).
    pub traceparent: Option<String>,
    /// The bearer token sent, if any (cloud sims check it).
    pub bearer: Option<String>,
    /// The body as received; kept by cloud sims only.
    pub body: Option<String>,
}

struct Shared {
    spec: SimSpec,
    addr: SocketAddr,
    faults: Mutex<Faults>,
    /// Models on "disk" (`/api/tags`): starts as the spec's, changed by pull, copy, create, delete.
    models: Mutex<Vec<String>>,
    /// Held models that are not the catalogue's current revision of their own name: copies
    /// (their source's) and `SimSpec::older` ones.
    origins: Mutex<std::collections::HashMap<String, catalog::Origin>>,
    /// Bytes of each layer (by digest) on disk: whole for pulled layers, part for a pull the
    /// client abandoned (Ollama keeps the part and resumes from it).
    layers: Mutex<std::collections::HashMap<String, u64>>,
    /// Pulls streaming now, pulls that ended with `success`, pulls the client abandoned, and
    /// the layer bytes every pull has "downloaded".
    pulling: AtomicUsize,
    pulls_completed: AtomicUsize,
    pulls_cancelled: AtomicUsize,
    pulled_bytes: std::sync::atomic::AtomicU64,
    /// Digests uploaded with `POST /api/blobs/:digest`.
    blobs: Mutex<Vec<String>>,
    received: Mutex<Vec<Received>>,
    loaded: Mutex<Vec<String>>,
    /// When each loaded model unloads (`keep_alive`; default five minutes from last use).
    expires: Mutex<std::collections::HashMap<String, time::OffsetDateTime>>,
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
    running: AtomicUsize,
    /// The most requests it held at once (queued + running): what a fleet's limit is checked by.
    peak: AtomicUsize,
    completed: AtomicUsize,
    cancelled: AtomicUsize,
    /// Answers that have sent their first chunk and not ended.
    streaming: AtomicUsize,
    probes: AtomicU32,
    flapped_down: AtomicBool,
    server: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicUsize,
}

impl Shared {
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn serves(&self, model: &str) -> bool {
        let m = crate::config::normalize_model(model);
        self.models().contains(&m)
    }

    fn models(&self) -> Vec<String> {
        self.models.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A pulled or created model: the catalogue's current revision of its name.
    fn add_model(&self, model: &str) {
        let m = crate::config::normalize_model(model);
        self.origins.lock().unwrap_or_else(|p| p.into_inner()).remove(&m);
        self.hold(&m);
    }

    /// `model` as a copy of `origin` (its digest and facts).
    fn add_copy(&self, model: &str, origin: catalog::Origin) {
        let m = crate::config::normalize_model(model);
        self.origins.lock().unwrap_or_else(|p| p.into_inner()).insert(m.clone(), origin);
        self.hold(&m);
    }

    fn hold(&self, m: &str) {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        if !models.iter().any(|x| x == m) {
            models.push(m.to_string());
        }
    }

    /// What a held (or about to be pulled) model is.
    fn origin(&self, model: &str) -> catalog::Origin {
        let m = crate::config::normalize_model(model);
        let origins = self.origins.lock().unwrap_or_else(|p| p.into_inner());
        origins.get(&m).cloned().unwrap_or_else(|| catalog::Origin::current(&m))
    }

    fn remove_model(&self, model: &str) -> bool {
        let m = crate::config::normalize_model(model);
        let origin = self.origin(&m);
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        let before = models.len();
        models.retain(|x| *x != m);
        let removed = models.len() != before;
        drop(models);
        self.origins.lock().unwrap_or_else(|p| p.into_inner()).remove(&m);
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).retain(|x| *x != m);
        // Ollama removes the blobs no other model still uses.
        if removed && !self.models().iter().any(|x| self.origin(x) == origin) {
            let mut layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
            for l in catalog::layers(&origin) {
                layers.remove(&l.digest);
            }
        }
        removed
    }
}

/// A running simulated node. Dropping it stops it.
pub struct SimNode {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNode").field("addr", &self.shared.addr).finish()
    }
}

impl SimNode {
    /// Start on an ephemeral loopback port.
    pub async fn start(spec: SimSpec) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), spec).await
    }

    pub async fn start_on(addr: SocketAddr, spec: SimSpec) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let models: Vec<String> = spec.models.iter().map(|m| crate::config::normalize_model(m)).collect();
        let origins: std::collections::HashMap<_, _> = spec
            .older
            .iter()
            .map(|m| crate::config::normalize_model(m))
            .filter(|m| models.contains(m))
            .map(|m| (m.clone(), catalog::Origin { base: m, revision: catalog::CURRENT - 1 }))
            .collect();
        // What the node holds is on its disk, every layer whole.
        let layers = models
            .iter()
            .flat_map(|m| catalog::layers(origins.get(m).unwrap_or(&catalog::Origin::current(m))))
            .map(|l| (l.digest, l.size))
            .collect();
        let shared = Arc::new(Shared {
            slots: Arc::new(Semaphore::new(spec.parallel.max(1))),
            models: Mutex::new(models),
            origins: Mutex::new(origins),
            layers: Mutex::new(layers),
            pulling: AtomicUsize::new(0),
            pulls_completed: AtomicUsize::new(0),
            pulls_cancelled: AtomicUsize::new(0),
            pulled_bytes: std::sync::atomic::AtomicU64::new(0),
            spec,
            addr,
            faults: Mutex::new(Faults::default()),
            received: Mutex::new(Vec::new()),
            blobs: Mutex::new(Vec::new()),
            loaded: Mutex::new(Vec::new()),
            expires: Mutex::new(std::collections::HashMap::new()),
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            streaming: AtomicUsize::new(0),
            probes: AtomicU32::new(0),
            flapped_down: AtomicBool::new(false),
            server: Mutex::new(None),
            next_id: AtomicUsize::new(1),
        });
        serve(&shared, listener);
        tracing::info!(%addr, models = ?shared.models(), "simulated node listening");
        Ok(Self { shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// Stop listening and drop every open connection, as a crashed node would.
    pub fn stop(&self) {
        stop(&self.shared);
    }

    /// Listen again on the same address after `stop`.
    pub async fn restart(&self) -> std::io::Result<()> {
        restart(&self.shared).await
    }

    pub fn set_faults(&self, faults: Faults) {
        *self.shared.faults() = faults;
    }

    pub fn update_faults(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.shared.faults());
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Requests received on `path` (exact match).
    pub fn count(&self, path: &str) -> usize {
        self.received().iter().filter(|r| r.path == path).count()
    }

    /// Inference requests received (chat, generate, embeddings, `/v1/*`).
    pub fn inference_count(&self) -> usize {
        self.received().iter().filter(|r| inference::is_inference(&r.path)).count()
    }

    /// Streams the client abandoned before the end.
    pub fn cancelled(&self) -> usize {
        self.shared.cancelled.load(Ordering::Acquire)
    }

    /// Inference answers sent to the end.
    pub fn completed(&self) -> usize {
        self.shared.completed.load(Ordering::Acquire)
    }

    /// Models the node has now.
    pub fn models(&self) -> Vec<String> {
        self.shared.models()
    }

    /// Digests this node holds blobs for.
    pub fn blobs(&self) -> Vec<String> {
        self.shared.blobs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Pulls streaming right now.
    pub fn pulling(&self) -> usize {
        self.shared.pulling.load(Ordering::Acquire)
    }

    /// Pulls the client abandoned before `success` (the node stopped downloading then).
    pub fn pulls_cancelled(&self) -> usize {
        self.shared.pulls_cancelled.load(Ordering::Acquire)
    }

    /// Pulls that ended with `success`.
    pub fn pulls_completed(&self) -> usize {
        self.shared.pulls_completed.load(Ordering::Acquire)
    }

    /// Layer bytes every pull has downloaded so far.
    pub fn pulled_bytes(&self) -> u64 {
        self.shared.pulled_bytes.load(Ordering::Acquire)
    }

    /// The digest `/api/tags` lists for a held model, if held.
    pub fn digest(&self, model: &str) -> Option<String> {
        self.shared.serves(model).then(|| self.shared.origin(model).digest())
    }

    /// Answers mid-stream right now: first chunk sent, not ended.
    pub fn streaming(&self) -> usize {
        self.shared.streaming.load(Ordering::Acquire)
    }

    /// Requests generating right now.
    pub fn running(&self) -> usize {
        self.shared.running.load(Ordering::Acquire)
    }

    /// The most inference requests it held at once (waiting for a slot or generating).
    pub fn max_in_flight(&self) -> usize {
        self.shared.peak.load(Ordering::Acquire)
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        stop(&self.shared);
    }
}

fn serve(shared: &Arc<Shared>, listener: TcpListener) {
    let app = router::router(Arc::clone(shared));
    let handle = tokio::spawn(async move {
        // Connections live in this task's JoinSet, so aborting the task drops them all.
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((sock, _)) = accepted else { continue };
                    let _ = sock.set_nodelay(true);
                    let svc = hyper_util::service::TowerToHyperService::new(app.clone());
                    conns.spawn(async move {
                        let io = hyper_util::rt::TokioIo::new(sock);
                        let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                            .serve_connection(io, svc)
                            .await;
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    *shared.server.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
}

fn stop(shared: &Shared) {
    if let Some(h) = shared.server.lock().unwrap_or_else(|p| p.into_inner()).take() {
        h.abort();
        tracing::info!(addr = %shared.addr, "simulated node stopped");
    }
}

async fn restart(shared: &Arc<Shared>) -> std::io::Result<()> {
    stop(shared);
    let listener = TcpListener::bind(shared.addr).await?;
    serve(shared, listener);
    tracing::info!(addr = %shared.addr, "simulated node listening again");
    Ok(())
}

/// The demo cluster: `n` simulated nodes with different models and speeds, named sim-a,
/// sim-b, ... (what `corral demo` and the desktop app run when there is nothing to front).
pub async fn demo_nodes(n: usize) -> std::io::Result<(Vec<SimNode>, Vec<crate::config::NodeConfig>)> {
    let catalog: [&[&str]; 3] = [
        &["llama3.2:latest", "qwen2.5:7b", "nomic-embed-text:latest"],
        &["llama3.2:latest", "nomic-embed-text:latest"],
        &["llama3.2:latest", "qwen2.5:7b"],
    ];
    let mut sims = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..n.clamp(1, 26) {
        let spec = SimSpec {
            models: catalog[i % catalog.len()].iter().map(|s| s.to_string()).collect(),
            tps: 40.0 + 10.0 * i as f64,
            ttft: Duration::from_millis(120 + 40 * i as u64),
            // Pulls take a while, so their progress (and Cancel) can be seen.
            pull_ms: 8_000 + 2_000 * i as u64,
            // The third node has not pulled llama3.2 since it was updated: another digest.
            older: if i == 2 { vec!["llama3.2:latest".into()] } else { Vec::new() },
            ..SimSpec::default()
        };
        let node = SimNode::start(spec).await?;
        nodes.push(crate::config::NodeConfig {
            name: format!("sim-{}", (b'a' + i as u8) as char),
            url: node.url(),
            ..crate::config::NodeConfig::default()
        });
        sims.push(node);
    }
    Ok((sims, nodes))
}

/// A simulated OpenAI-compatible cloud for the demo, its provider entry, and two categories
/// to try it with: `public` may fall back to it (with redaction), `private` never leaves.
pub async fn demo_cloud(
) -> std::io::Result<(SimNode, crate::config::ProviderConfig, Vec<crate::config::CategoryConfig>)> {
    use crate::config::{CategoryConfig, CloudPermission, ProviderConfig};
    let spec = SimSpec { models: vec!["gpt-4o-mini".into()], cloud: true, tps: 80.0, ..SimSpec::default() };
    let cloud = SimNode::start(spec).await?;
    let provider = ProviderConfig {
        name: "cloud-sim".into(),
        base_url: format!("{}/v1", cloud.url()),
        model_map: [("*".to_string(), "gpt-4o-mini".to_string())].into(),
        ..ProviderConfig::default()
    };
    let categories = vec![
        CategoryConfig {
            name: "public".into(),
            cloud: CloudPermission::OnFailure,
            providers: vec!["cloud-sim".into()],
            redact: true,
            ..CategoryConfig::default()
        },
        CategoryConfig { name: "private".into(), priority: 0, ..CategoryConfig::default() },
    ];
    Ok((cloud, provider, categories))
}

/// Start `n` nodes on consecutive ports from `base_port` (all ephemeral if 0), for
/// `corral sim --nodes N`.
pub async fn start_many(n: usize, base_port: u16, spec: &SimSpec) -> std::io::Result<Vec<SimNode>> {
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let port = if base_port == 0 { 0 } else { base_port + i as u16 };
        nodes.push(SimNode::start_on(SocketAddr::from(([127, 0, 0, 1], port)), spec.clone()).await?);
    }
    Ok(nodes)
}

impl Faults {
    /// Next scripted step (with `times` left as it was), consuming one use of it.
    fn next_step(&mut self) -> Option<ScriptStep> {
        let step = self.script.front_mut()?;
        let taken = step.clone();
        step.times = step.times.saturating_sub(1);
        if step.times == 0 {
            self.script.pop_front();
        }
        Some(taken)
    }
}

/// Delay values in effect for one request.
#[derive(Debug, Clone, Copy)]
struct Pace {
    ttft: Duration,
    per_token: Duration,
    cut_after: Option<usize>,
    hang_after: Option<usize>,
}

impl Pace {
    fn of(spec: &SimSpec, f: &Faults) -> Self {
        let per_token = match f.token_delay_ms {
            Some(ms) => Duration::from_millis(ms),
            None if spec.tps > 0.0 => Duration::from_secs_f64(1.0 / spec.tps),
            None => Duration::ZERO,
        };
        Self {
            ttft: f.ttft_ms.map(Duration::from_millis).unwrap_or(spec.ttft),
            per_token,
            cut_after: f.cut_after,
            hang_after: f.hang_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_is_consumed_in_order() {
        let mut f = Faults::statuses(500, 2);
        f.script.push_back(ScriptStep::rate_limited(1, Some(3)));
        let mut status = || f.next_step().map(|s| (s.status, s.retry_after));
        assert_eq!(status(), Some((500, None)));
        assert_eq!(status(), Some((500, None)));
        assert_eq!(status(), Some((429, Some(3))));
        assert_eq!(status(), None);
    }

    #[test]
    fn steps_parse_with_and_without_their_new_fields() {
        let f: Faults = serde_json::from_str(r#"{"script":[{"status":500}]}"#).expect("the old shape still parses");
        assert_eq!(f.script[0], ScriptStep::new(500, 1));
        let f: Faults = serde_json::from_str(
            r#"{"script":[{"status":429,"times":2,"retry_after":5},
                {"status":400,"error":{"message":"filtered","type":"invalid_request_error","code":"content_filter"}}]}"#,
        )
        .expect("retry_after and error parse");
        assert_eq!(f.script[0].retry_after, Some(5));
        assert_eq!(f.script[1].error.as_ref().and_then(|e| e.code.as_deref()), Some("content_filter"));
        assert!(
            serde_json::from_str::<Faults>(r#"{"script":[{"status":500,"retry_afterr":1}]}"#).is_err(),
            "typos in a step are rejected"
        );
        assert!(serde_json::from_str::<Faults>(r#"{"script":[{"status":400,"error":{"msg":"x"}}]}"#).is_err());
        let back: Faults = serde_json::from_str(&serde_json::to_string(&f).expect("json")).expect("round trip");
        assert_eq!(back, f, "GET /_sim/faults reads back as it was set");
    }

    #[test]
    fn faults_parse_from_control_json() {
        let f: Faults = serde_json::from_str(r#"{"script":[{"status":500,"times":3}],"ttft_ms":200,"cut_after":5}"#)
            .expect("documented control body parses");
        assert_eq!(f.script[0].times, 3);
        assert_eq!(f.cut_after, Some(5));
        assert!(serde_json::from_str::<Faults>(r#"{"cut_afterr":5}"#).is_err(), "typos are rejected");
    }
}
