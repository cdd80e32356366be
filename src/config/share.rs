//! Sharing a setup between machines: `config export` writes a config as text, `config import`
//! combines a file with the running config, and its preview lists what would change.
//!
//! What travels is the cluster's shape: nodes, categories and providers (matched by name), and
//! with `replace` also the tuning sections (proxy, health, breaker, retry, queue, alerts). What
//! belongs to one machine never travels: listener and admin addresses and the store stay the
//! receiving side's. Secrets never travel either: a config only names keyring entries, and
//! `secret_names` lists them so the receiver knows what to set.
//!
//! A shared file is untrusted input. [`plan`] reads the file's own TOML keys, so a merge takes
//! only what the file says (a file with one provider adds that provider and nothing else; a
//! node it names changes only in the fields it sets), lists every changed field old -> new,
//! and names each *trust change* in words: a node or provider URL changing, a category gaining
//! cloud permission or losing redaction, a provider's `secret` changing, a category's
//! `providers`, `order` or `models` sending traffic elsewhere, a new category that may use the
//! cloud. A trust change is applied only when accepted by its id (or all at once); the rest of
//! the file applies and the plan says what was held back. Keys are never carried over to a new
//! origin: a provider key is bound in the keyring to the origin it was stored for (`secrets`).
//! `plan` is pure (config and text in, the next config and its change list out), so a preview
//! and an apply of the same file on the same running config agree; validating the result and
//! swapping it in is the caller's job.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::schema::Config;
use super::validate::ConfigError;

/// How an imported config combines with the running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImportMode {
    /// Add the file's nodes, categories and providers; on a name both have, the fields the
    /// file sets win; everything else stays.
    Merge,
    /// Nodes, categories and providers become exactly the file's.
    Replace,
}

/// One field of an item that an import changes, as TOML values (`(unset)` when absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    pub field: String,
    pub old: String,
    pub new: String,
}

/// One line of an import preview, with the fields it changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// "added" | "changed" | "removed"
    pub action: &'static str,
    /// "node" | "category" | "provider" | "section"
    pub kind: &'static str,
    pub name: String,
    /// Every field that differs, old -> new (for an added item: those not at their default).
    pub fields: Vec<FieldChange>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = match self.action {
            "added" => '+',
            "removed" => '-',
            _ => '~',
        };
        write!(f, "{sign} {} {} ({})", self.kind, self.name, self.action)
    }
}

/// A change that moves trust: where requests or a key may go, or what protects them. Applied
/// only when accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrustChange {
    /// Stable for the same file on the same config: `kind:name:field`.
    pub id: String,
    pub kind: &'static str,
    pub name: String,
    /// The field, or "added" for a new item that is a trust change as a whole.
    pub field: &'static str,
    /// What it means, in words.
    pub message: String,
    pub accepted: bool,
}

/// Which trust changes a person confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accept {
    /// Every trust change listed (`--accept-trust-changes`).
    All,
    /// These ids only; none when empty.
    Ids(BTreeSet<String>),
}

impl Accept {
    pub fn none() -> Self {
        Self::Ids(BTreeSet::new())
    }

    fn accepts(&self, id: &str) -> bool {
        match self {
            Self::All => true,
            Self::Ids(ids) => ids.contains(id),
        }
    }
}

/// An import worked out: the config to run, what changes, the trust changes and which of them
/// are held back, and notes for the person (keys that a provider will not get).
#[derive(Debug, Clone)]
pub struct Plan {
    pub next: Config,
    /// Everything the file would change, trust changes included (whether held back: `trust`).
    pub changes: Vec<Change>,
    pub trust: Vec<TrustChange>,
    pub held_back: Vec<String>,
    pub notes: Vec<String>,
}

