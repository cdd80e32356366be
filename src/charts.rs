//! Charts: pure functions from a stats snapshot to SVG (for the UI) or PNG (for reports).
//!
//! `Snapshot::build` turns request rows and node events from the store into time series:
//! latency p50/p95 and time to first byte per node, tokens/s per node, requests by outcome,
//! queue depth (reconstructed exactly from each request's arrival and queue wait), and a health
//! timeline of state bands per node. `draw` renders one chart into any plotters backend, so the
//! SVG for the UI and the one-page PNG report share the code. Text uses an embedded DejaVu
//! Sans, so output does not depend on the fonts installed.

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Serialize;

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

    fn title(self) -> &'static str {
        match self {
            Self::Latency => "Latency p50 (solid) / p95 (dashed), ms",
            Self::Ttfb => "Time to first byte p50, ms",
            Self::Throughput => "Tokens per second",
            Self::Outcomes => "Requests by outcome",
            Self::Queue => "Queue depth",
            Self::Health => "Node health",
        }
    }
}

/// A named line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    pub name: String,
    /// (bucket start ms, value); buckets without data are absent.
    pub points: Vec<(i64, f64)>,
}

/// One state held by a node over `[from, to)`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Band {
    pub from: i64,
    pub to: i64,
    pub state: String,
}

/// Everything the charts show, for a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    pub from_ms: i64,
    pub to_ms: i64,
    pub bucket_ms: i64,
    pub latency_p50: Vec<Series>,
    pub latency_p95: Vec<Series>,
    pub ttfb_p50: Vec<Series>,
    pub tokens_per_s: Vec<Series>,
    pub outcomes: Vec<Series>,
    pub queue_depth: Series,
    pub health: Vec<(String, Vec<Band>)>,
}

/// Nearest-rank percentile of an ascending slice (0 for an empty one).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

impl Snapshot {
    /// Bucket `rows` and `events` over `[from_ms, to_ms)` into `buckets` steps.
    pub fn build(rows: &[RequestRow], events: &[NodeEventRow], from_ms: i64, to_ms: i64, buckets: i64) -> Snapshot {
        let bucket_ms = ((to_ms - from_ms) / buckets.max(1)).max(1);
        let samples = Samples::collect(rows, from_ms, to_ms, bucket_ms);
        let secs = bucket_ms as f64 / 1000.0;
        Snapshot {
            from_ms,
            to_ms,
            bucket_ms,
            latency_p50: per_node(&samples.total, |v| percentile(v, 50.0)),
            latency_p95: per_node(&samples.total, |v| percentile(v, 95.0)),
            ttfb_p50: per_node(&samples.ttfb, |v| percentile(v, 50.0)),
            tokens_per_s: per_node(&samples.tokens, |v| v.iter().sum::<f64>() / secs),
            outcomes: samples
                .outcomes
                .into_iter()
                .map(|(name, pts)| Series { name, points: pts.into_iter().collect() })
                .collect(),
            queue_depth: queue_depth(rows, from_ms, bucket_ms, buckets),
            health: health_bands(rows, events, from_ms, to_ms),
        }
    }
}

/// Per node, per bucket start: the values that fell into that bucket.
type PerNode = BTreeMap<String, BTreeMap<i64, Vec<f64>>>;

/// The requests that started in the window, sorted into buckets.
#[derive(Default)]
struct Samples {
    total: PerNode,
    ttfb: PerNode,
    tokens: PerNode,
    /// Per status, per bucket start: how many requests ended that way.
    outcomes: BTreeMap<String, BTreeMap<i64, f64>>,
}

impl Samples {
    fn collect(rows: &[RequestRow], from_ms: i64, to_ms: i64, bucket_ms: i64) -> Samples {
        let bucket_of = |t: i64| from_ms + ((t - from_ms) / bucket_ms) * bucket_ms;
        let mut s = Samples::default();
        for r in rows.iter().filter(|r| r.started_at >= from_ms && r.started_at < to_ms) {
            let b = bucket_of(r.started_at);
            *s.outcomes.entry(r.status.clone()).or_default().entry(b).or_default() += 1.0;
            let Some(node) = &r.node else { continue };
            for (map, value) in
                [(&mut s.total, r.total_ms), (&mut s.ttfb, r.ttfb_ms), (&mut s.tokens, r.completion_tokens)]
            {
                if let Some(v) = value {
                    map.entry(node.clone()).or_default().entry(b).or_default().push(v as f64);
                }
            }
        }
        s
    }
}

