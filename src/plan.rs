//! Finish-time planning, the engine of the `fastest-finish` policy.
//!
//! For each candidate node the planner estimates when this request would be done there:
//!
//! ```text
//! finish = when a slot frees + prefill (prompt tokens / prefill speed)
//!        + decode (num_predict, else the model's typical answer here, else 256 tokens, / decode speed)
//!        + cold load (when the model is not resident there)
//! ```
//!
//! and picks the earliest, which may be a busy fast node rather than an idle slow one (the
//! field report's tail batch: idle A needs 80 s, busy B frees in 5 s and then needs 20 s, so
//! waiting for B ends at 25 s). Speeds come from `crate::speed`; a node with no estimate yet
//! is assumed as fast as the fastest known candidate (so it gets explored and learned), and
//! with nothing known at all `DEFAULT_DECODE_TPS` is used.
//!
//! When a slot frees comes from a `Board`: one timetable per node, `max_concurrency` slots,
//! each free at the expected end of the request running in it (from the node's timetable;
//! a request past its expected end is expected to overrun by as much again, so a stalled node
//! is not imagined as "about to finish"). Booking a plan moves the chosen slot to the plan's
//! finish, so within one walk of the queue two waiting requests never count the same future
//! slot. A board lives for one walk and is rebuilt from the nodes on the next, which re-plans
//! every waiter as estimates change. A plan is an estimate, never a reservation a node knows.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use memchr::memmem::FinderRev;
use tokio::time::Instant;

use crate::node::{ModelRef, Node};
use crate::speed::{Pace, Speed};

/// Decode speed assumed when no candidate has an estimate for the model.
pub const DEFAULT_DECODE_TPS: f64 = 30.0;
/// Answer length assumed when neither `num_predict` nor history says.
pub const DEFAULT_OUTPUT_TOKENS: f64 = 256.0;
/// Prompt tokens are estimated from the body's size at this many bytes per token.
pub const BYTES_PER_TOKEN: usize = 4;
/// A model that answered on a node this recently is taken as still loaded there (Ollama's
/// default `keep_alive`).
pub const RESIDENT_FOR: Duration = Duration::from_secs(5 * 60);
/// The longest service a plan counts, in nanoseconds (a day).
const DAY_NANOS: f64 = 24.0 * 3600.0 * 1e9;
const RESIDENT_NANOS: i64 = RESIDENT_FOR.as_nanos() as i64;

/// How much work a request is, as far as it can be told before it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    pub prompt_tokens: u64,
    /// `num_predict` (`max_tokens` on `/v1`), when the request says.
    pub output_tokens: Option<u64>,
}

impl Work {
    /// The work in a request body, by scanning it (no JSON parse).
    pub fn of(body: &[u8]) -> Self {
        // Searchers made once: building one per search was most of the search (callgrind).
        static NUM_PREDICT: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(b"\"num_predict\":"));
        static MAX_TOKENS: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(b"\"max_tokens\":"));
        let num = |k: &FinderRev<'static>| crate::speed::number_after(body, k);
        let output = num(&NUM_PREDICT).or_else(|| num(&MAX_TOKENS));
        Work { prompt_tokens: (body.len() / BYTES_PER_TOKEN) as u64, output_tokens: output.filter(|n| *n > 0) }
    }
}

/// Speeds to assume for a node that has none: the best among the candidates.
#[derive(Debug, Clone, Copy)]
struct Fallback {
    decode_tps: f64,
    prefill_tps: Option<f64>,
}

impl Fallback {
    /// For a node that lacks nothing, which never looks at it.
    const UNUSED: Self = Self { decode_tps: f64::NAN, prefill_tps: None };

    /// The best of `speeds`; with no decode speed among them, `DEFAULT_DECODE_TPS`.
    fn of(speeds: impl IntoIterator<Item = Speed>) -> Self {
        let (mut decode, mut prefill) = (None::<f64>, None::<f64>);
        for s in speeds {
            if let Some(v) = s.decode_tps {
                decode = Some(decode.map_or(v, |a| a.max(v)));
            }
            if let Some(v) = s.prefill_tps {
                prefill = Some(prefill.map_or(v, |a| a.max(v)));
            }
        }
        Self { decode_tps: decode.unwrap_or(DEFAULT_DECODE_TPS), prefill_tps: prefill }
    }
}

