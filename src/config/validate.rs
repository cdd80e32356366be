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

/// `(path, message)` pairs, in the order the checks found them.
type Found = Vec<(String, String)>;

fn push(out: &mut Found, path: impl Into<String>, message: impl Into<String>) {
    out.push((path.into(), message.into()));
}

impl Config {
    /// Semantic checks over the whole config: `(path, message)` for every problem.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let addrs = listeners(self, &mut out);
        admin(self, &addrs, &mut out);
        nodes(self, &mut out);
        categories(self, &mut out);
        providers(self, &mut out);
        secret_owners(self, &mut out);
        nonzero(self, &mut out);
        connections(self, &mut out);
        alerts(self, &mut out);
        telemetry(self, &mut out);
        store(self, &mut out);
        retry(self, &mut out);
        quotas(self, &mut out);
        out
    }

    /// Settings that are valid but risky: `(path, message)` for each, shown by `corral config
    /// check` and logged at start. A listener on a non-loopback address without client keys
    /// lets anyone who can reach the host use the cluster.
    pub fn warnings(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let open = l.addr.parse::<SocketAddr>().is_ok_and(|a| !a.ip().is_loopback());
            if open && l.api_keys.is_empty() {
                out.push((
                    format!("listeners[{i}].addr"),
                    format!(
                        "{} is reachable from other machines and names no api_keys: anyone who can reach it can use the cluster; add api_keys = [...]",
                        l.addr
                    ),
                ));
            }
        }
        for (i, p) in self.providers.iter().enumerate() {
            let Ok(u) = url::Url::parse(&p.base_url) else { continue };
            let local = match u.host() {
                Some(url::Host::Domain(d)) => d == "localhost",
                Some(url::Host::Ipv4(v4)) => v4.is_loopback(),
                Some(url::Host::Ipv6(v6)) => v6.is_loopback(),
                None => true,
            };
            if u.scheme() == "http" && !local && !p.secret.is_empty() {
                out.push((
                    format!("providers[{i}].base_url"),
                    format!("{} is plain http: the API key and every prompt would cross the network unencrypted; use https://", p.base_url),
                ));
            }
        }
        if self.admin.addr.parse::<SocketAddr>().is_ok_and(|a| !a.ip().is_loopback()) {
            out.push((
                "admin.addr".into(),
                format!("{} exposes the admin API beyond this machine; only its token protects it", self.admin.addr),
            ));
        }
        out
    }
}

/// `[[listeners]]`: addresses parse and differ, key names are secret names, categories exist.
/// Returns the proxy addresses, which the admin address must not reuse.
fn listeners(c: &Config, out: &mut Found) -> HashSet<SocketAddr> {
    if c.listeners.is_empty() {
        push(out, "listeners", "at least one proxy listener is needed");
    }
    let mut addrs = HashSet::new();
    for (i, l) in c.listeners.iter().enumerate() {
        match l.addr.parse::<SocketAddr>() {
            Err(_) => push(
                out,
                format!("listeners[{i}].addr"),
                format!("\"{}\" is not an address like 127.0.0.1:11400", l.addr),
            ),
            Ok(a) => {
                // Port 0 means "any free port": never a clash.
                if a.port() != 0 && !addrs.insert(a) {
                    push(out, format!("listeners[{i}].addr"), format!("{a} is used twice"));
                }
            }
        }
        for (j, k) in l.api_keys.iter().enumerate() {
            if k != super::ANY_FLEET_KEY && crate::secrets::check_name(k).is_err() {
                push(
                    out,
                    format!("listeners[{i}].api_keys[{j}]"),
                    format!("\"{k}\" is not a secret name (a-z, 0-9, '-', '_', '.')"),
                );
            }
        }
        if let Some(cat) = &l.category {
            if !c.categories.iter().any(|k| &k.name == cat) {
                push(out, format!("listeners[{i}].category"), format!("no category named \"{cat}\""));
            }
            if !l.categories.is_empty() && !l.categories.contains(cat) {
                push(
                    out,
                    format!("listeners[{i}].category"),
                    format!("\"{cat}\" is not among this listener's categories"),
                );
            }
        }
        for (j, cat) in l.categories.iter().enumerate() {
            if !c.categories.iter().any(|k| &k.name == cat) {
                push(out, format!("listeners[{i}].categories[{j}]"), format!("no category named \"{cat}\""));
            }
        }
        for (j, o) in l.allowed_origins.iter().enumerate() {
            if let Some(why) = bad_origin_pattern(o) {
                push(out, format!("listeners[{i}].allowed_origins[{j}]"), format!("\"{o}\" {why}"));
            }
        }
    }
    addrs
}