/// Import the text of a shared file into `base`: parse it (every problem with its line), take
/// only the keys it has, and hold back every trust change `accept` does not name.
pub fn plan(base: &Config, text: &str, mode: ImportMode, accept: &Accept) -> Result<Plan, ConfigError> {
    let incoming = Config::parse(text)?;
    // `parse` accepted the text, so it is a TOML table.
    let raw: toml::Table = toml::from_str(text).unwrap_or_default();
    let proposed = propose(base, &incoming, Some(&raw), mode);
    // The preview lists everything the file would change, held back or not.
    let changes = diff(base, &proposed);
    let mut trust = trust_changes(base, &proposed);
    let mut next = proposed;
    let mut held_back = Vec::new();
    for t in &mut trust {
        t.accepted = accept.accepts(&t.id);
        if !t.accepted {
            hold_back(&mut next, base, t);
            held_back.push(t.id.clone());
        }
    }
    if next.nodes.is_empty() && !held_back.is_empty() && trust.iter().any(|t| t.field == "added" && t.kind == "node") {
        // Every node the result would have is a new one held back: say so, rather than the
        // validator's "at least one node is needed".
        let ids: Vec<&str> = held_back.iter().map(String::as_str).filter(|id| id.starts_with("node:")).collect();
        return Err(ConfigError {
            problems: vec![super::validate::Problem {
                path: "nodes".into(),
                line: None,
                message: format!(
                    "every node this import would leave is new, and a new node is held back until accepted ({}): accept them (--accept-trust-changes={}, or tick them on the Share screen); nothing was changed",
                    ids.join(", "),
                    ids.join(",")
                ),
            }],
        });
    }
    let notes = key_notes(base, &next);
    Ok(Plan { next, changes, trust, held_back, notes })
}

/// The result of importing `incoming` (a whole config built in code: every section counts as
/// present, and no trust change is held back) into `base`, and what changes. A shared file
/// goes through [`plan`] instead. Addresses (listeners, admin) and the store location stay the
/// base's: they belong to the machine, not to the shared setup.
pub fn import(base: &Config, incoming: &Config, mode: ImportMode) -> (Config, Vec<Change>) {
    let next = propose(base, incoming, None, mode);
    let changes = diff(base, &next);
    (next, changes)
}

/// `base` with the file's items: with `raw` (the file's own keys) a merge takes only the
/// sections the file has and, for an item both have, only the fields the file sets.
fn propose(base: &Config, incoming: &Config, raw: Option<&toml::Table>, mode: ImportMode) -> Config {
    let mut next = base.clone();
    next.nodes = combine(&base.nodes, &incoming.nodes, section(raw, "nodes"), |n| &n.name, mode);
    next.categories = combine(&base.categories, &incoming.categories, section(raw, "categories"), |c| &c.name, mode);
    next.providers = combine(&base.providers, &incoming.providers, section(raw, "providers"), |p| &p.name, mode);
    next.proxy = take_section(&base.proxy, &incoming.proxy, raw, "proxy", mode);
    next.health = take_section(&base.health, &incoming.health, raw, "health", mode);
    next.breaker = take_section(&base.breaker, &incoming.breaker, raw, "breaker", mode);
    next.retry = take_section(&base.retry, &incoming.retry, raw, "retry", mode);
    next.queue = take_section(&base.queue, &incoming.queue, raw, "queue", mode);
    next.alerts = take_section(&base.alerts, &incoming.alerts, raw, "alerts", mode);
    next.quotas = combine(&base.quotas, &incoming.quotas, section(raw, "quotas"), |q| &q.key, mode);
    next
}

/// One settings section (`[proxy]`, `[health]`, ...): a replace takes the file's whole; a merge
/// takes the keys the file sets and keeps the rest of `base` (a file without the section
/// changes nothing there). Without the file's text every section counts as given.
fn take_section<T: Clone + Serialize + DeserializeOwned>(
    base: &T,
    incoming: &T,
    raw: Option<&toml::Table>,
    key: &str,
    mode: ImportMode,
) -> T {
    match (mode, raw) {
        (ImportMode::Replace, _) | (ImportMode::Merge, None) => incoming.clone(),
        (ImportMode::Merge, Some(raw)) => match raw.get(key).and_then(toml::Value::as_table) {
            Some(patch) => overlay(base, patch, incoming),
            None => base.clone(),
        },
    }
}

/// What the file says of one array section: `None` for "take every item whole" (no raw text),
/// `Some(items)` for the file's own tables (empty when the file lacks the section).
fn section<'a>(raw: Option<&'a toml::Table>, key: &str) -> Option<Vec<&'a toml::Table>> {
    raw.map(|r| {
        r.get(key)
            .and_then(toml::Value::as_array)
            .map_or_else(Vec::new, |a| a.iter().filter_map(toml::Value::as_table).collect())
    })
}

fn combine<T: Clone + PartialEq + Serialize + DeserializeOwned>(
    base: &[T],
    incoming: &[T],
    raw: Option<Vec<&toml::Table>>,
    name: impl Fn(&T) -> &str,
    mode: ImportMode,
) -> Vec<T> {
    if mode == ImportMode::Replace {
        return incoming.to_vec();
    }
    let mut out = base.to_vec();
    // With the file's text, only the items it lists (parse keeps their order, one for one).
    let listed: Vec<(&T, Option<&toml::Table>)> = match &raw {
        None => incoming.iter().map(|i| (i, None)).collect(),
        Some(tables) => incoming.iter().zip(tables.iter().copied().map(Some)).collect(),
    };
    for (item, table) in listed {
        match out.iter_mut().find(|o| name(o) == name(item)) {
            Some(slot) => *slot = table.map_or_else(|| item.clone(), |t| overlay(slot, t, item)),
            None => out.push(item.clone()),
        }
    }
    out
}