/// `plan`'s running choice: (index, wait, service, finish), in nanoseconds from `now`, the
/// service not yet whole, the finish as the float `consider` compares (kept, not remade from
/// the other two per candidate).
type Best = Option<(usize, u64, f64, f64)>;

/// `wait + service` as a float, for ordering. The wait goes through i64 (one instruction; u64's
/// conversion is several): clamping at i64::MAX keeps the order, and near-ties are compared
/// exactly anyway.
#[inline(always)]
fn finish_of(wait: u64, service: f64) -> f64 {
    wait.min(i64::MAX as u64) as i64 as f64 + service
}

/// Keep candidate `i` in `best` when it finishes earlier (ties: see `Board::plan`; `tie` gives
/// a candidate's rank, in flight and index). A function, so it is surely inlined into the loop:
/// as a closure it was a call per candidate, a third of the decision (issue 16).
#[inline(always)]
fn consider(best: &mut Best, i: usize, (wait, service): (u64, f64), tie: &impl Fn(usize) -> (u8, usize, usize)) {
    let finish = finish_of(wait, service);
    let better = match *best {
        None => true,
        Some((b, best_wait, best_service, best_finish)) => {
            // Compared as `quotes` are, in whole nanoseconds; but finishes more than a
            // nanosecond apart (two, for the float sums' rounding) order the same before
            // truncation, so only near-ties pay for the conversions.
            if finish < best_finish - 2.0 {
                true
            } else if finish > best_finish + 2.0 {
                false
            } else {
                let whole = |wait: u64, service: f64| (wait.saturating_add(nanos(service)), wait);
                match whole(wait, service).cmp(&whole(best_wait, best_service)) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Greater => false,
                    std::cmp::Ordering::Equal => tie(i) < tie(b),
                }
            }
        }
    };
    if better {
        *best = Some((i, wait, service, finish));
    }
}

/// Whether `work`'s cost at `pace` needs the other nodes' speeds (`Fallback`).
fn lacks(pace: &Pace, work: &Work) -> bool {
    pace.per_output.is_nan() || (pace.per_prompt.is_nan() && work.prompt_tokens > 0)
}

/// Reads the candidates' speeds for one decision: the model hashed and the clock stamped once.
struct Reader<'a> {
    model: Option<ModelRef<'a>>,
    now: Instant,
    at: i64,
}

impl<'a> Reader<'a> {
    fn new(key: Option<&'a str>, now: Instant) -> Self {
        Self { model: key.map(ModelRef::new), now, at: crate::speed::stamp(now) }
    }

    #[inline]
    fn speed(&self, n: &Node) -> Option<Speed> {
        self.model.and_then(|m| n.speed_of(m, self.now, self.at))
    }

    /// The node's pace: from its card, else from its book.
    #[inline]
    fn pace(&self, n: &Node) -> Pace {
        let Some(m) = self.model else { return Pace::UNKNOWN };
        n.pace_of(m, self.at).unwrap_or_else(|| self.speed(n).map_or(Pace::UNKNOWN, |s| Pace::of(&s)))
    }
}

/// How long `work` takes at `pace` once it has a slot, in nanoseconds, not yet whole (see
/// `nanos`).
#[inline(always)]
fn service(pace: &Pace, resident: bool, work: &Work, fallback: Fallback) -> f64 {
    let known = |v: f64| Some(v).filter(|v| !v.is_nan());
    let per_output = known(pace.per_output).unwrap_or_else(|| 1e9 / fallback.decode_tps.max(0.001));
    let output = work.output_tokens.map(|n| n as f64).or(known(pace.typical_output)).unwrap_or(DEFAULT_OUTPUT_TOKENS);
    let per_prompt = known(pace.per_prompt).or_else(|| fallback.prefill_tps.map(|p| 1e9 / p.max(0.001)));
    let prefill = per_prompt.map_or(0.0, |p| work.prompt_tokens as f64 * p);
    let load = if resident { 0.0 } else { known(pace.load).unwrap_or(0.0) };
    (output * per_output + prefill + load).min(DAY_NANOS)
}