/// Why an `allowed_origins` entry cannot match a browser's `Origin` header, if it cannot.
fn bad_origin_pattern(o: &str) -> Option<&'static str> {
    if o == "*" {
        return None;
    }
    match o.split_once("://") {
        None => Some("is not an origin like https://chat.example or http://localhost:3000 (or * for any)"),
        Some(("", _)) => Some("has no scheme"),
        Some((_, rest)) if rest.contains('/') => Some("has a path; an origin is scheme://host[:port] only"),
        Some(_) if o.chars().any(|c| c.is_whitespace() || c == ',') => Some("has a space or comma; list one per entry"),
        Some(_) => None,
    }
}

/// `[admin]`: the address parses and is not also a proxy listener.
fn admin(c: &Config, proxy_addrs: &HashSet<SocketAddr>, out: &mut Found) {
    match c.admin.addr.parse::<SocketAddr>() {
        Err(_) => push(out, "admin.addr", format!("\"{}\" is not an address like 127.0.0.1:11402", c.admin.addr)),
        Ok(a) => {
            if a.port() != 0 && proxy_addrs.contains(&a) {
                push(out, "admin.addr", format!("{a} is also a proxy listener"));
            }
        }
    }
}

/// `[[nodes]]`: at least one; unique well-formed names, http(s) URLs, usable weights and limits.
fn nodes(c: &Config, out: &mut Found) {
    if c.nodes.is_empty() {
        push(out, "nodes", "at least one node is needed");
    }
    let mut names = HashSet::new();
    for (i, n) in c.nodes.iter().enumerate() {
        if n.name.is_empty() {
            push(out, format!("nodes[{i}].name"), "a node needs a name");
        } else if !n.name.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "-_.".contains(ch)) {
            push(out, format!("nodes[{i}].name"), format!("\"{}\" may only use a-z, 0-9, '-', '_' and '.'", n.name));
        } else if !names.insert(n.name.as_str()) {
            push(out, format!("nodes[{i}].name"), format!("\"{}\" is used by an earlier node", n.name));
        }
        if let Some(why) = upstream_url_problem(&n.url) {
            push(out, format!("nodes[{i}].url"), why);
        } else if let Some(l) = c.listeners.iter().find(|l| is_own_listener(&n.url, &l.addr)) {
            push(
                out,
                format!("nodes[{i}].url"),
                format!("\"{}\" is this broker's own listener {}: requests would loop back into Corral", n.url, l.addr),
            );
        }
        if n.weight == 0 {
            push(out, format!("nodes[{i}].weight"), "must be greater than 0");
        }
        if n.max_concurrency == 0 {
            push(out, format!("nodes[{i}].max_concurrency"), "must be at least 1");
        }
    }
}

/// What is wrong with a node's `url` or a provider's `base_url`, in words: it must be http(s)
/// with a host, and hold no user name or password (`http://trusted@evil:1` goes to `evil`, and
/// keys belong in the keyring) and no query or fragment (paths are appended to it).
fn upstream_url_problem(raw: &str) -> Option<String> {
    let u = match url::Url::parse(raw) {
        Ok(u) => u,
        Err(e) => return Some(format!("\"{raw}\" is not a URL: {e}")),
    };
    if !matches!(u.scheme(), "http" | "https") || u.host().is_none() {
        return Some(format!("\"{raw}\" must be an http:// or https:// URL with a host (got scheme {})", u.scheme()));
    }
    let host = u.host_str().unwrap_or_default();
    if !u.username().is_empty() || u.password().is_some() {
        return Some(format!(
            "\"{raw}\" holds a user name or password before '@': its host is {host}; keys go in the keyring (secret), never in a URL"
        ));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Some(format!("\"{raw}\" has a query or fragment ('?', '#'): give scheme://host[:port][/path]"));
    }
    None
}

