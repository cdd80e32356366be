//! Telemetry: what happened, for people and machines.
//!
//! - A live event bus (`Bus`, two `tokio::sync::broadcast` channels): node state changes,
//!   finished requests, config reloads. The admin SSE stream hears everything; the store's
//!   node-event recorder, the desktop notifications and the tray hear only the notable part
//!   (every change, and the requests that can raise an alert), so an ordinary request wakes no
//!   task of theirs. Nothing on the request path waits for a listener.
//! - Prometheus metrics (`prometheus-client`, an explicit registry, no global recorder):
//!   requests by node/category/outcome, latency and time-to-first-byte histograms, tokens,
//!   fallbacks; gauges (in-flight, queue depth, breaker, health) are read at scrape time.
//! - One `Trace` per request: it fills in the request's row as the request moves along, and
//!   when it ends (or is dropped: the client left) it is judged once and fans out to the store,
//!   the metrics, the bus, and one structured `tracing` event with the same fields as the row.
//! - With `[telemetry] otlp_endpoint`, the same trace as OpenTelemetry spans (`crate::otlp`): a
//!   span for the request and one per attempt (`Trace::attempt_began` / `attempt_failed`),
//!   handed to the exporter when the trace is judged; without it, each hook is one branch.

use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry as MetricsRegistry;
use serde::Serialize;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::node::{NodeState, Registry};
use crate::store::{now_ms, RequestRow, Started, Store};

/// Something worth telling listeners about.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    NodeState {
        node: String,
        from: NodeState,
        to: NodeState,
        reason: String,
        at: i64,
    },
    /// Shared: the store's record and every listener's copy are one allocation.
    Request(Arc<RequestRow>),
    ConfigReload {
        ok: bool,
        error: Option<String>,
    },
    /// The share of requests answered by cloud providers crossed `alerts.fallback_share`
    /// (`above`), or fell back below it.
    FallbackShare {
        share: f64,
        requests: u64,
        threshold: f64,
        above: bool,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    node: String,
    category: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    node: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    node: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    node: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
    /// The provider's model that answered.
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    node: String,
    outcome: String,
}

fn latency_histogram() -> Histogram {
    // 5 ms .. ~164 s: LLM answers span five orders of magnitude.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.005, 2.0, 16))
}

/// One answering party's per-request series (a node, `provider:<name>` or `none`), looked up
/// once: `finish` otherwise built and hashed five label sets, cloning their strings, for every
/// request (issue 16). Each is made on first use, so `/metrics` shows the same series as
/// before. Families never drop a series, so a kept handle never goes stale.
#[derive(Default)]
struct PartySeries {
    duration: OnceLock<Histogram>,
    ttfb: OnceLock<Histogram>,
    prompt: OnceLock<Counter>,
    completion: OnceLock<Counter>,
    /// `requests` by (category, outcome): the categories configured times a few outcomes.
    requests: Mutex<Vec<(String, String, Counter)>>,
}

impl PartySeries {
    /// Count `row` (answered by `node`, this party) in its series.
    fn observe(&self, m: &Metrics, node: &str, row: &RequestRow) {
        self.requests(&m.requests, node, &row.category, &row.status).inc();
        let labels = || NodeLabels { node: node.to_string() };
        if let Some(ms) = row.total_ms {
            self.duration.get_or_init(|| m.duration.get_or_create(&labels()).clone()).observe(ms as f64 / 1000.0);
        }
        if let Some(ms) = row.ttfb_ms {
            self.ttfb.get_or_init(|| m.ttfb.get_or_create(&labels()).clone()).observe(ms as f64 / 1000.0);
        }
        for (kind, series, n) in
            [("prompt", &self.prompt, row.prompt_tokens), ("completion", &self.completion, row.completion_tokens)]
        {
            if let Some(n) = n.filter(|n| *n > 0) {
                let labels = || TokenLabels { node: node.to_string(), kind: kind.into() };
                series.get_or_init(|| m.tokens.get_or_create(&labels()).clone()).inc_by(n as u64);
            }
        }
    }

