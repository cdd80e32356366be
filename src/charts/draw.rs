//! Drawing a [`Snapshot`] with plotters, for `corral report` (PNG or SVG, every chart on one
//! page) and `/admin/charts/{chart}.svg`. Lines are connected within runs of buckets that have
//! data and broken where a bucket has none; a value with no neighbour gets a marker so it
//! shows. Text is 13.7 px and more in the SVG (plotters sizes 17 to 24) in an embedded DejaVu Sans, so output does
//! not depend on the fonts installed. Colours match the UI's (`ui/src/charts/look.ts`).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Chart, Series, Snapshot};

/// Node colours, by a node's index in [`Snapshot::nodes`]; no green or red, which say health.
pub const NODE_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(227, 119, 194),
    RGBColor(140, 86, 75),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
];

const CAPTION: u32 = 24;
const LABEL: u32 = 18;
const LEGEND: u32 = 17;

/// The colour of a node state (the UI's `--ok`, `--warn`, `--bad`, `--info`, `--idle`).
pub fn state_color(state: &str) -> RGBColor {
    match state {
        "healthy" => RGBColor(47, 125, 79),
        "recovering" => RGBColor(183, 121, 31),
        "unhealthy" => RGBColor(192, 57, 43),
        "draining" => RGBColor(43, 108, 176),
        "disabled" => RGBColor(138, 148, 142),
        _ => RGBColor(201, 209, 204),
    }
}

/// The colour of an outcome, in [`OUTCOMES`] order.
pub fn outcome_color(outcome: &str) -> RGBColor {
    match outcome {
        "ok" => RGBColor(47, 125, 79),
        "fallback" => RGBColor(43, 108, 176),
        "client_error" => RGBColor(183, 121, 31),
        "error" => RGBColor(192, 57, 43),
        "interrupted" => RGBColor(142, 68, 173),
        "cancelled" => RGBColor(138, 148, 142),
        "unknown" => RGBColor(107, 117, 111),
        _ => RGBColor(90, 90, 90),
    }
}

/// The states a health chart's legend lists, in order.
const STATES: [&str; 6] = ["healthy", "recovering", "unhealthy", "draining", "disabled", "unknown"];

/// Make the embedded font available to plotters (idempotent).
pub fn ensure_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
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

/// A line to draw: its values, colour, legend label (`None`: no legend entry) and dash.
struct Line<'a> {
    values: &'a [Option<f64>],
    color: RGBColor,
    label: Option<String>,
    dashed: bool,
}

/// Runs of consecutive buckets with a value, as (x at the bucket's middle, value) points.
fn runs(snap: &Snapshot, values: &[Option<f64>]) -> Vec<Vec<(i64, f64)>> {
    let mut out: Vec<Vec<(i64, f64)>> = vec![Vec::new()];
    for (start, v) in snap.buckets.iter().zip(values) {
        match v {
            Some(v) => {
                if let Some(run) = out.last_mut() {
                    run.push((start + snap.bucket_ms / 2, *v));
                }
            }
            None if out.last().is_some_and(|r| !r.is_empty()) => out.push(Vec::new()),
            None => {}
        }
    }
    out.retain(|r| !r.is_empty());
    out
}

fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    snap: &Snapshot,
    lines: &[Line],
) -> DrawResult {
    let max = lines.iter().flat_map(|l| l.values.iter().flatten()).fold(0.0f64, |a, b| a.max(*b));
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", CAPTION))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(
            snap.from_ms..snap.from_ms + snap.bucket_ms * snap.buckets.len() as i64,
            0.0..(max * 1.1).max(1.0),
        )?;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(5)
        .x_label_formatter(&|x| clock(*x))
        .y_label_formatter(&|v| if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.1}") })
        .label_style(("sans-serif", LABEL))
        .draw()?;
    if snap.requests == 0 && lines.iter().all(|l| l.values.iter().flatten().all(|v| *v == 0.0)) {
        let (w, h) = area.dim_in_pixel();
        let style = ("sans-serif", LABEL + 2).into_text_style(area).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Center,
        ));
        area.draw_text("no requests in this window", &style, (w as i32 / 2, h as i32 / 2))?;
    }
    let mut labelled = false;
    for l in lines {
        let color = l.color;
        let style = color.stroke_width(if l.dashed { 2 } else { 3 });
        for (k, run) in runs(snap, l.values).into_iter().enumerate() {
            // A lone value has no neighbour to draw a line to: a marker shows it.
            if run.len() == 1 {
                chart.draw_series(run.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
            }
            let drawn = if l.dashed {
                chart.draw_series(DashedLineSeries::new(run, 8, 5, style))?
            } else {
                chart.draw_series(LineSeries::new(run, style))?
            };
            if let (0, Some(label)) = (k, &l.label) {
                labelled = true;
                drawn
                    .label(label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3)));
            }
        }
    }
    if labelled {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", LEGEND))
            .draw()?;
    }
    Ok(())
}

