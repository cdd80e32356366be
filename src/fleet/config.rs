//! The fleet's shared config: the sections every broker runs alike live in `config_versions`
//! (numbered without gaps, a trigger notifies `corral_config` on every insert), and the
//! database is their source of truth. Each broker keeps its own listeners, admin, store and
//! telemetry, and the proxy's start-bound keys.
//!
//! One task per broker keeps the two in step ([`run`]): it wakes on a notification, on any
//! local `apply()` (an admin edit, an import, a file reload) and every [`POLL`], and then
//! [`Sync::step`] compares three things: the version in force, the shared part running now,
//! and the newest version in the database. A local change (running differs from in force) is
//! published as the next number; a newer version is validated whole, written into the
//! broker's file and applied; both at once are merged three-way, key by key (items matched by
//! name; on one field the database's version wins), and the result published. A version that
//! does not parse or validate is refused once, reported in `/admin/status`, and the broker
//! keeps what it runs.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgPool;
use tokio_util::sync::CancellationToken;
use toml::{Table, Value};

use super::{listen, notified, Fleet};
use crate::config::Config;
use crate::state::Shared;

/// The sections a fleet shares; everything else is each machine's own.
pub const SHARED_SECTIONS: &[&str] =
    &["nodes", "categories", "providers", "proxy", "health", "breaker", "retry", "queue", "alerts", "quotas"];

/// Keys of `[proxy]` bound to a machine's sockets or memory at start: never shared.
pub const LOCAL_PROXY_KEYS: &[&str] = &[
    "connect_timeout_ms",
    "header_read_timeout_ms",
    "keep_alive_timeout_ms",
    "max_connections",
    "max_connections_per_ip",
    "stream_buffer_total_bytes",
];

/// The backstop for a notification lost while the listening connection was away.
pub const POLL: Duration = Duration::from_secs(2);

/// How long a broker waits at start for the fleet's config before serving with its own.
pub const FIRST_SYNC: Duration = Duration::from_secs(5);

/// How often the names of secrets the config uses are looked up in this machine's keyring.
const SECRETS_EVERY: Duration = Duration::from_secs(5);

const NEWEST_SQL: &str = "SELECT version, config FROM config_versions ORDER BY version DESC LIMIT 1";
const PUBLISH_SQL: &str =
    "INSERT INTO config_versions (version, config, author) VALUES ($1, $2, $3) ON CONFLICT (version) DO NOTHING";

/// What `/admin/status` shows of the shared config under `fleet.config`.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct ConfigSync {
    /// The version in force; `None` until the first sync.
    pub version: Option<i64>,
    /// The newest version this broker refused, and why; cleared when a newer one applies.
    pub refused: Option<Refused>,
    /// Named secrets the config uses that this machine's keyring lacks (providers' `secret`,
    /// `store.password_secret`).
    pub missing_secrets: Vec<String>,
    /// Why the keyring could not be asked, while it cannot.
    pub secrets_error: Option<String>,
    /// The last database error of the sync, while it fails.
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Refused {
    pub version: i64,
    pub reason: String,
}

/// The shared part of `config`, as the database holds it.
pub fn shared_part(config: &Config) -> Table {
    let mut all = Table::try_from(config).unwrap_or_default();
    all.retain(|k, _| SHARED_SECTIONS.contains(&k));
    if let Some(Value::Table(proxy)) = all.get_mut("proxy") {
        proxy.retain(|k, _| !LOCAL_PROXY_KEYS.contains(&k));
    }
    all
}