/// One series per node: `f` of each bucket's values, sorted ascending.
fn per_node(m: &PerNode, f: impl Fn(&[f64]) -> f64) -> Vec<Series> {
    m.iter()
        .map(|(node, buckets)| Series {
            name: node.clone(),
            points: buckets
                .iter()
                .map(|(b, v)| {
                    let mut v = v.clone();
                    v.sort_by(|a, b| a.total_cmp(b));
                    (*b, f(&v))
                })
                .collect(),
        })
        .collect()
}

/// Requests waiting at each bucket's midpoint: arrived, and not yet out of the queue.
fn queue_depth(rows: &[RequestRow], from_ms: i64, bucket_ms: i64, buckets: i64) -> Series {
    Series {
        name: "queued".into(),
        points: (0..buckets.max(1))
            .map(|i| {
                let t = from_ms + i * bucket_ms + bucket_ms / 2;
                let depth =
                    rows.iter().filter(|r| r.started_at <= t && r.started_at + r.queued_ms.unwrap_or(0) > t).count();
                (from_ms + i * bucket_ms, depth as f64)
            })
            .collect(),
    }
}

/// Per node seen in `rows` or `events`: the states it held over the window, back to back.
/// A node with no event in view was in its first event's `from_state`, else healthy.
fn health_bands(rows: &[RequestRow], events: &[NodeEventRow], from_ms: i64, to_ms: i64) -> Vec<(String, Vec<Band>)> {
    let mut health: BTreeMap<String, Vec<Band>> = BTreeMap::new();
    for node in rows.iter().filter_map(|r| r.node.clone()).chain(events.iter().map(|e| e.node.clone())) {
        health.entry(node).or_default();
    }
    for (node, bands) in health.iter_mut() {
        let mine: Vec<&NodeEventRow> = events.iter().filter(|e| &e.node == node).collect();
        let mut state = mine.first().map(|e| e.from_state.clone()).unwrap_or_else(|| "healthy".into());
        let mut since = from_ms;
        for e in mine.iter().filter(|e| e.at < to_ms) {
            if e.at > since {
                bands.push(Band { from: since, to: e.at, state: state.clone() });
            }
            since = e.at.max(from_ms);
            state = e.to_state.clone();
        }
        bands.push(Band { from: since, to: to_ms, state });
    }
    health.into_iter().collect()
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn state_color(state: &str) -> RGBColor {
    match state {
        "healthy" => RGBColor(46, 160, 67),
        "recovering" => RGBColor(210, 153, 34),
        "unhealthy" => RGBColor(207, 34, 46),
        "draining" => RGBColor(130, 80, 223),
        "disabled" => RGBColor(110, 119, 129),
        _ => RGBColor(175, 184, 193),
    }
}

/// Make the embedded font available to plotters (idempotent).
pub fn ensure_font() {
    register_font();
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
        if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_err() {
            tracing::warn!("the embedded chart font did not load; charts will have no text");
        }
    });
}

/// Why a chart could not be drawn or a report not written.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// plotters failed while drawing (into a string or a pixel buffer).
    #[error("cannot draw the chart: {0}")]
    Draw(String),
    /// The report was drawn but its file could not be written.
    #[error("cannot write {}: {detail}", path.display())]
    Write { path: std::path::PathBuf, detail: String },
}

impl ChartError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Draw(_) => "chart_draw_failed",
            Self::Write { .. } => "report_write_failed",
        }
    }
}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for ChartError {
    fn from(e: DrawingAreaErrorKind<E>) -> Self {
        Self::Draw(e.to_string())
    }
}

type DrawResult = Result<(), ChartError>;

fn clock(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let t = time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!("{:02}:{:02}", t.hour(), t.minute())
}

fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    snap: &Snapshot,
    solid: &[Series],
    dashed: &[Series],
) -> DrawResult {
    let max = solid.iter().chain(dashed).flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(24)
        .y_label_area_size(48)
        .build_cartesian_2d(snap.from_ms..snap.to_ms, 0.0..(max * 1.1).max(1.0))?;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(5)
        .x_label_formatter(&|x| clock(*x))
        .label_style(("sans-serif", 11))
        .draw()?;
    for (i, s) in solid.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
        // Markers, so a lone data point is visible too.
        chart.draw_series(s.points.iter().map(|p| Circle::new(*p, 2, color.filled())))?;
    }
    for (i, s) in dashed.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart.draw_series(DashedLineSeries::new(s.points.iter().copied(), 6, 4, color.stroke_width(1)))?;
    }
    if !solid.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 11))
            .draw()?;
    }
    Ok(())
}

fn draw_health<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, snap: &Snapshot) -> DrawResult {
    let rows = snap.health.len().max(1) as i32;
    let names: Vec<String> = snap.health.iter().map(|(n, _)| n.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(Chart::Health.title(), ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(24)
        .y_label_area_size(64)
        .build_cartesian_2d(snap.from_ms..snap.to_ms, (0..rows).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_labels(6)
        .y_labels(rows as usize)
        .x_label_formatter(&|x| clock(*x))
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 11))
        .draw()?;
    for (i, (_, bands)) in snap.health.iter().enumerate() {
        let i = i as i32;
        chart.draw_series(bands.iter().map(|b| {
            let mut r = Rectangle::new(
                [(b.from, SegmentValue::Exact(i)), (b.to, SegmentValue::Exact(i + 1))],
                state_color(&b.state).filled(),
            );
            r.set_margin(3, 3, 0, 0);
            r
        }))?;
    }
    Ok(())
}

/// Draw one chart into `area`.
pub fn draw<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, chart: Chart, snap: &Snapshot) -> DrawResult {
    register_font();
    area.fill(&WHITE)?;
    match chart {
        Chart::Latency => draw_lines(area, chart.title(), snap, &snap.latency_p50, &snap.latency_p95),
        Chart::Ttfb => draw_lines(area, chart.title(), snap, &snap.ttfb_p50, &[]),
        Chart::Throughput => draw_lines(area, chart.title(), snap, &snap.tokens_per_s, &[]),
        Chart::Outcomes => draw_lines(area, chart.title(), snap, &snap.outcomes, &[]),
        Chart::Queue => draw_lines(area, chart.title(), snap, std::slice::from_ref(&snap.queue_depth), &[]),
        Chart::Health => draw_health(area, snap),
    }
}

/// One chart as an SVG document.
pub fn svg(chart: Chart, snap: &Snapshot, size: (u32, u32)) -> Result<String, ChartError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        draw(&root, chart, snap)?;
        root.present()?;
    }
    Ok(out)
}

/// Every chart on one page, written to `path` (`.png` or `.svg`).
pub fn report(snap: &Snapshot, path: &std::path::Path) -> Result<(), ChartError> {
    let size = (1400, 1200);
    let is_svg = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if is_svg {
        let root = SVGBackend::new(path, size).into_drawing_area();
        page(&root, snap)?;
        root.present().map_err(|e| written(path, e))
    } else {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        page(&root, snap)?;
        root.present().map_err(|e| written(path, e))
    }
}

/// Presenting a file backend is what writes the file: its failure is a write failure.
fn written<E: std::error::Error + Send + Sync>(path: &std::path::Path, e: DrawingAreaErrorKind<E>) -> ChartError {
    ChartError::Write { path: path.to_path_buf(), detail: e.to_string() }
}