    fn requests(&self, family: &Family<RequestLabels, Counter>, node: &str, category: &str, outcome: &str) -> Counter {
        let mut known = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, counter)) = known.iter().find(|(c, o, _)| c == category && o == outcome) {
            return counter.clone();
        }
        let labels =
            RequestLabels { node: node.to_string(), category: category.to_string(), outcome: outcome.to_string() };
        let counter = family.get_or_create(&labels).clone();
        known.push((labels.category, labels.outcome, counter.clone()));
        counter
    }
}

struct Metrics {
    registry: MetricsRegistry,
    /// [`PartySeries`] by answering party.
    parties: RwLock<foldhash::HashMap<String, Arc<PartySeries>>>,
    requests: Family<RequestLabels, Counter>,
    duration: Family<NodeLabels, Histogram, fn() -> Histogram>,
    ttfb: Family<NodeLabels, Histogram, fn() -> Histogram>,
    tokens: Family<TokenLabels, Counter>,
    fallbacks: Family<ProviderLabels, Counter>,
    failed_attempts: Family<AttemptLabels, Counter>,
    in_flight: Family<NodeLabels, Gauge>,
    breaker_open: Family<NodeLabels, Gauge>,
    node_state: Family<StateLabels, Gauge>,
    speed: SpeedGauges,
    queue_depth: Gauge,
    store_dropped: Gauge,
    unauthenticated: Counter,
    fallback_share: Gauge<f64, std::sync::atomic::AtomicU64>,
    otlp: crate::otlp::Counters,
}

impl Metrics {
    fn party(&self, name: &str) -> Arc<PartySeries> {
        if let Some(p) = self.parties.read().unwrap_or_else(PoisonError::into_inner).get(name) {
            return Arc::clone(p);
        }
        let mut parties = self.parties.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(parties.entry(name.to_string()).or_default())
    }

    fn new() -> Self {
        let mut registry = MetricsRegistry::with_prefix("corral");
        let requests = Family::<RequestLabels, Counter>::default();
        let duration = Family::<NodeLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let ttfb = Family::<NodeLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let tokens = Family::<TokenLabels, Counter>::default();
        let fallbacks = Family::<ProviderLabels, Counter>::default();
        let in_flight = Family::<NodeLabels, Gauge>::default();
        let breaker_open = Family::<NodeLabels, Gauge>::default();
        let node_state = Family::<StateLabels, Gauge>::default();
        let queue_depth = Gauge::default();
        let store_dropped = Gauge::default();
        let unauthenticated = Counter::default();
        registry.register(
            "unauthenticated_rejections",
            "Requests refused for a missing or wrong client key (recorded one by one only up to a rate)",
            unauthenticated.clone(),
        );
        let fallback_share = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "fallback_share",
            "Share of inference requests answered by cloud providers over alerts.fallback_window_ms",
            fallback_share.clone(),
        );
        registry.register("requests", "Requests finished, by node, category and outcome", requests.clone());
        registry.register("request_duration_seconds", "Whole request time, by node", duration.clone());
        registry.register("time_to_first_byte_seconds", "Time to the first byte of the answer, by node", ttfb.clone());
        registry.register("tokens", "Tokens by node and kind (prompt, completion)", tokens.clone());
        registry.register(
            "fallbacks",
            "Requests answered by a cloud provider, by provider and its model",
            fallbacks.clone(),
        );
        let failed_attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "failed_attempts",
            "Attempts on a node that did not answer (another node, the cloud or an error did), by outcome",
            failed_attempts.clone(),
        );
        registry.register("in_flight", "Requests running on a node", in_flight.clone());
        registry.register("breaker_state", "Breaker state: 0 closed, 1 half-open, 2 open", breaker_open.clone());
        registry.register("node_state", "1 for the state each node is in", node_state.clone());
        registry.register("queue_depth", "Requests waiting for a free node", queue_depth.clone());
        let speed = SpeedGauges::register(&mut registry);
        let otlp = crate::otlp::Counters::register(&mut registry);
        registry.register(
            "store_dropped_records",
            "Request records dropped because the store writer fell behind",
            store_dropped.clone(),
        );
        Self {
            registry,
            parties: RwLock::default(),
            requests,
            duration,
            ttfb,
            tokens,
            fallbacks,
            failed_attempts,
            in_flight,
            breaker_open,
            node_state,
            speed,
            queue_depth,
            store_dropped,
            unauthenticated,
            fallback_share,
            otlp,
        }
    }
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The speed model per node and model (`crate::speed`); a series exists only while known.
struct SpeedGauges {
    decode: Family<ModelLabels, FloatGauge>,
    prefill: Family<ModelLabels, FloatGauge>,
    load: Family<ModelLabels, FloatGauge>,
}

