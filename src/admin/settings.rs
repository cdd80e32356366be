//! `/admin/settings` and `/admin/client-keys`: what the UI's Settings screen reads and edits.
//!
//! Settings are the broker-wide sections a person tunes: the listeners (addresses, origin,
//! allowed web origins), the admin address, `[health]`, `[breaker]`, `[queue]`, `[retry]` and
//! the store's retention. A `PUT` takes any subset, key by key, merged into the sections as they
//! stand; the whole resulting config is validated, written into the config file as every other
//! edit is (`config::write_into`: in place, comments kept), and the live sections are applied at
//! once. Keys bound at start (`state::RESTART_KEYS`: listeners, the admin address, the store)
//! are written to the file only and named in `restart_needed`: the answer never pretends a
//! socket moved. Without a config file such keys cannot be kept, and the answer says to use
//! `--listen` / `--admin` instead.
//!
//! Client keys are keyring entries of purpose `client` that a listener names in `api_keys`.
//! Creating one makes a random key, stores it in the keyring, lists its name on the chosen
//! listeners in the file, and hands the value back once (never again: reads give names and
//! last use). Revoking deletes the value, which stops it within a second (`clients::watch`);
//! the name leaves a listener's list only where other keys remain, so a listener that asked
//! for keys never opens up at its next start.

use axum::extract::{Path, State};
use axum::Json;
use http::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{parse, validate, AdminError, AdminState};
use crate::config::{Config, Origin};
use crate::secrets::SecretError;

/// Keyring calls block on D-Bus: run them off the async workers.
async fn keyring<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SecretError> + Send + 'static,
) -> Result<T, AdminError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AdminError::Secret(SecretError::Keyring(e.to_string())))?
        .map_err(AdminError::from)
}

/// The config the next start will read: the file's, else the running one.
fn at_next_start(s: &AdminState) -> Config {
    s.shared.config_file().and_then(|p| Config::load(p).ok()).unwrap_or_else(|| (*s.shared.config()).clone())
}

/// `GET /admin/settings`.
pub(super) async fn get(State(s): State<AdminState>) -> Json<Value> {
    Json(settings_json(&s).await)
}

async fn settings_json(s: &AdminState) -> Value {
    let running = s.shared.config();
    let boot = at_next_start(s);
    let (bound, _) = s.shared.front();
    let listeners: Vec<Value> = boot
        .listeners
        .iter()
        .enumerate()
        .map(|(i, l)| {
            json!({
                "addr": l.addr,
                "origin": l.origin,
                "allowed_origins": l.allowed_origins,
                "api_keys": l.api_keys,
                "bound": bound.get(i),
                "exposed": exposed(&l.addr),
            })
        })
        .collect();
    let pending = s.shared.reload.lock().map(|r| r.pending_restart.clone()).unwrap_or_default();
    json!({
        "file": s.shared.config_file().map(|p| p.display().to_string()),
        "listeners": listeners,
        "admin": { "addr": boot.admin.addr, "exposed": exposed(&boot.admin.addr) },
        "health": running.health,
        "breaker": running.breaker,
        "queue": running.queue,
        "retry": running.retry,
        "store": retention_of(&boot.store),
        "pending_restart": pending,
        "client_keys": client_keys(s, &boot).await,
    })
}

/// Whether an address is reachable from other machines (not loopback).
fn exposed(addr: &str) -> bool {
    addr.parse::<std::net::SocketAddr>().map(|a| !a.ip().is_loopback()).unwrap_or(false)
}

/// The retention part of `[store]`: the keys the Settings screen edits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Retention {
    max_age_days: u32,
    max_rows: u64,
    retention_interval_ms: u64,
}

fn retention_of(store: &crate::config::StoreConfig) -> Retention {
    Retention {
        max_age_days: store.max_age_days,
        max_rows: store.max_rows,
        retention_interval_ms: store.retention_interval_ms,
    }
}

/// `GET /admin/client-keys`: the same list as the settings' `client_keys`.
pub(super) async fn list_keys(State(s): State<AdminState>) -> Json<Value> {
    let boot = at_next_start(&s);
    Json(client_keys(&s, &boot).await)
}

