//! The Grafana dashboard (`docs/grafana/corral.json`) queries only what `/metrics` exports:
//! every PromQL expression in it is read, its metric names extracted (strictly: an unknown
//! function or a name that is not a series fails), and each is checked against a scrape of a
//! broker that has served requests, a failover and a cloud fallback, by the family's declared
//! type (a counter is queried as `_total`, a histogram as `_bucket`, `_sum` or `_count`, a gauge
//! by its own name).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::cluster;
use corral::config::{CloudPermission, ProviderConfig};
use corral::sim::{Faults, SimNode, SimSpec};
use reqwest::Method;
use serde_json::Value;

const DASHBOARD: &str = include_str!("../docs/grafana/corral.json");

/// PromQL functions and aggregations the dashboard may call.
const FUNCTIONS: &[&str] =
    &["sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "clamp_min", "topk"];

/// Keywords that are neither functions nor series.
const KEYWORDS: &[&str] = &["bool", "and", "or", "unless", "offset"];

/// Words followed by a list of label names, not series.
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// Skip from `open` at `chars[i]` to just past its matching `close`, minding quoted strings.
fn skip_group(chars: &[char], mut i: usize, open: char, close: char) -> Result<usize, String> {
    let mut depth = 0;
    while i < chars.len() {
        match chars[i] {
            q @ ('"' | '\'' | '`') => i = skip_string(chars, i, q)?,
            c if c == open => {
                depth += 1;
                i += 1
            }
            c if c == close => {
                depth -= 1;
                i += 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => i += 1,
        }
    }
    Err(format!("unbalanced {open}{close}"))
}

fn skip_string(chars: &[char], i: usize, quote: char) -> Result<usize, String> {
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 2,
            c if c == quote => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err("unterminated string".into())
}

/// The series names a PromQL expression reads. Label matchers (`{...}`), ranges (`[5m]`),
/// strings, numbers and Grafana variables (`$node`) are skipped; a word before `(` must be a
/// known function, a word before a label list is skipped with it, any other word is a series.
fn metric_names(expr: &str) -> Result<Vec<String>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let (mut i, mut names) = (0, Vec::new());
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            i = skip_group(&chars, i, '{', '}')?;
        } else if c == '[' {
            i = skip_group(&chars, i, '[', ']')?;
        } else if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i, c)?;
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let rest: String = chars[next..].iter().collect();
            // `sum by (node) (...)`: an aggregation with its label list before the parenthesis.
            let grouped = ["by", "without"]
                .iter()
                .any(|k| rest.strip_prefix(k).is_some_and(|r| r.starts_with(|c: char| c.is_whitespace() || c == '(')));
            let call = chars.get(next) == Some(&'(') || grouped;
            if LABEL_LISTS.contains(&word.as_str()) {
                i = if call {
                    skip_group(&chars, next, '(', ')')?
                } else {
                    return Err(format!("`{word}` without labels"));
                };
            } else if call {
                if !FUNCTIONS.contains(&word.as_str()) {
                    return Err(format!("unknown function `{word}`"));
                }
            } else if !KEYWORDS.contains(&word.as_str()) {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    Ok(names)
}

/// Every PromQL string in the dashboard: panel targets' `expr` and the template variables'
/// `label_values(series, label)` queries (their series only), with where each was found.
fn queries(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let here = format!("{at}.{k}");
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => out.push((here, e.clone())),
                    ("query", Value::String(q)) if q.starts_with("label_values(") => {
                        let inner = q.trim_start_matches("label_values(").trim_end_matches(')');
                        let series = inner.rsplit_once(',').map_or(inner, |(s, _)| s);
                        out.push((here, series.trim().to_string()));
                    }
                    _ => queries(v, &here, out),
                }
            }
        }
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| queries(v, &format!("{at}[{i}]"), out)),
        _ => {}
    }
}

/// What a scrape exports: each family's type (`# TYPE`), and the sample names with a value.
fn exported(text: &str) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut types = BTreeMap::new();
    let mut samples = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                types.insert(name.to_string(), kind.to_string());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            samples.insert(name.to_string());
        }
    }
    (types, samples)
}

/// Whether `name` is a series of a family the scrape declares, as that family's type names
/// its series (OpenMetrics: counters `_total`, histograms `_bucket` / `_sum` / `_count`).
fn declared(name: &str, types: &BTreeMap<String, String>) -> bool {
    let of = |suffix: &str, kind: &[&str]| {
        name.strip_suffix(suffix).and_then(|f| types.get(f)).is_some_and(|t| kind.contains(&t.as_str()))
    };
    types.get(name).is_some_and(|t| t == "gauge" || t == "unknown")
        || of("_total", &["counter"])
        || of("_bucket", &["histogram"])
        || of("_sum", &["histogram"])
        || of("_count", &["histogram"])
}

/// Names in the dashboard the scrape does not export.
fn unexported(dashboard: &Value, types: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    queries(dashboard, "$", &mut found);
    let mut missing = Vec::new();
    for (at, expr) in &found {
        match metric_names(expr) {
            Ok(names) if names.is_empty() => missing.push(format!("{at}: no series in {expr:?}")),
            Ok(names) => {
                missing.extend(names.into_iter().filter(|n| !declared(n, types)).map(|n| format!("{at}: {n}")))
            }
            Err(e) => missing.push(format!("{at}: {e} in {expr:?}")),
        }
    }
    missing
}