impl SpeedGauges {
    fn register(registry: &mut MetricsRegistry) -> Self {
        let g = Self { decode: Family::default(), prefill: Family::default(), load: Family::default() };
        registry.register(
            "node_decode_tokens_per_second",
            "Learned generation speed (eval_count / eval_duration, EWMA), by node and model",
            g.decode.clone(),
        );
        registry.register(
            "node_prefill_tokens_per_second",
            "Learned prompt speed (prompt_eval_count / prompt_eval_duration, EWMA), by node and model",
            g.prefill.clone(),
        );
        registry.register(
            "node_load_seconds",
            "Learned cold-load time (load_duration of answers that loaded the model), by node and model",
            g.load.clone(),
        );
        g
    }

    fn set(&self, registry: &Registry) {
        self.decode.clear();
        self.prefill.clear();
        self.load.clear();
        let now = tokio::time::Instant::now();
        for n in registry.all().iter() {
            for (model, s) in n.speeds(now) {
                let labels = ModelLabels { node: n.name().to_string(), model };
                let put = |f: &Family<ModelLabels, FloatGauge>, v: Option<f64>| {
                    if let Some(v) = v {
                        f.get_or_create(&labels).set(v);
                    }
                };
                put(&self.decode, s.decode_tps);
                put(&self.prefill, s.prefill_tps);
                put(&self.load, s.load_ms.map(|ms| ms / 1000.0));
            }
        }
    }
}

/// Where events are published: `all` for listeners that show everything (the UI's event
/// stream), `notable` for those that act on changes (alerts, the node-event record, the tray):
/// every event but an ordinary request, which at thousands a second would wake each of them
/// per request for nothing.
#[derive(Clone, Debug)]
pub struct Bus {
    all: broadcast::Sender<Event>,
    notable: broadcast::Sender<Event>,
    /// A provider answered since a node last did: the next node answer ends a fallback, which
    /// the alerts tell (`alerts::Alerts::fallback`), so it is notable.
    in_fallback: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for Bus {
    fn default() -> Self {
        Self { all: broadcast::channel(1024).0, notable: broadcast::channel(1024).0, in_fallback: Arc::default() }
    }
}

impl Bus {
    pub fn send(&self, e: Event) {
        if self.notable(&e) {
            let _ = self.notable.send(e.clone());
        }
        let _ = self.all.send(e);
    }

    /// Whether `e` may change what a change-listener shows or says: anything but a request;
    /// a request that failed over, was answered by a provider, or ended a fallback.
    fn notable(&self, e: &Event) -> bool {
        use std::sync::atomic::Ordering;
        let Event::Request(row) = e else { return true };
        if row.fallback.is_some() {
            if row.status == "ok" {
                self.in_fallback.store(true, Ordering::Relaxed);
            }
            return true;
        }
        let ends_fallback = row.status == "ok"
            && row.node.is_some()
            && crate::cloud::can_fall_back(&row.endpoint)
            && self.in_fallback.load(Ordering::Relaxed)
            && self.in_fallback.swap(false, Ordering::Relaxed);
        row.attempts > 1 || ends_fallback
    }
}

pub struct Telemetry {
    bus: Bus,
    metrics: Metrics,
    store: Option<Store>,
    fallback_share: std::sync::Mutex<crate::cloud::share::Window>,
    /// Unauthenticated rejections recorded in the current second: (second, count).
    unauthenticated: std::sync::Mutex<(i64, u32)>,
    /// Where finished traces go as OTLP spans, when `[telemetry] otlp_endpoint` is set.
    exporter: Option<crate::otlp::Exporter>,
    /// Per-client-key usage, counted as requests finish (on in a fleet only; `clients::Usage`).
    usage: Arc<crate::clients::Usage>,
    /// Client-key quotas: tokens are added as requests finish (`quota.rs`).
    quotas: Arc<crate::quota::Quotas>,
}

/// Unauthenticated rejections recorded row by row per second; the rest are only counted.
const UNAUTHENTICATED_ROWS_PER_SEC: u32 = 10;

/// Longest model name, path or header value kept in a record or log line.
const RECORD_TEXT_MAX: usize = 256;

/// `text` as it may appear in a record or a log line: control characters escaped (a newline or
/// an ESC in a model name must not forge a log line or a terminal), at most 256 bytes.
pub fn for_record(text: &str) -> String {
    if fit_for_record(text) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len().min(RECORD_TEXT_MAX));
    for c in text.chars() {
        let before = out.len();
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
        if out.len() > RECORD_TEXT_MAX {
            out.truncate(before);
            out.push('…');
            break;
        }
    }
    out
}