/// A `service` in whole nanoseconds, truncated: a plain conversion, cheaper than
/// `Duration::from_secs_f64`'s exact rounding (no estimate is that exact). At most a day and
/// never negative or NaN, so inside i64, whose conversion is one instruction (u64's is several).
#[inline(always)]
fn nanos(service: f64) -> u64 {
    service as i64 as u64
}

/// The chosen candidate: where, when it starts and ends, and how long it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub index: usize,
    pub start: Instant,
    pub finish: Instant,
    pub service: Duration,
}

impl Plan {
    /// Whether the plan starts now (a slot is free), rather than waiting for one.
    pub fn starts_now(&self, now: Instant) -> bool {
        self.start <= now
    }
}

/// One candidate's estimate for one request.
#[derive(Debug, Clone, Copy)]
pub struct Quote {
    pub start: Instant,
    pub service: Duration,
}

/// Per-node slot timetables for one walk of the queue.
#[derive(Debug, Default)]
pub struct Board {
    /// By the node's address (a key only, never dereferenced).
    lanes: HashMap<usize, Vec<Instant>>,
    /// Whether bookings are kept: not for a board that decides one request and is dropped.
    once: bool,
}

impl Board {
    pub fn new() -> Self {
        Self::default()
    }

    /// A board for a single decision: nothing reads its bookings afterwards, so `book` keeps
    /// none (a slot taken now is in the node's own timetable for the next walk).
    pub fn once() -> Self {
        Self { once: true, ..Self::default() }
    }

    /// When each of `node`'s slots frees, built from its timetable on first use.
    fn lane(&mut self, node: &Arc<Node>, now: Instant, unknown: Duration) -> &mut Vec<Instant> {
        self.lanes.entry(Arc::as_ptr(node) as usize).or_insert_with(|| {
            let max = node.slots().max(1);
            let ends = node.running_ends();
            let untimed = node.in_flight().saturating_sub(ends.len());
            let mut slots: Vec<Instant> = ends
                .iter()
                .map(|&end| if end >= now { end } else { now + (now - end) })
                .chain(std::iter::repeat_n(now + unknown, untimed))
                .collect();
            slots.sort();
            slots.truncate(max);
            slots.resize(max, now);
            slots
        })
    }

    /// What `work` would cost on each of `nodes` (in order), given the bookings so far.
    pub fn quotes(&mut self, nodes: &[Arc<Node>], key: Option<&str>, work: &Work, now: Instant) -> Vec<Quote> {
        let reader = Reader::new(key, now);
        let speeds: Vec<Option<Speed>> = nodes.iter().map(|n| reader.speed(n)).collect();
        let fallback = Fallback::of(speeds.iter().flatten().copied());
        let pace = |s: &Option<Speed>| s.as_ref().map_or(Pace::UNKNOWN, Pace::of);
        nodes.iter().zip(&speeds).map(|(n, s)| self.quote(n, &pace(s), &reader, work, fallback)).collect()
    }

    /// `quotes(nodes, ..)[i]`, looking at the other nodes only when `nodes[i]` has no speed of
    /// its own to go by (the fallback is the best of theirs).
    ///
    /// Every request placed by a policy other than `fastest-finish` takes this (its node's
    /// timetable needs the estimate), so it reads the card's pace as `plan` does: no `Speed`
    /// rebuilt and no per-token times divided out again.
    pub fn quote_one(&mut self, nodes: &[Arc<Node>], i: usize, key: Option<&str>, work: &Work, now: Instant) -> Quote {
        let reader = Reader::new(key, now);
        let pace = reader.pace(&nodes[i]);
        let fallback = if lacks(&pace, work) {
            Fallback::of(nodes.iter().filter_map(|n| reader.speed(n)))
        } else {
            Fallback::UNUSED
        };
        self.quote(&nodes[i], &pace, &reader, work, fallback)
    }

    fn quote(&mut self, n: &Arc<Node>, pace: &Pace, reader: &Reader<'_>, work: &Work, fallback: Fallback) -> Quote {
        let (wait, service) = self.price(n, pace, reader, work, fallback);
        Quote { start: reader.now + Duration::from_nanos(wait), service: Duration::from_nanos(nanos(service)) }
    }