fn draw_health<DB: DrawingBackend>(whole: &DrawingArea<DB, Shift>, snap: &Snapshot) -> DrawResult {
    // The state key beside the plot, not over the bands.
    let (area, key) = whole.split_horizontally(whole.dim_in_pixel().0.saturating_sub(150));
    state_key(&key)?;
    let area = &area;
    let rows = snap.health.len().max(1) as i32;
    let names: Vec<String> = snap.health.iter().map(|h| h.node.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(Chart::Health.title(), ("sans-serif", CAPTION))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(snap.from_ms..snap.to_ms.max(snap.from_ms + 1), (0..rows).into_segmented())?;
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
        .label_style(("sans-serif", LABEL))
        .draw()?;
    for (i, h) in snap.health.iter().enumerate() {
        let i = i as i32;
        chart.draw_series(h.bands.iter().map(|b| {
            let mut r = Rectangle::new(
                [(b.from, SegmentValue::Exact(i)), (b.to, SegmentValue::Exact(i + 1))],
                state_color(&b.state).filled(),
            );
            r.set_margin(4, 4, 0, 0);
            r
        }))?;
    }
    Ok(())
}

/// A key for every state colour, whether or not it appears.
fn state_key<DB: DrawingBackend>(key: &DrawingArea<DB, Shift>) -> DrawResult {
    let style = ("sans-serif", LEGEND).into_text_style(key);
    for (i, state) in STATES.iter().enumerate() {
        let y = 48 + 26 * i as i32;
        key.draw(&Rectangle::new([(8, y - 7), (24, y + 7)], state_color(state).filled()))?;
        key.draw_text(state, &style, (32, y - 8))?;
    }
    Ok(())
}

/// A line per node of `series`, coloured by the node's place in the snapshot.
fn node_lines<'a>(snap: &Snapshot, series: &'a [Series], dashed: bool) -> Vec<Line<'a>> {
    series
        .iter()
        .map(|s| Line {
            values: &s.values,
            color: NODE_COLORS[snap.nodes.iter().position(|n| *n == s.name).unwrap_or(0) % NODE_COLORS.len()],
            label: (!dashed).then(|| s.name.clone()),
            dashed,
        })
        .collect()
}

/// Draw one chart into `area`.
pub fn draw<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, chart: Chart, snap: &Snapshot) -> DrawResult {
    ensure_font();
    area.fill(&WHITE)?;
    let title = chart.title();
    match chart {
        Chart::Latency => {
            let mut lines = node_lines(snap, &snap.latency_p50.nodes, false);
            lines.extend(node_lines(snap, &snap.latency_p95.nodes, true));
            draw_lines(area, title, snap, &lines)
        }
        Chart::Ttfb => draw_lines(area, title, snap, &node_lines(snap, &snap.ttfb_p50.nodes, false)),
        Chart::Throughput => draw_lines(area, title, snap, &node_lines(snap, &snap.tokens_per_s.nodes, false)),
        Chart::Outcomes => {
            let lines: Vec<Line> = snap
                .outcomes
                .iter()
                .map(|s| Line {
                    values: &s.values,
                    color: outcome_color(&s.name),
                    label: Some(s.name.clone()),
                    dashed: false,
                })
                .collect();
            draw_lines(area, title, snap, &lines)
        }
        Chart::Queue => {
            let line = Line { values: &snap.queue_depth, color: NODE_COLORS[0], label: None, dashed: false };
            draw_lines(area, title, snap, &[line])
        }
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
    let size = (1600, 1500);
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
    ensure_font();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(48);
    header.draw_text(
        &format!(
            "Corral report: {} to {} (UTC), {} requests; tokens/s = output tokens / generation time",
            clock(snap.from_ms),
            clock(snap.to_ms),
            snap.requests
        ),
        &("sans-serif", 26).into_text_style(&header),
        (16, 12),
    )?;
    for (area, chart) in body.split_evenly((3, 2)).iter().zip(Chart::ALL) {
        draw(area, chart, snap)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::fixed;
    use super::super::OUTCOMES;
    use super::*;

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
    fn svg_has_the_titles_node_names_and_readable_text() {
        let svg = svg(Chart::Latency, &fixed(), (640, 360)).expect("renders");
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("Latency p50"));
        assert!(svg.contains("gpu0") && svg.contains("gpu1"), "legend names the nodes");
        let sizes: Vec<f64> = svg
            .split("font-size=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next()?.trim_end_matches("px").parse().ok())
            .collect();
        assert!(!sizes.is_empty(), "the SVG has text with sizes");
        assert!(sizes.iter().all(|s| *s >= 12.0), "every text is at least 12 px: {sizes:?}");
    }

    #[test]
    fn a_gap_splits_the_line_and_a_lone_value_gets_a_marker() {
        let s = fixed();
        // gpu0's latency has values in buckets 0, 1 and 5: one run of two, one of one.
        let gpu0 = &s.latency_p50.nodes[0].values;
        let r = runs(&s, gpu0);
        assert_eq!(r.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(r[0][0].0, 5_000, "a value sits at its bucket's middle");
    }

    #[test]
    fn the_health_chart_has_a_legend_for_every_state() {
        let svg = svg(Chart::Health, &fixed(), (640, 360)).expect("renders");
        for state in STATES {
            assert!(svg.lines().any(|l| l.trim() == state), "the legend names {state}");
        }
        assert!(OUTCOMES.iter().all(|o| outcome_color(o) != RGBColor(90, 90, 90)), "every outcome has its colour");
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