/// Whether `text` is already as [`for_record`] would write it (the common case: a model name).
fn fit_for_record(text: &str) -> bool {
    text.len() <= RECORD_TEXT_MAX && !text.chars().any(char::is_control)
}

/// [`for_record`] in place, allocating only when something changes.
fn make_fit_for_record(text: &mut String) {
    if !fit_for_record(text) {
        *text = for_record(text);
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").field("store", &self.store).finish()
    }
}

impl Telemetry {
    pub fn new(store: Option<Store>, bus: Bus) -> Self {
        let share = crate::cloud::share::Window::new(crate::config::AlertsConfig::default(), Instant::now());
        Self {
            bus,
            metrics: Metrics::new(),
            store,
            fallback_share: std::sync::Mutex::new(share),
            unauthenticated: std::sync::Mutex::new((0, 0)),
            exporter: None,
            usage: Arc::default(),
            quotas: Arc::default(),
        }
    }

    /// This telemetry exporting every trace's spans to `url` (an OTLP/HTTP `…/v1/traces`)
    /// through `client`, and the exporter's task, to be spawned: it sends until `cancel`, then
    /// flushes what is queued.
    pub fn exporting(
        mut self,
        url: String,
        client: reqwest::Client,
        cancel: tokio_util::sync::CancellationToken,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (exporter, task) = crate::otlp::Exporter::start(url, client, self.metrics.otlp.clone(), cancel);
        self.exporter = Some(exporter);
        (self, task)
    }

    /// Count one request refused for its client key; `true` while it may also be recorded
    /// (at most `UNAUTHENTICATED_ROWS_PER_SEC` a second).
    pub fn note_unauthenticated(&self) -> bool {
        self.metrics.unauthenticated.inc();
        let second = now_ms() / 1000;
        let mut w = self.unauthenticated.lock().unwrap_or_else(|p| p.into_inner());
        if w.0 != second {
            *w = (second, 0);
        }
        w.1 += 1;
        w.1 <= UNAUTHENTICATED_ROWS_PER_SEC
    }

    pub fn set_alerts(&self, cfg: crate::config::AlertsConfig) {
        self.share_window().set_config(cfg);
    }

    fn share_window(&self) -> std::sync::MutexGuard<'_, crate::cloud::share::Window> {
        self.fallback_share.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Share of inference requests a cloud provider answered in the alert window, and how many
    /// requests that is out of.
    pub fn fallback_share(&self) -> (f64, u64) {
        self.share_window().share(Instant::now())
    }

    /// A fresh bus; node state changes are published on it from the registry.
    pub fn bus() -> Bus {
        Bus::default()
    }

    /// A sink for the registry's node state changes that publishes them on `bus`.
    pub fn state_sink(bus: Bus) -> crate::node::StateSink {
        Arc::new(move |c: crate::node::StateChange| {
            bus.send(Event::NodeState { node: c.node, from: c.from, to: c.to, reason: c.reason, at: c.at });
        })
    }

