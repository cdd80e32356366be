//! Charts: the recent past as bucketed numbers, one computation for every chart Corral shows.
//!
//! `Snapshot::build` turns request rows and node events from the store into series over fixed
//! time buckets: latency p50/p95, time to first byte p50 and tokens/s, each per node and for
//! the whole cluster; requests by outcome; queue depth (the peak per bucket, reconstructed
//! exactly from each request's arrival and queue wait); and a health timeline of state bands
//! per node. The UI draws its live charts from this snapshot as JSON
//! (`GET /admin/charts/series`), and `draw` renders the same snapshot with plotters for
//! `corral report` and `/admin/charts/{chart}.svg`, so a number on screen and in a report is one
//! number.
//!
//! Invariants: a request counts in the bucket where it ended (a past bucket does not change
//! as long requests finish); a bucket with no request has no latency, first byte or tokens/s
//! (`None`, drawn as a gap, never as 0), while counts (outcomes, queue depth) are 0 there.
//! Tokens per second has one definition ([`generation`]): completion tokens / the node's
//! generation time, aggregated as total tokens / total generation seconds; the node cards of
//! `/admin/status` use the same function.

mod draw;

use std::collections::BTreeMap;

use serde::Serialize;

pub use draw::{draw, ensure_font, report, svg, ChartError};

use crate::store::{NodeEventRow, RequestRow};

/// The charts there are, by URL name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    Latency,
    Ttfb,
    Throughput,
    Outcomes,
    Queue,
    Health,
}

impl Chart {
    pub const ALL: [Chart; 6] =
        [Chart::Latency, Chart::Ttfb, Chart::Throughput, Chart::Outcomes, Chart::Queue, Chart::Health];

    pub fn name(self) -> &'static str {
        match self {
            Self::Latency => "latency",
            Self::Ttfb => "ttfb",
            Self::Throughput => "throughput",
            Self::Outcomes => "outcomes",
            Self::Queue => "queue",
            Self::Health => "health",
        }
    }

    pub fn from_name(name: &str) -> Option<Chart> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::Latency => "Latency p50 (solid) / p95 (dashed), ms",
            Self::Ttfb => "Time to first token p50, ms",
            Self::Throughput => "Tokens/s (output tokens / generation time)",
            Self::Outcomes => "Requests by outcome",
            Self::Queue => "Queue depth (peak)",
            Self::Health => "Node health",
        }
    }
}

/// Fixed time buckets: `count` steps of `step_ms` from `from_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Buckets {
    pub from_ms: i64,
    pub step_ms: i64,
    pub count: usize,
}

impl Buckets {
    /// `count` buckets of `step_ms` aligned to multiples of the step, the last one holding
    /// `now_ms`: polled again a second later, the same buckets come back (only the last grows).
    pub fn ending_at(now_ms: i64, step_ms: i64, count: usize) -> Buckets {
        let step_ms = step_ms.max(1);
        let count = count.max(1);
        let last = now_ms.div_euclid(step_ms) * step_ms;
        Buckets { from_ms: last - (count as i64 - 1) * step_ms, step_ms, count }
    }

    /// `count` equal buckets over `[from_ms, to_ms)` (a report's window).
    pub fn spanning(from_ms: i64, to_ms: i64, count: usize) -> Buckets {
        let count = count.max(1);
        let step_ms = ((to_ms - from_ms) / count as i64).max(1);
        Buckets { from_ms, step_ms, count }
    }

    /// The end of the last bucket.
    pub fn to_ms(&self) -> i64 {
        self.from_ms + self.step_ms * self.count as i64
    }

    /// Which bucket `t` falls in, if any.
    pub fn index(&self, t: i64) -> Option<usize> {
        (t >= self.from_ms && t < self.to_ms()).then(|| ((t - self.from_ms) / self.step_ms) as usize)
    }

    /// Each bucket's start.
    pub fn starts(&self) -> impl Iterator<Item = i64> + '_ {
        (0..self.count as i64).map(|i| self.from_ms + i * self.step_ms)
    }
}

/// A named line: one value per bucket, `None` where there is no data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// One measure for the whole cluster and per node.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Metric {
    pub cluster: Vec<Option<f64>>,
    pub nodes: Vec<Series>,
}

/// One state held by a node over `[from, to)`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Band {
    pub from: i64,
    pub to: i64,
    pub state: String,
}

/// A node's states over the window, back to back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeHealth {
    pub node: String,
    pub bands: Vec<Band>,
}