/// Whether `url` reaches the proxy listener bound at `addr` on this machine: the same port on a
/// loopback name or address, the listener's own address, or any local one when it binds them all.
fn is_own_listener(url: &str, addr: &str) -> bool {
    let (Ok(u), Ok(bound)) = (url::Url::parse(url), addr.parse::<SocketAddr>()) else { return false };
    if u.port_or_known_default() != Some(bound.port()) {
        return false;
    }
    let ip = match u.host() {
        Some(url::Host::Domain(d)) => return d.eq_ignore_ascii_case("localhost") || d.ends_with(".localhost"),
        Some(url::Host::Ipv4(v4)) => std::net::IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => std::net::IpAddr::V6(v6),
        None => return false,
    };
    ip == bound.ip() || ip.is_loopback() && (bound.ip().is_loopback() || bound.ip().is_unspecified())
}

/// `[[categories]]`: unique names; `order`, `providers` and `models` refer to real things.
fn categories(c: &Config, out: &mut Found) {
    let mut cats = HashSet::new();
    for (i, cat) in c.categories.iter().enumerate() {
        if cat.name.is_empty() {
            push(out, format!("categories[{i}].name"), "a category needs a name");
        } else if !cats.insert(cat.name.as_str()) {
            push(out, format!("categories[{i}].name"), format!("\"{}\" is used by an earlier category", cat.name));
        }
        for (j, o) in cat.order.iter().enumerate() {
            if !c.nodes.iter().any(|n| &n.name == o) {
                push(out, format!("categories[{i}].order[{j}]"), format!("no node named \"{o}\""));
            }
        }
        if cat.queue_timeout_ms == 0 {
            push(out, format!("categories[{i}].queue_timeout_ms"), "must be greater than 0");
        }
        if cat.stream_idle_timeout_ms < 100 {
            push(out, format!("categories[{i}].stream_idle_timeout_ms"), "must be at least 100 (milliseconds)");
        }
        if cat.first_token_timeout_ms > 0 && cat.first_token_timeout_ms < 100 {
            push(
                out,
                format!("categories[{i}].first_token_timeout_ms"),
                "must be 0 (off) or at least 100 (milliseconds)",
            );
        }
        idempotency(i, cat, out);
        for (j, p) in cat.providers.iter().enumerate() {
            if !c.providers.iter().any(|q| &q.name == p) {
                push(out, format!("categories[{i}].providers[{j}]"), format!("no provider named \"{p}\""));
            }
        }
        if cat.cloud == CloudPermission::OnFailure && cat.providers.is_empty() {
            push(
                out,
                format!("categories[{i}].providers"),
                "cloud = \"on-failure\" needs at least one provider to fall back to",
            );
        }
        for (j, m) in cat.degrade.iter().enumerate() {
            let path = format!("categories[{i}].degrade[{j}]");
            if m.trim().is_empty() || m.len() > 256 || m.chars().any(char::is_control) {
                push(out, path, "must be a model name (1 to 256 characters, no control characters)");
            } else if cat.degrade[..j].iter().any(|d| super::model_key(d) == super::model_key(m)) {
                push(out, path, format!("\"{m}\" is already earlier in the chain"));
            }
        }
        if let Some(text) = &cat.static_answer {
            if text.trim().is_empty() || text.len() > 4096 {
                push(out, format!("categories[{i}].static"), "must be a sentence of 1 to 4096 bytes");
            }
        }
        for (j, m) in cat.models.iter().enumerate() {
            if m.is_empty() {
                push(out, format!("categories[{i}].models[{j}]"), "an empty pattern matches nothing");
            }
        }
    }
}

/// Longest `idempotency_window_ms`: a day; names are held in memory only.
const MAX_IDEMPOTENCY_WINDOW_MS: u64 = 86_400_000;

fn idempotency(i: usize, cat: &super::schema::CategoryConfig, out: &mut Found) {
    if cat.idempotency_window_ms > MAX_IDEMPOTENCY_WINDOW_MS {
        push(
            out,
            format!("categories[{i}].idempotency_window_ms"),
            format!("must be at most {MAX_IDEMPOTENCY_WINDOW_MS} (a day, in milliseconds); 0 turns deduplication off"),
        );
    }
    request_limits(i, &cat.limits, out);
    if cat.replay_finished && cat.idempotency_window_ms == 0 {
        push(
            out,
            format!("categories[{i}].replay_finished"),
            "needs idempotency_window_ms > 0: with deduplication off there is nothing to replay",
        );
    }
}