    /// Every event, a finished request each included: for listeners that show them all.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.bus.all.subscribe()
    }

    /// Every event but ordinary requests ([`Bus`]): for listeners that act on changes.
    pub fn subscribe_notable(&self) -> broadcast::Receiver<Event> {
        self.bus.notable.subscribe()
    }

    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// Per-client-key usage counted as requests finish (off unless a fleet turned it on).
    pub fn usage(&self) -> &Arc<crate::clients::Usage> {
        &self.usage
    }

    /// Client-key quotas in force and their windows.
    pub fn quotas(&self) -> &Arc<crate::quota::Quotas> {
        &self.quotas
    }

    pub fn publish(&self, e: Event) {
        self.bus.send(e);
    }

    /// Start tracing a request.
    pub fn begin(self: &Arc<Self>, id: &str, endpoint: &str, origin: &str, client_id: Option<String>) -> Trace {
        let started_at = now_ms();
        let endpoint = &for_record(endpoint);
        if let Some(s) = &self.store {
            let client_request_id = client_id.clone();
            s.started(Started { id: id.to_string(), started_at, endpoint: endpoint.to_string(), client_request_id });
        }
        Trace {
            telemetry: Arc::clone(self),
            started: Instant::now(),
            row: RequestRow {
                id: id.to_string(),
                started_at,
                endpoint: endpoint.to_string(),
                origin: origin.to_string(),
                client_request_id: client_id,
                status: "running".into(),
                ..RequestRow::default()
            },
            done: false,
            spans: self.exporter.as_ref().map(|_| Box::new(crate::otlp::Live::new())),
            client: None,
        }
    }

    /// Prometheus text exposition, gauges read now.
    pub fn render(&self, registry: &Registry, queue_depth: usize) -> String {
        let m = &self.metrics;
        for n in registry.all().iter() {
            let node = NodeLabels { node: n.name().to_string() };
            m.in_flight.get_or_create(&node).set(n.in_flight() as i64);
            let breaker = match n.breaker_state() {
                crate::breaker::BreakerState::Closed => 0,
                crate::breaker::BreakerState::HalfOpen => 1,
                crate::breaker::BreakerState::Open => 2,
            };
            m.breaker_open.get_or_create(&node).set(breaker);
            let current = n.state();
            for s in [
                NodeState::Unknown,
                NodeState::Healthy,
                NodeState::Unhealthy,
                NodeState::Recovering,
                NodeState::Draining,
                NodeState::Disabled,
            ] {
                m.node_state
                    .get_or_create(&StateLabels { node: n.name().to_string(), state: s.name().to_string() })
                    .set(i64::from(s == current));
            }
        }
        m.speed.set(registry);
        m.queue_depth.set(queue_depth as i64);
        m.fallback_share.set(self.fallback_share().0);
        m.store_dropped.set(self.store.as_ref().map_or(0, |s| s.dropped() as i64));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &m.registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }

    fn export(&self, spans: crate::otlp::RequestSpans) {
        if let Some(e) = &self.exporter {
            e.offer(spans);
        }
    }

    fn finish(&self, row: RequestRow) {
        let m = &self.metrics;
        // Who answered: a node, a cloud provider (`provider:<name>`), or nobody.
        // Borrowed for a node (the common case): it only names the party's series.
        let node: std::borrow::Cow<'_, str> = match (&row.node, &row.fallback) {
            (Some(n), _) => n.as_str().into(),
            (None, Some(p)) => format!("provider:{p}").into(),
            (None, None) => "none".into(),
        };
        m.party(&node).observe(m, &node, &row);
        if let Some(p) = &row.fallback {
            let model = row.answered_model.clone().unwrap_or_else(|| row.model.clone());
            m.fallbacks.get_or_create(&ProviderLabels { provider: p.clone(), model }).inc();
        }
        for f in &row.failed_attempts {
            m.failed_attempts.get_or_create(&AttemptLabels { node: f.node.clone(), outcome: f.outcome.clone() }).inc();
        }
        if crate::cloud::can_fall_back(&row.endpoint) && row.status != "client_error" {
            let by_cloud = row.fallback.is_some() && row.status == "ok";
            let crossing = self.share_window().record(Instant::now(), by_cloud);
            if let Some(c) = crossing {
                if c.above {
                    tracing::warn!(
                        share = c.share,
                        requests = c.requests,
                        threshold = c.threshold,
                        "cloud providers are answering a large share of requests"
                    );
                } else {
                    tracing::info!(
                        share = c.share,
                        requests = c.requests,
                        threshold = c.threshold,
                        "cloud fallback share is back below the alert threshold"
                    );
                }
                self.publish(Event::FallbackShare {
                    share: c.share,
                    requests: c.requests,
                    threshold: c.threshold,
                    above: c.above,
                });
            }
        }
        tracing::info!(
            target: "corral::request",
            id = %row.id, endpoint = %row.endpoint, category = %row.category, origin = %row.origin, model = %row.model,
            node = row.node.as_deref().unwrap_or(""), attempts = row.attempts, status = %row.status,
            http_status = row.http_status.unwrap_or(0), error_code = row.error_code.as_deref().unwrap_or(""),
            queued_ms = row.queued_ms.unwrap_or(0), ttfb_ms = row.ttfb_ms.unwrap_or(0), total_ms = row.total_ms.unwrap_or(0),
            prompt_tokens = row.prompt_tokens.unwrap_or(0), completion_tokens = row.completion_tokens.unwrap_or(0),
            streamed = row.streamed, interrupted = row.interrupted,
            "request finished"
        );
        let row = Arc::new(row);
        if let Some(s) = &self.store {
            s.finished(Arc::clone(&row));
        }
        self.publish(Event::Request(row));
    }
}

