//! Routing: which node gets a request.
//!
//! Three steps, always in this order:
//! 1. `candidates` filters the registry down to nodes that may take this request at all
//!    (active, not down, serve the model, not already tried for it).
//! 2. `Router::pick` narrows them: occupancy first (unless the category turns `affinity` off,
//!    only the best tier stays: loaded-and-idle > not loaded > loaded-but-busy > loading would
//!    evict another loaded model; "loaded" is `/api/ps` showing it entirely in VRAM, see
//!    `occupancy`; a category with `wait_for_warm` puts loaded-but-busy before not loaded), a
//!    node that keeps missing first-token deadlines after all of those (`Node::is_slow`), then
//!    slow start (a recovering node stays in the running with probability equal to its ramp,
//!    10% -> 100%).
//! 3. The category's `Balance` policy chooses one. Policies are small types behind one tiny
//!    trait; randomness comes from an injected, seedable RNG (tower's `Balance::from_rng`):
//!    - `round-robin`: a shared cursor.
//!    - `weighted`: smooth weighted round robin (nginx): every pick adds each node's weight to
//!      its running score, takes the highest, and subtracts the total from the winner; a 3:1
//!      split interleaves as a a b a, never a a a b.
//!    - `least-connections`: fewest in-flight per unit of weight; ties broken at random, so a
//!      burst does not pile onto the first node.
//!    - `least-latency`: lowest peak-EWMA time to first byte; a node with no sample yet counts
//!      as fastest, so it gets explored.
//!    - `p2c`: power of two choices (Mitzenmacher; linkerd, tower): two distinct nodes at
//!      random, the one with lower peak-EWMA x (in-flight + 1) wins. O(1), and no herd.
//!    - `priority`: the first node in the category's `order` (else config order) that can
//!      serve: an ordered failover list.
//!    - `sticky`: consistent hashing of `X-Corral-Session` on a ring with 160 virtual nodes per
//!      node, so a session keeps hitting the node that holds its KV cache, and a node leaving
//!      moves only its own sessions. Without a session it picks at random.
//!    - `fastest-finish`: the earliest estimated finish (`crate::plan`: slot wait + prefill +
//!      decode + cold load, from the learned speed model). Admission plans it over busy nodes
//!      too, so a request may wait for a fast busy node instead of starting on a slow idle one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::config::{CategoryConfig, Policy};
use crate::node::{hash64, Glance, ModelRef, Node, Registry};
use crate::plan::{Board, Work};

/// Why no candidate could be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCandidate {
    /// No configured node lists the model, whatever its health (its last known list). Nodes
    /// that are down and never listed their models do not count, unless no node's list is known
    /// at all; nodes without a list that are up, disabled or draining may have it.
    UnknownModel,
    /// Nodes that have the model exist, but none is active and up.
    NoneAvailable,
    /// Every available node was already tried for this request.
    AllTried,
}

/// The nodes one decision chooses among; usually the per-model index's own list, not a copy.
pub type Nodes = Arc<Vec<Arc<Node>>>;

/// Nodes that may serve `model` now (ignoring capacity), skipping the ones in `tried`.
///
/// From the registry's per-model index (`Registry::by_model`): the nodes that list the model
/// (or whose list is not known yet), narrowed to the available and untried ones, in config
/// order. With all of them available and none tried (the common case) that is the index's
/// list itself. Only when none is left does the full scan below tell why.
pub fn candidates(registry: &Registry, model: Option<&str>, tried: &[Arc<Node>]) -> Result<Nodes, NoCandidate> {
    let key = model.map(crate::config::model_key);
    let index = registry.by_model();
    let serving = index.serving(key.as_deref());
    let usable = |n: &Arc<Node>| n.is_available() && !tried.iter().any(|t| Arc::ptr_eq(t, n));
    if !serving.is_empty() && serving.iter().all(usable) {
        return Ok(Arc::clone(serving));
    }
    let fresh: Vec<Arc<Node>> = serving.iter().filter(|n| usable(n)).cloned().collect();
    if !fresh.is_empty() {
        return Ok(Arc::new(fresh));
    }
    why_none(registry, key.as_deref(), tried).map(Arc::new)
}

/// The full scan behind `candidates` when the index leaves nothing: which `NoCandidate` it is,
/// or the one node there is (tried already, but trying it again beats giving up).
fn why_none(registry: &Registry, key: Option<&str>, tried: &[Arc<Node>]) -> Result<Vec<Arc<Node>>, NoCandidate> {
    let all = registry.all();
    let (mut serving, mut available, mut unlisted_out, mut listed) = (0usize, 0usize, 0usize, false);
    let mut last_available = None;
    let mut fresh = Vec::with_capacity(all.len());
    for n in all.iter() {
        let serves = key.map(|k| n.serves_key(k));
        listed |= serves.is_some_and(|s| s.is_some());
        match serves {
            Some(Some(false)) => continue,
            // A node whose model list is not known yet may have it; one that is down (not
            // one an operator disabled or drains) is counted below.
            Some(None) if n.state() == crate::node::NodeState::Unhealthy => {
                unlisted_out += 1;
                continue;
            }
            _ => {}
        }
        serving += 1;
        if !n.is_available() {
            continue;
        }
        available += 1;
        last_available = Some(n);
        if !tried.iter().any(|t| Arc::ptr_eq(t, n)) {
            fresh.push(Arc::clone(n));
        }
    }
    match (serving, available, last_available) {
        // With no node's list known there is nothing to call the model unknown against.
        (0, _, _) if unlisted_out > 0 && !listed => Err(NoCandidate::NoneAvailable),
        (0, _, _) => Err(NoCandidate::UnknownModel),
        (_, 0, _) => Err(NoCandidate::NoneAvailable),
        _ if !fresh.is_empty() => Ok(fresh),
        // The only node there is: trying it again beats giving up.
        (_, 1, Some(only)) => Ok(vec![Arc::clone(only)]),
        _ => Err(NoCandidate::AllTried),
    }
}