/// Every client key a listener names (or the keyring holds as a client key), with the
/// listeners that ask for it, whether its value is in the keyring, and its last use.
async fn client_keys(s: &AdminState, boot: &Config) -> Value {
    let stored = keyring(crate::secrets::entries).await;
    let mut names: std::collections::BTreeSet<String> =
        boot.listeners.iter().chain(&s.shared.config().listeners).flat_map(|l| l.api_keys.clone()).collect();
    if let Ok(entries) = &stored {
        names.extend(entries.iter().filter(|e| e.purpose == "client").map(|e| e.name.clone()));
    }
    let used = s.shared.client_keys.info();
    let (fleet_names, usage, fleet_error) = match &s.fleet {
        Some(f) => super::fleet_keys::listed(f).await,
        None => Default::default(),
    };
    names.extend(fleet_names.iter().cloned());
    names.remove(crate::config::ANY_FLEET_KEY);
    let quotas = s.shared.telemetry.quotas().view(crate::quota::now_s());
    let keys: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let fleet_key = fleet_names.contains(&name);
            let takes = |l: &crate::config::ListenerConfig| {
                l.api_keys.contains(&name)
                    || (fleet_key && l.api_keys.iter().any(|k| k == crate::config::ANY_FLEET_KEY))
            };
            let on: Vec<usize> = boot.listeners.iter().enumerate().filter(|(_, l)| takes(l)).map(|(i, _)| i).collect();
            let in_keyring = stored.as_ref().ok().map(|e| e.iter().any(|x| x.name == name));
            let last_used = used.iter().find(|k| k.name == name).and_then(|k| k.last_used);
            let quota = quotas.iter().find(|q| q.key == name);
            let row =
                json!({ "name": name, "listeners": on, "stored": in_keyring, "last_used": last_used, "quota": quota });
            super::fleet_keys::with_usage(row, &usage, &fleet_names)
        })
        .collect();
    json!({ "keys": keys, "keyring_error": stored.err().map(|e| e.to_string()), "fleet_error": fleet_error })
}

