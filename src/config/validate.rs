//! Validation: every problem in a config, each with the dotted path of the value at fault
//! (`nodes[1].url`) and, when the text is at hand, the line it sits on.
//!
//! `Config::validate` never stops at the first problem: each section has its own check, and
//! every check runs and pushes what it finds, in a fixed order (listeners, admin, nodes,
//! categories, providers, the numeric settings, alerts, retry), so the same config always
//! gives the same list. Checks only read the config: they fix nothing and fill in nothing, and
//! a config with an empty list is safe to run. The paths and messages are shown to people and
//! matched by tests and scripts: change them only on purpose. `Locator` maps a path back to its
//! line through `toml_edit`'s spans, walking up the path when the value itself is not in the
//! file (a default that breaks a rule points at its section).

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;

use super::schema::{CloudPermission, Config};

/// One thing wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the offending value, e.g. `nodes[1].url`.
    pub path: String,
    /// 1-based line in the file, when the value could be located.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: ")?,
            None => write!(f, "")?,
        }
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one config text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(f, "{n} problem{} in config", if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

impl ConfigError {
    pub fn code(&self) -> &'static str {
        "invalid_config"
    }
}

impl Config {
    /// Semantic checks over the whole config: `(path, message)` for every problem.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut push = |path: String, msg: String| out.push((path, msg));

        if self.listeners.is_empty() {
            push("listeners".into(), "at least one proxy listener is needed".into());
        }
        let mut addrs = HashSet::new();
        for (i, l) in self.listeners.iter().enumerate() {
            match l.addr.parse::<SocketAddr>() {
                Err(_) => push(
                    format!("listeners[{i}].addr"),
                    format!("\"{}\" is not an address like 127.0.0.1:11400", l.addr),
                ),
                Ok(a) => {
                    // Port 0 means "any free port": never a clash.
                    if a.port() != 0 && !addrs.insert(a) {
                        push(format!("listeners[{i}].addr"), format!("{a} is used twice"));
                    }
                }
            }
            for (j, k) in l.api_keys.iter().enumerate() {
                if crate::secrets::check_name(k).is_err() {
                    push(
                        format!("listeners[{i}].api_keys[{j}]"),
                        format!("\"{k}\" is not a secret name (a-z, 0-9, '-', '_', '.')"),
                    );
                }
            }
            if let Some(c) = &l.category {
                if !self.categories.iter().any(|k| &k.name == c) {
                    push(format!("listeners[{i}].category"), format!("no category named \"{c}\""));
                }
            }
        }
        match self.admin.addr.parse::<SocketAddr>() {
            Err(_) => {
                push("admin.addr".into(), format!("\"{}\" is not an address like 127.0.0.1:11402", self.admin.addr))
            }
            Ok(a) => {
                if a.port() != 0 && addrs.contains(&a) {
                    push("admin.addr".into(), format!("{a} is also a proxy listener"));
                }
            }
        }