/// What a policy may look at besides the nodes.
#[derive(Debug, Clone, Copy)]
pub struct PickCtx<'a> {
    pub model: Option<&'a str>,
    pub session: Option<&'a str>,
    pub now: Instant,
    /// How much work the request is (for `fastest-finish`).
    pub work: Work,
}

/// Occupancy rank of `node` for the model `key` (lower is better): 0 loaded and idle, 1 not
/// loaded (loading it displaces nothing), 2 loaded but busy, 3 not loaded while another model
/// is (loading it would likely evict that one). "Loaded" is `/api/ps`'s word, entirely in VRAM;
/// "resident" is not "idle": with `OLLAMA_MAX_LOADED_MODELS=1` a loaded model is usually busy.
#[inline(always)]
pub fn occupancy(node: &Node, model: Option<ModelRef<'_>>) -> u8 {
    occupancy_at(node, node.glance(), model)
}

/// `occupancy` with the node's state already read.
#[inline(always)]
fn occupancy_at(node: &Node, glance: Glance, model: Option<ModelRef<'_>>) -> u8 {
    tier_at(node, glance, model, &TIERS[0])
}

/// Occupancy tiers by `(hot, busy, other)` as bits 2, 1, 0: as `occupancy` says, and with
/// `wait_for_warm` (a loaded busy node, 1, before a cold idle one, 2). A lookup, not
/// branches: `Router::pick_among` takes it for every node.
const TIERS: [[u8; 8]; 2] = [[1, 3, 1, 3, 0, 0, 2, 2], [2, 3, 2, 3, 0, 0, 1, 1]];

#[inline(always)]
fn tier_at(node: &Node, glance: Glance, model: Option<ModelRef<'_>>, tiers: &[u8; 8]) -> u8 {
    let Some(model) = model else { return 0 };
    let (hot, other) = node.loaded_facts(model);
    let busy = glance.in_flight() > 0;
    tiers[usize::from(hot) << 2 | usize::from(busy) << 1 | usize::from(other)]
}

/// The rank `Router::pick` keeps the best of: occupancy (with `wait_for_warm`, a loaded busy
/// node before a cold idle one), and a node that keeps missing first-token deadlines after
/// every other (slow, not broken: still there when nothing else is).
#[inline(always)]
fn rank(node: &Node, glance: Glance, model: Option<ModelRef<'_>>, tiers: &[u8; 8], now: Instant) -> u8 {
    let tier = tier_at(node, glance, model, tiers);
    tier + if glance.maybe_slow() && node.is_slow(now) { 4 } else { 0 }
}

/// The nodes one policy chooses among: some of a candidate list, by position in it, so
/// narrowing the candidates (occupancy tiers, slow start) copies positions, not `Arc`s.
#[derive(Debug, Clone, Copy)]
pub struct Pool<'a> {
    nodes: &'a [Arc<Node>],
    at: &'a [u32],
}

impl<'a> Pool<'a> {
    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    pub fn node(&self, i: usize) -> &'a Arc<Node> {
        &self.nodes[self.at[i] as usize]
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a Arc<Node>> + Clone + 'a {
        let nodes = self.nodes;
        self.at.iter().map(move |&i| &nodes[i as usize])
    }
}

/// A routing policy. `pool` is never empty; the answer is an index into it.
pub trait Balance: Send + Sync + std::fmt::Debug {
    fn pick(&self, pool: Pool<'_>, ctx: &PickCtx<'_>, rng: &mut SmallRng) -> usize;
}

/// Index of a uniformly random element among those with the lowest `key`: one pass, no
/// allocation (reservoir sampling over the ties: the k-th tie replaces the pick with
/// probability 1/k).
fn min_by_random_tie<K: PartialOrd + Copy>(pool: Pool<'_>, rng: &mut SmallRng, key: impl Fn(&Node) -> K) -> usize {
    let (mut best, mut at, mut ties) = (key(pool.node(0)), 0, 1u32);
    for (i, n) in pool.iter().enumerate().skip(1) {
        let k = key(n);
        if k < best {
            (best, at, ties) = (k, i, 1);
        } else if k <= best {
            ties += 1;
            if rng.gen_range(0..ties) == 0 {
                at = i;
            }
        }
    }
    at
}

#[derive(Debug, Default)]
pub struct RoundRobin {
    cursor: AtomicUsize,
}

impl Balance for RoundRobin {
    fn pick(&self, pool: Pool<'_>, _: &PickCtx<'_>, _: &mut SmallRng) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed) % pool.len()
    }
}

/// Smooth weighted round robin's running scores, by node id (`Node::id`).
#[derive(Debug, Default)]
pub struct Weighted {
    current: Mutex<Vec<i64>>,
}

impl Balance for Weighted {
    fn pick(&self, pool: Pool<'_>, _: &PickCtx<'_>, _: &mut SmallRng) -> usize {
        let mut current = lock(&self.current);
        let top = pool.iter().map(|n| n.id()).max().unwrap_or(0);
        if current.len() <= top {
            current.resize(top + 1, 0);
        }
        let (mut total, mut best, mut best_score) = (0i64, 0, i64::MIN);
        for (i, n) in pool.iter().enumerate() {
            let w = i64::from(n.weight());
            total += w;
            let score = &mut current[n.id()];
            *score += w;
            if *score > best_score {
                best_score = *score;
                best = i;
            }
        }
        current[pool.node(best).id()] -= total;
        best
    }
}