fn request_limits(i: usize, l: &super::schema::RequestLimits, out: &mut Found) {
    let path = |field: &str| format!("categories[{i}].limits.{field}");
    for (default, max, d, m) in [
        (l.default_predict, l.max_predict, "default_predict", "max_predict"),
        (l.default_num_ctx, l.max_num_ctx, "default_num_ctx", "max_num_ctx"),
        (l.default_keep_alive_s.unwrap_or(0), l.max_keep_alive_s, "default_keep_alive_s", "max_keep_alive_s"),
    ] {
        if max > 0 && default > max {
            push(out, path(d), format!("{default} is over {m} ({max}): a default must be within its cap"));
        }
    }
    for (t, f) in [(l.temperature_min, "temperature_min"), (l.temperature_max, "temperature_max")] {
        if t.is_some_and(|t| !t.is_finite() || t < 0.0) {
            push(out, path(f), "must be a number of 0 or more");
        }
    }
    if let (Some(lo), Some(hi)) = (l.temperature_min, l.temperature_max) {
        if lo > hi {
            push(out, path("temperature_min"), format!("{lo} is above temperature_max ({hi}): the range is empty"));
        }
    }
}

/// Secrets have owners: a provider may only name a provider key, never a client key (a
/// listener's `api_keys`) or one of Corral's internal entries (the admin token); a client key
/// is never an internal entry either. The keyring enforces the same at lookup; this says it
/// early, with the path, so a hostile shared file is refused before anything runs it.
fn secret_owners(c: &Config, out: &mut Found) {
    for (i, p) in c.providers.iter().enumerate() {
        if crate::secrets::is_internal(&p.secret) {
            push(
                out,
                format!("providers[{i}].secret"),
                format!("\"{}\" is Corral's internal admin token, not a provider key; a provider may only use a provider key (store one with `corral secret set NAME`)", p.secret),
            );
            continue;
        }
        let client = c.listeners.iter().enumerate().find_map(|(l, listener)| {
            listener.api_keys.iter().position(|k| !p.secret.is_empty() && *k == p.secret).map(|j| (l, j))
        });
        if let Some((l, j)) = client {
            push(
                out,
                format!("providers[{i}].secret"),
                format!("\"{}\" is a client key (listeners[{l}].api_keys[{j}]), not a provider key; a provider may only use a provider key", p.secret),
            );
        }
    }
    for (i, l) in c.listeners.iter().enumerate() {
        for (j, k) in l.api_keys.iter().enumerate().filter(|(_, k)| crate::secrets::is_internal(k)) {
            push(
                out,
                format!("listeners[{i}].api_keys[{j}]"),
                format!("\"{k}\" is Corral's internal admin token, not a client key"),
            );
        }
    }
}

/// `[[providers]]`: unique names, http(s) base URLs, secret names, timeouts above 0.
fn providers(c: &Config, out: &mut Found) {
    let mut provs = HashSet::new();
    for (i, p) in c.providers.iter().enumerate() {
        if p.name.is_empty() {
            push(out, format!("providers[{i}].name"), "a provider needs a name");
        } else if !provs.insert(p.name.as_str()) {
            push(out, format!("providers[{i}].name"), format!("\"{}\" is used by an earlier provider", p.name));
        }
        if let Some(why) = upstream_url_problem(&p.base_url) {
            push(out, format!("providers[{i}].base_url"), why);
        }
        if !p.secret.is_empty() && crate::secrets::check_name(&p.secret).is_err() {
            push(
                out,
                format!("providers[{i}].secret"),
                format!("\"{}\" is not a secret name (a-z, 0-9, '-', '_', '.')", p.secret),
            );
        }
        for (field, v) in
            [("connect_timeout_ms", p.connect_timeout_ms), ("first_byte_timeout_ms", p.first_byte_timeout_ms)]
        {
            if v == 0 {
                push(out, format!("providers[{i}].{field}"), "must be greater than 0");
            }
        }
    }
}