/// One request's record in the making. Judged once: by `finish`, or on drop as `cancelled`.
pub struct Trace {
    telemetry: Arc<Telemetry>,
    started: Instant,
    pub row: RequestRow,
    done: bool,
    /// The request's OpenTelemetry spans in the making; `None` unless exporting.
    spans: Option<Box<crate::otlp::Live>>,
    /// The client key's name, when a listener's `api_keys` admitted the request: its usage.
    client: Option<String>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace").field("id", &self.row.id).finish()
    }
}

impl Trace {
    /// The request came with client key `name`: its usage counts when the trace finishes.
    pub fn for_client(&mut self, name: Option<String>) {
        self.client = name;
    }

    pub fn elapsed_ms(&self) -> i64 {
        self.started.elapsed().as_millis() as i64
    }

    /// Time from arrival to dispatch (set on the first dispatch only).
    pub fn mark_dispatched(&mut self) {
        if self.row.queued_ms.is_none() {
            self.row.queued_ms = Some(self.elapsed_ms());
        }
    }

    pub fn mark_first_byte(&mut self) {
        self.row.ttfb_ms = Some(self.elapsed_ms());
    }

    /// Continue the trace the client's `traceparent` names (W3C), when it sent a valid one.
    pub fn continue_from(&mut self, headers: &http::HeaderMap) {
        if let Some(s) = self.spans.as_mut() {
            s.continue_from(headers.get(crate::otlp::TRACEPARENT).and_then(|v| v.to_str().ok()));
        }
    }

    /// An attempt on `node` begins; when exporting, the `traceparent` to send the node (its
    /// attempt span, a child of the request's).
    pub fn attempt_began(&mut self, node: &str) -> Option<http::HeaderValue> {
        let s = self.spans.as_mut()?;
        // The model a degrade step asked for (a provider answers only after the attempts).
        let degraded = self.row.answered_model.clone();
        http::HeaderValue::from_str(&s.attempt_began(node, degraded)).ok()
    }

    /// The attempt on `node` ended without an answer (`outcome`: an `Outcome` name).
    pub fn attempt_failed(&mut self, node: &str, outcome: &str, detail: &str) {
        self.row.failed_attempts.push(crate::store::FailedAttempt {
            node: node.to_string(),
            outcome: outcome.to_string(),
            detail: for_record(detail),
        });
        if let Some(s) = self.spans.as_mut() {
            s.attempt_failed(outcome, &for_record(detail));
        }
    }