fn page<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, snap: &Snapshot) -> DrawResult {
    register_font();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(40);
    header.draw_text(
        &format!("Corral report: {} to {} (UTC)", clock(snap.from_ms), clock(snap.to_ms)),
        &("sans-serif", 20).into_text_style(&header),
        (16, 10),
    )?;
    for (area, chart) in body.split_evenly((3, 2)).iter().zip(Chart::ALL) {
        draw(area, chart, snap)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (id, node, start, total ms, ttfb ms, tokens, status, queued ms)
    type Fixture<'a> = (&'a str, &'a str, i64, i64, i64, i64, &'a str, i64);

    fn row((id, node, at, total, ttfb, tokens, status, queued): Fixture<'_>) -> RequestRow {
        RequestRow {
            id: id.into(),
            started_at: at,
            node: Some(node.into()),
            total_ms: Some(total),
            ttfb_ms: Some(ttfb),
            completion_tokens: Some(tokens),
            status: status.into(),
            queued_ms: Some(queued),
            ..RequestRow::default()
        }
    }

    pub(crate) fn fixed() -> Snapshot {
        let rows = vec![
            row(("a", "gpu0", 0, 100, 10, 20, "ok", 0)),
            row(("b", "gpu0", 10_000, 300, 30, 40, "ok", 0)),
            row(("c", "gpu1", 20_000, 900, 90, 10, "ok", 25_000)),
            row(("d", "gpu1", 35_000, 500, 50, 0, "error", 0)),
            row(("e", "gpu0", 50_000, 200, 20, 30, "interrupted", 0)),
        ];
        let events = vec![
            NodeEventRow {
                at: 30_000,
                node: "gpu1".into(),
                from_state: "healthy".into(),
                to_state: "unhealthy".into(),
                reason: "x".into(),
            },
            NodeEventRow {
                at: 45_000,
                node: "gpu1".into(),
                from_state: "unhealthy".into(),
                to_state: "recovering".into(),
                reason: "y".into(),
            },
        ];
        Snapshot::build(&rows, &events, 0, 60_000, 6)
    }

    #[test]
    fn snapshot_buckets_percentiles_queue_and_bands() {
        let s = fixed();
        assert_eq!(s.bucket_ms, 10_000);
        let gpu0 = &s.latency_p50.iter().find(|x| x.name == "gpu0").expect("gpu0").points;
        assert_eq!(gpu0, &vec![(0, 100.0), (10_000, 300.0), (50_000, 200.0)]);
        let ok = s.outcomes.iter().find(|x| x.name == "ok").expect("ok");
        assert_eq!(ok.points.iter().map(|p| p.1).sum::<f64>(), 3.0);
        // Request c waited over [20 s, 45 s): queued at the bucket midpoints 25 s and 35 s.
        let depth: Vec<f64> = s.queue_depth.points.iter().map(|p| p.1).collect();
        assert_eq!(depth, vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        let bands = &s.health.iter().find(|(n, _)| n == "gpu1").expect("gpu1").1;
        let states: Vec<&str> = bands.iter().map(|b| b.state.as_str()).collect();
        assert_eq!(states, vec!["healthy", "unhealthy", "recovering"]);
        assert_eq!(bands[1].from, 30_000);
        assert_eq!(bands[1].to, 45_000);
        let tps = &s.tokens_per_s.iter().find(|x| x.name == "gpu0").expect("gpu0").points;
        assert_eq!(tps[0], (0, 2.0), "20 tokens in a 10 s bucket");
    }

    #[test]
    fn charts_match_their_snapshots() {
        let s = fixed();
        for chart in Chart::ALL {
            let svg = svg(chart, &s, (640, 360)).expect("renders");
            let path = format!("{}/tests/snapshots/chart-{}.svg", env!("CARGO_MANIFEST_DIR"), chart.name());
            if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
                std::fs::write(&path, &svg).expect("write snapshot");
                continue;
            }
            let want = std::fs::read_to_string(&path)
                .unwrap_or_else(|_| panic!("missing {path}; run with UPDATE_SNAPSHOTS=1"));
            assert_eq!(
                svg,
                want,
                "{} chart changed; inspect it and run with UPDATE_SNAPSHOTS=1 if intended",
                chart.name()
            );
        }
    }

    #[test]
    fn svg_has_the_titles_and_node_names() {
        let svg = svg(Chart::Latency, &fixed(), (640, 360)).expect("renders");
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("Latency p50"));
        assert!(svg.contains("gpu0") && svg.contains("gpu1"), "legend names the nodes");
    }

    #[test]
    fn a_report_that_cannot_be_written_says_where() {
        let dir = std::env::temp_dir().join(format!("corral-charts-missing-{}", std::process::id()));
        for name in ["report.svg", "report.png"] {
            let path = dir.join(name);
            let err = report(&fixed(), &path).expect_err("the directory does not exist");
            assert_eq!(err.code(), "report_write_failed", "{err}");
            assert!(err.to_string().contains(&path.display().to_string()), "the message names the file: {err}");
        }
    }
}