/// `local` with its shared sections replaced by `part`, parsed and validated whole.
pub fn with_shared(local: &Config, part: &Table) -> Result<Config, String> {
    if let Some(k) = part.keys().find(|k| !SHARED_SECTIONS.contains(&k.as_str())) {
        return Err(format!(
            "{k}: not a shared section (each broker keeps its own listeners, admin, store and telemetry)"
        ));
    }
    let mut all = Table::try_from(local).map_err(|e| e.to_string())?;
    let own_proxy = match all.get("proxy") {
        Some(Value::Table(p)) => p.clone(),
        _ => Table::new(),
    };
    all.retain(|k, _| !SHARED_SECTIONS.contains(&k));
    all.extend(part.iter().map(|(k, v)| (k.clone(), v.clone())));
    let proxy = all.entry("proxy").or_insert_with(|| Value::Table(Table::new()));
    let Value::Table(proxy) = proxy else { return Err("proxy: must be a table".into()) };
    for key in LOCAL_PROXY_KEYS {
        proxy.remove(*key);
        if let Some(v) = own_proxy.get(*key) {
            proxy.insert((*key).to_string(), v.clone());
        }
    }
    let text = toml::to_string(&all).map_err(|e| e.to_string())?;
    Config::parse(&text).map_err(|e| e.to_string())
}

/// Three-way merge of one value: a side that did not change takes the other's; tables merge
/// key by key, arrays of named tables item by item; on one field both changed, `remote` wins.
pub fn merge3(base: Option<&Value>, local: Option<&Value>, remote: Option<&Value>) -> Option<Value> {
    if local == base {
        return remote.cloned();
    }
    if remote == base || remote == local {
        return local.cloned();
    }
    match (base, local, remote) {
        (Some(Value::Table(b)), Some(Value::Table(l)), Some(Value::Table(r))) => {
            Some(Value::Table(merge_tables(b, l, r)))
        }
        (Some(Value::Array(b)), Some(Value::Array(l)), Some(Value::Array(r))) => {
            merge_named(b, l, r).map(Value::Array).or_else(|| Some(Value::Array(r.clone())))
        }
        _ => remote.cloned(),
    }
}

fn merge_tables(b: &Table, l: &Table, r: &Table) -> Table {
    let mut keys: Vec<&String> = r.keys().collect();
    keys.extend(l.keys().filter(|k| !r.contains_key(*k)));
    keys.into_iter().filter_map(|k| merge3(b.get(k), l.get(k), r.get(k)).map(|v| (k.clone(), v))).collect()
}

/// Arrays whose items are tables with a unique `name`: merged per name, in `remote`'s order
/// with `local`'s additions after. `None` when an item has no name.
fn merge_named(b: &[Value], l: &[Value], r: &[Value]) -> Option<Vec<Value>> {
    fn named(items: &[Value]) -> Option<Vec<(&str, &Value)>> {
        items.iter().map(|v| v.get("name").and_then(Value::as_str).map(|n| (n, v))).collect()
    }
    let (b, l, r) = (named(b)?, named(l)?, named(r)?);
    fn find<'a>(items: &[(&str, &'a Value)], name: &str) -> Option<&'a Value> {
        items.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
    let mut names: Vec<&str> = r.iter().map(|(n, _)| *n).collect();
    names.extend(l.iter().map(|(n, _)| *n).filter(|n| find(&r, n).is_none()));
    names.dedup();
    Some(names.into_iter().filter_map(|n| merge3(find(&b, n), find(&l, n), find(&r, n))).collect())
}

/// The version in force and its shared part (as this broker normalised it).
struct InForce {
    version: i64,
    part: Table,
}

/// One broker's side of the shared config.
pub struct Sync {
    fleet: Arc<Fleet>,
    shared: Arc<Shared>,
    in_force: Option<InForce>,
    /// The newest version refused: not tried again until a newer one.
    refused: Option<i64>,
}

impl Sync {
    pub fn new(fleet: Arc<Fleet>, shared: Arc<Shared>) -> Self {
        Self { fleet, shared, in_force: None, refused: None }
    }

    fn pool(&self) -> &PgPool {
        self.fleet.pool()
    }

