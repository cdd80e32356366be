//! Secrets in the OS keyring: Secret Service on Linux, Keychain on macOS, Credential Manager on
//! Windows, through the `keyring` crate.
//!
//! This module is the only code that touches secret values. Config files and exports only
//! name a secret; the admin API stores and deletes values but never returns one; errors and
//! logs name the secret, never its value.
//!
//! Secrets have owners. Each entry lives in the namespace of its purpose (a keyring service of
//! its own): `corral.provider` (cloud API keys), `corral.client` (keys clients of a remote
//! listener present), `corral.internal` (the admin token). A provider's key is read with
//! [`provider_key`], which looks in the provider namespace only, and only hands the key out for
//! an origin (scheme, host, port) the key is bound to: the bindings sit in the keyring too
//! (`corral.binding`), beside the key, out of reach of a config file or an import. A key is
//! bound when a person stores it for the providers that name it (`corral secret set`,
//! `PUT /admin/secrets/{name}`) or re-confirms it (`corral secret bind`, the Providers
//! screen); never on first use, which is exactly what a re-pointed provider would ask for.
//!
//! Entries from before namespaces (service `corral`, and entries stored without saying what
//! they are for) are *unclaimed*: a client-key lookup ([`get`]) may read them, a provider
//! never does. [`claim`] moves them into their namespace, bound to the origins of the config
//! a person wrote: the broker calls it once at start with the file it started with (never
//! with a config changed by an import or the admin API), and `corral config import` with the
//! file it is about to change, before writing it.
//!
//! The keyring cannot list its entries, so each namespace keeps its names in one more entry
//! of its own (`index`), a JSON list. Keyring calls block (D-Bus round trips), so async callers
//! run them on the blocking pool. Index updates are serialized within a process; two processes
//! changing secrets at the same instant could lose a name from an index (never a value).
//! Tests without a Secret Service call [`use_memory_store`] first: the same code over a map in
//! this process's memory.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use keyring::Entry;
use serde::Serialize;

/// The service of entries from before namespaces (and of their index).
const LEGACY: &str = "corral";
/// Where each provider key's bound origins are kept (a JSON list per key name).
const BINDINGS: &str = "corral.binding";
const INDEX: &str = "index";
/// Names Corral keeps for itself: never a provider's or a client's key.
pub const INTERNAL_NAMES: &[&str] = &["admin-token"];

/// Serializes read-modify-write of the indexes and bindings within this process.
static INDEX_LOCK: Mutex<()> = Mutex::new(());

/// What a keyring entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    /// A cloud provider's API key, sent only to the origins it is bound to.
    Provider,
    /// A key a client of a remote listener presents.
    Client,
    /// Corral's own: the admin token.
    Internal,
}

impl Purpose {
    fn service(self) -> &'static str {
        match self {
            Self::Provider => "corral.provider",
            Self::Client => "corral.client",
            Self::Internal => "corral.internal",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Client => "client",
            Self::Internal => "internal",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret names use a-z, 0-9, '-', '_' and '.', 1 to 64 characters; \"{0}\" does not")]
    BadName(String),
    #[error("no secret named \"{0}\" in the keyring")]
    NotFound(String),
    #[error("a secret value cannot be empty")]
    Empty,
    #[error("the OS keyring is not available ({0}); on Linux a Secret Service (gnome-keyring, KeePassXC) must be running and unlocked")]
    NoKeyring(String),
    #[error("the OS keyring refused: {0}")]
    Keyring(String),
    #[error("\"{0}\" is reserved for Corral's own use (the admin token); pick another name")]
    Reserved(String),
    #[error("\"{name}\" is a {purpose} entry; a provider may only use a provider key (store one with `corral secret set NAME --origin URL`)")]
    WrongPurpose { name: String, purpose: &'static str },
    #[error("key \"{name}\" not bound to this origin ({origin}); re-confirm with `corral secret bind {name} --origin {origin}` or on the Providers screen")]
    Unbound { name: String, origin: String },
    #[error("\"{0}\" is not an http(s) origin like https://api.openai.com")]
    BadOrigin(String),
}