    /// Judge the request: `status` is ok | client_error | error | interrupted | cancelled.
    pub fn finish(mut self, status: &str, http_status: Option<u16>, error_code: Option<&str>) {
        self.complete(status, http_status, error_code);
    }

    /// The node is done with the request (its slot is free) but the client is still reading
    /// what Corral buffered for it: keep the verdict and the node's finish time; the record is
    /// made by `finish_judged` once the client has the last byte (or as `cancelled` if it
    /// leaves first).
    pub fn judge(&mut self, status: &str, http_status: Option<u16>, error_code: Option<&str>) {
        self.row.node_done_ms = Some(self.elapsed_ms());
        self.row.status = status.to_string();
        self.row.http_status = http_status.map(i64::from).or(self.row.http_status);
        self.row.error_code = error_code.map(str::to_string).or(self.row.error_code.take());
    }

    /// The client has the last byte of an answer judged by `judge`: make the record.
    pub fn finish_judged(mut self) {
        let status = std::mem::take(&mut self.row.status);
        let code = self.row.error_code.take();
        self.complete(&status, None, code.as_deref());
    }

    fn complete(&mut self, status: &str, http_status: Option<u16>, error_code: Option<&str>) {
        if self.done {
            return;
        }
        self.done = true;
        self.row.status = status.to_string();
        self.row.http_status = http_status.map(i64::from).or(self.row.http_status);
        self.row.error_code = error_code.map(str::to_string).or(self.row.error_code.take());
        self.row.finished_at = Some(now_ms());
        self.row.total_ms = Some(self.elapsed_ms());
        // Without read-ahead the node and the client finish together.
        self.row.node_done_ms = self.row.node_done_ms.or(self.row.total_ms);
        self.row.interrupted = status == "interrupted";
        make_fit_for_record(&mut self.row.model);
        make_fit_for_record(&mut self.row.category);
        if let Some(spans) = self.spans.take().and_then(|s| s.finish(&self.row)) {
            self.telemetry.export(spans);
        }
        if let Some(client) = self.client.take() {
            self.telemetry.usage.count(&client, self.row.prompt_tokens, self.row.completion_tokens);
            let tokens = self.row.prompt_tokens.unwrap_or(0).max(0) + self.row.completion_tokens.unwrap_or(0).max(0);
            self.telemetry.quotas.add_tokens(&client, tokens as u64, crate::quota::now_s());
        }
        self.telemetry.finish(std::mem::take(&mut self.row));
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        // Dropped unjudged: the client went away before the end.
        self.complete("cancelled", Some(499), Some("client_gone"));
    }
}