    /// Bring the config in force and the database in step (see the module's rules). A
    /// publish that loses a race re-reads and goes again, a bounded number of times.
    pub async fn step(&mut self) -> Result<(), sqlx::Error> {
        for _ in 0..8 {
            let newest: Option<(i64, String)> = sqlx::query_as(NEWEST_SQL).fetch_optional(self.pool()).await?;
            let running = shared_part(&self.shared.config());
            let changed = self.in_force.as_ref().is_some_and(|f| f.part != running);
            let Some((version, text)) = newest else {
                // An empty fleet: this broker's shared part becomes version 1.
                if self.publish(1, &running).await? {
                    self.in_force(1, running);
                    return Ok(());
                }
                continue;
            };
            let base = self.in_force.as_ref().map(|f| f.version);
            if base == Some(version) {
                if !changed || self.publish(version + 1, &running).await? {
                    if changed {
                        self.in_force(version + 1, running);
                    }
                    return Ok(());
                }
                continue;
            }
            if self.refused == Some(version) {
                return Ok(());
            }
            let remote = match text.parse::<Table>() {
                Ok(t) => t,
                Err(e) => {
                    self.refuse(version, format!("not valid TOML: {}", e.message()));
                    return Ok(());
                }
            };
            let merged = match (&self.in_force, changed) {
                (Some(f), true) => match merge3(
                    Some(&Value::Table(f.part.clone())),
                    Some(&Value::Table(running)),
                    Some(&Value::Table(remote.clone())),
                ) {
                    Some(Value::Table(t)) => t,
                    _ => remote.clone(),
                },
                _ => remote.clone(),
            };
            if merged == remote {
                match self.adopt(&remote) {
                    Ok(part) => self.in_force(version, part),
                    Err(reason) => self.refuse(version, reason),
                }
                return Ok(());
            }
            // Both changed: the merge goes in as the next version, then applies here.
            if let Err(reason) = with_shared(&self.shared.config(), &merged) {
                self.refuse(version, format!("this broker's edit merged onto it does not validate: {reason}"));
                return Ok(());
            }
            if self.publish(version + 1, &merged).await? {
                match self.adopt(&merged) {
                    Ok(part) => self.in_force(version + 1, part),
                    Err(reason) => self.refuse(version + 1, reason),
                }
                return Ok(());
            }
        }
        tracing::warn!("the shared config kept changing under this broker's publish; trying again at the next wake-up");
        Ok(())
    }

    /// Insert `part` as `version`; false when another broker got that number first.
    async fn publish(&self, version: i64, part: &Table) -> Result<bool, sqlx::Error> {
        let text = toml::to_string(part).unwrap_or_default();
        let done = sqlx::query(PUBLISH_SQL)
            .bind(version)
            .bind(text)
            .bind(self.fleet.name())
            .execute(self.pool())
            .await?
            .rows_affected()
            == 1;
        if done {
            tracing::info!(version, "shared config published");
        }
        Ok(done)
    }

    /// Validate `part` over the local sections, write it into the file, apply it. Returns the
    /// shared part now running (normalised: defaults filled in).
    fn adopt(&self, part: &Table) -> Result<Table, String> {
        let _one_at_a_time = self.shared.edit_lock();
        let next = with_shared(&self.shared.config(), part)?;
        self.shared.persist(&next).map_err(|e| format!("cannot write the config file: {e}"))?;
        let running = shared_part(&next);
        self.shared.apply(next);
        Ok(running)
    }

    fn in_force(&mut self, version: i64, part: Table) {
        let changed = self.in_force.as_ref().map(|f| f.version) != Some(version);
        self.in_force = Some(InForce { version, part });
        self.refused = None;
        self.fleet.set_config_version(version);
        self.fleet.update_sync(|s| {
            s.version = Some(version);
            s.refused = None;
            s.last_error = None;
        });
        if changed {
            tracing::info!(version, "shared config in force");
        }
    }