/// Everything the charts show, for a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    pub from_ms: i64,
    /// The end of the data (now, for a live window): the last bucket may be partly in the future.
    pub to_ms: i64,
    pub bucket_ms: i64,
    /// Each bucket's start; every `values` list is aligned to it.
    pub buckets: Vec<i64>,
    /// Every node the snapshot names, sorted: a node's colour is its index here.
    pub nodes: Vec<String>,
    /// Requests that ended in the window.
    pub requests: usize,
    pub latency_p50: Metric,
    pub latency_p95: Metric,
    pub ttfb_p50: Metric,
    pub tokens_per_s: Metric,
    /// Requests per bucket by outcome (`ok`, `fallback`, `error`, ...), in [`OUTCOMES`] order.
    pub outcomes: Vec<Series>,
    pub queue_depth: Vec<Option<f64>>,
    pub health: Vec<NodeHealth>,
}

/// Outcomes in the order they are listed and coloured; a status not named here comes after.
pub const OUTCOMES: [&str; 7] = ["ok", "fallback", "client_error", "error", "interrupted", "cancelled", "unknown"];

/// Nearest-rank percentile of an ascending slice (0 for an empty one).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Tokens per second's one definition, for one request: `(completion tokens, generation
/// seconds)`, where generation time is the node's own `eval_duration` (the time it spent
/// producing the tokens, without loading or reading the prompt), or, for an answer that does
/// not report it, the streaming time after the first byte. `None` when either is unknown or 0.
/// Aggregate as total tokens / total seconds, never as a mean of per-request rates.
pub fn generation(r: &RequestRow) -> Option<(f64, f64)> {
    let tokens = r.completion_tokens.filter(|t| *t > 0)?;
    let us = r.generation_us.or_else(|| match (r.streamed, r.total_ms, r.ttfb_ms) {
        (true, Some(total), Some(first)) if total > first => Some((total - first) * 1_000),
        _ => None,
    })?;
    (us > 0).then(|| (tokens as f64, us as f64 / 1e6))
}

/// Tokens/s of a set of requests by [`generation`]'s definition.
pub fn tokens_per_s<'a>(rows: impl IntoIterator<Item = &'a RequestRow>) -> Option<f64> {
    let (tokens, secs) = rows.into_iter().filter_map(generation).fold((0.0, 0.0), |(t, s), (a, b)| (t + a, s + b));
    (secs > 0.0).then(|| tokens / secs)
}

/// What a finished request counts as: its status, or `fallback` when a cloud answered.
pub fn outcome_of(r: &RequestRow) -> &str {
    if r.fallback.is_some() && r.status == "ok" {
        "fallback"
    } else {
        &r.status
    }
}

/// The state a node is in now (for the live window), by name.
pub type Current = [(String, String)];

impl Snapshot {
    /// Bucket `rows` and `events` into `b`, with data up to `now_ms`. `current` names the
    /// nodes configured now and their state (empty for a report), so a node with no change in
    /// view is drawn in the state it is in.
    pub fn build(rows: &[RequestRow], events: &[NodeEventRow], b: Buckets, now_ms: i64, current: &Current) -> Snapshot {
        let grid = Grid::collect(rows, b);
        let health = health_bands(rows, events, b.from_ms, now_ms, current);
        let nodes: Vec<String> = grid
            .nodes
            .keys()
            .cloned()
            .chain(health.iter().map(|h| h.node.clone()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        Snapshot {
            from_ms: b.from_ms,
            to_ms: now_ms,
            bucket_ms: b.step_ms,
            buckets: b.starts().collect(),
            nodes,
            requests: grid.requests,
            latency_p50: grid.metric(|c| c.percentile_of(&c.total, 50.0)),
            latency_p95: grid.metric(|c| c.percentile_of(&c.total, 95.0)),
            ttfb_p50: grid.metric(|c| c.percentile_of(&c.ttfb, 50.0)),
            tokens_per_s: grid.metric(|c| (c.gen_s > 0.0).then(|| c.tokens / c.gen_s)),
            outcomes: grid.outcomes(),
            queue_depth: queue_peaks(rows, b),
            health,
        }
    }
}

/// What one bucket holds for one node (or the cluster).
#[derive(Debug, Clone, Default)]
struct Cell {
    total: Vec<f64>,
    ttfb: Vec<f64>,
    tokens: f64,
    gen_s: f64,
}

impl Cell {
    fn add(&mut self, r: &RequestRow) {
        self.total.extend(r.total_ms.map(|v| v as f64));
        self.ttfb.extend(r.ttfb_ms.map(|v| v as f64));
        if let Some((tokens, secs)) = generation(r) {
            self.tokens += tokens;
            self.gen_s += secs;
        }
    }

    fn percentile_of(&self, values: &[f64], p: f64) -> Option<f64> {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| percentile(&v, p))
    }
}

/// The requests that ended in the window, sorted into buckets.
struct Grid {
    cluster: Vec<Cell>,
    nodes: BTreeMap<String, Vec<Cell>>,
    /// Per outcome, per bucket: how many requests ended that way.
    outcomes: BTreeMap<String, Vec<f64>>,
    requests: usize,
}

impl Grid {
    fn collect(rows: &[RequestRow], b: Buckets) -> Grid {
        let mut g = Grid {
            cluster: vec![Cell::default(); b.count],
            nodes: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            requests: 0,
        };
        for r in rows.iter().filter(|r| r.status != "running") {
            let Some(i) = b.index(r.finished_at.unwrap_or(r.started_at)) else { continue };
            g.requests += 1;
            g.outcomes.entry(outcome_of(r).to_string()).or_insert_with(|| vec![0.0; b.count])[i] += 1.0;
            g.cluster[i].add(r);
            if let Some(node) = &r.node {
                g.nodes.entry(node.clone()).or_insert_with(|| vec![Cell::default(); b.count])[i].add(r);
            }
        }
        g
    }