impl SecretError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadName(_) => "bad_secret_name",
            Self::NotFound(_) => "secret_not_found",
            Self::Empty => "empty_secret",
            Self::NoKeyring(_) => "keyring_unavailable",
            Self::Keyring(_) => "keyring_failed",
            Self::Reserved(_) => "reserved_secret_name",
            Self::WrongPurpose { .. } => "secret_wrong_purpose",
            Self::Unbound { .. } => "key_not_bound",
            Self::BadOrigin(_) => "bad_origin",
        }
    }
}

pub fn check_name(name: &str) -> Result<(), SecretError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
        && name != INDEX;
    if ok {
        Ok(())
    } else {
        Err(SecretError::BadName(name.chars().take(64).collect()))
    }
}

/// Whether `name` is one of Corral's internal entries.
pub fn is_internal(name: &str) -> bool {
    INTERNAL_NAMES.contains(&name)
}

/// A name a person may store a provider or client key under.
fn check_user_name(name: &str) -> Result<(), SecretError> {
    check_name(name)?;
    if is_internal(name) {
        return Err(SecretError::Reserved(name.to_string()));
    }
    Ok(())
}

/// The origin a key is bound to: `scheme://host:port`, with the scheme's default port filled
/// in, so `https://api.openai.com/v1` and `https://api.openai.com:443/x` are one origin.
pub fn origin_of(url: &str) -> Result<String, SecretError> {
    let bad = || SecretError::BadOrigin(url.chars().take(200).collect());
    let u = url::Url::parse(url).map_err(|_| bad())?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad());
    }
    let host = u.host_str().ok_or_else(bad)?;
    let port = u.port_or_known_default().ok_or_else(bad)?;
    Ok(format!("{}://{}:{port}", u.scheme(), host.to_ascii_lowercase()))
}

// ---- the store: the OS keyring, or a map for tests -------------------------------------------

enum Store {
    Os,
    Memory(Mutex<HashMap<(String, String), String>>),
}

static STORE: OnceLock<Store> = OnceLock::new();

fn store() -> &'static Store {
    STORE.get_or_init(|| Store::Os)
}

/// Test hook: keep this process's secrets in memory instead of the OS keyring. Call it before
/// any other function here; returns false when the OS keyring was already in use (then nothing
/// changes). The `corral` binary never calls it.
pub fn use_memory_store() -> bool {
    STORE.set(Store::Memory(Mutex::default())).is_ok() || matches!(store(), Store::Memory(_))
}

fn map(e: keyring::Error, name: &str) -> SecretError {
    match e {
        keyring::Error::NoEntry => SecretError::NotFound(name.to_string()),
        keyring::Error::NoStorageAccess(inner) | keyring::Error::PlatformFailure(inner) => {
            SecretError::NoKeyring(inner.to_string())
        }
        other => SecretError::Keyring(other.to_string()),
    }
}

fn entry(service: &str, name: &str) -> Result<Entry, SecretError> {
    Entry::new(service, name).map_err(|e| map(e, name))
}

fn raw_get(service: &str, name: &str) -> Result<Option<String>, SecretError> {
    match store() {
        Store::Memory(m) => {
            Ok(m.lock().unwrap_or_else(|p| p.into_inner()).get(&(service.to_string(), name.to_string())).cloned())
        }
        Store::Os => match entry(service, name)?.get_password() {
            Ok(v) => Ok(Some(v)),
            Err(keyring::Error::NoEntry) => Ok(None),
            Err(e) => Err(map(e, name)),
        },
    }
}

fn raw_set(service: &str, name: &str, value: &str) -> Result<(), SecretError> {
    match store() {
        Store::Memory(m) => {
            m.lock().unwrap_or_else(|p| p.into_inner()).insert((service.into(), name.into()), value.into());
            Ok(())
        }
        Store::Os => entry(service, name)?.set_password(value).map_err(|e| map(e, name)),
    }
}