        if self.nodes.is_empty() {
            push("nodes".into(), "at least one node is needed".into());
        }
        let mut names = HashSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.name.is_empty() {
                push(format!("nodes[{i}].name"), "a node needs a name".into());
            } else if !n.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c)) {
                push(format!("nodes[{i}].name"), format!("\"{}\" may only use a-z, 0-9, '-', '_' and '.'", n.name));
            } else if !names.insert(n.name.as_str()) {
                push(format!("nodes[{i}].name"), format!("\"{}\" is used by an earlier node", n.name));
            }
            match url::Url::parse(&n.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                Ok(u) => push(
                    format!("nodes[{i}].url"),
                    format!("\"{}\" must be an http:// or https:// URL with a host (got scheme {})", n.url, u.scheme()),
                ),
                Err(e) => push(format!("nodes[{i}].url"), format!("\"{}\" is not a URL: {e}", n.url)),
            }
            if n.weight == 0 {
                push(format!("nodes[{i}].weight"), "must be greater than 0".into());
            }
            if n.max_concurrency == 0 {
                push(format!("nodes[{i}].max_concurrency"), "must be at least 1".into());
            }
        }

        let mut cats = HashSet::new();
        for (i, c) in self.categories.iter().enumerate() {
            if c.name.is_empty() {
                push(format!("categories[{i}].name"), "a category needs a name".into());
            } else if !cats.insert(c.name.as_str()) {
                push(format!("categories[{i}].name"), format!("\"{}\" is used by an earlier category", c.name));
            }
            for (j, o) in c.order.iter().enumerate() {
                if !self.nodes.iter().any(|n| &n.name == o) {
                    push(format!("categories[{i}].order[{j}]"), format!("no node named \"{o}\""));
                }
            }
            if c.queue_timeout_ms == 0 {
                push(format!("categories[{i}].queue_timeout_ms"), "must be greater than 0".into());
            }
            for (j, p) in c.providers.iter().enumerate() {
                if !self.providers.iter().any(|q| &q.name == p) {
                    push(format!("categories[{i}].providers[{j}]"), format!("no provider named \"{p}\""));
                }
            }
            if c.cloud == CloudPermission::OnFailure && c.providers.is_empty() {
                push(
                    format!("categories[{i}].providers"),
                    "cloud = \"on-failure\" needs at least one provider to fall back to".into(),
                );
            }
            for (j, m) in c.models.iter().enumerate() {
                if m.is_empty() {
                    push(format!("categories[{i}].models[{j}]"), "an empty pattern matches nothing".into());
                }
            }
        }

        let mut provs = HashSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            if p.name.is_empty() {
                push(format!("providers[{i}].name"), "a provider needs a name".into());
            } else if !provs.insert(p.name.as_str()) {
                push(format!("providers[{i}].name"), format!("\"{}\" is used by an earlier provider", p.name));
            }
            match url::Url::parse(&p.base_url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                Ok(_) => push(
                    format!("providers[{i}].base_url"),
                    format!("\"{}\" must be an http:// or https:// URL", p.base_url),
                ),
                Err(e) => push(format!("providers[{i}].base_url"), format!("\"{}\" is not a URL: {e}", p.base_url)),
            }
            if !p.secret.is_empty() && crate::secrets::check_name(&p.secret).is_err() {
                push(
                    format!("providers[{i}].secret"),
                    format!("\"{}\" is not a secret name (a-z, 0-9, '-', '_', '.')", p.secret),
                );
            }
            for (field, v) in
                [("connect_timeout_ms", p.connect_timeout_ms), ("first_byte_timeout_ms", p.first_byte_timeout_ms)]
            {
                if v == 0 {
                    push(format!("providers[{i}].{field}"), "must be greater than 0".into());
                }
            }
        }

        for (field, v) in [
            ("proxy.connect_timeout_ms", self.proxy.connect_timeout_ms),
            ("proxy.first_byte_timeout_ms", self.proxy.first_byte_timeout_ms),
            ("proxy.idle_timeout_ms", self.proxy.idle_timeout_ms),
            ("proxy.max_body_bytes", self.proxy.max_body_bytes as u64),
            ("health.interval_ms", self.health.interval_ms),
            ("health.timeout_ms", self.health.timeout_ms),
            ("health.deep_interval_ms", self.health.deep_interval_ms),
            ("health.failures_to_down", u64::from(self.health.failures_to_down)),
            ("health.successes_to_up", u64::from(self.health.successes_to_up)),
            ("breaker.failures_to_open", u64::from(self.breaker.failures_to_open)),
            ("breaker.trial_requests", u64::from(self.breaker.trial_requests)),
            ("queue.max_requests", self.queue.max_requests as u64),
            ("store.max_rows", self.store.max_rows),
            ("store.channel_capacity", self.store.channel_capacity as u64),
            ("store.retention_interval_ms", self.store.retention_interval_ms),
            ("queue.max_bytes", self.queue.max_bytes as u64),
            ("proxy.default_num_ctx", self.proxy.default_num_ctx),
            ("proxy.header_read_timeout_ms", self.proxy.header_read_timeout_ms),
            ("retry.max_attempts", u64::from(self.retry.max_attempts)),
        ] {
            if v == 0 {
                push(field.into(), "must be greater than 0".into());
            }
        }
        if !(0.0..=1.0).contains(&self.alerts.fallback_share) {
            push("alerts.fallback_share".into(), "must be between 0 and 1 (0 turns the alert off)".into());
        }
        if self.alerts.fallback_window_ms < 1_000 {
            push("alerts.fallback_window_ms".into(), "must be at least 1000".into());
        }
        if !(0.0..=1.0).contains(&self.retry.budget_ratio) {
            push("retry.budget_ratio".into(), "must be between 0 and 1".into());
        }
        if self.retry.backoff_cap_ms < self.retry.backoff_base_ms {
            push("retry.backoff_cap_ms".into(), "must not be smaller than retry.backoff_base_ms".into());
        }
        out
    }
}

/// Finds the line of a dotted path in the original text.
pub(super) struct Locator<'a> {
    pub(super) text: &'a str,
    pub(super) doc: &'a toml_edit::ImDocument<&'a str>,
}

