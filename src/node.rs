//! The node registry: each configured node's static facts plus its live state.
//!
//! Live state is written by the probes in `health`, by the outcomes of real requests in
//! `proxy`, and by operators through the admin API; it is read on every request by `route` and
//! `admit`. Reads are lock-free (atomics, `ArcSwap` snapshots) or take a short `Mutex` that is
//! never held across an `.await`.
//!
//! A node's state is one of: `unknown` (not probed yet; routable, so a fresh broker serves at
//! once), `healthy`, `unhealthy`, `recovering` (back after being down: its share ramps up over
//! `slow_start` so it is not flooded), `draining` (operator: no new requests, in-flight ones
//! finish) and `disabled`. The first four come from health, the last two from the operator.
//!
//! Every state carries why and since when (`Since`): the concrete cause a probe or request
//! saw ("connection refused at http://10.0.0.6:11434") or the operator's action, and the wall
//! time it began. A down node keeps its original "since" while the cause is refreshed by each
//! failed probe. What a dead node last reported (loaded models, time to first byte) is kept
//! with the time it was learned, so readers can show it as last-known, never as live.
//!
//! In-flight counting is a guard (`InFlight`) taken at dispatch and dropped when the answer's
//! stream ends or is cancelled, so the count can never drift or go below zero. Dropping a
//! guard wakes the admission queue.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::breaker::{Breaker, BreakerPolicy, BreakerState, Permit};
use crate::config::{model_key, normalize_model, Config, NodeConfig};
use crate::ewma::PeakEwma;
use crate::outcome::Outcome;
use crate::speed::{Book, Card, Cards, Pace, Speed, Timing};

/// Liveness as the probes and passive signals see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Unknown,
    Healthy,
    Unhealthy,
}

impl Health {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Healthy,
            2 => Self::Unhealthy,
            _ => Self::Unknown,
        }
    }
    fn as_u8(self) -> u8 {
        match self {
            Self::Unknown => 0,
            Self::Healthy => 1,
            Self::Unhealthy => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// What the operator asked of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Admin {
    Active,
    Draining,
    Disabled,
}

impl Admin {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Draining,
            2 => Self::Disabled,
            _ => Self::Active,
        }
    }
    fn as_u8(self) -> u8 {
        match self {
            Self::Active => 0,
            Self::Draining => 1,
            Self::Disabled => 2,
        }
    }
}

/// The one state a person sees for a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Unknown,
    Healthy,
    Unhealthy,
    Recovering,
    Draining,
    Disabled,
}

impl NodeState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
            Self::Recovering => "recovering",
            Self::Draining => "draining",
            Self::Disabled => "disabled",
        }
    }
}

/// A model a node reported as loaded in `/api/ps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadedModel {
    pub name: String,
    pub size: u64,
    pub size_vram: u64,
    pub context_length: Option<u64>,
}

impl LoadedModel {
    /// Entirely in GPU memory: the fast case model affinity looks for.
    pub fn fully_in_vram(&self) -> bool {
        self.size > 0 && self.size_vram >= self.size
    }
}

/// How many loaded models `Node::loaded_facts` reads from atomics; past this (rare: Ollama
/// keeps up to three per GPU by default) it reads the list.
const LOADED_SIGS: usize = 4;

/// FNV-1a with a SplitMix64 finalizer: the sticky ring's hash of a session and of a node's
/// points, so every broker of a fleet maps a session alike. FNV alone leaves keys
/// that differ in their last character close together.
pub fn hash64(s: &str) -> u64 {
    let mut z: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes().chain(std::iter::once(0xff)) {
        z ^= u64::from(b);
        z = z.wrapping_mul(0x0000_0100_0000_01b3);
    }
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A model key as one routing decision compares it: hashed once, not once per node.
#[derive(Debug, Clone, Copy)]
pub struct ModelRef<'a> {
    pub key: &'a str,
    hash: u64,
}

impl<'a> ModelRef<'a> {
    pub fn new(key: &'a str) -> Self {
        Self { key, hash: model_hash(key) }
    }
}

/// A model key's hash as routing compares loaded models and speed cards by, its low bit
/// clear. foldhash rather than `hash64`: it reads eight bytes at a time where FNV reads one,
/// and a decision hashes its model at least once (with it, a fastest-finish decision at 100
/// nodes took 287 fewer instructions under callgrind). Kept within the process (nothing
/// stores or shares it), so a fixed seed is enough.
fn model_hash(key: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x636f_7272_616c).hash_one(key) & !1
}

/// A loaded model's signature: its key's hash, the low bit set when it is entirely in VRAM.
fn loaded_sig(l: &LoadedModel) -> u64 {
    model_hash(&l.name) | u64::from(l.fully_in_vram())
}

/// Why a node is in its state, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Since {
    /// The concrete cause ("connection refused at http://10.0.0.6:11434") or the operator's act.
    pub reason: String,
    /// Unix milliseconds.
    pub at_ms: i64,
}

impl Since {
    fn now(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), at_ms: crate::store::now_ms() }
    }
}