/// Timeouts, periods, counts and limits across the tuning sections, where 0 makes no sense.
fn nonzero(c: &Config, out: &mut Found) {
    for (field, v) in [
        ("proxy.connect_timeout_ms", c.proxy.connect_timeout_ms),
        ("proxy.first_byte_timeout_ms", c.proxy.first_byte_timeout_ms),
        ("proxy.idle_timeout_ms", c.proxy.idle_timeout_ms),
        ("proxy.max_body_bytes", c.proxy.max_body_bytes as u64),
        ("health.interval_ms", c.health.interval_ms),
        ("health.timeout_ms", c.health.timeout_ms),
        ("health.deep_interval_ms", c.health.deep_interval_ms),
        ("health.failures_to_down", u64::from(c.health.failures_to_down)),
        ("health.successes_to_up", u64::from(c.health.successes_to_up)),
        ("breaker.failures_to_open", u64::from(c.breaker.failures_to_open)),
        ("breaker.trial_requests", u64::from(c.breaker.trial_requests)),
        ("queue.max_requests", c.queue.max_requests as u64),
        ("store.max_rows", c.store.max_rows),
        ("store.channel_capacity", c.store.channel_capacity as u64),
        ("store.retention_interval_ms", c.store.retention_interval_ms),
        ("queue.max_bytes", c.queue.max_bytes as u64),
        ("queue.max_model_ops", c.queue.max_model_ops as u64),
        ("proxy.default_num_ctx", c.proxy.default_num_ctx),
        ("proxy.header_read_timeout_ms", c.proxy.header_read_timeout_ms),
        ("proxy.keep_alive_timeout_ms", c.proxy.keep_alive_timeout_ms),
        ("proxy.body_read_timeout_ms", c.proxy.body_read_timeout_ms),
        ("proxy.max_connections", c.proxy.max_connections as u64),
        ("proxy.max_connections_per_ip", c.proxy.max_connections_per_ip as u64),
        ("admin.max_connections", c.admin.max_connections as u64),
        ("admin.max_connections_per_ip", c.admin.max_connections_per_ip as u64),
        ("retry.max_attempts", u64::from(c.retry.max_attempts)),
    ] {
        if v == 0 {
            push(out, field, "must be greater than 0");
        }
    }
}

/// `[proxy]` and `[admin]` connection caps: one address never gets more than the listener.
fn connections(c: &Config, out: &mut Found) {
    for (section, per_ip, max) in [
        ("proxy", c.proxy.max_connections_per_ip, c.proxy.max_connections),
        ("admin", c.admin.max_connections_per_ip, c.admin.max_connections),
    ] {
        if per_ip > max {
            push(
                out,
                format!("{section}.max_connections_per_ip"),
                format!("must not be larger than {section}.max_connections ({max})"),
            );
        }
    }
}

/// `[alerts]`: the fallback share is a ratio, and its window long enough to mean something.
fn alerts(c: &Config, out: &mut Found) {
    if !(0.0..=1.0).contains(&c.alerts.fallback_share) {
        push(out, "alerts.fallback_share", "must be between 0 and 1 (0 turns the alert off)");
    }
    if c.alerts.fallback_window_ms < 1_000 {
        push(out, "alerts.fallback_window_ms", "must be at least 1000");
    }
}

/// `[telemetry]`: the collector is an http(s) URL with a host that `/v1/traces` can follow.
fn telemetry(c: &Config, out: &mut Found) {
    let Some(e) = &c.telemetry.otlp_endpoint else { return };
    let path = "telemetry.otlp_endpoint";
    match url::Url::parse(e) {
        Ok(u) if !matches!(u.scheme(), "http" | "https") || u.host().is_none() => push(
            out,
            path,
            format!("\"{e}\" must be an http:// or https:// URL with a host (got scheme {})", u.scheme()),
        ),
        Ok(u) if u.query().is_some() || u.fragment().is_some() => {
            push(out, path, format!("\"{e}\" must not have a query or fragment: /v1/traces is appended to it"))
        }
        Ok(_) => {}
        Err(err) => push(out, path, format!("\"{e}\" is not a URL: {err}")),
    }
}