    fn metric(&self, f: impl Fn(&Cell) -> Option<f64>) -> Metric {
        Metric {
            cluster: self.cluster.iter().map(&f).collect(),
            nodes: self
                .nodes
                .iter()
                .map(|(name, cells)| Series { name: name.clone(), values: cells.iter().map(&f).collect() })
                .collect(),
        }
    }

    fn outcomes(&self) -> Vec<Series> {
        let rank = |name: &str| OUTCOMES.iter().position(|o| *o == name).unwrap_or(OUTCOMES.len());
        let mut out: Vec<Series> = self
            .outcomes
            .iter()
            .map(|(name, counts)| Series { name: name.clone(), values: counts.iter().map(|c| Some(*c)).collect() })
            .collect();
        out.sort_by_key(|s| rank(&s.name));
        out
    }
}

/// The most requests waiting at once in each bucket: each request waited over
/// `[started_at, started_at + queued_ms)`; a sweep over those edges finds the peaks.
fn queue_peaks(rows: &[RequestRow], b: Buckets) -> Vec<Option<f64>> {
    let mut edges: Vec<(i64, i32)> = rows
        .iter()
        .filter_map(|r| r.queued_ms.filter(|q| *q > 0).map(|q| [(r.started_at, 1), (r.started_at + q, -1)]))
        .flatten()
        .collect();
    // At the same instant a leaving request sorts first: one out and one in is not two waiting.
    edges.sort();
    let (mut depth, mut i) = (0i32, 0usize);
    b.starts()
        .map(|start| {
            while i < edges.len() && edges[i].0 < start {
                depth += edges[i].1;
                i += 1;
            }
            let mut peak = depth;
            while i < edges.len() && edges[i].0 < start + b.step_ms {
                depth += edges[i].1;
                peak = peak.max(depth);
                i += 1;
            }
            Some(f64::from(peak.max(0)))
        })
        .collect()
}

/// Per node seen in `rows`, `events` or `current`: the states it held over `[from_ms, to_ms)`,
/// back to back. A node with no event in view was in its first event's `from_state`, else in
/// its current state, else (a report's node that only served) healthy. The time before a
/// first event out of `unknown` (the broker had not started) has no band: a gap.
fn health_bands(
    rows: &[RequestRow],
    events: &[NodeEventRow],
    from_ms: i64,
    to_ms: i64,
    current: &Current,
) -> Vec<NodeHealth> {
    let mut names: BTreeMap<String, Option<&str>> = BTreeMap::new();
    for node in rows.iter().filter_map(|r| r.node.clone()).chain(events.iter().map(|e| e.node.clone())) {
        names.entry(node).or_default();
    }
    for (node, state) in current {
        names.insert(node.clone(), Some(state));
    }
    names
        .into_iter()
        .map(|(node, now)| {
            let mine: Vec<&NodeEventRow> = events.iter().filter(|e| e.node == node && e.at < to_ms).collect();
            let first = mine.first().map(|e| e.from_state.as_str());
            let mut state = first.or(now).unwrap_or("healthy").to_string();
            let mut since = from_ms;
            let mut bands = Vec::new();
            for e in mine {
                // Before a node's first known state (the broker was not running) is a gap.
                let before_start = bands.is_empty() && since == from_ms && state == "unknown";
                if e.at > since && !before_start {
                    bands.push(Band { from: since, to: e.at, state: state.clone() });
                }
                since = e.at.max(from_ms);
                state = e.to_state.clone();
            }
            bands.push(Band { from: since, to: to_ms.max(since), state });
            NodeHealth { node, bands }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (id, node, end, total ms, ttfb ms, tokens, status, queued ms)
    type Fixture<'a> = (&'a str, &'a str, i64, i64, i64, i64, &'a str, i64);

    pub(crate) fn row((id, node, end, total, ttfb, tokens, status, queued): Fixture<'_>) -> RequestRow {
        RequestRow {
            id: id.into(),
            started_at: end - total,
            finished_at: Some(end),
            node: Some(node.into()),
            total_ms: Some(total),
            ttfb_ms: Some(ttfb),
            completion_tokens: Some(tokens),
            // Generation is what follows the first byte, in these fixtures.
            generation_us: Some((total - ttfb) * 1_000),
            status: status.into(),
            queued_ms: Some(queued),
            ..RequestRow::default()
        }
    }

    pub(crate) fn event(at: i64, node: &str, from: &str, to: &str) -> NodeEventRow {
        NodeEventRow { at, node: node.into(), from_state: from.into(), to_state: to.into(), reason: "x".into() }
    }

    pub(crate) fn fixed() -> Snapshot {
        let rows = vec![
            row(("a", "gpu0", 1_000, 100, 10, 18, "ok", 0)),
            row(("b", "gpu0", 11_000, 300, 100, 40, "ok", 0)),
            row(("c", "gpu1", 21_000, 900, 100, 80, "ok", 0)),
            row(("d", "gpu1", 35_000, 500, 50, 0, "error", 0)),
            row(("e", "gpu0", 51_000, 200, 20, 36, "interrupted", 0)),
            row(("f", "gpu0", 52_000, 400, 200, 20, "ok", 0)),
        ];
        let events = vec![
            event(5_000, "gpu0", "unknown", "healthy"),
            event(30_000, "gpu1", "healthy", "unhealthy"),
            event(45_000, "gpu1", "unhealthy", "recovering"),
        ];
        Snapshot::build(&rows, &events, Buckets::spanning(0, 60_000, 6), 60_000, &[])
    }

    fn node<'a>(m: &'a Metric, name: &str) -> &'a [Option<f64>] {
        &m.nodes.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no series for {name}")).values
    }