/// How long a state has lasted, as a person says it: "45 s", "3 min", "2 h 5 min", "3 d 4 h".
pub fn duration_text(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 if s % 3600 / 60 == 0 => format!("{} h", s / 3600),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Tunables a node's live state needs; from the `[health]` and `[breaker]` sections.
#[derive(Debug, Clone, Copy)]
pub struct NodeTuning {
    pub breaker: BreakerPolicy,
    pub slow_start: Duration,
    pub latency_decay: Duration,
}

impl NodeTuning {
    /// From the `[breaker]` and `[health]` sections.
    pub fn of(config: &Config) -> Self {
        Self {
            breaker: BreakerPolicy {
                failures_to_open: config.breaker.failures_to_open,
                cooldown: Duration::from_millis(config.breaker.cooldown_ms),
                trial_requests: config.breaker.trial_requests,
            },
            slow_start: Duration::from_millis(config.health.slow_start_ms),
            latency_decay: Duration::from_secs(10),
        }
    }
}

impl Default for NodeTuning {
    fn default() -> Self {
        Self {
            breaker: BreakerPolicy { failures_to_open: 5, cooldown: Duration::from_secs(10), trial_requests: 2 },
            slow_start: Duration::from_secs(30),
            latency_decay: Duration::from_secs(10),
        }
    }
}

pub struct Node {
    /// What every routing decision reads, together in one or two cache lines (a decision
    /// over 100 nodes touches each node's `hot` and little else).
    hot: Hot,
    pub config: NodeConfig,
    pub base_url: url::Url,
    probe_successes: AtomicU32,
    probe_failures: AtomicU32,
    /// When the node last came back from unhealthy: the start of its slow-start ramp.
    returned_at: Mutex<Option<Instant>>,
    slow_start_ms: std::sync::atomic::AtomicU64,
    breaker: Mutex<Breaker>,
    ttfb: Mutex<PeakEwma>,
    /// Unix ms of the last time-to-first-byte sample; 0 before the first.
    ttfb_at_ms: AtomicI64,
    /// Why and since when the node's health is what it is.
    health_since: Mutex<Since>,
    /// Why and since when the operator's setting is what it is.
    admin_since: Mutex<Since>,
    /// Until when the node asked not to be sent more (its 429's `Retry-After`).
    held_until: Mutex<Option<Instant>>,
    /// The last miss: a slow mark lasts `SLOW_FOR` after it, then the node is tried again.
    last_miss: Mutex<Option<Instant>>,
    /// Models from `/api/tags`, normalized; `None` until the first deep probe answers.
    models: ArcSwap<Option<BTreeSet<String>>>,
    loaded: ArcSwap<Vec<LoadedModel>>,
    /// Unix ms of the last `/api/ps` answer that set `loaded`; 0 before the first.
    loaded_at_ms: AtomicI64,
    /// Context length per model, learned from `/api/ps` and `/api/show`.
    context: ArcSwap<HashMap<String, u64>>,
    served: AtomicUsize,
    /// Prefill, decode and load speed per model key, learned from finished answers.
    speed: Mutex<Book>,
    /// `speed` for routing to read without its lock: see `Cards`.
    cards: Cards,
    /// The expected end of each running request that has one (slot id, end): when a slot frees.
    timetable: Mutex<Vec<(u64, Instant)>>,
    next_slot: AtomicU64,
    wake: Arc<Wake>,
    events: Events,
    /// Bumped whenever a model list changes: the registry's per-model index is rebuilt then.
    models_gen: Arc<AtomicU64>,
}

/// The atomics routing reads for every candidate, kept apart from the rest of `Node` so a
/// pass over many nodes loads one or two cache lines each, not one per field. In this order
/// (`repr(C)`) the first 64 bytes hold every field but the loaded models after the first.
#[repr(C, align(64))]
struct Hot {
    /// Unique in the process, never reused: where per-node routing state (smooth weighted
    /// round robin's scores, a sticky ring's owners) is kept without hashing names.
    id: usize,
    /// What a routing pass checks first, in one word: see `Glance`.
    glance: AtomicU64,
    /// `least-latency`'s order key, published with every sample: see `latency_key`.
    ttfb_key: AtomicU64,
    /// The estimate's decay in seconds (the order key is comparable between nodes that share it).
    ttfb_decay_s: f64,
    weight: AtomicU32,
    /// As configured; `Glance::slots` is the smaller of this and `fleet_share`.
    max_concurrency: AtomicU32,
    /// This broker's share of the node's slots in a fleet (`crate::fleet::capacity`);
    /// `u32::MAX` for a broker on its own.
    fleet_share: AtomicU32,
    /// First-token deadlines missed in a row (reset by an answer that made it).
    first_token_misses: AtomicU32,
    loaded_count: AtomicU8,
    /// `loaded` as routing reads it (`loaded_sig` of the first `LOADED_SIGS`), written before
    /// `loaded_count`, which is `u8::MAX` when the list is longer.
    loaded_sigs: [AtomicU64; LOADED_SIGS],
}

/// A node's routing state as of one load: requests running (bits 0..32), slots this broker
/// may fill (32..56), and the marks that take a decision off its fast path (56..64: the
/// operator's setting, health, a slow-start ramp, a breaker not closed, a 429's hold-off,
/// first-token deadlines missed).
/// In one word so a pass over many nodes reads one atomic per node and settles the common
/// case ("nothing unusual, a free slot") with two comparisons; and so taking a slot checks
/// the count against the slots atomically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Glance(u64);

impl Glance {
    const RUNNING: u64 = (1 << 32) - 1;
    const SLOTS_SHIFT: u32 = 32;
    const SLOTS_MAX: u64 = (1 << 24) - 1;
    const ADMIN_SHIFT: u32 = 56;
    const HEALTH_SHIFT: u32 = 58;
    const UNHEALTHY: u64 = 2 << Self::HEALTH_SHIFT; // `Health::Unhealthy.as_u8()`
    const RAMPING: u64 = 1 << 60;
    const BREAKER_OPEN: u64 = 1 << 61;
    const HELD: u64 = 1 << 62;
    const SLOW: u64 = 1 << 63;
    /// Any of these, and the decision looks closer: not active, down, ramping, a breaker not
    /// closed, a hold-off that may be running, a slow mark that may hold.
    const UNUSUAL: u64 =
        (3 << Self::ADMIN_SHIFT) | Self::UNHEALTHY | Self::RAMPING | Self::BREAKER_OPEN | Self::HELD | Self::SLOW;

    fn new(slots: u64, admin: Admin) -> Self {
        Self(0).with_slots(slots).with_admin(admin)
    }

    #[inline(always)]
    pub fn in_flight(self) -> usize {
        (self.0 & Self::RUNNING) as usize
    }

    #[inline(always)]
    pub fn slots(self) -> usize {
        ((self.0 >> Self::SLOTS_SHIFT) & Self::SLOTS_MAX) as usize
    }

    #[inline(always)]
    pub fn has_room(self) -> bool {
        self.in_flight() < self.slots()
    }

    /// Nothing that needs a closer look: active, not down, no ramp, breaker closed, no hold-off.
    #[inline(always)]
    pub fn is_usual(self) -> bool {
        self.0 & Self::UNUSUAL == 0
    }

    pub fn admin(self) -> Admin {
        Admin::from_u8(((self.0 >> Self::ADMIN_SHIFT) & 3) as u8)
    }

    pub fn health(self) -> Health {
        Health::from_u8(((self.0 >> Self::HEALTH_SHIFT) & 3) as u8)
    }

    /// Takes new requests at all: active and not known to be down.
    #[inline(always)]
    pub fn is_available(self) -> bool {
        self.0 & ((3 << Self::ADMIN_SHIFT) | Self::UNHEALTHY) == 0
    }

    /// A slow-start ramp may be running.
    #[inline(always)]
    pub fn ramping(self) -> bool {
        self.0 & Self::RAMPING != 0
    }

    #[inline(always)]
    pub fn breaker_closed(self) -> bool {
        self.0 & Self::BREAKER_OPEN == 0
    }

    /// A hold-off may be running.
    #[inline(always)]
    pub fn held(self) -> bool {
        self.0 & Self::HELD != 0
    }

    /// `SLOW_AFTER_MISSES` first-token deadlines may have been missed in a row.
    #[inline(always)]
    pub fn maybe_slow(self) -> bool {
        self.0 & Self::SLOW != 0
    }

    fn with_slots(self, slots: u64) -> Self {
        let slots = slots.min(Self::SLOTS_MAX) << Self::SLOTS_SHIFT;
        Self(self.0 & !(Self::SLOTS_MAX << Self::SLOTS_SHIFT) | slots)
    }

    fn with_admin(self, admin: Admin) -> Self {
        Self(self.0 & !(3 << Self::ADMIN_SHIFT) | u64::from(admin.as_u8()) << Self::ADMIN_SHIFT)
    }

    fn with_health(self, health: Health) -> Self {
        Self(self.0 & !(3 << Self::HEALTH_SHIFT) | u64::from(health.as_u8()) << Self::HEALTH_SHIFT)
    }
}

// The claim above, checked: the first loaded model's signature ends within the first line.
const _: () = assert!(std::mem::offset_of!(Hot, loaded_sigs) + 8 <= 64);

/// Node ids: a process-wide counter.
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// The instant `least-latency`'s order keys count from (any fixed instant will do; offsets
/// before it are negative, never clamped).
fn latency_epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A change of the state a person sees for a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateChange {
    pub node: String,
    pub from: NodeState,
    pub to: NodeState,
    pub reason: String,
    /// Unix milliseconds.
    pub at: i64,
}

/// Who hears about state changes: set once by whoever listens (telemetry), called
/// synchronously and never blocking, so the registry needs to know nothing about listeners.
pub type StateSink = Arc<dyn Fn(StateChange) + Send + Sync>;

type Events = Arc<std::sync::OnceLock<StateSink>>;

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.config.name).field("state", &self.state()).finish()
    }
}

impl Node {
    pub fn new(config: NodeConfig, tuning: NodeTuning, wake: Arc<Wake>) -> Result<Self, url::ParseError> {
        Self::with_events(config, tuning, wake, Events::default(), Arc::default())
    }