/// `[store]`: a fleet's `url` is a PostgreSQL URL without a password (the password is a
/// keyring secret, as every secret is), and a broker name is short and printable.
fn store(c: &Config, out: &mut Found) {
    if let Some(u) = &c.store.url {
        let path = "store.url";
        match url::Url::parse(u) {
            Ok(p) if !matches!(p.scheme(), "postgres" | "postgresql") || p.host().is_none() => push(
                out,
                path,
                format!("\"{u}\" must be a postgres:// URL with a host (SQLite needs no URL: set store.path)"),
            ),
            Ok(p) if p.password().is_some() => push(
                out,
                path,
                "a password does not belong in the config file: store it with `corral secret set NAME` and name it in store.password_secret",
            ),
            Ok(_) => {}
            Err(err) => push(out, path, format!("\"{u}\" is not a URL: {err}")),
        }
    }
    if let Some(b) = &c.store.broker {
        if b.is_empty() || b.len() > 64 || !b.chars().all(|ch| ch.is_ascii_graphic()) {
            push(out, "store.broker", format!("\"{b}\" must be 1 to 64 visible ASCII characters"));
        }
    }
}

/// `[retry]`: the budget is a ratio and the backoff cap is not below its base.
fn retry(c: &Config, out: &mut Found) {
    if !(0.0..=1.0).contains(&c.retry.budget_ratio) {
        push(out, "retry.budget_ratio", "must be between 0 and 1");
    }
    if !(0.0..=1.0).contains(&c.queue.remote_share) {
        push(out, "queue.remote_share", "must be between 0 and 1");
    }
    if c.retry.backoff_cap_ms < c.retry.backoff_base_ms {
        push(out, "retry.backoff_cap_ms", "must not be smaller than retry.backoff_base_ms");
    }
}