/// Remove an entry; whether there was one.
fn raw_delete(service: &str, name: &str) -> Result<bool, SecretError> {
    match store() {
        Store::Memory(m) => {
            Ok(m.lock().unwrap_or_else(|p| p.into_inner()).remove(&(service.to_string(), name.to_string())).is_some())
        }
        Store::Os => match entry(service, name)?.delete_credential() {
            Ok(()) => Ok(true),
            Err(keyring::Error::NoEntry) => Ok(false),
            Err(e) => Err(map(e, name)),
        },
    }
}

fn read_list(service: &str, name: &str) -> Result<Vec<String>, SecretError> {
    Ok(raw_get(service, name)?.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default())
}

fn write_list(service: &str, name: &str, list: &[String]) -> Result<(), SecretError> {
    if list.is_empty() {
        return raw_delete(service, name).map(|_| ());
    }
    raw_set(service, name, &serde_json::to_string(list).unwrap_or_else(|_| "[]".into()))
}

/// Add or remove `name` in `service`'s index. Callers hold `INDEX_LOCK`.
fn index(service: &str, name: &str, present: bool) -> Result<(), SecretError> {
    let mut names = read_list(service, INDEX)?;
    let had = names.iter().any(|n| n == name);
    if had == present {
        return Ok(());
    }
    names.retain(|n| n != name);
    if present {
        names.push(name.to_string());
        names.sort();
    }
    write_list(service, INDEX, &names)
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    INDEX_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Remove `name` from every namespace but `keep` (and from the unclaimed ones). Callers hold
/// the lock.
fn remove_elsewhere(name: &str, keep: Option<Purpose>) -> Result<bool, SecretError> {
    let mut removed = false;
    for p in [Purpose::Provider, Purpose::Client] {
        if Some(p) != keep && raw_delete(p.service(), name)? {
            index(p.service(), name, false)?;
            removed = true;
        }
    }
    if keep != Some(Purpose::Provider) {
        raw_delete(BINDINGS, name)?;
    }
    if raw_delete(LEGACY, name)? {
        index(LEGACY, name, false)?;
        removed = true;
    }
    Ok(removed)
}

// ---- what the CLI and the admin API call ------------------------------------------------------

/// Store `value` under `name` without saying what it is for: an unclaimed entry. A client-key
/// lookup may use it; a provider only once it is claimed ([`claim`]) or bound ([`bind`]).
pub fn set(name: &str, value: &str) -> Result<(), SecretError> {
    check_user_name(name)?;
    if value.is_empty() {
        return Err(SecretError::Empty);
    }
    let _serial = lock();
    remove_elsewhere(name, None)?;
    raw_set(LEGACY, name, value)?;
    index(LEGACY, name, true)?;
    tracing::info!(secret = name, "secret stored in the OS keyring (unclaimed)");
    Ok(())
}

/// Store a provider's key, bound to exactly `origins` (each `scheme://host:port`, see
/// [`origin_of`]): setting a key again is how a person re-confirms where it may go.
pub fn set_provider_key(name: &str, value: &str, origins: &[String]) -> Result<(), SecretError> {
    check_user_name(name)?;
    if value.is_empty() {
        return Err(SecretError::Empty);
    }
    let origins = origins.iter().map(|o| origin_of(o)).collect::<Result<Vec<_>, _>>()?;
    let _serial = lock();
    remove_elsewhere(name, Some(Purpose::Provider))?;
    raw_set(Purpose::Provider.service(), name, value)?;
    index(Purpose::Provider.service(), name, true)?;
    write_list(BINDINGS, name, &dedup(origins.clone()))?;
    tracing::info!(secret = name, origins = ?origins, "provider key stored in the OS keyring");
    Ok(())
}

/// Store a client key (one a client of a remote listener presents).
pub fn set_client_key(name: &str, value: &str) -> Result<(), SecretError> {
    check_user_name(name)?;
    if value.is_empty() {
        return Err(SecretError::Empty);
    }
    let _serial = lock();
    remove_elsewhere(name, Some(Purpose::Client))?;
    raw_set(Purpose::Client.service(), name, value)?;
    index(Purpose::Client.service(), name, true)?;
    tracing::info!(secret = name, "client key stored in the OS keyring");
    Ok(())
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

/// A person's confirmation that provider key `name` may be sent to `origin` (a URL; only its
/// scheme, host and port count). An unclaimed entry becomes a provider key on the way.
pub fn bind(name: &str, origin: &str) -> Result<String, SecretError> {
    check_user_name(name)?;
    let origin = origin_of(origin)?;
    let _serial = lock();
    if raw_get(Purpose::Provider.service(), name)?.is_none() {
        if raw_get(Purpose::Client.service(), name)?.is_some() {
            return Err(SecretError::WrongPurpose { name: name.into(), purpose: "client" });
        }
        let value = raw_get(LEGACY, name)?.ok_or_else(|| SecretError::NotFound(name.into()))?;
        raw_set(Purpose::Provider.service(), name, &value)?;
        index(Purpose::Provider.service(), name, true)?;
        raw_delete(LEGACY, name)?;
        index(LEGACY, name, false)?;
    }
    let mut origins = read_list(BINDINGS, name)?;
    origins.push(origin.clone());
    write_list(BINDINGS, name, &dedup(origins))?;
    tracing::info!(secret = name, origin = %origin, "provider key bound to an origin");
    Ok(origin)
}

/// The origins provider key `name` is bound to (empty for any other entry).
pub fn bindings(name: &str) -> Result<Vec<String>, SecretError> {
    check_name(name)?;
    read_list(BINDINGS, name)
}

/// Claim unclaimed entries for the config a person wrote: each `(name, base_url)` of a provider
/// becomes a provider key bound to that origin, each client name a client key. Entries already
/// in a namespace are left as they are (their bindings too). Returns the names claimed.
pub fn claim(providers: &[(String, String)], clients: &[String]) -> Result<Vec<String>, SecretError> {
    let _serial = lock();
    let mut claimed = Vec::new();
    for name in clients.iter().filter(|n| check_user_name(n).is_ok()) {
        if let Some(v) = raw_get(LEGACY, name)? {
            raw_set(Purpose::Client.service(), name, &v)?;
            index(Purpose::Client.service(), name, true)?;
            raw_delete(LEGACY, name)?;
            index(LEGACY, name, false)?;
            claimed.push(name.clone());
        }
    }
    for name in providers.iter().map(|(n, _)| n).filter(|n| check_user_name(n).is_ok()) {
        let Some(v) = raw_get(LEGACY, name)? else { continue };
        let origins: Vec<String> =
            providers.iter().filter(|(n, _)| n == name).filter_map(|(_, u)| origin_of(u).ok()).collect();
        raw_set(Purpose::Provider.service(), name, &v)?;
        index(Purpose::Provider.service(), name, true)?;
        write_list(BINDINGS, name, &dedup(origins))?;
        raw_delete(LEGACY, name)?;
        index(LEGACY, name, false)?;
        tracing::info!(secret = %name, "unclaimed key claimed as a provider key by the config the broker started with");
        claimed.push(name.clone());
    }
    Ok(claimed)
}

/// The key provider `name` may send to `origin` (a URL): from the provider namespace only,
/// and only when bound to that origin.
pub fn provider_key(name: &str, url: &str) -> Result<String, SecretError> {
    check_name(name)?;
    if is_internal(name) {
        return Err(SecretError::WrongPurpose { name: name.into(), purpose: "internal" });
    }
    let origin = origin_of(url)?;
    match raw_get(Purpose::Provider.service(), name)? {
        Some(key) if read_list(BINDINGS, name)?.contains(&origin) => Ok(key),
        Some(_) => Err(SecretError::Unbound { name: name.into(), origin }),
        None if raw_get(Purpose::Client.service(), name)?.is_some() => {
            Err(SecretError::WrongPurpose { name: name.into(), purpose: "client" })
        }
        None if raw_get(LEGACY, name)?.is_some() => Err(SecretError::Unbound { name: name.into(), origin }),
        None => Err(SecretError::NotFound(name.into())),
    }
}

/// How a provider at `url` stands with key `name`, without handing the value out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// Stored and bound to this provider's origin.
    Set,
    Missing,
    /// Stored, but not for this origin (or unclaimed): a person must confirm it.
    Unbound,
    /// The name is a client key or an internal entry.
    WrongPurpose,
}

pub fn provider_key_state(name: &str, url: &str) -> Result<KeyState, SecretError> {
    match provider_key(name, url) {
        Ok(_) => Ok(KeyState::Set),
        Err(SecretError::NotFound(_)) => Ok(KeyState::Missing),
        Err(SecretError::Unbound { .. } | SecretError::BadOrigin(_)) => Ok(KeyState::Unbound),
        Err(SecretError::WrongPurpose { .. }) => Ok(KeyState::WrongPurpose),
        Err(e) => Err(e),
    }
}

/// The value of a client key (or an unclaimed entry), else of a provider key: for client-key
/// checks and the CLI. Never an internal entry. A provider's key is read with [`provider_key`].
pub fn get(name: &str) -> Result<String, SecretError> {
    check_name(name)?;
    if is_internal(name) {
        return Err(SecretError::Reserved(name.to_string()));
    }
    for service in [Purpose::Client.service(), LEGACY, Purpose::Provider.service()] {
        if let Some(v) = raw_get(service, name)? {
            return Ok(v);
        }
    }
    Err(SecretError::NotFound(name.to_string()))
}

/// The value of a client key: from the client namespace, or an unclaimed entry stored before
/// namespaces. Never a provider's key or an internal entry, so a listener's `api_keys` cannot
/// turn a provider key into a way in.
pub fn client_key(name: &str) -> Result<String, SecretError> {
    check_name(name)?;
    if is_internal(name) {
        return Err(SecretError::Reserved(name.to_string()));
    }
    for service in [Purpose::Client.service(), LEGACY] {
        if let Some(v) = raw_get(service, name)? {
            return Ok(v);
        }
    }
    Err(SecretError::NotFound(name.to_string()))
}

/// The value of an unclaimed entry only (`corral secret set NAME` that no provider or
/// listener names): the store's PostgreSQL password (`store.password_secret`). Never a
/// provider's key, which may go only to its provider's origin, nor a client key or an
/// internal entry, so naming one in `[store]` cannot send it to a database host.
pub fn unclaimed(name: &str) -> Result<String, SecretError> {
    check_name(name)?;
    if is_internal(name) {
        return Err(SecretError::Reserved(name.to_string()));
    }
    raw_get(LEGACY, name)?.ok_or_else(|| SecretError::NotFound(name.to_string()))
}

/// Whether `name` has a value (without handing the value out).
pub fn is_set(name: &str) -> Result<bool, SecretError> {
    match get(name) {
        Ok(_) => Ok(true),
        Err(SecretError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

pub fn delete(name: &str) -> Result<(), SecretError> {
    check_user_name(name)?;
    let _serial = lock();
    if !remove_elsewhere(name, None)? {
        return Err(SecretError::NotFound(name.to_string()));
    }
    tracing::info!(secret = name, "secret deleted from the OS keyring");
    Ok(())
}

/// One stored entry, by name: what it is for ("unclaimed" when nobody said) and, for a provider
/// key, the origins it may be sent to. Never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stored {
    pub name: String,
    pub purpose: &'static str,
    pub origins: Vec<String>,
}

/// Every stored entry but the internal ones, sorted by name. Never values.
pub fn entries() -> Result<Vec<Stored>, SecretError> {
    let mut out = Vec::new();
    for name in read_list(Purpose::Provider.service(), INDEX)? {
        let origins = read_list(BINDINGS, &name)?;
        out.push(Stored { name, purpose: Purpose::Provider.as_str(), origins });
    }
    for name in read_list(Purpose::Client.service(), INDEX)? {
        out.push(Stored { name, purpose: Purpose::Client.as_str(), origins: Vec::new() });
    }
    for name in read_list(LEGACY, INDEX)?.into_iter().filter(|n| !is_internal(n)) {
        out.push(Stored { name, purpose: "unclaimed", origins: Vec::new() });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Names of the stored secrets, sorted. Never values.
pub fn list() -> Result<Vec<String>, SecretError> {
    let mut names: Vec<String> = entries()?.into_iter().map(|e| e.name).collect();
    names.dedup();
    Ok(names)
}

/// The admin API's token, kept in the keyring's internal namespace so the desktop app hands
/// the same one to its window on every start (and a person never types it). Created on first
/// use; a token from before namespaces is moved there (and out of reach of any key lookup).
pub fn admin_token() -> Result<String, SecretError> {
    const NAME: &str = "admin-token";
    let service = Purpose::Internal.service();
    let _serial = lock();
    if let Some(t) = raw_get(service, NAME)?.filter(|t| !t.is_empty()) {
        return Ok(t);
    }
    let token = match raw_get(LEGACY, NAME)?.filter(|t| !t.is_empty()) {
        Some(old) => old,
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    raw_set(service, NAME, &token)?;
    raw_delete(LEGACY, NAME)?;
    Ok(token)
}

/// Where the admin token that `corral serve` keeps between starts lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenHome {
    /// The OS keyring's internal namespace (`corral.internal`, entry `admin-token`), shared
    /// with the desktop app.
    Keyring,
    /// A file readable only by its owner (mode 0600), used where no keyring answers.
    File(std::path::PathBuf),
}

/// The name of the admin token's file in the state dir, where no keyring answers.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// A token Corral would have made: long and varied enough (a hand-edited file may not be).
fn strong(token: &str) -> bool {
    token.chars().count() >= 32 && token.chars().collect::<std::collections::BTreeSet<_>>().len() >= 8
}

/// The admin token kept in `dir`/`admin-token`, made on first use: 32 random bytes as hex, in
/// a file only its owner may read (0600; the dir 0700 when this creates it). A file that is
/// empty or holds a weak token is replaced; one readable by others is narrowed to 0600.
pub fn file_admin_token(dir: &std::path::Path) -> std::io::Result<String> {
    let path = dir.join(ADMIN_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if strong(t.trim()) => {
            narrow(&path)?;
            return Ok(t.trim().to_string());
        }
        Ok(_) => {
            tracing::warn!(file = %path.display(), "the admin token file held no usable token; a new one replaces it")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let token = {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    // Written whole to a private temporary file, then renamed: never a half-written token.
    let tmp = dir.join(format!(".{ADMIN_TOKEN_FILE}.{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    {
        use std::io::Write;
        let mut f = options.open(&tmp)?;
        f.write_all(token.as_bytes())?;
        f.sync_all()?;
    }
    narrow(&tmp)?;
    std::fs::rename(&tmp, &path)?;
    Ok(token)
}

/// Owner-only permissions on `path` (no-op off Unix).
fn narrow(path: &std::path::Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if std::fs::metadata(path)?.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// The admin token `corral serve` keeps across starts, so open browser tabs stay signed in:
/// the keyring's, as the desktop app uses ([`admin_token`]); where the keyring fails or does not
/// answer, the file in `state_dir` ([`file_admin_token`]). Returns the token, where it is kept
/// and, when the keyring was passed over, why. Blocks (D-Bus): call it off the async workers.
pub fn kept_admin_token(
    state_dir: &std::path::Path,
    keyring: impl FnOnce() -> Result<String, SecretError>,
) -> std::io::Result<(String, TokenHome, Option<SecretError>)> {
    match keyring() {
        Ok(t) if strong(&t) => Ok((t, TokenHome::Keyring, None)),
        Ok(_) => {
            let why = SecretError::Keyring("the keyring's admin token is too weak to use".into());
            Ok((file_admin_token(state_dir)?, TokenHome::File(state_dir.join(ADMIN_TOKEN_FILE)), Some(why)))
        }
        Err(e) => Ok((file_admin_token(state_dir)?, TokenHome::File(state_dir.join(ADMIN_TOKEN_FILE)), Some(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_the_keyring_is_touched() {
        for bad in ["", "Upper", "has space", "index", &"x".repeat(65), "semi;colon"] {
            assert_eq!(set(bad, "v").err().map(|e| e.code()), Some("bad_secret_name"), "{bad:?}");
        }
        assert_eq!(set("ok-name", "").err().map(|e| e.code()), Some("empty_secret"));
        assert_eq!(set("admin-token", "v").err().map(|e| e.code()), Some("reserved_secret_name"));
        assert_eq!(
            provider_key("admin-token", "https://x").err().map(|e| e.code()),
            Some("secret_wrong_purpose"),
            "a provider never reads the admin token"
        );
    }

    #[test]
    fn an_origin_is_scheme_host_and_port() {
        assert_eq!(origin_of("https://api.openai.com/v1").ok().as_deref(), Some("https://api.openai.com:443"));
        assert_eq!(origin_of("http://127.0.0.1:9/v1").ok().as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(origin_of("HTTPS://API.OpenAI.com:443/x").ok().as_deref(), Some("https://api.openai.com:443"));
        assert!(origin_of("file:///etc/passwd").is_err());
        assert!(origin_of("not a url").is_err());
    }

    #[test]
    fn without_a_keyring_the_token_is_kept_in_an_owner_only_file_and_read_back() {
        let dir = std::env::temp_dir().join(format!("corral-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let none = || Err(SecretError::NoKeyring("no session bus".into()));
        let (first, home, why) = kept_admin_token(&dir, none).expect("a file token");
        assert_eq!(home, TokenHome::File(dir.join(ADMIN_TOKEN_FILE)));
        assert_eq!(why.map(|e| e.code()), Some("keyring_unavailable"), "the reason is handed back for the log");
        assert!(strong(&first), "{first}");
        let (again, _, _) = kept_admin_token(&dir, none).expect("read back");
        assert_eq!(first, again, "the second start gets the same token");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(ADMIN_TOKEN_FILE)).expect("file").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "only the owner may read the token");
            std::fs::set_permissions(dir.join(ADMIN_TOKEN_FILE), std::fs::Permissions::from_mode(0o644))
                .expect("chmod");
            kept_admin_token(&dir, none).expect("read back");
            let mode = std::fs::metadata(dir.join(ADMIN_TOKEN_FILE)).expect("file").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "a widened file is narrowed again");
        }
        std::fs::write(dir.join(ADMIN_TOKEN_FILE), "short").expect("tamper");
        let (replaced, _, _) = kept_admin_token(&dir, none).expect("replaced");
        assert!(strong(&replaced) && replaced != first, "a weak token in the file is replaced");
        let keyring = || Ok("k".repeat(8) + "0123456789abcdef0123456789abcdef");
        let (from_keyring, home, why) = kept_admin_token(&dir, keyring).expect("keyring");
        assert_eq!((home, why.is_none()), (TokenHome::Keyring, true));
        assert!(from_keyring.starts_with("kkkk"), "the keyring wins when it answers");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_database_password_is_an_unclaimed_entry_never_a_provider_or_client_key() {
        assert!(use_memory_store(), "the lib tests keep secrets in memory");
        set_provider_key("pwtest-openai", "sk-provider", &["https://api.openai.com:443".into()]).expect("provider key");
        set_client_key("pwtest-client", "ck-value").expect("client key");
        set("pwtest-db", "db-password").expect("unclaimed");
        assert_eq!(unclaimed("pwtest-db").ok().as_deref(), Some("db-password"));
        for name in ["pwtest-openai", "pwtest-client", "pwtest-missing"] {
            assert_eq!(unclaimed(name).err().map(|e| e.code()), Some("secret_not_found"), "{name}");
        }
    }
}