    fn with_events(
        config: NodeConfig,
        tuning: NodeTuning,
        wake: Arc<Wake>,
        events: Events,
        models_gen: Arc<AtomicU64>,
    ) -> Result<Self, url::ParseError> {
        let base_url = url::Url::parse(&config.url)?;
        let admin_reason = if config.enabled { "enabled in the config" } else { "disabled in the config" };
        Ok(Self {
            hot: Hot {
                glance: AtomicU64::new(
                    Glance::new(
                        u64::from(config.max_concurrency.max(1)),
                        if config.enabled { Admin::Active } else { Admin::Disabled },
                    )
                    .0,
                ),
                weight: AtomicU32::new(config.weight.max(1)),
                max_concurrency: AtomicU32::new(config.max_concurrency.max(1)),
                fleet_share: AtomicU32::new(u32::MAX),
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                ttfb_key: AtomicU64::new(f64::NEG_INFINITY.to_bits()),
                ttfb_decay_s: tuning.latency_decay.as_secs_f64().max(1e-9),
                first_token_misses: AtomicU32::new(0),
                loaded_sigs: Default::default(),
                loaded_count: AtomicU8::new(0),
            },
            config,
            base_url,
            probe_successes: AtomicU32::new(0),
            probe_failures: AtomicU32::new(0),
            returned_at: Mutex::new(None),
            slow_start_ms: std::sync::atomic::AtomicU64::new(tuning.slow_start.as_millis() as u64),
            breaker: Mutex::new(Breaker::new(tuning.breaker)),
            ttfb: Mutex::new(PeakEwma::new(tuning.latency_decay)),
            ttfb_at_ms: AtomicI64::new(0),
            health_since: Mutex::new(Since::now("not probed yet")),
            admin_since: Mutex::new(Since::now(admin_reason)),
            held_until: Mutex::new(None),
            last_miss: Mutex::new(None),
            models: ArcSwap::from_pointee(None),
            loaded: ArcSwap::from_pointee(Vec::new()),
            loaded_at_ms: AtomicI64::new(0),
            context: ArcSwap::from_pointee(HashMap::new()),
            served: AtomicUsize::new(0),
            speed: Mutex::new(Book::default()),
            cards: Cards::default(),
            timetable: Mutex::new(Vec::new()),
            next_slot: AtomicU64::new(1),
            wake,
            events,
            models_gen,
        })
    }