/// A `PUT /admin/settings` body: any subset of the sections, each any subset of its keys.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SettingsPatch {
    listeners: Option<Vec<ListenerPatch>>,
    admin: Option<AdminPatch>,
    health: Option<Value>,
    breaker: Option<Value>,
    queue: Option<Value>,
    retry: Option<Value>,
    store: Option<Value>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ListenerPatch {
    addr: Option<String>,
    origin: Option<Origin>,
    allowed_origins: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AdminPatch {
    addr: Option<String>,
}

/// In words, why a value does not fit its key (serde's wording names Rust types).
fn plain(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if text.contains("expected u") || text.contains("expected usize") {
        "must be a whole number, 0 or more".into()
    } else if text.contains("expected f64") {
        "must be a number".into()
    } else if text.contains("unknown field") {
        "is not a setting of this section".into()
    } else {
        text
    }
}

/// `current` with the keys of `patch` (a JSON object) set, each checked on its own so every
/// bad key is named: `section.key: why`.
fn merged<T: Serialize + DeserializeOwned + Clone>(
    section: &str,
    current: &T,
    patch: Option<&Value>,
    problems: &mut Vec<String>,
) -> T {
    let Some(patch) = patch else { return current.clone() };
    let Some(keys) = patch.as_object() else {
        problems.push(format!("{section}: send an object of settings"));
        return current.clone();
    };
    let Ok(Value::Object(base)) = serde_json::to_value(current) else { return current.clone() };
    let mut all = base.clone();
    let before = problems.len();
    for (k, v) in keys {
        let mut one = base.clone();
        one.insert(k.clone(), v.clone());
        match serde_json::from_value::<T>(Value::Object(one)) {
            Ok(_) => {
                all.insert(k.clone(), v.clone());
            }
            Err(e) => problems.push(format!("{section}.{k}: {}", plain(&e))),
        }
    }
    if problems.len() > before {
        return current.clone();
    }
    serde_json::from_value(Value::Object(all)).unwrap_or_else(|e| {
        problems.push(format!("{section}: {}", plain(&e)));
        current.clone()
    })
}

/// The restart-bound part of a patch, applied to the config of the next start.
fn apply_bound(boot: &mut Config, patch: &SettingsPatch, problems: &mut Vec<String>) {
    for (i, p) in patch.listeners.iter().flatten().enumerate() {
        let Some(l) = boot.listeners.get_mut(i) else {
            problems.push(format!("listeners[{i}]: there is no such listener; add listeners in the config file"));
            continue;
        };
        if let Some(a) = &p.addr {
            l.addr = a.trim().to_string();
        }
        if let Some(o) = p.origin {
            l.origin = o;
        }
        if let Some(o) = &p.allowed_origins {
            l.allowed_origins = o.iter().map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect();
        }
    }
    if let Some(a) = patch.admin.as_ref().and_then(|a| a.addr.as_ref()) {
        boot.admin.addr = a.trim().to_string();
    }
    let r = merged("store", &retention_of(&boot.store), patch.store.as_ref(), problems);
    boot.store.max_age_days = r.max_age_days;
    boot.store.max_rows = r.max_rows;
    boot.store.retention_interval_ms = r.retention_interval_ms;
}

/// `PUT /admin/settings`: validate the whole result, write the file, apply what applies now.
/// Answers `saved_to`, `restart_needed` (the keys that wait for a restart) and the settings.
pub(super) async fn put(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let patch: SettingsPatch = parse(&body)?;
    // From reading the config in force to swapping the result in: one edit at a time.
    let one_at_a_time = s.shared.edit_lock();
    let running = s.shared.config();
    let mut problems = Vec::new();
    let mut next = (*running).clone();
    next.health = merged("health", &running.health, patch.health.as_ref(), &mut problems);
    next.breaker = merged("breaker", &running.breaker, patch.breaker.as_ref(), &mut problems);
    next.queue = merged("queue", &running.queue, patch.queue.as_ref(), &mut problems);
    next.retry = merged("retry", &running.retry, patch.retry.as_ref(), &mut problems);
    let before = at_next_start(&s);
    let mut boot = before.clone();
    apply_bound(&mut boot, &patch, &mut problems);
    if !problems.is_empty() {
        return Err(AdminError::Invalid(problems));
    }
    let to_write = with_bound(&next, &boot);
    validate(&to_write)?;
    let waits = crate::state::restart_needed(&before, &boot);
    let saved_to = write_or_refuse(&s, &to_write, &waits)?;
    s.shared.apply(next);
    drop(one_at_a_time);
    note_pending(&s, &waits);
    let mut answer = settings_json(&s).await;
    answer["saved_to"] = json!(saved_to);
    answer["restart_needed"] = json!(waits);
    Ok(Json(answer))
}

/// `next` with the restart-bound sections of `boot`: what the file should hold.
fn with_bound(next: &Config, boot: &Config) -> Config {
    let mut c = next.clone();
    c.listeners = boot.listeners.clone();
    c.admin = boot.admin.clone();
    c.store = boot.store.clone();
    c.proxy.connect_timeout_ms = boot.proxy.connect_timeout_ms;
    c.proxy.header_read_timeout_ms = boot.proxy.header_read_timeout_ms;
    c.telemetry = boot.telemetry.clone();
    c
}

/// Write the config file; without one, refuse a change that only a file could keep.
fn write_or_refuse(s: &AdminState, to_write: &Config, waits: &[&str]) -> Result<Option<String>, AdminError> {
    match s.shared.config_file() {
        Some(path) => {
            crate::config::write_into(path, to_write)?;
            Ok(Some(path.display().to_string()))
        }
        None if waits.is_empty() => Ok(None),
        None => Err(AdminError::Invalid(
            waits
                .iter()
                .map(|k| {
                    let key = if *k == "listeners" { "listeners[0].addr" } else { k };
                    format!("{key}: this broker runs without a config file, so this cannot be kept; start it with --listen ADDR / --admin ADDR, or with --config FILE")
                })
                .collect(),
        )),
    }
}

/// Record keys that wait for a restart where the status shows them.
fn note_pending(s: &AdminState, waits: &[&str]) {
    if let Ok(mut r) = s.shared.reload.lock() {
        for k in waits {
            if !r.pending_restart.iter().any(|p| p == k) {
                r.pending_restart.push((*k).to_string());
            }
        }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewKey {
    name: String,
    /// Listener indexes that will ask for it (default: every listener).
    #[serde(default)]
    listeners: Option<Vec<usize>>,
}

/// 32 random bytes, hex, with a prefix that says what it is.
fn new_key_value() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("ck-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// `POST /admin/client-keys` `{"name", "listeners"?}`: a new client key, its value in the answer
/// (the only time it is shown), its name on the listeners in the config file.
pub(super) async fn create(
    State(s): State<AdminState>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), AdminError> {
    let ask: NewKey = parse(&body)?;
    crate::secrets::check_name(&ask.name)?;
    if let Some(fleet) = &s.fleet {
        return super::fleet_keys::create(&s, fleet, ask.name, new_key_value(), ask.listeners).await;
    }
    let name = ask.name.clone();
    if keyring(move || crate::secrets::client_key(&name).map(|_| true).or_else(not_found_is_false)).await? {
        return Err(AdminError::Conflict { kind: "client key", name: ask.name });
    }
    let running = s.shared.config();
    let before = at_next_start(&s);
    let mut boot = before.clone();
    let on: Vec<usize> = ask.listeners.unwrap_or_else(|| (0..boot.listeners.len()).collect());
    for &i in &on {
        let l = boot
            .listeners
            .get_mut(i)
            .ok_or_else(|| AdminError::Invalid(vec![format!("listeners[{i}]: there is no such listener")]))?;
        if !l.api_keys.contains(&ask.name) {
            l.api_keys.push(ask.name.clone());
        }
    }
    let to_write = with_bound(&running, &boot);
    validate(&to_write)?;
    let value = new_key_value();
    let (n, v) = (ask.name.clone(), value.clone());
    keyring(move || crate::secrets::set_client_key(&n, &v)).await?;
    let waits = crate::state::restart_needed(&before, &boot);
    let saved_to = match write_or_refuse(&s, &to_write, &waits) {
        Ok(p) => p,
        Err(e) => {
            let n = ask.name.clone();
            let _ = keyring(move || crate::secrets::delete(&n)).await;
            return Err(e);
        }
    };
    note_pending(&s, &waits);
    // Live at once where a running listener already asks for this name; else at the restart.
    let live = running.listeners.iter().enumerate().any(|(i, l)| on.contains(&i) && l.api_keys.contains(&ask.name));
    tracing::info!(client_key = %ask.name, listeners = ?on, "client key created");
    let answer =
        json!({ "name": ask.name, "key": value, "listeners": on, "saved_to": saved_to, "restart_needed": !live });
    Ok((StatusCode::CREATED, Json(answer)))
}

fn not_found_is_false(e: SecretError) -> Result<bool, SecretError> {
    match e {
        SecretError::NotFound(_) => Ok(false),
        other => Err(other),
    }
}

/// `DELETE /admin/client-keys/{name}`: the value leaves the keyring (the key stops working
/// within a second); the name leaves each listener's list where other keys remain.
pub(super) async fn revoke(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    crate::secrets::check_name(&name)?;
    let in_fleet = match &s.fleet {
        Some(fleet) => super::fleet_keys::revoke(fleet, &s, &name).await?,
        None => false,
    };
    let n = name.clone();
    let in_keyring = keyring(move || crate::secrets::delete(&n).map(|_| true).or_else(not_found_is_false));
    // A fleet member's keyring may not answer at all (a headless server): that is no error here.
    let deleted = match in_keyring.await {
        Ok(d) => d || in_fleet,
        Err(_) if in_fleet => true,
        Err(e) => return Err(e),
    };
    let before = at_next_start(&s);
    let mut boot = before.clone();
    let mut kept_on = Vec::new();
    for (i, l) in boot.listeners.iter_mut().enumerate().filter(|(_, l)| l.api_keys.contains(&name)) {
        if l.api_keys.len() > 1 {
            l.api_keys.retain(|k| *k != name);
        } else {
            kept_on.push(i);
        }
    }
    if !deleted && before == boot && kept_on.is_empty() {
        return Err(AdminError::NotFound { kind: "client key", name });
    }
    let saved_to = match s.shared.config_file() {
        Some(path) if before != boot => {
            crate::config::write_into(path, &with_bound(&s.shared.config(), &boot))?;
            Some(path.display().to_string())
        }
        _ => None,
    };
    tracing::info!(client_key = %name, "client key revoked");
    Ok(Json(json!({ "name": name, "revoked": true, "kept_on": kept_on, "saved_to": saved_to })))
}