fn table_of<T: Serialize>(v: &T) -> toml::Table {
    match toml::Value::try_from(v) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    }
}

/// `base` with the keys of `patch` set; `whole` (the file's item, defaults filled) if that
/// cannot be built, which cannot happen for a patch the parser accepted as this type.
fn overlay<T: Clone + Serialize + DeserializeOwned>(base: &T, patch: &toml::Table, whole: &T) -> T {
    let mut t = table_of(base);
    for (k, v) in patch {
        t.insert(k.clone(), v.clone());
    }
    T::deserialize(toml::Value::Table(t)).unwrap_or_else(|_| whole.clone())
}

/// `item` with `field` as it is in `base` (absent there: absent here).
fn restore_field<T: Clone + Serialize + DeserializeOwned>(item: &mut T, base: &T, field: &str) {
    let mut t = table_of(item);
    match table_of(base).remove(field) {
        Some(v) => t.insert(field.to_string(), v),
        None => t.remove(field),
    };
    if let Ok(v) = T::deserialize(toml::Value::Table(t)) {
        *item = v;
    }
}

fn render(v: Option<&toml::Value>) -> String {
    v.map_or_else(|| "(unset)".to_string(), ToString::to_string)
}

/// Every field that differs between `old` and `new`, in `new`'s order.
fn fields<T: Serialize>(old: &T, new: &T) -> Vec<FieldChange> {
    let (old, new) = (table_of(old), table_of(new));
    let mut keys: Vec<&String> = new.keys().collect();
    keys.extend(old.keys().filter(|k| !new.contains_key(*k)));
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| FieldChange { field: k.clone(), old: render(old.get(k)), new: render(new.get(k)) })
        .collect()
}

/// What changes from `base` to `next`, item by item, with every field.
fn diff(base: &Config, next: &Config) -> Vec<Change> {
    let mut changes = Vec::new();
    list_diff("node", &base.nodes, &next.nodes, |n| &n.name, &mut changes);
    list_diff("category", &base.categories, &next.categories, |c| &c.name, &mut changes);
    list_diff("provider", &base.providers, &next.providers, |p| &p.name, &mut changes);
    list_diff("quota", &base.quotas, &next.quotas, |q| &q.key, &mut changes);
    let sections = [
        ("proxy", fields(&base.proxy, &next.proxy)),
        ("health", fields(&base.health, &next.health)),
        ("breaker", fields(&base.breaker, &next.breaker)),
        ("retry", fields(&base.retry, &next.retry)),
        ("queue", fields(&base.queue, &next.queue)),
        ("alerts", fields(&base.alerts, &next.alerts)),
    ];
    for (name, f) in sections.into_iter().filter(|(_, f)| !f.is_empty()) {
        changes.push(Change { action: "changed", kind: "section", name: name.into(), fields: f });
    }
    changes
}

fn list_diff<T: Default + PartialEq + Serialize>(
    kind: &'static str,
    base: &[T],
    next: &[T],
    name: impl Fn(&T) -> &str,
    out: &mut Vec<Change>,
) {
    for item in next {
        let n = name(item).to_string();
        match base.iter().find(|b| name(b) == n) {
            None => out.push(Change { action: "added", kind, name: n, fields: fields(&T::default(), item) }),
            Some(old) if old != item => {
                out.push(Change { action: "changed", kind, name: n, fields: fields(old, item) })
            }
            Some(_) => {}
        }
    }
    for old in base.iter().filter(|b| !next.iter().any(|i| name(i) == name(b))) {
        out.push(Change { action: "removed", kind, name: name(old).to_string(), fields: Vec::new() });
    }
}

fn trust(kind: &'static str, name: &str, field: &'static str, message: String) -> TrustChange {
    TrustChange { id: format!("{kind}:{name}:{field}"), kind, name: name.to_string(), field, message, accepted: false }
}

/// `url` as it will be dialled: a host in another script is shown as DNS sees it (punycode),
/// with what the file wrote beside it, so `аpi.openai.com` (a Cyrillic а) cannot pass for
/// `api.openai.com` in a preview.
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) if u.host_str().is_some_and(|h| h.starts_with("xn--") || h.contains(".xn--")) => {
            format!("{} (written {url})", u.as_str())
        }
        _ => url.to_string(),
    }
}