/// Each quota names one key (or `"*"`) once, limits something, over a window from a minute
/// to 31 days.
fn quotas(c: &Config, out: &mut Found) {
    let mut seen = HashSet::new();
    for (i, q) in c.quotas.iter().enumerate() {
        if q.key != super::ANY_FLEET_KEY && crate::secrets::check_name(&q.key).is_err() {
            push(
                out,
                format!("quotas[{i}].key"),
                format!("\"{}\" is not a client key name (a-z, 0-9, '-', '_', '.') or \"*\"", q.key),
            );
        } else if !seen.insert(q.key.as_str()) {
            push(out, format!("quotas[{i}].key"), format!("\"{}\" has a quota already", q.key));
        }
        if q.requests == 0 && q.tokens == 0 {
            push(out, format!("quotas[{i}]"), "limits nothing: set requests or tokens (or both)");
        }
        if !(60..=31 * 86_400).contains(&q.window_s) {
            push(out, format!("quotas[{i}].window_s"), "must be between 60 (a minute) and 2678400 (31 days)");
        }
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

    #[test]
    fn a_static_answer_must_say_something_short() {
        for (text, ok) in
            [("\"busy, try later\"", true), ("\"  \"", false), (&format!("\"{}\"", "x".repeat(5000)), false)]
        {
            let cfg = format!("[[categories]]\nname = \"default\"\nstatic = {text}\n");
            let got = Config::parse(&cfg);
            assert_eq!(got.is_ok(), ok, "{cfg:.60}: {got:?}");
            if let Err(e) = got {
                assert!(e.problems.iter().any(|p| p.path == "categories[0].static"), "{e}");
            }
        }
    }

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

    #[test]
    fn idempotency_and_request_limits_are_checked() {
        let text = "[[categories]]\nname = \"default\"\nidempotency_window_ms = 0\nreplay_finished = true\n\n[categories.limits]\nmax_predict = 100\ndefault_predict = 200\ntemperature_min = 1.5\ntemperature_max = 0.5\nover_limit = \"refuse\"\n\n[[categories]]\nname = \"long\"\nidempotency_window_ms = 999999999\ndegrade = [\"qwen2.5:3b\", \"\", \"qwen2.5:3b\"]\n";
        let err = Config::parse(text).expect_err("broken settings");
        let found: Vec<(&str, &str)> = err.problems.iter().map(|p| (p.path.as_str(), p.message.as_str())).collect();
        for (path, says) in [
            ("categories[0].replay_finished", "needs idempotency_window_ms > 0"),
            ("categories[0].limits.default_predict", "over max_predict"),
            ("categories[0].limits.temperature_min", "range is empty"),
            ("categories[1].idempotency_window_ms", "at most 86400000"),
            ("categories[1].degrade[1]", "must be a model name"),
            ("categories[1].degrade[2]", "already earlier in the chain"),
        ] {
            assert!(
                found.iter().any(|(p, m)| *p == path && m.contains(says)),
                "{path}: {says:?} missing from {found:?}"
            );
        }
        let ok =
            "[[categories]]\nname = \"default\"\n\n[categories.limits]\nmax_predict = 512\nover_limit = \"clamp\"\n";
        let c = Config::parse(ok).unwrap_or_else(|e| panic!("a cap alone is fine: {e}"));
        assert_eq!((c.categories[0].limits.max_predict, c.categories[0].idempotency_window_ms), (512, 600_000));
    }

    #[test]
    fn an_upstream_url_with_credentials_or_a_query_is_refused_and_says_its_real_host() {
        let why = upstream_url_problem("http://127.0.0.1:34501@127.0.0.1:34666/v1").expect("refused");
        assert!(why.contains("its host is 127.0.0.1") && why.contains("keyring"), "{why}");
        assert!(upstream_url_problem("https://user:pw@api.example.com/v1").is_some());
        assert!(upstream_url_problem("http://127.0.0.1:34501?@evil:1/v1")
            .expect("refused")
            .contains("query or fragment"));
        assert!(upstream_url_problem("http://127.0.0.1:34501#@evil:1/v1").is_some());
        assert!(upstream_url_problem("ftp://10.0.0.1").expect("refused").contains("http:// or https://"));
        for ok in
            ["http://10.0.0.1:11434", "https://api.openai.com/v1", "http://[::1]:11434", "http://gpu0.local:11434/"]
        {
            assert_eq!(upstream_url_problem(ok), None, "{ok}");
        }
    }

    #[test]
    fn a_node_that_is_this_brokers_own_listener_is_refused() {
        for (url, addr, own) in [
            ("http://127.0.0.1:11400", "127.0.0.1:11400", true),
            ("http://localhost:11400/", "0.0.0.0:11400", true),
            ("http://[::1]:11400", "[::]:11400", true),
            ("http://10.0.0.5:11400", "10.0.0.5:11400", true),
            ("http://127.0.0.1:11434", "127.0.0.1:11400", false),
            ("http://10.0.0.6:11400", "127.0.0.1:11400", false),
        ] {
            assert_eq!(is_own_listener(url, addr), own, "{url} against {addr}");
        }
    }

    #[test]
    fn a_key_sent_over_plain_http_to_another_host_is_warned_about() {
        let mut c = Config::default();
        let provider = |url: &str| crate::config::ProviderConfig {
            name: "p".into(),
            base_url: url.into(),
            secret: "p-key".into(),
            ..Default::default()
        };
        c.providers = vec![provider("http://api.example.com/v1")];
        assert!(c.warnings().iter().any(|(path, m)| path == "providers[0].base_url" && m.contains("unencrypted")));
        c.providers = vec![provider("https://api.example.com/v1"), provider("http://127.0.0.1:8080/v1")];
        assert!(c.warnings().iter().all(|(path, _)| !path.starts_with("providers")), "https, or this machine");
    }

    #[test]
    fn every_section_is_checked_in_a_fixed_order() {
        use crate::config::{CategoryConfig, ListenerConfig, NodeConfig, ProviderConfig};
        let mut c = Config::default();
        c.listeners.push(ListenerConfig {
            addr: "bad".into(),
            category: Some("nope".into()),
            api_keys: vec!["Bad Key".into()],
            ..ListenerConfig::default()
        });
        c.listeners.push(ListenerConfig::default());
        c.admin.addr = c.listeners[0].addr.clone();
        c.nodes.push(NodeConfig { name: "BAD".into(), url: "ftp://x".into(), weight: 0, ..NodeConfig::default() });
        c.categories.push(CategoryConfig {
            name: "default".into(),
            order: vec!["zz".into()],
            cloud: CloudPermission::OnFailure,
            ..CategoryConfig::default()
        });
        c.providers.push(ProviderConfig { base_url: "nope".into(), ..ProviderConfig::default() });
        c.proxy.idle_timeout_ms = 0;
        c.alerts.fallback_window_ms = 5;
        c.retry.backoff_cap_ms = 1;
        let got = c.validate();
        let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "listeners[1].addr",
                "listeners[1].api_keys[0]",
                "listeners[1].category",
                "listeners[2].addr",
                "admin.addr",
                "nodes[1].name",
                "nodes[1].url",
                "nodes[1].weight",
                "categories[1].name",
                "categories[1].order[0]",
                "categories[1].providers",
                "providers[0].name",
                "providers[0].base_url",
                "proxy.idle_timeout_ms",
                "alerts.fallback_window_ms",
                "retry.backoff_cap_ms",
            ],
            "one check per section, run in this order, each reporting every problem it finds"
        );
        assert_eq!(got[4].1, "127.0.0.1:11400 is also a proxy listener", "admin sees the listeners' addresses");
    }

    #[test]
    fn allowed_origins_must_be_origins_and_model_ops_need_a_limit() {
        let text = "[[listeners]]\naddr = \"127.0.0.1:11400\"\nallowed_origins = [\"*\", \"https://chat.example\", \"http://*.lan:3000\", \"chat.example\", \"https://a.example/path\", \"https://a, https://b\"]\nmodel_ops = true\n\n[queue]\nmax_model_ops = 0\n";
        let c: Config = toml::from_str(text).expect("the keys parse");
        assert!(c.listeners[0].allows_model_ops());
        let got = c.validate();
        let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "listeners[0].allowed_origins[3]",
                "listeners[0].allowed_origins[4]",
                "listeners[0].allowed_origins[5]",
                "queue.max_model_ops"
            ],
            "{got:?}"
        );
        let remote = crate::config::ListenerConfig { origin: crate::config::Origin::Remote, ..Default::default() };
        assert!(!remote.allows_model_ops(), "a remote listener runs no model operations unless it says so");
    }

    #[test]
    fn an_otlp_endpoint_is_an_http_url_that_v1_traces_can_follow() {
        let check = |e: &str| {
            let c = Config::parse(&format!("[telemetry]\notlp_endpoint = \"{e}\"\n"));
            c.err().map(|e| e.problems.iter().map(|p| format!("{}: {}", p.path, p.message)).collect::<Vec<_>>())
        };
        assert_eq!(check("http://127.0.0.1:4318"), None, "a collector on loopback is fine");
        assert_eq!(check("https://otel.example/base/"), None, "a path prefix is kept");
        for bad in ["grpc://127.0.0.1:4317", "127.0.0.1:4318", "http://x/?a=1", "not a url"] {
            let got = check(bad).unwrap_or_default();
            assert!(got.iter().any(|p| p.starts_with("telemetry.otlp_endpoint")), "{bad} is refused: {got:?}");
        }
        let c = Config::parse("[telemetry]\notlp_endpoint = \"http://c:4318/otlp/\"\n").expect("valid");
        assert_eq!(c.telemetry.traces_url().as_deref(), Some("http://c:4318/otlp/v1/traces"));
        assert_eq!(Config::default().telemetry.traces_url(), None, "off by default");
    }

    #[test]
    fn a_fleet_store_url_is_postgres_and_holds_no_password() {
        let check = |toml: &str| {
            Config::parse(toml)
                .err()
                .map(|e| e.problems.iter().map(|p| format!("{}: {}", p.path, p.message)).collect::<Vec<_>>())
        };
        assert_eq!(check("[store]\nurl = \"postgres://corral@127.0.0.1:5432/corral\"\nbroker = \"gpu-gw-1\"\n"), None);
        assert_eq!(check("[store]\nurl = \"postgresql://db.lan/corral\"\npassword_secret = \"pg\"\n"), None);
        for (bad, why) in [
            ("url = \"sqlite:///tmp/x.db\"", "postgres://"),
            ("url = \"postgres://corral:hunter2@db/corral\"", "password does not belong"),
            ("url = \"not a url\"", "is not a URL"),
            ("broker = \"two words\"", "visible ASCII"),
        ] {
            let got = check(&format!("[store]\n{bad}\n")).unwrap_or_default();
            assert!(got.iter().any(|p| p.starts_with("store.") && p.contains(why)), "{bad}: {got:?}");
        }
    }
}