    /// `quote` as nanoseconds from `now`: (the wait for a slot, the service not yet whole).
    /// What `plan` compares for every candidate, in numbers rather than instants.
    #[inline(always)]
    fn price(
        &mut self,
        n: &Arc<Node>,
        pace: &Pace,
        reader: &Reader<'_>,
        work: &Work,
        fallback: Fallback,
    ) -> (u64, f64) {
        let now = reader.now;
        // A model that answered here within `RESIDENT_FOR` (or later than `now`) is resident.
        let recent = pace.last != i64::MIN && reader.at.saturating_sub(pace.last) < RESIDENT_NANOS;
        let resident = recent || reader.model.is_some_and(|m| n.loaded_facts(m).0);
        let service = service(pace, resident, work, fallback);
        // A node with a free slot and nothing booked on it this walk starts now: its lane
        // (one entry per slot) is built only once something is booked there.
        let key_of = Arc::as_ptr(n) as usize;
        let glance = n.glance();
        if glance.in_flight() < glance.slots().max(1) && (self.lanes.is_empty() || !self.lanes.contains_key(&key_of)) {
            return (0, service);
        }
        let lane = self.lane(n, now, Duration::from_nanos(nanos(service)));
        let start = lane.iter().min().copied().unwrap_or(now).max(now);
        (u64::try_from((start - now).as_nanos()).unwrap_or(u64::MAX), service)
    }

    /// The candidate with the earliest finish; ties go to the one that starts first, then to
    /// the lower `rank` (occupancy: loaded-and-idle first), then to fewer in flight (so nodes
    /// that are all unknown yet share the first requests and all get learned), then config order.
    ///
    /// One pass over the candidates, each priced from its lock-free card; a node with no speed
    /// of its own is priced with the best of the others' (`Fallback`), known only once all are
    /// read, so such nodes (new ones, mostly none) wait for a second pass. Same choice as the
    /// minimum of `quotes`.
    pub fn plan(
        &mut self,
        nodes: &[Arc<Node>],
        key: Option<&str>,
        work: &Work,
        now: Instant,
        rank: impl Fn(&Node) -> u8,
    ) -> Option<Plan> {
        self.plan_plain(nodes, key, work, now, rank, |_| true)
    }