    #[test]
    fn buckets_hold_percentiles_and_gaps_where_nothing_ended() {
        let s = fixed();
        assert_eq!(s.bucket_ms, 10_000);
        assert_eq!(s.buckets, vec![0, 10_000, 20_000, 30_000, 40_000, 50_000]);
        assert_eq!(s.requests, 6);
        assert_eq!(s.nodes, vec!["gpu0", "gpu1"]);
        // Two requests in the last bucket (200, 400 ms): nearest rank puts p50 on 400 (rank
        // round(0.5) = 1), and p95 too.
        assert_eq!(node(&s.latency_p50, "gpu0"), &[Some(100.0), Some(300.0), None, None, None, Some(400.0)]);
        assert_eq!(node(&s.latency_p95, "gpu0")[5], Some(400.0));
        assert_eq!(s.latency_p50.cluster, vec![Some(100.0), Some(300.0), Some(900.0), Some(500.0), None, Some(400.0)]);
        assert_eq!(node(&s.ttfb_p50, "gpu1"), &[None, None, Some(100.0), Some(50.0), None, None]);
    }

    #[test]
    fn tokens_per_s_is_total_tokens_over_total_generation_time() {
        let s = fixed();
        // a: 18 tokens in 90 ms = 200/s; b: 40 in 200 ms = 200/s.
        assert_eq!(node(&s.tokens_per_s, "gpu0")[..2], [Some(200.0), Some(200.0)]);
        // Last bucket: e (36 in 180 ms) and f (20 in 200 ms): 56 tokens / 0.38 s, not the mean
        // of 200/s and 100/s.
        let last = node(&s.tokens_per_s, "gpu0")[5].expect("a value");
        assert!((last - 56.0 / 0.38).abs() < 1e-9, "{last}");
        // d produced no token: no rate, a gap rather than 0.
        assert_eq!(node(&s.tokens_per_s, "gpu1")[3], None);
        let rows = [row(("x", "n", 0, 1_000, 500, 10, "ok", 0))];
        assert_eq!(tokens_per_s(&rows), Some(20.0), "10 tokens in 500 ms of generation");
    }