/// Status word for an HTTP status the client got.
pub fn status_for(http: u16) -> &'static str {
    match http {
        200..=399 => "ok",
        400..=499 => "client_error",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_text_is_escaped_and_bounded() {
        assert_eq!(for_record("llama3.2\n\u{1b}[31mFAKE"), "llama3.2\\n\\u{1b}[31mFAKE");
        let long = for_record(&"m".repeat(5_000_000));
        assert!(long.len() <= RECORD_TEXT_MAX + '…'.len_utf8(), "a 5 MB name is cut: {}", long.len());
        assert_eq!(for_record("qwen2.5:7b"), "qwen2.5:7b", "ordinary names are untouched");
        let (fits, over) = ("m".repeat(RECORD_TEXT_MAX), "m".repeat(RECORD_TEXT_MAX + 1));
        assert_eq!(for_record(&fits), fits, "256 bytes fit");
        assert_eq!(for_record(&over), format!("{fits}…"), "the 257th byte does not");
        let escaped_at_the_end = format!("{}\\n", "m".repeat(RECORD_TEXT_MAX - 2));
        assert_eq!(for_record(&format!("{}\n", "m".repeat(RECORD_TEXT_MAX - 2))), escaped_at_the_end);
        let cut_escape = for_record(&format!("{}\n", "m".repeat(RECORD_TEXT_MAX - 1)));
        assert_eq!(cut_escape, format!("{}…", "m".repeat(RECORD_TEXT_MAX - 1)), "an escape is not cut in half");
        let mut in_place = String::from("llama3.2\u{7}");
        make_fit_for_record(&mut in_place);
        assert_eq!(in_place, for_record("llama3.2\u{7}"));
    }

    fn request(node: Option<&str>, attempts: i64, fallback: Option<&str>) -> Event {
        Event::Request(Arc::new(RequestRow {
            endpoint: "/api/chat".into(),
            node: node.map(str::to_string),
            attempts,
            fallback: fallback.map(str::to_string),
            status: "ok".into(),
            ..RequestRow::default()
        }))
    }

    /// Each finished request counts once in its party's series, whichever party it is and
    /// however often the party's handles were looked up before; a series appears only once a
    /// request has something for it (no time to first byte for a request nobody answered).
    #[test]
    fn each_request_counts_once_in_its_partys_series() {
        let telemetry = Telemetry::new(None, Bus::default());
        let row = |node: Option<&str>, fallback: Option<&str>, status: &str, ttfb: Option<i64>, tokens: Option<i64>| {
            RequestRow {
                endpoint: "/api/chat".into(),
                node: node.map(str::to_string),
                fallback: fallback.map(str::to_string),
                category: "chat".into(),
                status: status.into(),
                total_ms: Some(20),
                ttfb_ms: ttfb,
                completion_tokens: tokens,
                ..RequestRow::default()
            }
        };
        telemetry.finish(row(Some("a"), None, "ok", Some(5), Some(3)));
        telemetry.finish(row(Some("a"), None, "ok", Some(7), Some(4)));
        telemetry.finish(row(Some("a"), None, "error", None, None));
        telemetry.finish(row(None, Some("openai"), "ok", Some(9), None));
        telemetry.finish(row(None, None, "error", None, None));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &telemetry.metrics.registry).expect("encode");
        for line in [
            r#"corral_requests_total{node="a",category="chat",outcome="ok"} 2"#,
            r#"corral_requests_total{node="a",category="chat",outcome="error"} 1"#,
            r#"corral_requests_total{node="provider:openai",category="chat",outcome="ok"} 1"#,
            r#"corral_requests_total{node="none",category="chat",outcome="error"} 1"#,
            r#"corral_request_duration_seconds_count{node="a"} 3"#,
            r#"corral_time_to_first_byte_seconds_count{node="a"} 2"#,
            r#"corral_tokens_total{node="a",kind="completion"} 7"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(!text.contains(r#"corral_time_to_first_byte_seconds_count{node="none"}"#), "{text}");
        assert!(!text.contains(r#"kind="prompt""#), "no prompt tokens counted yet: {text}");
    }

    /// What each listener hears: `all` every event, `notable` changes and the requests that
    /// can raise an alert, never an ordinary answer.
    #[test]
    fn change_listeners_hear_changes_and_alerting_requests_only() {
        let bus = Bus::default();
        let (mut all, mut notable) = (bus.all.subscribe(), bus.notable.subscribe());
        let heard = |rx: &mut broadcast::Receiver<Event>| {
            std::iter::from_fn(|| rx.try_recv().ok())
                .map(|e| match e {
                    Event::Request(r) => format!(
                        "{}/{}/{}",
                        r.node.as_deref().unwrap_or("-"),
                        r.attempts,
                        r.fallback.as_deref().unwrap_or("-")
                    ),
                    other => format!("{other:?}").split_whitespace().next().unwrap_or("").to_string(),
                })
                .collect::<Vec<_>>()
        };
        bus.send(request(Some("n0"), 1, None));
        bus.send(Event::ConfigReload { ok: true, error: None });
        bus.send(request(Some("n0"), 2, None));
        bus.send(request(None, 1, Some("openai")));
        bus.send(request(Some("n1"), 1, None));
        bus.send(request(Some("n1"), 1, None));
        assert_eq!(heard(&mut all), ["n0/1/-", "ConfigReload", "n0/2/-", "-/1/openai", "n1/1/-", "n1/1/-"]);
        assert_eq!(
            heard(&mut notable),
            ["ConfigReload", "n0/2/-", "-/1/openai", "n1/1/-"],
            "the ordinary answers are left out, but the one that ends a fallback"
        );
    }
}