    /// `plan`, or `None` as soon as a node is not `plain` (the caller narrows the list then):
    /// the check rides the planning pass instead of a pass of its own.
    pub fn plan_plain(
        &mut self,
        nodes: &[Arc<Node>],
        key: Option<&str>,
        work: &Work,
        now: Instant,
        rank: impl Fn(&Node) -> u8,
        plain: impl Fn(&Node) -> bool,
    ) -> Option<Plan> {
        let reader = Reader::new(key, now);
        let mut best: Best = None;
        let tie = |i: usize| (rank(&nodes[i]), nodes[i].in_flight(), i);
        let mut lacking = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            if !plain(n) {
                return None;
            }
            let pace = reader.pace(n);
            if lacks(&pace, work) {
                lacking.push((i, pace));
            } else {
                // The fallback is not used for a node that lacks nothing.
                consider(&mut best, i, self.price(n, &pace, &reader, work, Fallback::UNUSED), &tie);
            }
        }
        if !lacking.is_empty() {
            let fallback = Fallback::of(nodes.iter().filter_map(|n| reader.speed(n)));
            for (i, pace) in lacking {
                consider(&mut best, i, self.price(&nodes[i], &pace, &reader, work, fallback), &tie);
            }
        }
        let (index, wait, service, _) = best?;
        let (start, service) = (now + Duration::from_nanos(wait), Duration::from_nanos(nanos(service)));
        Some(Plan { index, start, finish: start + service, service })
    }

    /// `plan` for the usual case, in a pass that does only what that case needs: every node
    /// usual (`Glance::is_usual`) with a free slot, nothing booked on this board, every node
    /// with a pace of its own for `work` (no `Fallback`), and no two finishes within the
    /// 2 ns where `plan` looks closer (ties). `None` as soon as any of that does not hold:
    /// `plan` decides then, and decides the same wherever this one answers (a property test
    /// says so). The caller checks the rest of "plainly routable" (a first try).
    ///
    /// Why a pass of its own: `plan`'s general loop, with its lanes, fallback and tie-break
    /// kept live for every node, cost about 140 instructions a node, 1.3-1.6 us at 100 nodes
    /// against the 1 us a decision must stay under (issue 16).
    pub fn plan_usual(&self, nodes: &[Arc<Node>], key: Option<&str>, work: &Work, now: Instant) -> Option<Plan> {
        if !self.lanes.is_empty() {
            return None;
        }
        let reader = Reader::new(key, now);
        let model = reader.model?;
        let prompt = work.prompt_tokens as f64;
        let recent_after = reader.at.saturating_sub(RESIDENT_NANOS);
        // `usize::MAX` until a node is priced: an `Option` here cost 7 instructions a node.
        let (mut best, mut best_finish) = (usize::MAX, f64::INFINITY);
        for (i, n) in nodes.iter().enumerate() {
            let glance = n.glance();
            if !(glance.is_usual() && glance.has_room()) {
                return None;
            }
            let pace = n.pace_of(model, reader.at)?;
            if lacks(&pace, work) {
                return None;
            }
            // `price`'s "answered within `RESIDENT_FOR`", as one comparison (none: `i64::MIN`).
            let resident = pace.last > recent_after || n.loaded_facts(model).0;
            // `service`, its unknowns settled as they are for a node that lacks nothing; the
            // same operations in the same order, so the same bits.
            let output = match work.output_tokens {
                Some(t) => t as f64,
                None if pace.typical_output.is_nan() => DEFAULT_OUTPUT_TOKENS,
                None => pace.typical_output,
            };
            let prefill = if pace.per_prompt.is_nan() { 0.0 } else { prompt * pace.per_prompt };
            let load = if resident || pace.load.is_nan() { 0.0 } else { pace.load };
            let finish = (output * pace.per_output + prefill + load).min(DAY_NANOS);
            if finish < best_finish - 2.0 {
                (best, best_finish) = (i, finish);
            } else if finish.is_nan() || finish <= best_finish + 2.0 {
                // A near tie (or a NaN, which no pace makes): `plan`'s exact comparison.
                return None;
            }
        }
        if best == usize::MAX {
            return None; // no nodes
        }
        let service = Duration::from_nanos(nanos(best_finish));
        Some(Plan { index: best, start: now, finish: now + service, service })
    }

    /// Count `plan` on its node's earliest slot, so no later plan in this walk counts it.
    pub fn book(&mut self, node: &Arc<Node>, plan: &Plan, now: Instant) {
        if self.once {
            return;
        }
        let lane = self.lane(node, now, plan.service);
        if let Some(slot) = lane.iter_mut().min() {
            *slot = plan.finish;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;
    use crate::node::{InFlight, NodeTuning, Registry};
    use crate::route::{PickCtx, Router};
    use crate::speed::Timing;

    fn fleet() -> Registry {
        let cfg = |name: &str, port| NodeConfig {
            name: name.into(),
            url: format!("http://127.0.0.1:{port}"),
            max_concurrency: 1,
            ..NodeConfig::default()
        };
        Registry::new(&[cfg("a", 1001), cfg("b", 1002)], NodeTuning::default()).expect("valid urls")
    }

    /// `node` generates at `tps` tokens/s (learned from one answer).
    fn teach(node: &Node, tps: u64, now: Instant) {
        let t = Timing { eval_tokens: Some(tps), eval: Some(Duration::from_secs(1)), ..Timing::default() };
        node.observe_speed("m", &t, now);
    }

    /// The tail batch: A (10 tok/s) is idle and would take 80 s for 800 tokens; B (40 tok/s)
    /// runs a request that ends in 5 s, then needs 20 s.
    fn tail_batch(now: Instant) -> (Registry, InFlight) {
        let reg = fleet();
        let nodes = reg.all();
        teach(&nodes[0], 10, now);
        teach(&nodes[1], 40, now);
        let mut running = nodes[1].try_dispatch(false).expect("b has a slot");
        running.plan(Some("m"), Some(now + Duration::from_secs(5)));
        (reg, running)
    }

    const BATCH: Work = Work { prompt_tokens: 0, output_tokens: Some(800) };

    #[tokio::test(start_paused = true)]
    async fn the_tail_batch_waits_for_the_busy_fast_node() {
        let now = Instant::now();
        let (reg, _running) = tail_batch(now);
        let nodes = reg.all();
        let plan = Board::new().plan(&nodes, Some("m:latest"), &BATCH, now, |_| 0).expect("a plan");
        assert_eq!(nodes[plan.index].name(), "b", "waiting 5 s for b beats 80 s on a: {plan:?}");
        assert_eq!(plan.start - now, Duration::from_secs(5));
        assert_eq!(plan.finish - now, Duration::from_secs(25));
        let quotes = Board::new().quotes(&nodes, Some("m:latest"), &BATCH, now);
        assert_eq!(quotes[0].start + quotes[0].service - now, Duration::from_secs(80), "a: now + 80 s");
        // least-connections sees only who is free: a.
        let free: Vec<Arc<Node>> = nodes.iter().filter(|n| n.has_capacity()).cloned().collect();
        let lc = Router::new(&crate::config::CategoryConfig::default(), Some(7));
        let ctx = PickCtx { model: Some("m"), session: None, now, work: BATCH };
        assert_eq!(free[lc.pick(&free, &ctx).expect("a pick")].name(), "a", "least-connections starts now on a");
    }

    #[tokio::test(start_paused = true)]
    async fn two_waiters_never_book_the_same_future_slot() {
        let now = Instant::now();
        let (reg, _running) = tail_batch(now);
        let nodes = reg.all();
        let mut board = Board::new();
        let mut got = Vec::new();
        for _ in 0..4 {
            let plan = board.plan(&nodes, Some("m:latest"), &BATCH, now, |_| 0).expect("a plan");
            board.book(&nodes[plan.index], &plan, now);
            got.push((nodes[plan.index].name().to_string(), (plan.start - now).as_secs()));
        }
        let want: Vec<(String, u64)> =
            [("b", 5), ("b", 25), ("b", 45), ("a", 0)].iter().map(|(n, s)| (n.to_string(), *s)).collect();
        assert_eq!(
            got, want,
            "each waiter takes the slot after the one booked before it; the fourth (b at 85 s) goes to a (80 s)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_past_its_expected_end_is_expected_to_overrun() {
        let start = Instant::now();
        let (reg, _running) = tail_batch(start);
        tokio::time::advance(Duration::from_secs(8)).await;
        let now = Instant::now();
        let q = Board::new().quotes(&reg.all(), Some("m:latest"), &BATCH, now);
        assert_eq!(q[1].start - now, Duration::from_secs(3), "3 s late: expected 3 s more, not 'any moment'");
    }

    #[test]
    fn work_is_read_from_the_body() {
        let w = Work::of(br#"{"model":"m","prompt":"hello there","options":{"num_predict":64}}"#);
        assert_eq!(w.output_tokens, Some(64));
        assert_eq!(Work::of(br#"{"model":"m","max_tokens":9}"#).output_tokens, Some(9));
        assert_eq!(Work::of(br#"{"model":"m"}"#).output_tokens, None);
    }

    /// A node as the property test below draws it: decode and prefill speed (in steps of
    /// 20 and 500 tokens a second), slots, requests running, the model loaded, cold-load
    /// seconds, and whether its last answer is past `RESIDENT_FOR`.
    type NodeSketch = (Option<u64>, Option<u64>, u32, usize, bool, Option<u64>, bool);

    /// The fleet the sketches draw, taught and loaded, with the guards of its running requests.
    /// The clock (paused) ends six minutes after the old answers.
    async fn sketched(fleet: &[NodeSketch]) -> (Registry, Vec<InFlight>) {
        let cfgs: Vec<NodeConfig> = (0..fleet.len())
            .map(|i| NodeConfig {
                name: format!("n{i}"),
                url: format!("http://127.0.0.1:{}", 1000 + i),
                max_concurrency: fleet[i].2,
                ..NodeConfig::default()
            })
            .collect();
        let reg = Registry::new(&cfgs, NodeTuning::default()).expect("valid urls");
        let mut running = Vec::new();
        // The old answers first, then six minutes on: past `RESIDENT_FOR`, not yet
        // past `FRESH_FOR`.
        for old in [true, false] {
            let now = Instant::now();
            for (n, (decode, prefill, _, _, _, load, _)) in reg.all().iter().zip(fleet).filter(|(_, f)| f.6 == old) {
                // Speeds from a few values only, so ties happen.
                let second = Some(Duration::from_secs(1));
                let t = Timing {
                    prompt_tokens: prefill.map(|p| p * 500),
                    prompt: prefill.map(|_| Duration::from_secs(1)),
                    eval_tokens: decode.map(|d| d * 20),
                    eval: decode.and(second),
                    load: load.map(Duration::from_secs),
                };
                if decode.is_some() || prefill.is_some() {
                    n.observe_speed("m", &t, now);
                }
            }
            if old {
                tokio::time::advance(Duration::from_secs(6 * 60)).await;
            }
        }
        let now = Instant::now();
        for (n, (_, _, _, busy, hot, _, _)) in reg.all().iter().zip(fleet) {
            if *hot {
                n.set_loaded(vec![crate::node::LoadedModel {
                    name: "m:latest".into(),
                    size: 1,
                    size_vram: 1,
                    context_length: None,
                }]);
            }
            for _ in 0..*busy {
                if let Some(mut g) = n.try_dispatch(false) {
                    g.plan(Some("m"), Some(now + Duration::from_secs(3)));
                    running.push(g);
                }
            }
        }
        (reg, running)
    }

    proptest::proptest! {
        /// The one-pass `plan` chooses what the minimum of `quotes` by the documented order
        /// chooses, on fleets with unknown speeds (the fallback's second pass), busy nodes,
        /// loaded models, cold loads (a model last answered past `RESIDENT_FOR`) and ties.
        #[test]
        fn plan_is_the_earliest_finish_among_the_quotes(
            fleet in proptest::collection::vec(
                (
                    proptest::option::of(1u64..4),
                    proptest::option::of(1u64..4),
                    1u32..3,
                    0usize..3,
                    proptest::bool::ANY,
                    proptest::option::of(1u64..4),
                    proptest::bool::ANY,
                ),
                1..8,
            ),
            prompt_tokens in proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..2000],
            output in proptest::option::of(1u64..500),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("rt");
            rt.block_on(async {
                let (reg, _running) = sketched(&fleet).await;
                let now = Instant::now();
                let nodes = reg.all();
                let work = Work { prompt_tokens, output_tokens: output };
                let model = Some(ModelRef::new("m:latest"));
                let rank = |n: &Node| crate::route::occupancy(n, model);
                let got = Board::new().plan(&nodes, Some("m:latest"), &work, now, rank).expect("a plan");
                let quotes = Board::new().quotes(&nodes, Some("m:latest"), &work, now);
                let (index, q) = quotes
                    .iter()
                    .enumerate()
                    .min_by_key(|(i, q)| (q.start + q.service, q.start, rank(&nodes[*i]), nodes[*i].in_flight(), *i))
                    .expect("a quote");
                proptest::prop_assert_eq!(got, Plan { index, start: q.start, finish: q.start + q.service, service: q.service });
                // One node's quote, as a request placed by another policy takes it.
                for (i, q) in quotes.iter().enumerate() {
                    let one = Board::new().quote_one(&nodes, i, Some("m:latest"), &work, now);
                    proptest::prop_assert_eq!((one.start, one.service), (q.start, q.service), "node {}", i);
                }
                // The usual-case pass: the same plan wherever it answers, and it answers
                // whenever every node has room and a pace of its own and no finishes nearly tie.
                let fast = Board::once().plan_usual(&nodes, Some("m:latest"), &work, now);
                if let Some(fast) = fast {
                    proptest::prop_assert_eq!(fast, got);
                }
                let usual = fleet.iter().all(|(decode, prefill, slots, busy, ..)| {
                    decode.is_some() && (prompt_tokens == 0 || prefill.is_some()) && (*busy as u32) < *slots
                });
                let ends: Vec<Duration> = quotes.iter().map(|q| q.start + q.service - now).collect();
                let apart = ends.iter().enumerate().all(|(i, a)| {
                    ends[..i].iter().all(|b| a.abs_diff(*b) > Duration::from_nanos(3))
                });
                if usual && apart {
                    proptest::prop_assert!(fast.is_some(), "a usual fleet with no near ties is answered");
                }
                if !usual {
                    proptest::prop_assert!(fast.is_none(), "answered {:?} for a fleet that is not usual", fast);
                }
                Ok(())
            })?;
        }
    }
}