#[derive(Debug, Default)]
pub struct LeastConnections;

impl Balance for LeastConnections {
    fn pick(&self, pool: Pool<'_>, _: &PickCtx<'_>, rng: &mut SmallRng) -> usize {
        min_by_random_tie(pool, rng, |n| n.in_flight() as f64 / f64::from(n.weight()))
    }
}

#[derive(Debug, Default)]
pub struct LeastLatency;

impl Balance for LeastLatency {
    fn pick(&self, pool: Pool<'_>, ctx: &PickCtx<'_>, rng: &mut SmallRng) -> usize {
        // The order keys compare estimates at any common `now` without an `exp` per node; a
        // node tuned with another decay (a reload in between) is compared by its estimate.
        let decay = pool.node(0).latency_decay_s();
        if pool.iter().all(|n| n.latency_decay_s() == decay) {
            return min_by_random_tie(pool, rng, |n| n.latency_key(decay).unwrap_or(f64::NEG_INFINITY));
        }
        min_by_random_tie(pool, rng, |n| n.ttfb_estimate(ctx.now).map_or(0, |d| d.as_nanos()))
    }
}

#[derive(Debug, Default)]
pub struct P2c;

impl P2c {
    fn cost(n: &Node, now: Instant) -> f64 {
        let latency = n.ttfb_estimate(now).map_or(0.0, |d| d.as_secs_f64());
        latency * (n.in_flight() as f64 + 1.0)
    }
}

impl Balance for P2c {
    fn pick(&self, pool: Pool<'_>, ctx: &PickCtx<'_>, rng: &mut SmallRng) -> usize {
        if pool.len() == 1 {
            return 0;
        }
        let a = rng.gen_range(0..pool.len());
        let mut b = rng.gen_range(0..pool.len() - 1);
        if b >= a {
            b += 1;
        }
        let (ca, cb) = (Self::cost(pool.node(a), ctx.now), Self::cost(pool.node(b), ctx.now));
        if ca <= cb {
            a
        } else {
            b
        }
    }
}

#[derive(Debug, Default)]
pub struct PriorityOrder {
    order: Vec<String>,
    /// Each node's place in `order`, by node id, found once per node (`UNRANKED`: not yet).
    places: Mutex<Vec<usize>>,
}

const UNRANKED: usize = usize::MAX - 1;

impl Balance for PriorityOrder {
    fn pick(&self, pool: Pool<'_>, _: &PickCtx<'_>, _: &mut SmallRng) -> usize {
        let mut places = lock(&self.places);
        let top = pool.iter().map(|n| n.id()).max().unwrap_or(0);
        if places.len() <= top {
            places.resize(top + 1, UNRANKED);
        }
        let mut place = |n: &Node| {
            let p = &mut places[n.id()];
            if *p == UNRANKED {
                *p = self.order.iter().position(|o| o == n.name()).unwrap_or(usize::MAX);
            }
            *p
        };
        // Nodes not in `order` keep their config order, after the listed ones.
        (0..pool.len()).min_by_key(|&i| (place(pool.node(i)), i)).unwrap_or(0)
    }
}

/// A consistent-hash ring: (point, owner's node id) sorted by point, and the ids it was built
/// over, sorted.
#[derive(Debug, Default)]
struct Ring {
    members: Vec<usize>,
    points: Vec<(u64, usize)>,
}

impl Ring {
    fn build<'a>(nodes: impl Iterator<Item = &'a Arc<Node>> + Clone) -> Self {
        let mut points: Vec<(u64, usize)> = nodes
            .clone()
            .flat_map(|n| (0..VIRTUAL_NODES).map(move |v| (hash64(&format!("{}#{v}", n.name())), n.id())))
            .collect();
        points.sort_unstable();
        let mut members: Vec<usize> = nodes.map(|n| n.id()).collect();
        members.sort_unstable();
        Self { members, points }
    }

    fn has(&self, id: usize) -> bool {
        self.members.binary_search(&id).is_ok()
    }
}

/// Consistent-hash ring, built over the candidates and kept while later candidate sets are
/// within it. The owner among a subset is the first point clockwise whose node is in the
/// subset, the same answer as a ring built over the subset alone (its points are a subset of
/// these), so a node that is full for a moment does not cost a rebuild.
#[derive(Debug, Default)]
pub struct Sticky {
    ring: Mutex<Ring>,
}

pub const VIRTUAL_NODES: usize = 160;

impl Balance for Sticky {
    fn pick(&self, pool: Pool<'_>, ctx: &PickCtx<'_>, rng: &mut SmallRng) -> usize {
        let Some(session) = ctx.session else { return rng.gen_range(0..pool.len()) };
        let mut ring = lock(&self.ring);
        if !pool.iter().all(|n| ring.has(n.id())) {
            *ring = Ring::build(pool.iter());
        }
        let h = hash64(session);
        let start = ring.points.partition_point(|(k, _)| *k < h);
        let points = ring.points.len();
        for step in 0..points {
            let owner = ring.points[(start + step) % points].1;
            if let Some(i) = pool.iter().position(|n| n.id() == owner) {
                return i;
            }
        }
        0
    }
}

/// The candidate whose estimated finish is earliest (`crate::plan`); given only free nodes,
/// the one that is done soonest from now. Admission plans over busy nodes too
/// (`Admission::place`), which is where waiting for a busy fast node is decided.
#[derive(Debug, Default)]
pub struct FastestFinish;