fn listed(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Which way a guard weakens: a larger value lets more in (a limit, how long a client may hold
/// a connection, attempts per request), or a smaller one does (how often nodes are probed).
#[derive(Clone, Copy, PartialEq)]
enum Weaker {
    Up,
    Down,
}

/// The settings that protect the broker and the nodes from load and slow or hostile clients
/// (section, field, which way weakens them). A shared file may tune them, but loosening one is
/// a trust change: a file could otherwise turn the flood defences off unseen.
const GUARDS: [(&str, &str, Weaker); 18] = [
    ("proxy", "max_body_bytes", Weaker::Up),
    ("proxy", "header_read_timeout_ms", Weaker::Up),
    ("proxy", "keep_alive_timeout_ms", Weaker::Up),
    ("proxy", "body_read_timeout_ms", Weaker::Up),
    ("proxy", "max_connections", Weaker::Up),
    ("proxy", "max_connections_per_ip", Weaker::Up),
    ("proxy", "stream_buffer_bytes", Weaker::Up),
    ("proxy", "stream_buffer_total_bytes", Weaker::Up),
    ("queue", "max_requests", Weaker::Up),
    ("queue", "max_bytes", Weaker::Up),
    ("queue", "remote_share", Weaker::Up),
    ("queue", "remote_max_wait_ms", Weaker::Up),
    ("queue", "max_model_ops", Weaker::Up),
    ("retry", "max_attempts", Weaker::Up),
    ("retry", "budget_ratio", Weaker::Up),
    ("retry", "budget_min_per_sec", Weaker::Up),
    ("health", "interval_ms", Weaker::Down),
    ("health", "deep_interval_ms", Weaker::Down),
];

/// A guarding section of `c` as a TOML table.
fn guard_section(c: &Config, section: &str) -> toml::Table {
    match section {
        "proxy" => table_of(&c.proxy),
        "queue" => table_of(&c.queue),
        "retry" => table_of(&c.retry),
        _ => table_of(&c.health),
    }
}

/// Every guard `next` loosens against `base`.
fn loosened_guards(base: &Config, next: &Config, out: &mut Vec<TrustChange>) {
    let number = |t: &toml::Table, f: &str| match t.get(f) {
        Some(toml::Value::Integer(i)) => Some(*i as f64),
        Some(toml::Value::Float(x)) => Some(*x),
        _ => None,
    };
    // Each section read once; GUARDS lists its fields section by section.
    for section in ["proxy", "queue", "retry", "health"] {
        let (old, new) = (guard_section(base, section), guard_section(next, section));
        for (_, field, weaker) in GUARDS.iter().filter(|g| g.0 == section) {
            let (Some(was), Some(now)) = (number(&old, field), number(&new, field)) else { continue };
            if (*weaker == Weaker::Up && now > was) || (*weaker == Weaker::Down && now < was) {
                let (was, now) = (render(old.get(*field)), render(new.get(*field)));
                let message = format!("{section}.{field} would go from {was} to {now}, loosening a guard against load and slow or hostile clients");
                out.push(trust("section", section, field, message));
            }
        }
    }
}

/// The trust changes from `base` to `next`, each in words.
fn trust_changes(base: &Config, next: &Config) -> Vec<TrustChange> {
    let mut out = Vec::new();
    loosened_guards(base, next, &mut out);
    for n in &next.nodes {
        if !base.nodes.iter().any(|o| o.name == n.name) {
            out.push(trust(
                "node",
                &n.name,
                "added",
                format!("new node {} would receive requests (prompts included) at {}", n.name, shown(&n.url)),
            ));
        }
        if let Some(old) = base.nodes.iter().find(|o| o.name == n.name).filter(|o| o.url != n.url) {
            out.push(trust(
                "node",
                &n.name,
                "url",
                format!(
                    "node {} would receive requests (prompts included) at {} instead of {}",
                    n.name,
                    shown(&n.url),
                    shown(&old.url)
                ),
            ));
        }
    }
    for p in &next.providers {
        let Some(old) = base.providers.iter().find(|o| o.name == p.name) else { continue };
        if old.base_url != p.base_url {
            out.push(trust("provider", &p.name, "base_url", format!(
                "provider {} would send requests to {} instead of {}; its key is not sent there until a person re-confirms it (corral secret bind)",
                p.name, shown(&p.base_url), shown(&old.base_url))));
        }
        if old.secret != p.secret {
            let was = if old.secret.is_empty() { "no key".to_string() } else { format!("\"{}\"", old.secret) };
            out.push(trust(
                "provider",
                &p.name,
                "secret",
                format!("provider {} would send keyring entry \"{}\" as its API key (was {was})", p.name, p.secret),
            ));
        }
    }
    for c in &next.categories {
        match base.categories.iter().find(|o| o.name == c.name) {
            None if c.cloud != super::CloudPermission::Never => out.push(trust(
                "category",
                &c.name,
                "added",
                format!(
                    "new category {} may send requests (models: {}) to cloud providers ({})",
                    c.name,
                    listed(&c.models),
                    listed(&c.providers)
                ),
            )),
            None => {}
            Some(old) => category_trust(old, c, &mut out),
        }
    }
    out
}

fn category_trust(old: &super::CategoryConfig, c: &super::CategoryConfig, out: &mut Vec<TrustChange>) {
    use super::CloudPermission::Never;
    if old.cloud == Never && c.cloud != Never {
        out.push(trust(
            "category",
            &c.name,
            "cloud",
            format!(
                "category {} would send requests to cloud providers when local nodes cannot serve them (was never)",
                c.name
            ),
        ));
    }
    if old.redact && !c.redact {
        out.push(trust(
            "category",
            &c.name,
            "redact",
            format!(
                "category {} would stop masking personal data before a request leaves for a cloud provider",
                c.name
            ),
        ));
    }
    if old.providers != c.providers {
        out.push(trust(
            "category",
            &c.name,
            "providers",
            format!(
                "category {} would fall back to providers {} instead of {}",
                c.name,
                listed(&c.providers),
                listed(&old.providers)
            ),
        ));
    }
    if old.order != c.order {
        out.push(trust(
            "category",
            &c.name,
            "order",
            format!("category {} would prefer nodes {} instead of {}", c.name, listed(&c.order), listed(&old.order)),
        ));
    }
    if old.models != c.models {
        out.push(trust(
            "category",
            &c.name,
            "models",
            format!(
                "category {} would take requests for models {} instead of {}",
                c.name,
                listed(&c.models),
                listed(&old.models)
            ),
        ));
    }
}

/// Undo one trust change in `next`: the field goes back to `base`'s value, a new item is left out.
fn hold_back(next: &mut Config, base: &Config, t: &TrustChange) {
    fn undo<T: Clone + Serialize + DeserializeOwned>(
        items: &mut Vec<T>,
        base: &[T],
        name: impl Fn(&T) -> &str,
        t: &TrustChange,
    ) {
        if t.field == "added" {
            items.retain(|i| name(i) != t.name);
        } else if let (Some(item), Some(old)) =
            (items.iter_mut().find(|i| name(i) == t.name), base.iter().find(|b| name(b) == t.name))
        {
            restore_field(item, old, t.field);
        }
    }
    match t.kind {
        "section" => match t.name.as_str() {
            "proxy" => restore_field(&mut next.proxy, &base.proxy, t.field),
            "queue" => restore_field(&mut next.queue, &base.queue, t.field),
            "retry" => restore_field(&mut next.retry, &base.retry, t.field),
            _ => restore_field(&mut next.health, &base.health, t.field),
        },
        "node" => {
            undo(&mut next.nodes, &base.nodes, |n| &n.name, t);
            if t.field == "added" {
                // A node left out is no category's preference either.
                for c in &mut next.categories {
                    c.order.retain(|o| *o != t.name);
                }
            }
        }
        "provider" => undo(&mut next.providers, &base.providers, |p| &p.name, t),
        _ => undo(&mut next.categories, &base.categories, |c| &c.name, t),
    }
}

/// Providers that will have no key after the import: new ones, and those whose origin changed
/// (a key is bound to the origin it was stored for and never follows a provider elsewhere).
fn key_notes(base: &Config, next: &Config) -> Vec<String> {
    let origin = |u: &str| crate::secrets::origin_of(u).unwrap_or_else(|_| u.to_string());
    next.providers
        .iter()
        .filter(|p| !p.secret.is_empty())
        .filter(|p| {
            base.providers
                .iter()
                .find(|o| o.name == p.name)
                .is_none_or(|o| origin(&o.base_url) != origin(&p.base_url) || o.secret != p.secret)
        })
        .map(|p| {
            format!(
            "provider {} gets key \"{}\" only if it is bound to {}: confirm with `corral secret bind {} --origin {}`",
            p.name, p.secret, origin(&p.base_url), p.secret, shown(&p.base_url))
        })
        .collect()
}

/// Secret names a config refers to (values live in the OS keyring, never in the file).
pub fn secret_names(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config
        .providers
        .iter()
        .map(|p| p.secret.clone())
        .chain(config.listeners.iter().flat_map(|l| l.api_keys.iter().cloned()))
        // `"*"` names no secret: it takes the fleet's keys, which live in its database.
        .filter(|s| !s.is_empty() && s != super::ANY_FLEET_KEY)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The text `config export` writes: a header, then the whole config with defaults filled in.
pub fn export_text(config: &Config) -> String {
    format!(
        "# Corral config, exported by corral {} (format 1). Secrets are never included:\n# providers name keyring entries; set them with `corral secret set NAME`.\n{}",
        env!("CARGO_PKG_VERSION"),
        config.to_toml()
    )
}

/// `url` with any password replaced by `***` (`http://user:***@host/`): what status, logs,
/// errors and shared files show of a node or provider URL. Text that is not a URL is left as
/// it is (validation reports it).
pub fn redacted_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// The config as a file to hand to someone else: `export_text` with credentials in node and
/// provider URLs replaced by `***` (they are secrets too; put them back by hand after import).
pub fn share_text(config: &Config) -> String {
    let mut shared = config.clone();
    for n in &mut shared.nodes {
        n.url = redacted_url(&n.url);
    }
    for p in &mut shared.providers {
        p.base_url = redacted_url(&p.base_url);
    }
    let text = export_text(&shared);
    let Ok(mut doc) = text.parse::<toml_edit::DocumentMut>() else { return text };
    for key in MACHINE_LOCAL {
        doc.remove(key);
    }
    if let Some(store) = doc.get_mut("store").and_then(toml_edit::Item::as_table_like_mut) {
        store.remove("path");
        // A broker's name in a fleet is its own: importers keep theirs (the whole [store]).
        store.remove("broker");
    }
    let note = "# Left out, as they belong to each machine: listener and admin addresses, client key\n# bindings, the store's file. An import keeps the importing machine's own.\n";
    format!(
        "{}{note}{}",
        text.lines().take(2).map(|l| format!("{l}\n")).collect::<String>(),
        strip_header(&doc.to_string())
    )
}

/// Sections of a config that describe one machine, never shared: where it listens (and which
/// client keys each listener takes) and its admin listener. The store's file goes too.
const MACHINE_LOCAL: [&str; 2] = ["listeners", "admin"];

/// `text` without the two header comment lines `export_text` puts first.
fn strip_header(text: &str) -> String {
    text.lines().skip_while(|l| l.starts_with('#')).map(|l| format!("{l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;

    #[test]
    fn a_merge_takes_the_section_keys_the_file_sets_and_says_so() {
        let mut base = Config::default();
        base.retry.max_attempts = 4;
        base.queue.max_requests = 77;
        let file = "[retry]\nbackoff_base_ms = 7\n";
        let p = plan(&base, file, ImportMode::Merge, &Accept::Ids(BTreeSet::new())).expect("plans");
        assert_eq!(p.next.retry.backoff_base_ms, 7, "the key the file sets");
        assert_eq!(p.next.retry.max_attempts, 4, "the keys it does not set stay");
        assert_eq!(p.next.queue.max_requests, 77, "a section the file lacks stays");
        let change = p.changes.iter().find(|c| c.kind == "section").expect("the section change is listed");
        assert_eq!((change.name.as_str(), change.fields.len()), ("retry", 1), "{change:?}");
        assert_eq!(change.fields[0].field, "backoff_base_ms");
    }

    #[test]
    fn shared_files_leave_out_what_belongs_to_the_machine() {
        let mut c = Config::default();
        c.store.path = Some("/home/ana/.local/share/corral/corral.db".into());
        c.admin.addr = "127.0.0.1:11500".into();
        c.store.broker = Some("ana-gw-1".into());
        let text = share_text(&c);
        for local in ["/home/ana", "[admin]", "[[listeners]]", "11500", "ana-gw-1"] {
            assert!(!text.contains(local), "{local} is machine-local:\n{text}");
        }
        assert!(text.starts_with("# Corral config, exported by corral"), "{text}");
        let back = Config::parse(&text).expect("still a valid config");
        assert_eq!(back.categories, c.categories);
        assert_eq!(back.store, Config::default().store, "an importer keeps its own store");
    }

    #[test]
    fn shared_files_never_carry_url_credentials() {
        assert_eq!(redacted_url("http://ops:hunter2@gpu1:11434/"), "http://ops:***@gpu1:11434/");
        assert_eq!(redacted_url("http://gpu1:11434"), "http://gpu1:11434", "no password: unchanged");
        assert_eq!(redacted_url("not a url"), "not a url");
        let c = Config { nodes: vec![node("a", "http://ops:hunter2@gpu1:11434")], ..Config::default() };
        let text = share_text(&c);
        assert!(!text.contains("hunter2") && text.contains("ops:***@gpu1"), "{text}");
        assert!(export_text(&c).contains("hunter2"), "the owner's own file keeps what they wrote");
    }

    fn node(name: &str, url: &str) -> NodeConfig {
        NodeConfig { name: name.into(), url: url.into(), ..NodeConfig::default() }
    }

    #[test]
    fn merge_adds_and_updates_but_keeps_the_rest() {
        let base = Config { nodes: vec![node("a", "http://a:1"), node("b", "http://b:1")], ..Config::default() };
        let mut incoming =
            Config { nodes: vec![node("b", "http://b:2"), node("c", "http://c:1")], ..Config::default() };
        incoming.listeners[0].addr = "0.0.0.0:9".into();
        let (next, changes) = import(&base, &incoming, ImportMode::Merge);
        let names: Vec<_> = next.nodes.iter().map(|n| (n.name.as_str(), n.url.as_str())).collect();
        assert_eq!(names, vec![("a", "http://a:1"), ("b", "http://b:2"), ("c", "http://c:1")]);
        assert!(changes.iter().any(|c| (c.action, c.kind, c.name.as_str()) == ("changed", "node", "b")));
        assert!(changes.iter().any(|c| (c.action, c.kind, c.name.as_str()) == ("added", "node", "c")));
        assert_eq!(next.listeners, base.listeners, "addresses belong to the machine");
    }

    #[test]
    fn replace_removes_what_the_file_lacks() {
        let base = Config { nodes: vec![node("a", "http://a:1"), node("b", "http://b:1")], ..Config::default() };
        let incoming = Config { nodes: vec![node("b", "http://b:1")], ..Config::default() };
        let (next, changes) = import(&base, &incoming, ImportMode::Replace);
        assert_eq!(next.nodes.len(), 1);
        assert_eq!(changes, vec![Change { action: "removed", kind: "node", name: "a".into(), fields: Vec::new() }]);
    }

    const MINE: &str = "[[nodes]]\nname = \"gpu1\"\nurl = \"http://10.0.0.1:11434\"\nweight = 2\n\n[[categories]]\nname = \"private\"\ncloud = \"never\"\nredact = true\n\n[[providers]]\nname = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nsecret = \"openai\"\n";

    #[test]
    fn a_merge_takes_only_what_the_file_says() {
        let base = Config::parse(MINE).expect("mine");
        let file = "[[providers]]\nname = \"backup\"\nbase_url = \"https://backup.example/v1\"\n";
        let p = plan(&base, file, ImportMode::Merge, &Accept::none()).expect("plan");
        assert_eq!(p.next.nodes, base.nodes, "no node `local` appears");
        assert_eq!(p.next.categories, base.categories, "no category is reset to its defaults");
        assert_eq!(p.changes.len(), 1, "{:?}", p.changes);
        assert_eq!((p.changes[0].action, p.changes[0].kind), ("added", "provider"));
        let p = plan(
            &base,
            "[[nodes]]\nname = \"gpu1\"\nurl = \"http://10.0.0.1:11434\"\nenabled = false\n",
            ImportMode::Merge,
            &Accept::none(),
        )
        .expect("plan");
        assert_eq!(p.next.nodes[0].weight, 2, "a field the file does not set keeps its value");
        assert!(!p.next.nodes[0].enabled);
        assert_eq!(
            p.changes[0].fields,
            vec![FieldChange { field: "enabled".into(), old: "true".into(), new: "false".into() }]
        );
    }

    #[test]
    fn trust_changes_are_held_back_until_accepted_one_by_one() {
        let base = Config::parse(MINE).expect("mine");
        let file = "[[nodes]]\nname = \"gpu1\"\nurl = \"http://evil:11434\"\nweight = 5\n\n[[categories]]\nname = \"private\"\ncloud = \"on-failure\"\nredact = false\nproviders = [\"openai\"]\n\n[[providers]]\nname = \"openai\"\nbase_url = \"https://evil.example/v1\"\nsecret = \"admin-key\"\n";
        let p = plan(&base, file, ImportMode::Merge, &Accept::none()).expect("plan");
        let ids: Vec<&str> = p.trust.iter().map(|t| t.id.as_str()).collect();
        for id in [
            "node:gpu1:url",
            "provider:openai:base_url",
            "provider:openai:secret",
            "category:private:cloud",
            "category:private:redact",
            "category:private:providers",
        ] {
            assert!(ids.contains(&id), "{id} is named: {ids:?}");
        }
        assert_eq!(p.held_back.len(), p.trust.len());
        assert_eq!(p.next.nodes[0].url, "http://10.0.0.1:11434", "the URL stays");
        assert_eq!(p.next.nodes[0].weight, 5, "the rest applies");
        assert_eq!(p.next.categories, base.categories);
        assert_eq!(p.next.providers, base.providers);
        let one = Accept::Ids(["node:gpu1:url".to_string()].into_iter().collect());
        let p = plan(&base, file, ImportMode::Merge, &one).expect("plan");
        assert_eq!(p.next.nodes[0].url, "http://evil:11434");
        assert_eq!(p.next.categories, base.categories, "only the accepted change applies");
        let all = plan(&base, file, ImportMode::Merge, &Accept::All).expect("plan");
        assert!(all.held_back.is_empty() && !all.next.categories[0].redact);
    }

    #[test]
    fn a_node_the_file_adds_is_held_back_with_the_preferences_that_name_it() {
        let base = Config::parse(MINE).expect("mine");
        let file = "[[nodes]]\nname = \"helper\"\nurl = \"http://203.0.113.9:11434\"\n\n[[categories]]\nname = \"default\"\norder = [\"helper\"]\n";
        let p = plan(&base, file, ImportMode::Merge, &Accept::none()).expect("plan");
        let added = p.trust.iter().find(|t| t.id == "node:helper:added").expect("a new node is a trust change");
        assert_eq!(
            added.message,
            "new node helper would receive requests (prompts included) at http://203.0.113.9:11434"
        );
        assert!(p.next.nodes.iter().all(|n| n.name != "helper"), "held back");
        assert!(p.next.categories.iter().all(|c| !c.order.contains(&"helper".to_string())), "and no order names it");
        assert_eq!(p.next.validate(), Vec::<(String, String)>::new(), "what runs is a valid config");
        let accepted = Accept::Ids(["node:helper:added".to_string()].into_iter().collect());
        let p = plan(&base, file, ImportMode::Merge, &accepted).expect("plan");
        assert!(p.next.nodes.iter().any(|n| n.name == "helper"), "applied once accepted");
    }

    #[test]
    fn a_file_that_loosens_a_guard_is_held_back_and_one_that_tightens_is_not() {
        let base = Config::parse(MINE).expect("mine");
        let file = "[proxy]\nheader_read_timeout_ms = 86400000\nmax_body_bytes = 1099511627776\nconnect_timeout_ms = 2500\n\n[queue]\nmax_requests = 10\nremote_share = 1.0\n\n[health]\ninterval_ms = 1\n\n[retry]\nmax_attempts = 1000\n";
        let p = plan(&base, file, ImportMode::Merge, &Accept::none()).expect("plan");
        let ids: Vec<&str> = p.trust.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "section:proxy:max_body_bytes",
                "section:proxy:header_read_timeout_ms",
                "section:queue:remote_share",
                "section:retry:max_attempts",
                "section:health:interval_ms"
            ],
            "only loosened guards, not max_requests lowered nor a plain timeout"
        );
        assert_eq!(p.next.proxy.header_read_timeout_ms, base.proxy.header_read_timeout_ms, "held back");
        assert_eq!(p.next.health.interval_ms, base.health.interval_ms);
        assert_eq!((p.next.queue.max_requests, p.next.proxy.connect_timeout_ms), (10, 2500), "the rest applies");
        assert!(p.trust[1].message.contains("proxy.header_read_timeout_ms would go from"), "{}", p.trust[1].message);
        let p = plan(&base, file, ImportMode::Merge, &Accept::All).expect("plan");
        assert_eq!(p.next.health.interval_ms, 1, "applied when a person accepts it");
    }

    #[test]
    fn a_look_alike_host_is_shown_as_dns_sees_it() {
        let base = Config::parse(MINE).expect("mine");
        let file = "[[nodes]]\nname = \"gpu1\"\nurl = \"http://gр\u{0443}0.example:11434\"\n";
        let p = plan(&base, file, ImportMode::Merge, &Accept::none()).expect("plan");
        let t = p.trust.iter().find(|t| t.id == "node:gpu1:url").expect("a re-pointed node");
        assert!(t.message.contains("http://xn--g0-") && t.message.contains("(written http://g"), "{}", t.message);
        assert_eq!(shown("https://api.openai.com/v1"), "https://api.openai.com/v1", "plain hosts as written");
    }

    #[test]
    fn export_round_trips() {
        let c = Config::default();
        assert_eq!(Config::parse(&export_text(&c)).expect("parses"), c);
    }
}