impl Locator<'_> {
    pub(super) fn serde_problem(&self, path: &str, e: toml::de::Error) -> Problem {
        let message = e.message().trim().to_string();
        // serde names the offending field (or the offending value) in backticks: point at the
        // key it belongs to when the file has it.
        let quoted = message.split('`').nth(1).unwrap_or_default();
        let full = if self.item(&format!("{path}.{quoted}")).is_some() {
            format!("{path}.{quoted}")
        } else {
            self.key_with_value(path, quoted).map(|k| format!("{path}.{k}")).unwrap_or_else(|| path.to_string())
        };
        Problem { line: self.line(&full, None), path: full, message }
    }

    pub(super) fn line(&self, path: &str, _hint: Option<usize>) -> Option<usize> {
        // Walk back up the path until something has a span.
        let mut p = path.to_string();
        loop {
            if let Some(span) = self.span(&p) {
                return Some(line_of(self.text, span.start));
            }
            match p.rfind(['.', '[']) {
                Some(i) => p.truncate(i),
                None => return None,
            }
        }
    }

    /// The key of the table at `path` whose value is the string `value`.
    fn key_with_value(&self, path: &str, value: &str) -> Option<String> {
        let table: Vec<(String, Option<String>)> = match self.item(path)? {
            Located::Table(t) => t.iter().map(|(k, v)| (k.to_string(), v.as_str().map(str::to_string))).collect(),
            Located::Item(toml_edit::Item::Table(t)) => {
                t.iter().map(|(k, v)| (k.to_string(), v.as_str().map(str::to_string))).collect()
            }
            Located::Item(toml_edit::Item::Value(toml_edit::Value::InlineTable(t)))
            | Located::Value(toml_edit::Value::InlineTable(t)) => {
                t.iter().map(|(k, v)| (k.to_string(), v.as_str().map(str::to_string))).collect()
            }
            _ => return None,
        };
        table.into_iter().find(|(_, v)| v.as_deref() == Some(value)).map(|(k, _)| k)
    }

    fn span(&self, path: &str) -> Option<std::ops::Range<usize>> {
        match self.item(path)? {
            Located::Item(item) => item.span(),
            Located::Table(t) => t.span(),
            Located::Value(v) => v.span(),
        }
    }

    fn item(&self, path: &str) -> Option<Located<'_>> {
        let mut cur = Located::Table(self.doc.as_table());
        for seg in path.split('.') {
            let (key, index) = match seg.split_once('[') {
                Some((k, rest)) => (k, rest.trim_end_matches(']').parse::<usize>().ok()),
                None => (seg, None),
            };
            let next = match cur {
                Located::Table(t) => Located::Item(t.get(key)?),
                Located::Item(toml_edit::Item::Table(t)) => Located::Item(t.get(key)?),
                Located::Item(toml_edit::Item::Value(toml_edit::Value::InlineTable(t))) => Located::Value(t.get(key)?),
                Located::Value(toml_edit::Value::InlineTable(t)) => Located::Value(t.get(key)?),
                _ => return None,
            };
            cur = match index {
                None => next,
                Some(i) => match next {
                    Located::Item(toml_edit::Item::ArrayOfTables(a)) => Located::Table(a.get(i)?),
                    Located::Item(toml_edit::Item::Value(toml_edit::Value::Array(a))) => Located::Value(a.get(i)?),
                    Located::Value(toml_edit::Value::Array(a)) => Located::Value(a.get(i)?),
                    _ => return None,
                },
            };
        }
        Some(cur)
    }
}

enum Located<'a> {
    Item(&'a toml_edit::Item),
    Table(&'a toml_edit::Table),
    Value(&'a toml_edit::Value),
}

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported_with_its_line() {
        let text = "[[nodes]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n\n[[nodes]]\nname = \"a\"\nurl = \"not a url\"\nweight = 0\n\n[[categories]]\nname = \"default\"\npolicy = \"fastest\"\n\n[health]\ninterval_ms = \"soon\"\n";
        let err = Config::parse(text).expect_err("three sections are broken");
        let lines: Vec<_> = err.problems.iter().map(|p| (p.path.as_str(), p.line)).collect();
        assert!(lines.contains(&("nodes[1].name", Some(6))), "duplicate name on line 6: {lines:?}");
        assert!(lines.contains(&("nodes[1].url", Some(7))), "bad url on line 7: {lines:?}");
        assert!(lines.contains(&("nodes[1].weight", Some(8))), "zero weight on line 8: {lines:?}");
        assert!(
            err.problems
                .iter()
                .any(|p| p.path.starts_with("categories[0]") && p.line == Some(12) && p.message.contains("fastest")),
            "{err}"
        );
        assert!(err.problems.iter().any(|p| p.path.starts_with("health") && p.line.is_some()), "{err}");
    }

    #[test]
    fn cloud_settings_are_checked() {
        let text = "[[nodes]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\nkind = \"openai\"\n\n[[categories]]\nname = \"default\"\ncloud = \"on-failure\"\n\n[[providers]]\nname = \"p\"\nbase_url = \"ftp://x\"\nsecret = \"Bad Name\"\nfirst_byte_timeout_ms = 0\n\n[alerts]\nfallback_share = 2.0\n";
        let err = Config::parse(text).expect_err("broken cloud settings");
        let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
        for want in [
            "categories[0].providers",
            "providers[0].base_url",
            "providers[0].secret",
            "providers[0].first_byte_timeout_ms",
            "alerts.fallback_share",
        ] {
            assert!(paths.contains(&want), "{want} missing from {paths:?}");
        }
        assert!(!paths.iter().any(|p| p.starts_with("nodes")), "kind = openai is a valid node: {paths:?}");
        let ok = "[[nodes]]\nname = \"a\"\nurl = \"https://gpu.example:443\"\n\n[[providers]]\nname = \"local-vllm\"\nbase_url = \"http://10.0.0.9:8000/v1\"\n";
        let c = Config::parse(ok).unwrap_or_else(|e| panic!("https nodes and key-less providers are fine: {e}"));
        assert_eq!(c.providers[0].first_byte_timeout_ms, 60_000);
    }
}