    /// Unique in the process: the index per-node routing state is kept under.
    #[inline]
    pub fn id(&self) -> usize {
        self.hot.id
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    #[inline]
    pub fn health(&self) -> Health {
        self.glance().health()
    }

    /// The node's routing state in one load: see `Glance`.
    #[inline(always)]
    pub fn glance(&self) -> Glance {
        Glance(self.hot.glance.load(Ordering::Acquire))
    }

    /// Change the glance word (other than its count, which `try_dispatch` and `InFlight` keep);
    /// the glance before the change.
    fn reglance(&self, f: impl Fn(Glance) -> Glance) -> Glance {
        let change = |w| Some(f(Glance(w)).0);
        Glance(self.hot.glance.fetch_update(Ordering::AcqRel, Ordering::Acquire, change).unwrap_or_else(|w| w))
    }

    /// Set or clear one of the glance's marks, writing only when it changes.
    fn mark(&self, mark: u64, on: bool) {
        if (self.glance().0 & mark != 0) != on {
            if on {
                self.hot.glance.fetch_or(mark, Ordering::AcqRel);
            } else {
                self.hot.glance.fetch_and(!mark, Ordering::AcqRel);
            }
        }
    }

    #[inline]
    pub fn admin(&self) -> Admin {
        self.glance().admin()
    }

    pub fn set_admin(&self, to: Admin) {
        let before = self.state();
        let from = self.reglance(|g| g.with_admin(to)).admin();
        if from != to {
            let reason = match (from, to) {
                (_, Admin::Disabled) => "disabled by an operator",
                (_, Admin::Draining) => "drained by an operator: running requests finish, no new ones start",
                (Admin::Draining, Admin::Active) => "undrained by an operator",
                (_, Admin::Active) => "enabled by an operator",
            };
            *lock(&self.admin_since) = Since::now(reason);
            tracing::info!(node = %self.name(), from = ?from, to = ?to, "node admin state changed");
            self.publish(before);
            self.wake.notify();
        }
    }

    /// Why the node is in the state a person sees, and since when: the operator's setting while
    /// it is disabled or draining; a down node's health (down since it went down, whatever the
    /// operator did meanwhile); otherwise whichever changed last.
    pub fn since(&self) -> Since {
        let health = lock(&self.health_since).clone();
        if self.admin() != Admin::Active {
            return lock(&self.admin_since).clone();
        }
        let admin = lock(&self.admin_since).clone();
        if self.health() == Health::Unhealthy || admin.at_ms <= health.at_ms {
            health
        } else {
            admin
        }
    }

    /// Tell listeners about a change of the state a person sees, with its reason.
    fn publish(&self, before: NodeState) {
        let after = self.state();
        if before != after {
            if let Some(sink) = self.events.get() {
                // `at` is when this change happened (a re-enabled down node is told now, with the
                // reason it has been down for), so the store's timeline stays in order.
                sink(StateChange {
                    node: self.name().to_string(),
                    from: before,
                    to: after,
                    reason: self.since().reason,
                    at: crate::store::now_ms(),
                });
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.admin() != Admin::Disabled
    }

    pub fn set_enabled(&self, on: bool) {
        self.set_admin(if on { Admin::Active } else { Admin::Disabled });
    }

    #[inline]
    pub fn weight(&self) -> u32 {
        self.hot.weight.load(Ordering::Acquire)
    }

    pub fn set_weight(&self, w: u32) {
        self.hot.weight.store(w.max(1), Ordering::Release);
    }

    #[inline]
    pub fn max_concurrency(&self) -> usize {
        self.hot.max_concurrency.load(Ordering::Acquire) as usize
    }

    pub fn set_max_concurrency(&self, n: u32) {
        self.hot.max_concurrency.store(n.max(1), Ordering::Release);
        self.reslot();
        self.wake.notify();
    }

    /// This broker's share of the node's slots in a fleet; `None` on its own.
    pub fn fleet_share(&self) -> Option<u32> {
        Some(self.hot.fleet_share.load(Ordering::Acquire)).filter(|s| *s != u32::MAX)
    }

    /// Set this broker's share of the node's slots (`u32::MAX`: no fleet). 0 keeps new
    /// requests in the queue; a share that rises wakes it.
    pub fn set_fleet_share(&self, n: u32) {
        let before = self.hot.fleet_share.swap(n, Ordering::AcqRel);
        self.reslot();
        if before < n {
            self.wake.notify();
        }
    }

    /// Write the glance's slots from both of their sources. Each setter stores its source
    /// first, so the last word written was computed after both stores it follows.
    fn reslot(&self) {
        self.reglance(|g| {
            let share = self.hot.fleet_share.load(Ordering::Acquire);
            g.with_slots(u64::from(self.hot.max_concurrency.load(Ordering::Acquire).min(share)))
        });
    }

    /// The slots this broker may fill: `max_concurrency`, within its fleet share.
    #[inline(always)]
    pub fn slots(&self) -> usize {
        self.glance().slots()
    }

    /// The state a person sees.
    pub fn state(&self) -> NodeState {
        match self.admin() {
            Admin::Disabled => return NodeState::Disabled,
            Admin::Draining => return NodeState::Draining,
            Admin::Active => {}
        }
        match self.health() {
            Health::Unknown => NodeState::Unknown,
            Health::Unhealthy => NodeState::Unhealthy,
            Health::Healthy if self.slow_start_factor(Instant::now()) < 1.0 => NodeState::Recovering,
            Health::Healthy => NodeState::Healthy,
        }
    }

    /// Share of its normal traffic a recovering node may take: ramps linearly from 10% to
    /// 100% over `slow_start` after it comes back (Envoy's slow start mode).
    #[inline(always)]
    pub fn slow_start_factor(&self, now: Instant) -> f64 {
        if !self.glance().ramping() {
            return 1.0;
        }
        self.ramp(now)
    }

    /// `slow_start_factor` while a ramp may be running (under the lock, off the fast path).
    #[cold]
    #[inline(never)]
    fn ramp(&self, now: Instant) -> f64 {
        let returned = lock(&self.returned_at);
        let slow_start = Duration::from_millis(self.slow_start_ms.load(Ordering::Acquire));
        let Some(at) = *returned else { return 1.0 };
        if Instant::now().saturating_duration_since(at) >= slow_start {
            // Over for good (not just as of a `now` in the past): the lock-free path again.
            // Under the lock, so a comeback marked meanwhile is not cleared.
            self.mark(Glance::RAMPING, false);
        }
        if slow_start.is_zero() {
            return 1.0;
        }
        let ramp = now.saturating_duration_since(at).as_secs_f64() / slow_start.as_secs_f64();
        ramp.clamp(0.1, 1.0)
    }

    /// Take a new breaker policy and slow-start length (a reload): the breaker keeps its
    /// state and counts, judged by the new threshold from the next outcome on.
    pub fn set_tuning(&self, tuning: NodeTuning) {
        self.with_breaker(|b| b.set_policy(tuning.breaker));
        self.slow_start_ms.store(tuning.slow_start.as_millis() as u64, Ordering::Release);
    }

    /// Keep the node out of routing for `wait` (it answered 429); it is busy, not down.
    pub fn hold_off(&self, wait: Duration) {
        let mut until = lock(&self.held_until);
        *until = Some(Instant::now() + wait);
        self.mark(Glance::HELD, true);
    }

    /// Whether the node asked, with a 429, not to be sent more until after `now`.
    #[inline(always)]
    pub fn held_off(&self, now: Instant) -> bool {
        self.glance().held() && self.held_now(now)
    }

    /// `held_off` while a hold-off may be running (under the lock, off the fast path).
    #[cold]
    #[inline(never)]
    pub fn held_now(&self, now: Instant) -> bool {
        let until = lock(&self.held_until);
        let held = until.is_some_and(|until| now < until);
        if until.is_some_and(|until| Instant::now() >= until) {
            // Over for good (not just as of a `now` in the past): the lock-free path again.
            self.mark(Glance::HELD, false);
        }
        held
    }

    /// What is left of the node's 429 hold-off at `now`, if any.
    pub fn held_off_left(&self, now: Instant) -> Option<Duration> {
        lock(&self.held_until).and_then(|until| until.checked_duration_since(now)).filter(|d| !d.is_zero())
    }

    #[inline(always)]
    pub fn in_flight(&self) -> usize {
        self.glance().in_flight()
    }

    /// Requests this node answered since start, for status and tests.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }

    #[inline(always)]
    pub fn has_capacity(&self) -> bool {
        self.glance().has_room()
    }

    /// Takes new requests at all: active and not known to be down.
    #[inline(always)]
    pub fn is_available(&self) -> bool {
        self.glance().is_available()
    }

    pub fn breaker_state(&self) -> BreakerState {
        self.with_breaker(|b| b.state(Instant::now()))
    }

    /// Whether the breaker would let a request through now.
    #[inline(always)]
    pub fn breaker_allows(&self, now: Instant) -> bool {
        self.glance().breaker_closed() || self.breaker_would_allow(now)
    }

    /// `breaker_allows` for a breaker that is not closed (under its lock, off the fast path).
    #[cold]
    #[inline(never)]
    pub fn breaker_would_allow(&self, now: Instant) -> bool {
        self.with_breaker(|b| b.would_allow(now))
    }

    /// Work on the breaker under its lock, then mirror whether it is closed.
    fn with_breaker<R>(&self, f: impl FnOnce(&mut Breaker) -> R) -> R {
        let mut b = lock(&self.breaker);
        let r = f(&mut b);
        self.mark(Glance::BREAKER_OPEN, !b.is_closed());
        r
    }

    /// The routing estimate: decays towards zero while no traffic flows, so a node that was
    /// slow once is tried again. For routing only; people are shown `ttfb_seen`.
    pub fn ttfb_estimate(&self, now: Instant) -> Option<Duration> {
        lock(&self.ttfb).estimate(now)
    }

    /// The time-to-first-byte estimate as of the last sample, and that sample's unix ms: the
    /// number to show, with its age (it does not fade while nothing is sent).
    pub fn ttfb_seen(&self) -> Option<(Duration, i64)> {
        let (d, _) = lock(&self.ttfb).last()?;
        Some((d, self.ttfb_at_ms.load(Ordering::Acquire)))
    }

    /// `least-latency`'s order key: the log of the decayed estimate plus the decay's share of
    /// `now`, which is the same for every candidate. The estimate at `now` is
    /// `est * exp(-(now - at) / decay)`, so its log is `key - now / decay`: comparing keys
    /// compares estimates without an `exp` (or a lock) per node. Without a sample: -inf (a
    /// node never measured is explored first). `None` when `other` decays differently.
    pub fn latency_key(&self, other_decay_s: f64) -> Option<f64> {
        (self.hot.ttfb_decay_s == other_decay_s).then(|| f64::from_bits(self.hot.ttfb_key.load(Ordering::Acquire)))
    }

    /// The decay `latency_key` is relative to.
    pub fn latency_decay_s(&self) -> f64 {
        self.hot.ttfb_decay_s
    }

    pub fn observe_ttfb(&self, sample: Duration) {
        let now = Instant::now();
        let mut ewma = lock(&self.ttfb);
        ewma.observe(sample, now);
        if let Some((est, at)) = ewma.last() {
            let epoch = latency_epoch();
            let offset = match at.checked_duration_since(epoch) {
                Some(d) => d.as_secs_f64(),
                None => -epoch.saturating_duration_since(at).as_secs_f64(),
            };
            let key = (est.as_nanos() as f64).max(1e-3).ln() + offset / self.hot.ttfb_decay_s;
            self.hot.ttfb_key.store(key.to_bits(), Ordering::Release);
        }
        drop(ewma);
        self.ttfb_at_ms.store(crate::store::now_ms(), Ordering::Release);
    }

    /// `Some(true/false)` once the node's model list is known; `None` before that.
    pub fn serves(&self, model: &str) -> Option<bool> {
        self.serves_key(&model_key(model))
    }

    /// `serves` for a name already passed through `model_key` (once per request, not per node).
    pub fn serves_key(&self, key: &str) -> Option<bool> {
        self.models.load().as_ref().as_ref().map(|set| set.contains(key))
    }

    pub fn models(&self) -> Option<BTreeSet<String>> {
        self.models.load().as_ref().clone()
    }

    pub fn set_models(&self, names: impl IntoIterator<Item = String>) {
        let set: BTreeSet<String> = names.into_iter().map(|n| normalize_model(&n)).collect();
        if self.models.load().as_ref().as_ref() != Some(&set) {
            self.models.store(Arc::new(Some(set)));
            self.models_gen.fetch_add(1, Ordering::AcqRel);
        }
        self.wake.notify();
    }

    pub fn loaded(&self) -> Arc<Vec<LoadedModel>> {
        self.loaded.load_full()
    }

    /// Unix ms of the `/api/ps` answer `loaded` comes from; `None` before the first.
    pub fn loaded_as_of(&self) -> Option<i64> {
        Some(self.loaded_at_ms.load(Ordering::Acquire)).filter(|&ms| ms > 0)
    }

    /// Has `model` loaded entirely in VRAM (model affinity's test).
    pub fn has_hot(&self, model: &str) -> bool {
        self.has_hot_key(&model_key(model))
    }

    pub fn has_hot_key(&self, key: &str) -> bool {
        self.loaded_facts(ModelRef::new(key)).0
    }

    /// What occupancy needs to know of `model` here: (it is loaded entirely in VRAM, some
    /// other model is loaded). From atomics, without the list, for up to `LOADED_SIGS` models.
    #[inline(always)]
    pub fn loaded_facts(&self, model: ModelRef<'_>) -> (bool, bool) {
        let count = self.hot.loaded_count.load(Ordering::Acquire);
        if usize::from(count) > LOADED_SIGS {
            return self.loaded_facts_from_list(model.key);
        }
        let (mut hot, mut other) = (false, false);
        for sig in &self.hot.loaded_sigs[..usize::from(count)] {
            // 0: this model, partly in VRAM; 1: this model, entirely; more: another model.
            let diff = sig.load(Ordering::Relaxed) ^ model.hash;
            hot |= diff == 1;
            other |= diff > 1;
        }
        (hot, other)
    }

    /// `loaded_facts` for a node with more models loaded than the atomics hold.
    ///
    /// Given the key alone (two registers), not the `ModelRef`: a struct that size goes by
    /// reference, and a pass over 100 nodes then wrote it to the stack once a node.
    #[cold]
    #[inline(never)]
    fn loaded_facts_from_list(&self, key: &str) -> (bool, bool) {
        let loaded = self.loaded.load();
        let hot = loaded.iter().any(|l| l.name == key && l.fully_in_vram());
        (hot, loaded.iter().any(|l| l.name != key))
    }

    /// What a finished answer of `model` said about this node's speed.
    pub fn observe_speed(&self, model: &str, timing: &Timing, now: Instant) {
        let key = model_key(model);
        let mut book = lock(&self.speed);
        let estimate = book.observe(&key, timing, now);
        self.cards.publish(ModelRef::new(&key).hash, &estimate);
    }

    /// `speed_of_key(model.key, now)`, from the published cards where they can say, without
    /// the lock (`at` is `crate::speed::stamp(now)`, taken once per decision).
    #[inline]
    pub fn speed_of(&self, model: ModelRef<'_>, now: Instant, at: i64) -> Option<Speed> {
        match self.cards.read(model.hash, at) {
            Card::Speed(s) => Some(s),
            Card::Never => None,
            Card::AskTheBook => self.speed_of_key(model.key, now),
        }
    }

    /// The speed estimate for `model` (by key); `None` when it never answered here.
    pub fn speed_of_key(&self, key: &str, now: Instant) -> Option<Speed> {
        lock(&self.speed).read(key, now)
    }

    /// `Pace::of(speed_of(..))` from the published card, when it can say (`None`: ask
    /// `speed_of`). `at` is `crate::speed::stamp(now)`.
    #[inline]
    pub fn pace_of(&self, model: ModelRef<'_>, at: i64) -> Option<Pace> {
        self.cards.pace(model.hash, at)
    }

    /// Every model's speed estimate, by model key.
    pub fn speeds(&self, now: Instant) -> Vec<(String, Speed)> {
        lock(&self.speed).all(now)
    }

    /// Expected ends of the running requests that have one, earliest first.
    pub fn running_ends(&self) -> Vec<Instant> {
        let mut ends: Vec<Instant> = lock(&self.timetable).iter().map(|(_, end)| *end).collect();
        ends.sort();
        ends
    }

    /// The node said it lacks `model`: stop routing it there until a probe says otherwise.
    pub fn forget_model(&self, model: &str) {
        let m = normalize_model(model);
        let mut set = self.models().unwrap_or_default();
        set.remove(&m);
        self.models.store(Arc::new(Some(set)));
        self.models_gen.fetch_add(1, Ordering::AcqRel);
    }

    pub fn set_loaded(&self, mut loaded: Vec<LoadedModel>) {
        for l in &mut loaded {
            l.name = normalize_model(&l.name);
        }
        let learned: Vec<(String, u64)> =
            loaded.iter().filter_map(|l| l.context_length.map(|c| (normalize_model(&l.name), c))).collect();
        for (slot, l) in self.hot.loaded_sigs.iter().zip(&loaded) {
            slot.store(loaded_sig(l), Ordering::Relaxed);
        }
        let count = if loaded.len() > LOADED_SIGS { u8::MAX } else { loaded.len() as u8 };
        self.hot.loaded_count.store(count, Ordering::Release);
        self.loaded.store(Arc::new(loaded));
        self.loaded_at_ms.store(crate::store::now_ms(), Ordering::Release);
        for (m, c) in learned {
            self.learn_context(&m, c);
        }
    }

    pub fn learn_context(&self, model: &str, length: u64) {
        let mut next = HashMap::clone(&self.context.load());
        next.insert(normalize_model(model), length);
        self.context.store(Arc::new(next));
    }

    pub fn context_length(&self, model: &str) -> Option<u64> {
        self.context_length_key(&model_key(model))
    }

    /// `context_length` for a name already passed through `model_key` (once per request, not
    /// per node: it was an allocation per node per request).
    pub fn context_length_key(&self, key: &str) -> Option<u64> {
        let context = self.context.load();
        if context.is_empty() {
            return None;
        }
        context.get(key).copied()
    }

    /// Take a slot if the node has one under `max_concurrency` (and this broker's fleet share)
    /// and its breaker lets the request through (atomically: two requests can never both take
    /// the last slot). `force` skips the breaker: the last node standing is never ejected.
    pub fn try_dispatch(self: &Arc<Self>, force: bool) -> Option<InFlight> {
        self.try_dispatch_at(force, Instant::now())
    }

    /// `try_dispatch` as of `now`, for a caller that has just read the clock.
    pub fn try_dispatch_at(self: &Arc<Self>, force: bool, now: Instant) -> Option<InFlight> {
        let (permit, forced) =
            self.with_breaker(|b| b.acquire(now).map(|p| (p, false)).or_else(|| force.then(|| (b.force(), true))))?;
        let take = |w| Glance(w).has_room().then_some(w + 1);
        match self.hot.glance.fetch_update(Ordering::AcqRel, Ordering::Acquire, take) {
            Ok(_) => Some(InFlight {
                node: Arc::clone(self),
                permit,
                judged: false,
                forced,
                model: None,
                slot: None,
                estimate: None,
            }),
            Err(_) => {
                // Give an unused trial back.
                if permit == Permit::Trial {
                    self.with_breaker(|b| b.record(permit, Outcome::ClientGone, now));
                }
                None
            }
        }
    }

    fn set_health(&self, to: Health, reason: &str) {
        let before = self.state();
        let from = self.reglance(|g| g.with_health(to)).health();
        if from != to {
            *lock(&self.health_since) = Since::now(reason);
            if from == Health::Unhealthy && to == Health::Healthy {
                let mut returned = lock(&self.returned_at);
                *returned = Some(Instant::now());
                self.mark(Glance::RAMPING, true);
            }
            tracing::info!(node = %self.name(), from = from.name(), to = to.name(), reason, "node health changed");
            self.publish(before);
            self.wake.notify();
        } else if to == Health::Unhealthy {
            // Still down: keep since when, tell the latest cause.
            lock(&self.health_since).reason = reason.to_string();
        }
    }

    /// Feed one liveness probe result through the hysteresis, without a reason.
    pub fn record_probe(&self, ok: bool, failures_to_down: u32, successes_to_up: u32) {
        let failure = format!("liveness probe failed at {}", crate::config::redacted_url(&self.config.url));
        let result = if ok { Ok(()) } else { Err(failure.as_str()) };
        self.record_probe_result(result, failures_to_down, successes_to_up);
    }

    /// Feed one probe result through the hysteresis; a failure carries its concrete reason
    /// ("connection refused at http://..."), which becomes the down state's reason.
    pub fn record_probe_result(&self, result: Result<(), &str>, failures_to_down: u32, successes_to_up: u32) {
        match result {
            Ok(()) => {
                self.probe_failures.store(0, Ordering::Release);
                let n = self.probe_successes.fetch_add(1, Ordering::AcqRel) + 1;
                match self.health() {
                    Health::Unknown => self.set_health(Health::Healthy, "first probe answered"),
                    Health::Unhealthy if n >= successes_to_up => {
                        self.set_health(Health::Healthy, "probes answered again")
                    }
                    _ => {}
                }
            }
            Err(reason) => {
                self.probe_successes.store(0, Ordering::Release);
                let n = self.probe_failures.fetch_add(1, Ordering::AcqRel) + 1;
                if self.health() == Health::Unhealthy || n >= failures_to_down {
                    let why = if n > 1 { format!("{reason} ({n} probes in a row)") } else { reason.to_string() };
                    self.set_health(Health::Unhealthy, &why);
                }
            }
        }
    }

    /// Whether the node keeps missing first-token deadlines: `SLOW_AFTER_MISSES` in a row, the
    /// last within `SLOW_FOR`. A slow node is not broken (its breaker and health are untouched):
    /// routing tries it after every other candidate until it answers in time or the mark lapses.
    #[inline(always)]
    pub fn is_slow(&self, now: Instant) -> bool {
        self.glance().maybe_slow()
            && self.hot.first_token_misses.load(Ordering::Acquire) >= SLOW_AFTER_MISSES
            && self.slow_mark_holds(now)
    }

    /// Whether the last miss is recent enough for the slow mark to hold (off the fast path).
    #[cold]
    #[inline(never)]
    fn slow_mark_holds(&self, now: Instant) -> bool {
        lock(&self.last_miss).is_some_and(|at| now.saturating_duration_since(at) < SLOW_FOR)
    }

    /// First-token deadlines missed in a row.
    pub fn first_token_misses(&self) -> u32 {
        self.hot.first_token_misses.load(Ordering::Acquire)
    }

    fn count_first_token(&self, outcome: Outcome) {
        match outcome {
            Outcome::Slow => {
                *lock(&self.last_miss) = Some(Instant::now());
                let n = self.hot.first_token_misses.fetch_add(1, Ordering::SeqCst) + 1;
                if n >= SLOW_AFTER_MISSES {
                    self.mark(Glance::SLOW, true);
                }
                if n == SLOW_AFTER_MISSES {
                    tracing::warn!(node = %self.name(), misses = n, "node marked slow: it keeps missing first-token deadlines; tried after the others");
                }
            }
            // Read before the swap, so the common case (no misses) writes nothing.
            Outcome::Success
                if self.hot.first_token_misses.load(Ordering::Acquire) > 0
                    && self.hot.first_token_misses.swap(0, Ordering::SeqCst) >= SLOW_AFTER_MISSES =>
            {
                self.mark(Glance::SLOW, false);
                // Misses counted since the swap may have set the mark just before it was
                // cleared: the count decides.
                if self.hot.first_token_misses.load(Ordering::SeqCst) >= SLOW_AFTER_MISSES {
                    self.mark(Glance::SLOW, true);
                }
                tracing::info!(node = %self.name(), "node no longer slow: it answered in time");
            }
            _ => {}
        }
    }

    /// Feed the judged outcome of a real exchange (passive health + breaker).
    fn record_outcome(&self, permit: Permit, outcome: Outcome) {
        if outcome == Outcome::Success {
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        self.count_first_token(outcome);
        if outcome == Outcome::ConnectFailed && self.health() != Health::Unhealthy {
            // A refused connection is certain: do not wait for the next probe.
            self.probe_successes.store(0, Ordering::Release);
            // The request path knows only that the connect failed; the next probe says exactly why.
            let url = crate::config::redacted_url(&self.config.url);
            self.set_health(
                Health::Unhealthy,
                &format!("a request could not connect to {url} (refused or unreachable)"),
            );
        }
        if let Some(state) = self.with_breaker(|b| b.record(permit, outcome, Instant::now())) {
            tracing::info!(node = %self.name(), breaker = state.name(), ?outcome, "breaker changed");
            self.wake.notify();
        }
    }
}

/// First-token deadlines missed in a row that mark a node slow.
pub const SLOW_AFTER_MISSES: u32 = 3;
/// How long a slow mark lasts after the last miss.
pub const SLOW_FOR: Duration = Duration::from_secs(60);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One request's claim on a node's capacity (and, when half-open, its breaker trial).
#[derive(Debug)]
pub struct InFlight {
    node: Arc<Node>,
    permit: Permit,
    judged: bool,
    forced: bool,
    /// The model asked for, for the speed model.
    model: Option<String>,
    /// This request's entry in the node's timetable.
    slot: Option<u64>,
    /// How long the request was expected to take from its arrival, when a policy planned it.
    estimate: Option<Duration>,
}

impl InFlight {
    /// Say which model runs in this slot and, when known, when it should end (entered into the
    /// node's timetable until the guard drops).
    pub fn plan(&mut self, model: Option<&str>, end: Option<Instant>) {
        self.model = model.map(str::to_string);
        if let Some(end) = end {
            let id = self.node.next_slot.fetch_add(1, Ordering::Relaxed);
            let mut table = lock(&self.node.timetable);
            if let Some(old) = self.slot.take() {
                table.retain(|(i, _)| *i != old);
            }
            table.push((id, end));
            self.slot = Some(id);
        }
    }

    /// Remember the planner's estimate for the response header.
    pub fn set_estimate(&mut self, estimate: Duration) {
        self.estimate = Some(estimate);
    }

    pub fn estimate(&self) -> Option<Duration> {
        self.estimate
    }

    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Feed the node's speed model with a finished answer's timing.
    pub fn observe_speed(&self, timing: &Timing, now: Instant) {
        if let Some(m) = self.model.as_deref() {
            self.node.observe_speed(m, timing, now);
        }
    }

    /// Whether this slot was given past an open breaker (the last node standing, with no
    /// other way to answer): such a node gets one attempt per request, not a retry loop.
    pub fn forced(&self) -> bool {
        self.forced
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Judge the exchange once; the slot is freed when the guard drops.
    pub fn judge(&mut self, outcome: Outcome) {
        if !self.judged {
            self.judged = true;
            self.node.record_outcome(self.permit, outcome);
        }
    }
}

/// What wakes the admission queue's dispatcher (`crate::admit`): node events that may let a
/// waiting request go (health, breaker, admin state, capacity, models), and freed slots. A slot
/// freed while nobody waits wakes nothing: with the queue empty, as under a steady load it
/// mostly is, that wake was a task scheduled and a queue walk per request for nothing.
#[derive(Debug, Default)]
pub struct Wake {
    notify: Notify,
    /// Requests in the admission queue.
    waiting: AtomicUsize,
}

impl Wake {
    /// Something changed that may place a waiting request.
    pub fn notify(&self) {
        self.notify.notify_one();
    }

    /// The dispatcher waits here.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// A request joined the queue; it tries to place itself once more after this, so a slot
    /// freed just before (unseen by `slot_freed`) is not missed.
    pub fn queued(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `slot_freed`: either that one sees this request waiting, or
        // the request's own placement after this sees the slot free.
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// A request left the queue (placed, timed out, gone).
    pub fn unqueued(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// A slot was given back (its `in_flight` already decremented).
    fn slot_freed(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_one();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // An exchange dropped without a verdict ended because the client left.
        self.judge(Outcome::ClientGone);
        if let Some(id) = self.slot.take() {
            lock(&self.node.timetable).retain(|(i, _)| *i != id);
        }
        // The count is the word's low bits, never below the guards that hold it.
        self.node.hot.glance.fetch_sub(1, Ordering::AcqRel);
        self.node.wake.slot_freed();
    }
}

/// All configured nodes, in config order; nodes can be added and removed at runtime (a removed
/// node's in-flight requests keep their `Arc` and finish).
pub struct Registry {
    nodes: ArcSwap<Vec<Arc<Node>>>,
    wake: Arc<Wake>,
    tuning: Mutex<NodeTuning>,
    events: Events,
    /// Bumped by every node whose model list changes, and by adding or removing a node.
    models_gen: Arc<AtomicU64>,
    /// The nodes that may serve each model, as of a `models_gen`: rebuilt on the first routing
    /// decision after a change, so a decision looks at the nodes that list its model only.
    by_model: ArcSwap<ModelIndex>,
    rebuilding: Mutex<()>,
}

/// For each model key, the nodes that list it or whose list is not known yet (config order).
#[derive(Debug, Default)]
pub struct ModelIndex {
    generation: u64,
    nodes: Arc<Vec<Arc<Node>>>,
    serving: HashMap<String, Arc<Vec<Arc<Node>>>, foldhash::fast::RandomState>,
    /// Nodes whose list is not known: the answer for a model no node lists.
    unlisted: Arc<Vec<Arc<Node>>>,
}

impl ModelIndex {
    fn build(generation: u64, nodes: Arc<Vec<Arc<Node>>>) -> Self {
        let lists: Vec<_> = nodes.iter().map(|n| n.models.load_full()).collect();
        let mut serving: HashMap<String, Vec<Arc<Node>>, foldhash::fast::RandomState> =
            lists.iter().filter_map(|l| l.as_ref().as_ref()).flatten().map(|m| (m.clone(), Vec::new())).collect();
        let mut unlisted = Vec::new();
        for (n, list) in nodes.iter().zip(&lists) {
            match list.as_ref() {
                Some(list) => {
                    for m in list.iter() {
                        if let Some(v) = serving.get_mut(m) {
                            v.push(Arc::clone(n));
                        }
                    }
                }
                // A node without a list may have any model: it is in every entry, in config order.
                None => {
                    serving.values_mut().for_each(|v| v.push(Arc::clone(n)));
                    unlisted.push(Arc::clone(n));
                }
            }
        }
        let serving = serving.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        Self { generation, nodes, serving, unlisted: Arc::new(unlisted) }
    }

    /// The nodes that may serve the model `key` (every node for `None`).
    pub fn serving(&self, key: Option<&str>) -> &Arc<Vec<Arc<Node>>> {
        match key {
            None => &self.nodes,
            Some(k) => self.serving.get(k).unwrap_or(&self.unlisted),
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("nodes", &self.nodes.load()).finish()
    }
}

impl Registry {
    pub fn new(configs: &[NodeConfig], tuning: NodeTuning) -> Result<Self, url::ParseError> {
        let wake = Arc::new(Wake::default());
        let events = Events::default();
        let models_gen = Arc::new(AtomicU64::new(1));
        let nodes = configs
            .iter()
            .map(|c| {
                Node::with_events(c.clone(), tuning, Arc::clone(&wake), Arc::clone(&events), Arc::clone(&models_gen))
                    .map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            nodes: ArcSwap::from_pointee(nodes),
            wake,
            tuning: Mutex::new(tuning),
            events,
            models_gen,
            by_model: ArcSwap::from_pointee(ModelIndex::default()),
            rebuilding: Mutex::new(()),
        })
    }

    /// A snapshot of the nodes.
    pub fn all(&self) -> Arc<Vec<Arc<Node>>> {
        self.nodes.load_full()
    }

    /// The per-model index as of now: one atomic load when nothing changed since the last
    /// decision, a rebuild (O(nodes x models), by one caller at a time) when something did.
    pub fn by_model(&self) -> Arc<ModelIndex> {
        let generation = self.models_gen.load(Ordering::Acquire);
        let index = self.by_model.load_full();
        if index.generation == generation {
            return index;
        }
        let _one = lock(&self.rebuilding);
        let index = self.by_model.load_full();
        if index.generation == generation {
            return index;
        }
        // Read the generation before the lists: a change during the build bumps it again.
        let fresh = Arc::new(ModelIndex::build(generation, self.nodes.load_full()));
        self.by_model.store(Arc::clone(&fresh));
        fresh
    }

    pub fn get(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.load().iter().find(|n| n.name() == name).cloned()
    }

    /// Add a node; the caller has validated the config (unique name, URL).
    pub fn add(&self, config: NodeConfig) -> Result<Arc<Node>, url::ParseError> {
        let tuning = *lock(&self.tuning);
        let node = Arc::new(Node::with_events(
            config,
            tuning,
            Arc::clone(&self.wake),
            Arc::clone(&self.events),
            Arc::clone(&self.models_gen),
        )?);
        let mut next = Vec::clone(&self.nodes.load());
        next.push(Arc::clone(&node));
        self.nodes.store(Arc::new(next));
        self.models_gen.fetch_add(1, Ordering::AcqRel);
        self.wake.notify();
        Ok(node)
    }

    /// Remove a node by name: it takes no new requests; in-flight ones finish.
    pub fn remove(&self, name: &str) -> Option<Arc<Node>> {
        let current = self.nodes.load();
        let gone = current.iter().find(|n| n.name() == name).cloned()?;
        let next: Vec<Arc<Node>> = current.iter().filter(|n| n.name() != name).cloned().collect();
        self.nodes.store(Arc::new(next));
        self.models_gen.fetch_add(1, Ordering::AcqRel);
        Some(gone)
    }

    /// Tell `sink` about every node's state changes from now on (one listener per registry).
    pub fn on_state_change(&self, sink: StateSink) {
        let _ = self.events.set(sink);
    }

    /// The tuning nodes added from now on get (a reload); existing nodes are retuned by the
    /// caller.
    pub fn set_tuning(&self, tuning: NodeTuning) {
        *lock(&self.tuning) = tuning;
    }

    /// Woken whenever a slot frees or a node's state changes.
    pub fn wake(&self) -> &Arc<Wake> {
        &self.wake
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Arc<Node> {
        let cfg = NodeConfig { name: "a".into(), url: "http://127.0.0.1:1".into(), ..NodeConfig::default() };
        Arc::new(Node::new(cfg, NodeTuning::default(), Arc::default()).expect("valid url"))
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration_text(-5), "0 s");
        assert_eq!(duration_text(45_900), "45 s");
        assert_eq!(duration_text(3 * 60_000 + 10_000), "3 min");
        assert_eq!(duration_text(2 * 3_600_000), "2 h");
        assert_eq!(duration_text(2 * 3_600_000 + 5 * 60_000), "2 h 5 min");
        assert_eq!(duration_text(3 * 86_400_000 + 4 * 3_600_000), "3 d 4 h");
    }

    #[test]
    fn a_down_node_says_why_and_keeps_since_when() {
        let n = node();
        n.record_probe_result(Ok(()), 2, 1);
        assert_eq!(n.since().reason, "first probe answered");
        n.record_probe_result(Err("timed out after 300 ms at http://127.0.0.1:1"), 2, 1);
        assert_eq!(n.health(), Health::Healthy, "one failure is below the threshold");
        n.record_probe_result(Err("connection refused at http://127.0.0.1:1"), 2, 1);
        let down = n.since();
        assert_eq!(n.state(), NodeState::Unhealthy);
        assert_eq!(down.reason, "connection refused at http://127.0.0.1:1 (2 probes in a row)");
        n.record_probe_result(Err("HTTP 500 at http://127.0.0.1:1: out of memory"), 2, 1);
        let later = n.since();
        assert_eq!(later.at_ms, down.at_ms, "still down since the first time");
        assert!(later.reason.starts_with("HTTP 500"), "the latest cause is told: {later:?}");
        n.set_enabled(false);
        assert_eq!(n.since().reason, "disabled by an operator");
        n.set_enabled(true);
        assert_eq!(n.since(), later, "re-enabled, it is still down for the same reason, since the same time");
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_node_last_reported_is_kept_with_its_time_and_does_not_fade() {
        let n = node();
        assert_eq!((n.loaded_as_of(), n.ttfb_seen()), (None, None), "nothing learned yet");
        n.set_loaded(vec![]);
        n.observe_ttfb(Duration::from_millis(250));
        tokio::time::advance(Duration::from_secs(600)).await;
        let (ttfb, at) = n.ttfb_seen().expect("a sample");
        assert_eq!(ttfb, Duration::from_millis(250), "ten idle minutes later it is still what was measured");
        assert!(n.ttfb_estimate(Instant::now()) < Some(Duration::from_millis(2)), "routing's estimate decays");
        assert!(at > 0 && n.loaded_as_of().is_some_and(|t| t > 0));
    }

    #[test]
    fn in_flight_guard_never_drifts() {
        let n = node();
        let a = n.try_dispatch(false).expect("slot");
        let b = n.try_dispatch(false).expect("slot");
        assert_eq!(n.in_flight(), 2);
        drop(a);
        drop(b);
        assert_eq!(n.in_flight(), 0);
    }

    #[test]
    fn capacity_is_enforced_atomically() {
        let n = node();
        n.set_max_concurrency(2);
        let _a = n.try_dispatch(false).expect("slot 1");
        let _b = n.try_dispatch(false).expect("slot 2");
        assert!(n.try_dispatch(false).is_none(), "no third slot");
    }

    #[test]
    fn a_freed_slot_wakes_the_queue_only_while_a_request_waits() {
        use futures_util::FutureExt as _;
        let wake = Wake::default();
        wake.slot_freed();
        assert!(wake.notified().now_or_never().is_none(), "nobody waits: no wake, no permit kept");
        wake.queued();
        wake.slot_freed();
        assert!(wake.notified().now_or_never().is_some(), "a request waits: woken");
        wake.unqueued();
        wake.slot_freed();
        assert!(wake.notified().now_or_never().is_none(), "it left: no wake again");
        wake.notify();
        assert!(wake.notified().now_or_never().is_some(), "node events wake it whatever waits");
    }

    #[tokio::test]
    async fn a_fleet_share_limits_the_slots_and_a_rising_share_wakes_the_queue() {
        let n = node();
        n.set_max_concurrency(4);
        assert_eq!(n.fleet_share(), None, "alone, no share");
        n.set_fleet_share(1);
        let _a = n.try_dispatch(false).expect("the one slot of the share");
        assert!(n.try_dispatch(false).is_none() && !n.has_capacity(), "the share, not max_concurrency, is the limit");
        n.set_fleet_share(0);
        assert_eq!(n.slots(), 0, "a share of 0 keeps requests queued");
        let woken = n.wake.notified();
        n.set_fleet_share(2);
        tokio::time::timeout(Duration::from_secs(1), woken).await.expect("a rising share wakes the dispatcher");
        assert!(n.try_dispatch(false).is_some(), "room again under the new share");
        n.set_fleet_share(u32::MAX);
        assert_eq!(n.slots(), 4, "back alone: max_concurrency");
    }

    #[test]
    fn hysteresis_needs_consecutive_successes_to_come_back() {
        let n = node();
        n.record_probe(true, 2, 3);
        assert_eq!(n.health(), Health::Healthy, "first good probe makes an unknown node healthy");
        n.record_probe(false, 2, 3);
        assert_eq!(n.health(), Health::Healthy, "one failure is not enough");
        n.record_probe(false, 2, 3);
        assert_eq!(n.health(), Health::Unhealthy);
        n.record_probe(true, 2, 3);
        n.record_probe(true, 2, 3);
        n.record_probe(false, 2, 3);
        n.record_probe(true, 2, 3);
        n.record_probe(true, 2, 3);
        assert_eq!(n.health(), Health::Unhealthy, "a failure in between restarts the count");
        n.record_probe(true, 2, 3);
        assert_eq!(n.health(), Health::Healthy);
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_node_ramps_up_over_slow_start() {
        let n = node();
        n.record_probe(true, 1, 1);
        assert_eq!(n.state(), NodeState::Healthy, "a first appearance is not a return");
        n.record_probe(false, 1, 1);
        assert_eq!(n.state(), NodeState::Unhealthy);
        n.record_probe(true, 1, 1);
        assert_eq!(n.state(), NodeState::Recovering);
        assert!((n.slow_start_factor(Instant::now()) - 0.1).abs() < 1e-9, "starts at the floor");
        tokio::time::advance(Duration::from_secs(15)).await;
        assert!((n.slow_start_factor(Instant::now()) - 0.5).abs() < 1e-6, "half way after half the ramp");
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(n.state(), NodeState::Healthy);
    }

    #[test]
    fn admin_states_override_health() {
        let n = node();
        n.record_probe(true, 1, 1);
        n.set_admin(Admin::Draining);
        assert_eq!(n.state(), NodeState::Draining);
        assert!(!n.is_available(), "a draining node takes nothing new");
        n.set_enabled(false);
        assert_eq!(n.state(), NodeState::Disabled);
        n.set_enabled(true);
        assert_eq!(n.state(), NodeState::Healthy);
    }

    #[test]
    fn an_unjudged_exchange_counts_as_client_gone() {
        let n = node();
        for _ in 0..20 {
            drop(n.try_dispatch(false).expect("slot"));
        }
        assert_eq!(n.breaker_state(), BreakerState::Closed);
        assert_ne!(n.health(), Health::Unhealthy);
    }

    #[test]
    fn failures_open_the_breaker_and_connect_errors_mark_it_down() {
        let n = node();
        for _ in 0..5 {
            n.try_dispatch(false).expect("slot").judge(Outcome::Failed);
        }
        assert_eq!(n.breaker_state(), BreakerState::Open);
        assert!(n.try_dispatch(false).is_none(), "an open breaker refuses");
        assert!(n.try_dispatch(true).is_some(), "unless it is the last node standing");
        let m = node();
        m.try_dispatch(false).expect("slot").judge(Outcome::ConnectFailed);
        assert_eq!(m.health(), Health::Unhealthy);
    }

    #[test]
    fn model_lookup_uses_ollama_names() {
        let n = node();
        assert_eq!(n.serves("llama3.2"), None, "unknown before the first deep probe");
        n.set_models(["llama3.2".to_string()]);
        assert_eq!(n.serves("llama3.2:latest"), Some(true));
        assert_eq!(n.serves("qwen"), Some(false));
        n.set_loaded(vec![LoadedModel {
            name: "llama3.2:latest".into(),
            size: 10,
            size_vram: 10,
            context_length: Some(8192),
        }]);
        assert!(n.has_hot("llama3.2"));
        assert_eq!(n.context_length("llama3.2"), Some(8192));
    }
}