impl Balance for FastestFinish {
    fn pick(&self, pool: Pool<'_>, ctx: &PickCtx<'_>, _: &mut SmallRng) -> usize {
        let key = ctx.model.map(crate::config::model_key);
        let model = key.as_deref().map(ModelRef::new);
        let nodes: Vec<Arc<Node>> = pool.iter().cloned().collect();
        Board::new().plan(&nodes, key.as_deref(), &ctx.work, ctx.now, |n| occupancy(n, model)).map_or(0, |p| p.index)
    }
}

pub fn balance_for(policy: Policy, category: &CategoryConfig) -> Box<dyn Balance> {
    match policy {
        Policy::RoundRobin => Box::new(RoundRobin::default()),
        Policy::Weighted => Box::new(Weighted::default()),
        Policy::LeastConnections => Box::new(LeastConnections),
        Policy::LeastLatency => Box::new(LeastLatency),
        Policy::P2c => Box::new(P2c),
        Policy::Priority => Box::new(PriorityOrder { order: category.order.clone(), places: Mutex::default() }),
        Policy::Sticky => Box::new(Sticky::default()),
        Policy::FastestFinish => Box::new(FastestFinish),
    }
}

/// A category's policy plus its state and RNG.
#[derive(Debug)]
pub struct Router {
    policy: Policy,
    affinity: bool,
    wait_for_warm: bool,
    balance: Box<dyn Balance>,
    rng: Mutex<SmallRng>,
}

impl Router {
    pub fn new(category: &CategoryConfig, seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => SmallRng::seed_from_u64(s),
            None => SmallRng::from_entropy(),
        };
        Self {
            policy: category.policy,
            affinity: category.affinity,
            wait_for_warm: category.wait_for_warm,
            balance: balance_for(category.policy, category),
            rng: Mutex::new(rng),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Index into `nodes` of the chosen one; `None` only for an empty slice.
    pub fn pick(&self, nodes: &[Arc<Node>], ctx: &PickCtx<'_>) -> Option<usize> {
        let key = ctx.model.map(crate::config::model_key);
        self.pick_among(nodes, ctx, key.as_deref(), |_, _| true)
    }

    /// `pick_among` for a request no node has been tried or excluded for, while every node is
    /// usual (`Glance::is_usual`: active, up, no ramp, breaker closed, no hold-off, no slow
    /// mark); `None` as soon as one is not (`pick_among` decides then). Those checks and the
    /// slow-start dice then drop nothing, so the pass reads each node's glance and loaded
    /// models and nothing else: most decisions are this one.
    pub fn pick_usual(&self, nodes: &[Arc<Node>], ctx: &PickCtx<'_>, key: Option<&str>) -> Option<Option<usize>> {
        let model = key.filter(|_| self.affinity).map(ModelRef::new);
        let tiers = &TIERS[usize::from(self.wait_for_warm)];
        let mut best = u8::MAX;
        let mut pool: SmallVec<[u32; POOL_INLINE]> = SmallVec::new();
        for (i, n) in nodes.iter().enumerate() {
            let glance = n.glance();
            if !glance.is_usual() {
                return None;
            }
            if !glance.has_room() {
                continue;
            }
            let tier = tier_at(n, glance, model, tiers);
            if tier > best {
                continue;
            }
            if tier < best {
                best = tier;
                pool.clear();
            }
            pool.push(i as u32);
        }
        if pool.is_empty() {
            return Some(None);
        }
        let chosen = self.balance.pick(Pool { nodes, at: &pool }, ctx, &mut lock(&self.rng));
        Some(pool.get(chosen).map(|&i| i as usize))
    }

    /// Index into `nodes` of the chosen one among those `keep` accepts; `None` when it
    /// accepts none. `key` is `ctx.model`'s key (`config::model_key`), found once by the
    /// caller. One pass over `nodes`, reading each node's `Glance` once (`keep` is given
    /// it), keeps the best occupancy tier's positions (no `Arc` is copied); slow-start dice
    /// are thrown only when a node in it is ramping up.
    pub fn pick_among(
        &self,
        nodes: &[Arc<Node>],
        ctx: &PickCtx<'_>,
        key: Option<&str>,
        mut keep: impl FnMut(&Node, Glance) -> bool,
    ) -> Option<usize> {
        let model = key.filter(|_| self.affinity).map(ModelRef::new);
        let tiers = &TIERS[usize::from(self.wait_for_warm)];
        let (mut best, mut ramping) = (u8::MAX, false);
        let mut pool: SmallVec<[u32; POOL_INLINE]> = SmallVec::new();
        for (i, n) in nodes.iter().enumerate() {
            let glance = n.glance();
            if !keep(n, glance) {
                continue;
            }
            let tier = rank(n, glance, model, tiers, ctx.now);
            if tier > best {
                continue;
            }
            if tier < best {
                (best, ramping) = (tier, false);
                pool.clear();
            }
            pool.push(i as u32);
            ramping |= glance.ramping() && n.slow_start_factor(ctx.now) < 1.0;
        }
        if pool.is_empty() {
            return None;
        }
        let mut rng = lock(&self.rng);
        if ramping {
            // A recovering node stays in with probability equal to its ramp; if every one
            // loses its dice, the whole tier stays.
            let passed: SmallVec<[u32; POOL_INLINE]> = pool
                .iter()
                .copied()
                .filter(|&i| {
                    let f = nodes[i as usize].slow_start_factor(ctx.now);
                    f >= 1.0 || rng.gen_bool(f.clamp(0.0, 1.0))
                })
                .collect();
            if !passed.is_empty() {
                pool = passed;
            }
        }
        let chosen = self.balance.pick(Pool { nodes, at: &pool }, ctx, &mut rng);
        pool.get(chosen).map(|&i| i as usize)
    }
}

/// Positions a decision keeps on the stack: a best tier of more nodes than this is rare.
const POOL_INLINE: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;
    use crate::node::{LoadedModel, NodeTuning};
    use crate::outcome::Outcome;
    use proptest::prelude::*;
    use std::time::Duration;