    fn refuse(&mut self, version: i64, reason: String) {
        tracing::error!(version, %reason, "shared config version refused; the running config stays");
        self.refused = Some(version);
        self.fleet.update_sync(|s| s.refused = Some(Refused { version, reason }));
    }

    fn failed(&self, e: &sqlx::Error) {
        tracing::warn!(error = %e, "shared config: the database did not answer; trying again");
        self.fleet.update_sync(|s| s.last_error = Some(e.to_string()));
    }
}

/// Before serving: take the fleet's config (or publish this broker's as the first version),
/// waiting at most [`FIRST_SYNC`]; without the database the broker starts on its own file and
/// the task catches up.
pub async fn first_sync(sync: &mut Sync) {
    match tokio::time::timeout(FIRST_SYNC, sync.step()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => sync.failed(&e),
        Err(_) => {
            tracing::warn!("the fleet's database did not answer at start; serving this broker's own config for now")
        }
    }
}

/// Follow the shared config until `cancel` fires.
pub async fn run(mut sync: Sync, cancel: CancellationToken) {
    let mut applied = sync.shared.applied();
    let mut listener = None;
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if listener.is_none() {
            listener = listen(sync.pool(), "corral_config").await;
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = poll.tick() => {}
            changed = applied.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            got = notified(&mut listener) => {
                if let Err(e) = got {
                    tracing::debug!(error = %e, "config notifications interrupted; listening again");
                    listener = None;
                }
            }
        }
        applied.borrow_and_update();
        if let Err(e) = sync.step().await {
            sync.failed(&e);
        }
    }
}