/// A broker over two sims that has served chats (cold loads included), one failover and one
/// cloud fallback.
async fn scrape_after_traffic() -> String {
    let cloud = SimNode::start(SimSpec { models: vec!["gpt-4o-mini".into()], cloud: true, ..SimSpec::default() })
        .await
        .expect("cloud sim starts");
    let base_url = format!("{}/v1", cloud.url());
    // A cold load above `speed::COLD_LOAD_MIN` on each node's first answer: the load time is learned.
    let c = cluster(2)
        .spec(0, |s| s.load_ms = 60)
        .spec(1, |s| s.load_ms = 60)
        .config(move |cfg| {
            cfg.categories[0].cloud = CloudPermission::OnFailure;
            cfg.categories[0].providers = vec!["cloud".into()];
            cfg.providers = vec![ProviderConfig {
                name: "cloud".into(),
                base_url,
                model_map: [("llama3.2".to_string(), "gpt-4o-mini".to_string())].into(),
                ..ProviderConfig::default()
            }];
        })
        .start()
        .await;
    c.learn_models().await;
    // Both nodes fail once: a failed attempt on each, then the cloud answers.
    for sim in &c.sims {
        sim.set_faults(Faults::statuses(500, 1));
    }
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.headers().get("x-corral-fallback").map(|v| v.to_str().unwrap_or("")), Some("cloud"));
    let _ = r.text().await;
    for stream in [false, true, false, true] {
        let r = c.chat("llama3.2", stream).await;
        assert_eq!(r.status(), 200, "a chat on a healthy node");
        let _ = r.text().await;
    }
    let r = c.admin(Method::GET, "/metrics").send().await.expect("metrics answer");
    assert_eq!(r.status(), 200);
    r.text().await.expect("metrics text")
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let text = scrape_after_traffic().await;
    let (types, samples) = exported(&text);
    let missing = unexported(&dashboard, &types);
    assert!(missing.is_empty(), "the dashboard queries what /metrics does not export: {missing:#?}\n{text}");
    // The traffic above gives every queried series a sample, so a name the broker declares but
    // never fills cannot slip in either.
    let mut found = Vec::new();
    queries(&dashboard, "$", &mut found);
    let queried: BTreeSet<String> = found.iter().flat_map(|(_, e)| metric_names(e).unwrap_or_default()).collect();
    let empty: Vec<&String> = queried.iter().filter(|n| !samples.contains(*n)).collect();
    assert!(empty.is_empty(), "queried series with no sample after traffic: {empty:?}\n{text}");
    assert!(queried.len() >= 10, "the dashboard covers latency, TTFT, tokens, outcomes, queue, breaker, fallback");
}

#[test]
fn the_check_fails_on_a_made_up_metric_or_a_wrong_suffix() {
    let scrape = "# TYPE corral_requests counter\ncorral_requests_total{node=\"a\"} 1\n\
                  # TYPE corral_request_duration_seconds histogram\n# TYPE corral_queue_depth gauge\ncorral_queue_depth 0\n";
    let (types, _) = exported(scrape);
    let dash = |expr: &str| serde_json::json!({ "panels": [{ "targets": [{ "expr": expr }] }] });
    let ok = "histogram_quantile(0.95, sum by (node, le) (rate(corral_request_duration_seconds_bucket{node=~\"$node\"}[$__rate_interval])))";
    assert!(unexported(&dash(ok), &types).is_empty(), "a histogram's _bucket is its series");
    assert!(unexported(&dash("sum(rate(corral_requests_total[5m])) / corral_queue_depth"), &types).is_empty());
    for bad in [
        "rate(corral_made_up_total[5m])",
        "rate(corral_requests[5m])",
        "corral_request_duration_seconds",
        "corral_queue_depth_bucket",
        "corral_queue_depth_total",
        "frobnicate(corral_queue_depth)",
        "sum by (node) (up)",
        "sum by node (corral_queue_depth)",
        "{__name__=\"corral_queue_depth\"}",
    ] {
        assert!(!unexported(&dash(bad), &types).is_empty(), "{bad:?} must fail the check");
    }
    // Label names and strings are not series.
    assert_eq!(
        metric_names("sum without (corral_fake) (corral_queue_depth{node=\"corral_fake\"}) > bool 1"),
        Ok(vec!["corral_queue_depth".to_string()])
    );
}

#[test]
fn the_dashboard_is_importable_with_its_datasource_as_an_input() {
    let d: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert_eq!(d["__inputs"][0]["name"], "DS_PROMETHEUS");
    assert_eq!(d["__inputs"][0]["pluginId"], "prometheus");
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("a panel id")), "panel ids are unique: {}", p["id"]);
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {} uses the input", p["title"]);
            for t in p["targets"].as_array().expect("targets") {
                assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "target of {} uses the input", p["title"]);
            }
        }
    }
}