    fn registry(n: usize) -> Registry {
        let cfgs: Vec<_> = (0..n)
            .map(|i| NodeConfig {
                name: format!("n{i}"),
                url: format!("http://127.0.0.1:{}", 1000 + i),
                max_concurrency: 1000,
                ..NodeConfig::default()
            })
            .collect();
        Registry::new(&cfgs, NodeTuning::default()).expect("valid urls")
    }

    fn router(policy: Policy) -> Router {
        Router::new(&CategoryConfig { policy, ..CategoryConfig::default() }, Some(42))
    }

    fn ctx<'a>(session: Option<&'a str>) -> PickCtx<'a> {
        PickCtx { model: None, session, now: Instant::now(), work: Work::default() }
    }

    fn tally(r: &Router, nodes: &[Arc<Node>], n: usize) -> Vec<usize> {
        let mut seen = vec![0; nodes.len()];
        for _ in 0..n {
            seen[r.pick(nodes, &ctx(None)).expect("non-empty")] += 1;
        }
        seen
    }

    #[test]
    fn round_robin_cycles() {
        let reg = registry(3);
        let r = router(Policy::RoundRobin);
        let picks: Vec<_> = (0..6).map(|_| r.pick(&reg.all(), &ctx(None)).expect("non-empty")).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn weighted_three_to_one_lands_within_five_percent() {
        let reg = registry(2);
        reg.all()[0].set_weight(3);
        let seen = tally(&router(Policy::Weighted), &reg.all(), 2000);
        let share = seen[0] as f64 / 2000.0;
        assert!((share - 0.75).abs() <= 0.75 * 0.05, "3:1 within 5%: {seen:?}");
    }

    #[test]
    fn weighted_interleaves_smoothly() {
        let reg = registry(2);
        reg.all()[0].set_weight(3);
        let r = router(Policy::Weighted);
        let picks: Vec<_> = (0..4).map(|_| r.pick(&reg.all(), &ctx(None)).expect("non-empty")).collect();
        assert_eq!(picks, vec![0, 0, 1, 0], "smooth WRR spreads the light node in, nginx-style");
    }

    #[test]
    fn least_connections_prefers_idle_and_spreads_ties() {
        let reg = registry(3);
        let r = router(Policy::LeastConnections);
        let _busy = reg.all()[0].try_dispatch(false);
        let seen = tally(&r, &reg.all(), 200);
        assert_eq!(seen[0], 0, "the busy node is never least loaded");
        assert!(seen[1] > 50 && seen[2] > 50, "ties between idle nodes are broken at random: {seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn least_latency_sends_most_to_a_five_times_faster_node() {
        let reg = registry(2);
        let r = router(Policy::LeastLatency);
        let nodes = reg.all();
        let mut seen = [0usize; 2];
        for _ in 0..1000 {
            let i = r.pick(&nodes, &ctx(None)).expect("non-empty");
            seen[i] += 1;
            // Node 0 answers in 20 ms, node 1 in 100 ms; time moves on between requests.
            nodes[i].observe_ttfb(Duration::from_millis(if i == 0 { 20 } else { 100 }));
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        let share = seen[0] as f64 / 1000.0;
        assert!(share >= 0.8, "at least 80% to the 5x faster node: {seen:?}");
        assert!(seen[1] > 0, "the slow node is still re-probed as its estimate decays");
    }

    #[tokio::test(start_paused = true)]
    async fn p2c_prefers_the_cheaper_node_but_never_starves_one() {
        let reg = registry(3);
        let nodes = reg.all();
        nodes[0].observe_ttfb(Duration::from_millis(10));
        nodes[1].observe_ttfb(Duration::from_millis(50));
        nodes[2].observe_ttfb(Duration::from_millis(50));
        let seen = tally(&router(Policy::P2c), &nodes, 3000);
        assert!(seen[0] > seen[1] && seen[0] > seen[2], "{seen:?}");
        // With two random choices the fastest wins every pair it is in: 2/3 of picks.
        let share = seen[0] as f64 / 3000.0;
        assert!((share - 2.0 / 3.0).abs() < 0.05, "{seen:?}");
    }

    #[test]
    fn priority_takes_the_first_in_order() {
        let reg = registry(3);
        let r = Router::new(
            &CategoryConfig {
                policy: Policy::Priority,
                order: vec!["n2".into(), "n0".into()],
                ..CategoryConfig::default()
            },
            Some(1),
        );
        let nodes = reg.all();
        assert_eq!(r.pick(&nodes, &ctx(None)), Some(2));
        let without_n2: Vec<_> = nodes.iter().filter(|n| n.name() != "n2").cloned().collect();
        assert_eq!(without_n2[r.pick(&without_n2, &ctx(None)).expect("pick")].name(), "n0");
    }

    #[test]
    fn sticky_keeps_sessions_and_moves_only_the_departed_nodes_keys() {
        let reg = registry(4);
        let r = router(Policy::Sticky);
        let nodes = reg.all();
        let sessions: Vec<String> = (0..400).map(|i| format!("session-{i}")).collect();
        let before: Vec<String> =
            sessions.iter().map(|s| nodes[r.pick(&nodes, &ctx(Some(s))).expect("pick")].name().to_string()).collect();
        let again: Vec<String> =
            sessions.iter().map(|s| nodes[r.pick(&nodes, &ctx(Some(s))).expect("pick")].name().to_string()).collect();
        assert_eq!(before, again, "a session stays on its node");
        let owners: std::collections::BTreeSet<_> = before.iter().collect();
        assert_eq!(owners.len(), 4, "sessions spread over every node");
        let remaining: Vec<_> = nodes.iter().filter(|n| n.name() != "n1").cloned().collect();
        for (s, was) in sessions.iter().zip(&before) {
            let now = remaining[r.pick(&remaining, &ctx(Some(s))).expect("pick")].name().to_string();
            if was != "n1" {
                assert_eq!(&now, was, "{s} moved although its node stayed");
            } else {
                assert_ne!(now, "n1");
            }
        }
    }

    #[test]
    fn affinity_prefers_nodes_with_the_model_hot_unless_turned_off() {
        let reg = registry(3);
        let nodes = reg.all();
        nodes[2].set_loaded(vec![LoadedModel {
            name: "m:latest".into(),
            size: 10,
            size_vram: 10,
            context_length: None,
        }]);
        nodes[1].set_loaded(vec![LoadedModel {
            name: "m:latest".into(),
            size: 10,
            size_vram: 5,
            context_length: None,
        }]);
        let r = router(Policy::RoundRobin);
        let c = PickCtx { model: Some("m"), session: None, now: Instant::now(), work: Work::default() };
        for _ in 0..6 {
            assert_eq!(r.pick(&nodes, &c), Some(2), "only n2 has it fully in VRAM");
        }
        let off = Router::new(
            &CategoryConfig { policy: Policy::RoundRobin, affinity: false, ..CategoryConfig::default() },
            Some(1),
        );
        let picks: std::collections::BTreeSet<_> = (0..6).map(|_| off.pick(&nodes, &c)).collect();
        assert_eq!(picks.len(), 3);
    }

    #[test]
    fn occupancy_orders_idle_loaded_then_cold_then_busy_then_evicting() {
        let reg = registry(4);
        let nodes = reg.all();
        let lm = |name: &str| LoadedModel { name: name.into(), size: 10, size_vram: 10, context_length: None };
        nodes[0].set_loaded(vec![lm("m:latest")]);
        nodes[1].set_loaded(vec![lm("m:latest")]);
        nodes[3].set_loaded(vec![lm("other:latest")]);
        let _busy = nodes[1].try_dispatch(false).expect("slot");
        let ranks: Vec<u8> = nodes.iter().map(|n| occupancy(n, Some(ModelRef::new("m:latest")))).collect();
        assert_eq!(ranks, vec![0, 2, 1, 3], "idle+loaded, busy+loaded, cold, would evict");
        let r = router(Policy::LeastConnections);
        let c = PickCtx { model: Some("m"), session: None, now: Instant::now(), work: Work::default() };
        assert_eq!(r.pick(&nodes, &c), Some(0), "loaded and idle first");
        let rest: Vec<_> = nodes[1..].to_vec();
        assert_eq!(rest[r.pick(&rest, &c).expect("pick")].name(), "n2", "a cold idle node beats a busy warm one");
        let last: Vec<_> = vec![Arc::clone(&nodes[1]), Arc::clone(&nodes[3])];
        assert_eq!(last[r.pick(&last, &c).expect("pick")].name(), "n1", "busy warm beats evicting another model");
    }

    #[test]
    fn a_category_that_waits_for_warm_puts_a_busy_loaded_node_before_a_cold_idle_one() {
        let reg = registry(2);
        let nodes = reg.all();
        nodes[0].set_loaded(vec![LoadedModel {
            name: "m:latest".into(),
            size: 10,
            size_vram: 10,
            context_length: None,
        }]);
        let _busy = nodes[0].try_dispatch(false).expect("slot");
        let c = PickCtx { model: Some("m"), session: None, now: Instant::now(), work: Work::default() };
        let cold_first = router(Policy::LeastConnections);
        assert_eq!(cold_first.pick(&nodes, &c), Some(1), "by default the cold idle node");
        let warm = Router::new(
            &CategoryConfig { policy: Policy::LeastConnections, wait_for_warm: true, ..CategoryConfig::default() },
            Some(1),
        );
        assert_eq!(warm.pick(&nodes, &c), Some(0), "wait_for_warm: the node that has it loaded");
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_keeps_missing_first_token_deadlines_is_tried_last_until_the_mark_lapses() {
        let reg = registry(2);
        let nodes = reg.all();
        let r = router(Policy::Priority);
        let ctx = || PickCtx { model: None, session: None, now: Instant::now(), work: Work::default() };
        for i in 0..crate::node::SLOW_AFTER_MISSES {
            assert_eq!(r.pick(&nodes, &ctx()), Some(0), "n0 first while it has missed {i}");
            nodes[0].try_dispatch(false).expect("slot").judge(Outcome::Slow);
        }
        assert!(nodes[0].is_slow(Instant::now()));
        assert_eq!(nodes[0].breaker_state(), crate::breaker::BreakerState::Closed, "slow, not broken");
        assert_eq!(r.pick(&nodes, &ctx()), Some(1), "a slow node goes after the others");
        assert_eq!(r.pick(&nodes[..1], &ctx()), Some(0), "and is still there alone");
        tokio::time::advance(crate::node::SLOW_FOR).await;
        assert_eq!(r.pick(&nodes, &ctx()), Some(0), "the mark lapses: tried again");
        nodes[0].try_dispatch(false).expect("slot").judge(Outcome::Success);
        assert_eq!(nodes[0].first_token_misses(), 0, "an answer in time clears the count");
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovering_node_gets_a_ramping_share() {
        let reg = registry(2);
        let nodes = reg.all();
        nodes[1].record_probe(true, 1, 1);
        nodes[1].record_probe(false, 1, 1);
        nodes[1].record_probe(true, 1, 1);
        let r = router(Policy::RoundRobin);
        let early = tally(&r, &nodes, 1000)[1];
        tokio::time::advance(Duration::from_secs(15)).await;
        let mid = tally(&r, &nodes, 1000)[1];
        tokio::time::advance(Duration::from_secs(15)).await;
        let done = tally(&r, &nodes, 1000)[1];
        assert!(early < 150, "10% ramp start: about 1 in 20 picks: {early}");
        assert!(early < mid && mid < done, "share grows: {early} < {mid} < {done}");
        assert!((450..=550).contains(&done), "full share after slow start: {done}");
    }

    #[test]
    fn candidates_skip_down_disabled_and_modelless_nodes() {
        let reg = registry(3);
        let nodes = reg.all();
        nodes[0].set_models(["a".to_string()]);
        nodes[1].set_models(["b".to_string()]);
        nodes[2].set_models(["a".to_string()]);
        nodes[2].set_enabled(false);
        let c = candidates(&reg, Some("a"), &[]).expect("n0 serves a");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name(), "n0");
        assert_eq!(candidates(&reg, Some("zzz"), &[]).err(), Some(NoCandidate::UnknownModel));
        nodes[0].try_dispatch(false).expect("slot").judge(Outcome::ConnectFailed);
        assert_eq!(candidates(&reg, Some("a"), &[]).err(), Some(NoCandidate::NoneAvailable));
    }

    #[test]
    fn a_down_node_that_never_listed_its_models_does_not_hide_a_typo() {
        let reg = registry(2);
        let nodes = reg.all();
        nodes[1].record_probe(false, 1, 1);
        assert_eq!(candidates(&reg, Some("a"), &[]).map(|c| c.len()), Ok(1), "n0 is up and may have it");
        nodes[0].record_probe(false, 1, 1);
        assert_eq!(
            candidates(&reg, Some("a"), &[]).err(),
            Some(NoCandidate::NoneAvailable),
            "no list known anywhere: a node that is down may have it"
        );
        nodes[0].set_models(["a".to_string()]);
        assert_eq!(
            candidates(&reg, Some("a"), &[]).err(),
            Some(NoCandidate::NoneAvailable),
            "listed by a node that is down: 503, not 404"
        );
        assert_eq!(
            candidates(&reg, Some("b"), &[]).err(),
            Some(NoCandidate::UnknownModel),
            "listed nowhere, whatever the health, though n1's list is not known"
        );
        nodes[1].set_enabled(false);
        assert_eq!(
            candidates(&reg, Some("b"), &[]).err(),
            Some(NoCandidate::NoneAvailable),
            "a disabled node may have it: the operator took it out, not a failure"
        );
    }

    #[test]
    fn a_tried_node_is_not_picked_again_unless_it_is_the_only_one() {
        let reg = registry(2);
        let nodes = reg.all();
        let c = candidates(&reg, None, std::slice::from_ref(&nodes[0])).expect("n1 left");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name(), "n1");
        assert_eq!(candidates(&reg, None, &nodes).err(), Some(NoCandidate::AllTried));
        let single = registry(1);
        assert!(candidates(&single, None, &single.all()).is_ok());
    }

    #[test]
    fn the_per_model_index_follows_model_lists_and_added_and_removed_nodes() {
        let reg = registry(2);
        let nodes = reg.all();
        let names = |c: Nodes| c.iter().map(|n| n.name().to_string()).collect::<Vec<_>>();
        assert_eq!(names(candidates(&reg, Some("a"), &[]).expect("lists unknown")), ["n0", "n1"]);
        nodes[0].set_models(["a".to_string()]);
        assert_eq!(names(candidates(&reg, Some("a"), &[]).expect("n0 lists it")), ["n0", "n1"], "n1's list is unknown");
        nodes[1].set_models(["b".to_string()]);
        assert_eq!(names(candidates(&reg, Some("a"), &[]).expect("n0 only")), ["n0"]);
        let added =
            reg.add(NodeConfig { name: "n9".into(), url: "http://127.0.0.1:9".into(), ..NodeConfig::default() });
        assert_eq!(names(candidates(&reg, Some("a"), &[]).expect("and the new one")), ["n0", "n9"], "{added:?}");
        nodes[0].forget_model("a");
        assert_eq!(names(candidates(&reg, Some("a"), &[]).expect("the new one")), ["n9"]);
        reg.remove("n9");
        assert_eq!(candidates(&reg, Some("a"), &[]).err(), Some(NoCandidate::UnknownModel));
        // The common case hands out the index's own list: no copy per decision.
        let (x, y) = (candidates(&reg, Some("b"), &[]).expect("n1"), candidates(&reg, Some("b"), &[]).expect("n1"));
        assert!(Arc::ptr_eq(&x, &y));
    }

    #[test]
    fn more_loaded_models_than_the_atomics_hold_are_read_from_the_list() {
        let reg = registry(1);
        let node = &reg.all()[0];
        let lm = |name: &str, vram| LoadedModel { name: name.into(), size: 10, size_vram: vram, context_length: None };
        let many: Vec<_> = (0..6).map(|i| lm(&format!("m{i}:latest"), 10)).collect();
        node.set_loaded(many);
        assert_eq!(occupancy(node, Some(ModelRef::new("m5:latest"))), 0, "the sixth is hot");
        assert_eq!(occupancy(node, Some(ModelRef::new("x:latest"))), 3, "another model would be evicted");
        node.set_loaded(vec![lm("m:latest", 5)]);
        assert_eq!(
            occupancy(node, Some(ModelRef::new("m:latest"))),
            1,
            "partly in VRAM is not hot, and nothing else is loaded"
        );
        node.set_loaded(Vec::new());
        assert_eq!(occupancy(node, Some(ModelRef::new("m:latest"))), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn least_latencys_order_keys_order_nodes_as_their_decayed_estimates_do() {
        let reg = registry(6);
        let nodes = reg.all();
        let mut rng = SmallRng::seed_from_u64(9);
        use rand::Rng as _;
        for round in 0..200 {
            let n = &nodes[rng.gen_range(0..nodes.len())];
            n.observe_ttfb(Duration::from_millis(rng.gen_range(1..500)));
            tokio::time::advance(Duration::from_millis(rng.gen_range(0..3000))).await;
            let now = Instant::now();
            let decay = nodes[0].latency_decay_s();
            let by_estimate: Vec<u128> =
                nodes.iter().map(|n| n.ttfb_estimate(now).map_or(0, |d| d.as_nanos())).collect();
            let by_key: Vec<f64> = nodes.iter().map(|n| n.latency_key(decay).unwrap_or(f64::NEG_INFINITY)).collect();
            for i in 0..nodes.len() {
                for j in 0..nodes.len() {
                    // Estimates compare in whole nanoseconds; keys are exact.
                    if by_estimate[i] + 1 < by_estimate[j] {
                        assert!(by_key[i] < by_key[j], "round {round}: {by_estimate:?} vs {by_key:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_sticky_ring_kept_over_more_nodes_answers_as_one_built_over_the_candidates() {
        let reg = registry(8);
        let nodes = reg.all();
        let wide = router(Policy::Sticky);
        let _ = wide.pick(&nodes, &ctx(Some("warm-up")));
        for leave in 0..nodes.len() {
            let subset: Vec<_> =
                nodes.iter().enumerate().filter(|(i, _)| i % 3 != leave % 3).map(|(_, n)| Arc::clone(n)).collect();
            let fresh = router(Policy::Sticky);
            for i in 0..100 {
                let s = format!("s{leave}-{i}");
                assert_eq!(wide.pick(&subset, &ctx(Some(&s))), fresh.pick(&subset, &ctx(Some(&s))), "{s}");
            }
        }
    }

    proptest! {
        /// The pass for all-usual nodes answers as the general one does (same policy state and
        /// dice), and gives up exactly when a node is not usual.
        #[test]
        fn the_usual_pass_picks_as_the_full_one(
            nodes_at in proptest::collection::vec((1u32..4, 0usize..4, 0u8..4, 0u8..8), 1..12),
            seed: u64,
            p in 0usize..Policy::ALL.len(),
            warm: bool,
        ) {
            let policy = Policy::ALL[p];
            let reg = registry(nodes_at.len());
            let nodes = reg.all();
            let mut guards = Vec::new();
            for (n, &(slots, busy, loaded, odd)) in nodes.iter().zip(&nodes_at) {
                n.set_max_concurrency(slots);
                for _ in 0..busy { guards.push(n.try_dispatch(false)); }
                let model = |name: &str, size_vram| LoadedModel { name: name.into(), size: 10, size_vram, context_length: None };
                match loaded {
                    1 => n.set_loaded(vec![model("m:latest", 10)]),
                    2 => n.set_loaded(vec![model("m:latest", 5)]),
                    3 => n.set_loaded(vec![model("other:latest", 10)]),
                    _ => {}
                }
                if odd == 0 { n.set_admin(crate::node::Admin::Draining); }
            }
            let category = CategoryConfig { policy, wait_for_warm: warm, ..CategoryConfig::default() };
            let (usual, full) = (Router::new(&category, Some(seed)), Router::new(&category, Some(seed)));
            let c = PickCtx { model: Some("m"), session: Some("s"), now: Instant::now(), work: Work::default() };
            let all_usual = nodes.iter().all(|n| n.glance().is_usual());
            for _ in 0..4 {
                let fast = usual.pick_usual(&nodes, &c, Some("m:latest"));
                let slow = full.pick_among(&nodes, &c, Some("m:latest"), |n, g| g.has_room() && n.is_available());
                prop_assert_eq!(fast.is_some(), all_usual);
                if let Some(fast) = fast {
                    prop_assert_eq!(fast, slow);
                }
            }
        }

        #[test]
        fn every_policy_picks_inside_the_candidates(n in 1usize..12, busy in proptest::collection::vec(0usize..4, 12), seed: u64, p in 0usize..Policy::ALL.len(), session in "[a-z]{0,8}") {
            let policy = Policy::ALL[p];
            let reg = registry(n);
            let nodes = reg.all();
            let mut guards = Vec::new();
            for (i, b) in busy.iter().take(n).enumerate() {
                for _ in 0..*b { guards.push(nodes[i].try_dispatch(false)); }
            }
            let r = Router::new(&CategoryConfig { policy, ..CategoryConfig::default() }, Some(seed));
            let c = PickCtx { model: None, session: (!session.is_empty()).then_some(session.as_str()), now: Instant::now(), work: Work::default() };
            for _ in 0..8 {
                let i = r.pick(&nodes, &c).expect("non-empty");
                prop_assert!(i < n);
                if policy == Policy::LeastConnections {
                    let min = nodes.iter().map(|x| x.in_flight()).min().unwrap_or(0);
                    prop_assert_eq!(nodes[i].in_flight(), min);
                }
            }
        }
    }
}
