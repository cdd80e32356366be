//! Sharing a setup between machines: `config export` writes a config as text, `config import`
//! combines a file with the running config, and its preview lists what would change.
//!
//! What travels is the cluster's shape: nodes, categories and providers (matched by name), and
//! with `replace` also the tuning sections (proxy, health, breaker, retry, queue, alerts). What
//! belongs to one machine never travels: listener and admin addresses and the store stay the
//! receiving side's. Secrets never travel either: a config only names keyring entries, and
//! `secret_names` lists them so the receiver knows what to set. `import` is pure (two configs
//! in, the next config and its change list out), so a preview and an apply of the same file on
//! the same running config agree; validating the result and swapping it in is the caller's job.

use serde::{Deserialize, Serialize};

use super::schema::Config;

/// How an imported config combines with the running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImportMode {
    /// Add the file's nodes, categories and providers; the file wins on a name both have;
    /// everything else stays.
    Merge,
    /// Nodes, categories and providers become exactly the file's.
    Replace,
}

/// One line of an import preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// "added" | "changed" | "removed"
    pub action: &'static str,
    /// "node" | "category" | "provider" | "section"
    pub kind: &'static str,
    pub name: String,
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

/// The result of importing `incoming` into `base`: the config to run and what changes.
/// Addresses (listeners, admin) and the store location stay the base's: they belong to the
/// machine, not to the shared setup.
pub fn import(base: &Config, incoming: &Config, mode: ImportMode) -> (Config, Vec<Change>) {
    fn combine<T: Clone + PartialEq>(
        kind: &'static str,
        base: &[T],
        incoming: &[T],
        name: impl Fn(&T) -> &str,
        mode: ImportMode,
        changes: &mut Vec<Change>,
    ) -> Vec<T> {
        let mut out: Vec<T> = match mode {
            ImportMode::Merge => base.to_vec(),
            ImportMode::Replace => Vec::new(),
        };
        for item in incoming {
            let n = name(item);
            match base.iter().find(|b| name(b) == n) {
                None => changes.push(Change { action: "added", kind, name: n.to_string() }),
                Some(old) if old != item => changes.push(Change { action: "changed", kind, name: n.to_string() }),
                Some(_) => {}
            }
            match out.iter_mut().find(|o| name(o) == n) {
                Some(slot) => *slot = item.clone(),
                None => out.push(item.clone()),
            }
        }
        if mode == ImportMode::Replace {
            for old in base.iter().filter(|b| !incoming.iter().any(|i| name(i) == name(b))) {
                changes.push(Change { action: "removed", kind, name: name(old).to_string() });
            }
        }
        out
    }
    let mut changes = Vec::new();
    let mut next = base.clone();
    next.nodes = combine("node", &base.nodes, &incoming.nodes, |n| &n.name, mode, &mut changes);
    next.categories = combine("category", &base.categories, &incoming.categories, |c| &c.name, mode, &mut changes);
    next.providers = combine("provider", &base.providers, &incoming.providers, |p| &p.name, mode, &mut changes);
    for (name, differs) in [
        ("proxy", base.proxy != incoming.proxy),
        ("health", base.health != incoming.health),
        ("breaker", base.breaker != incoming.breaker),
        ("retry", base.retry != incoming.retry),
        ("queue", base.queue != incoming.queue),
        ("alerts", base.alerts != incoming.alerts),
    ] {
        if differs && mode == ImportMode::Replace {
            changes.push(Change { action: "changed", kind: "section", name: name.to_string() });
        }
    }
    if mode == ImportMode::Replace {
        next.proxy = incoming.proxy.clone();
        next.health = incoming.health.clone();
        next.breaker = incoming.breaker.clone();
        next.retry = incoming.retry.clone();
        next.queue = incoming.queue.clone();
        next.alerts = incoming.alerts.clone();
    }
    (next, changes)
}

/// Secret names a config refers to (values live in the OS keyring, never in the file).
pub fn secret_names(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config
        .providers
        .iter()
        .map(|p| p.secret.clone())
        .chain(config.listeners.iter().flat_map(|l| l.api_keys.iter().cloned()))
        .filter(|s| !s.is_empty())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;

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
        assert!(changes.contains(&Change { action: "changed", kind: "node", name: "b".into() }));
        assert!(changes.contains(&Change { action: "added", kind: "node", name: "c".into() }));
        assert_eq!(next.listeners, base.listeners, "addresses belong to the machine");
    }

    #[test]
    fn replace_removes_what_the_file_lacks() {
        let base = Config { nodes: vec![node("a", "http://a:1"), node("b", "http://b:1")], ..Config::default() };
        let incoming = Config { nodes: vec![node("b", "http://b:1")], ..Config::default() };
        let (next, changes) = import(&base, &incoming, ImportMode::Replace);
        assert_eq!(next.nodes.len(), 1);
        assert_eq!(changes, vec![Change { action: "removed", kind: "node", name: "a".into() }]);
    }

    #[test]
    fn export_round_trips() {
        let c = Config::default();
        assert_eq!(Config::parse(&export_text(&c)).expect("parses"), c);
    }
}