/// Look up the config's named secrets in this machine's keyring every [`SECRETS_EVERY`].
pub async fn watch_secrets(fleet: Arc<Fleet>, shared: Arc<Shared>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(SECRETS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let config = shared.config();
        let found = tokio::task::spawn_blocking(move || missing_secrets(&config)).await;
        let (missing, error) = match found {
            Ok(Ok(m)) => (m, None),
            Ok(Err(e)) => (Vec::new(), Some(e.to_string())),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        fleet.update_sync(|s| {
            s.missing_secrets = missing;
            s.secrets_error = error;
        });
    }
}

/// The secret names `config` uses that this keyring cannot give for their use.
fn missing_secrets(config: &Config) -> Result<Vec<String>, crate::secrets::SecretError> {
    use crate::secrets::{provider_key_state, unclaimed, KeyState, SecretError};
    let mut missing = Vec::new();
    for p in config.providers.iter().filter(|p| !p.secret.is_empty()) {
        if provider_key_state(&p.secret, &p.base_url)? != KeyState::Set {
            missing.push(p.secret.clone());
        }
    }
    if let Some(name) = &config.store.password_secret {
        match unclaimed(name) {
            Ok(_) => {}
            Err(SecretError::NotFound(_)) => missing.push(name.clone()),
            Err(e) => return Err(e),
        }
    }
    missing.sort();
    missing.dedup();
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Table {
        text.parse().expect("toml")
    }

    #[test]
    fn the_shared_part_leaves_out_what_is_each_machines_own() {
        let c = Config::parse("[admin]\naddr = \"127.0.0.1:9\"\n[proxy]\nmax_connections = 7000\ndrain_timeout_ms = 1234\n[[nodes]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n").expect("config");
        let part = shared_part(&c);
        assert!(part.get("admin").is_none() && part.get("listeners").is_none() && part.get("store").is_none());
        let proxy = part["proxy"].as_table().expect("proxy");
        assert!(proxy.get("max_connections").is_none(), "{proxy:?}");
        assert_eq!(proxy["drain_timeout_ms"].as_integer(), Some(1234));
        assert_eq!(part["nodes"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn a_version_replaces_the_shared_sections_and_keeps_the_machines_own() {
        let local = Config::parse("[admin]\naddr = \"127.0.0.1:9\"\n[proxy]\nmax_connections = 7000\n[[nodes]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n").expect("config");
        let remote = table("[proxy]\nmax_connections = 99\ndrain_timeout_ms = 4321\n[[nodes]]\nname = \"b\"\nurl = \"http://127.0.0.1:2\"\n");
        let next = with_shared(&local, &remote).expect("applies");
        assert_eq!(next.admin.addr, "127.0.0.1:9");
        assert_eq!(next.proxy.max_connections, 7000, "a machine's own key is never taken from the fleet");
        assert_eq!(next.proxy.drain_timeout_ms, 4321);
        assert_eq!(next.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["b"]);
        let bad = with_shared(&local, &table("[admin]\naddr = \"0.0.0.0:1\"\n")).expect_err("machine-local");
        assert!(bad.starts_with("admin: not a shared section"), "{bad}");
        let invalid = with_shared(&local, &table("[[nodes]]\nname = \"b\"\nurl = \"ftp://x\"\n")).expect_err("invalid");
        assert!(invalid.contains("nodes[0].url"), "{invalid}");
        let unknown = with_shared(&local, &table("[health]\nintervall_ms = 5\n")).expect_err("unknown key");
        assert!(unknown.contains("intervall_ms"), "{unknown}");
    }

    /// A version written into a broker's file and read back must be the same version, or the
    /// reload would look like a local edit and two brokers would publish it back and forth.
    #[test]
    fn the_readme_config_survives_the_fleet_s_round_trip_through_a_file() {
        let readme = include_str!("../../README.md");
        let start = readme.find("```toml\n").expect("README has a config example") + "```toml\n".len();
        let text = &readme[start..start + readme[start..].find("```").expect("closed")];
        let config = Config::parse(text).expect("the README's config is valid");
        let mut remote = shared_part(&config);
        // A version from elsewhere: one field changed, so the file really is written.
        if let Some(Value::Table(h)) = remote.get_mut("health") {
            h.insert("interval_ms".into(), Value::Integer(4321));
        }
        let next = with_shared(&config, &remote).expect("applies");
        assert_eq!(shared_part(&next), remote, "applied as published");
        let dir = std::env::temp_dir().join(format!("corral-fleet-roundtrip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("corral.toml");
        std::fs::write(&file, text).expect("write");
        crate::config::write_into(&file, &next).expect("written into the file");
        let back = Config::load(&file).expect("reads back");
        assert_eq!(shared_part(&back), remote, "the file read back is the version, not a local edit");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn two_edits_on_one_version_merge_per_key_and_per_named_item() {
        let base = table("[health]\ninterval_ms = 1000\ntimeout_ms = 500\n[[nodes]]\nname = \"a\"\nweight = 1\n[[nodes]]\nname = \"b\"\nweight = 1\n");
        let local = table("[health]\ninterval_ms = 2000\ntimeout_ms = 500\n[[nodes]]\nname = \"a\"\nweight = 5\n[[nodes]]\nname = \"b\"\nweight = 1\n[[nodes]]\nname = \"c\"\nweight = 1\n");
        let remote = table("[health]\ninterval_ms = 3000\ntimeout_ms = 700\n[[nodes]]\nname = \"b\"\nweight = 2\n");
        let merged =
            merge3(Some(&Value::Table(base)), Some(&Value::Table(local)), Some(&Value::Table(remote))).expect("merged");
        let want = table("[health]\ninterval_ms = 3000\ntimeout_ms = 700\n");
        let got = merged.as_table().expect("table");
        assert_eq!(got["health"], want["health"], "one field both changed: the database's wins; one side only: kept");
        let names: Vec<&str> =
            got["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["name"].as_str()).collect();
        // `a`: removed in the database, reweighted here; both changed it, the database wins.
        assert_eq!(names, ["b", "c"], "remote's order, then local's additions");
        assert_eq!(got["nodes"][0]["weight"].as_integer(), Some(2));
    }
}