    #[test]
    fn generation_time_falls_back_to_streaming_time_only_for_streams() {
        let mut r = row(("x", "n", 0, 1_000, 200, 40, "ok", 0));
        r.generation_us = None;
        assert_eq!(generation(&r), None, "a whole answer without eval_duration has no generation time");
        r.streamed = true;
        assert_eq!(generation(&r), Some((40.0, 0.8)), "a stream's time after its first byte");
        r.completion_tokens = Some(0);
        assert_eq!(generation(&r), None);
    }

    #[test]
    fn outcomes_count_per_bucket_and_name_fallbacks() {
        let mut rows =
            vec![row(("a", "gpu0", 1_000, 10, 1, 1, "ok", 0)), row(("b", "gpu0", 2_000, 10, 1, 1, "error", 0))];
        let mut cloud = row(("c", "gpu0", 15_000, 10, 1, 1, "ok", 0));
        (cloud.node, cloud.fallback) = (None, Some("openai".into()));
        rows.push(cloud);
        rows.push(RequestRow { id: "r".into(), started_at: 3_000, status: "running".into(), ..Default::default() });
        let s = Snapshot::build(&rows, &[], Buckets::spanning(0, 20_000, 2), 20_000, &[]);
        let names: Vec<&str> = s.outcomes.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, vec!["ok", "fallback", "error"], "in the fixed order; running is not an outcome");
        assert_eq!(s.outcomes[1].values, vec![Some(0.0), Some(1.0)]);
        assert_eq!(s.requests, 3);
    }

    #[test]
    fn queue_depth_is_the_peak_in_each_bucket() {
        let mut a = row(("a", "n", 30_000, 20_000, 1, 1, "ok", 12_000));
        a.started_at = 12_000; // waited [12 s, 24 s)
        let mut b = row(("b", "n", 30_000, 10_000, 1, 1, "ok", 1_000));
        b.started_at = 22_000; // waited [22 s, 23 s)
        let mut c = row(("c", "n", 30_000, 10_000, 1, 1, "ok", 5_000));
        c.started_at = 24_000; // arrives as a leaves: never three at once
        let s = Snapshot::build(&[a, b, c], &[], Buckets::spanning(0, 40_000, 4), 40_000, &[]);
        assert_eq!(s.queue_depth, vec![Some(0.0), Some(1.0), Some(2.0), Some(0.0)]);
    }

    #[test]
    fn health_bands_follow_events_and_the_current_state() {
        let s = fixed();
        let gpu1 = &s.health.iter().find(|h| h.node == "gpu1").expect("gpu1").bands;
        let states: Vec<&str> = gpu1.iter().map(|b| b.state.as_str()).collect();
        assert_eq!(states, vec!["healthy", "unhealthy", "recovering"]);
        assert_eq!((gpu1[1].from, gpu1[1].to), (30_000, 45_000));
        let gpu0 = &s.health.iter().find(|h| h.node == "gpu0").expect("gpu0").bands;
        assert_eq!(gpu0, &vec![Band { from: 5_000, to: 60_000, state: "healthy".into() }], "no band before the start");
        let current = [("gpu9".to_string(), "disabled".to_string())];
        let live = Snapshot::build(&[], &[], Buckets::ending_at(100_000, 5_000, 12), 100_000, &current);
        assert_eq!(live.requests, 0);
        assert_eq!(live.health[0].bands, vec![Band { from: 45_000, to: 100_000, state: "disabled".into() }]);
    }

    #[test]
    fn live_buckets_are_aligned_and_hold_now() {
        let b = Buckets::ending_at(123_456, 5_000, 60);
        assert_eq!(b.from_ms % 5_000, 0);
        assert_eq!(b.index(123_456), Some(59), "now is in the last bucket");
        assert_eq!(b.index(b.from_ms - 1), None);
        assert_eq!(Buckets::ending_at(124_999, 5_000, 60), b, "the same buckets a second later");
    }
}
