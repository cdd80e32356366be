//! Secrets (cloud API keys) in the OS keyring: Secret Service on Linux, Keychain on macOS,
//! Credential Manager on Windows, through the `keyring` crate.
//!
//! This module is the only code that touches secret values. Config files and exports only
//! name a secret; the admin API stores and deletes values but never returns one; errors and
//! logs name the secret, never its value. The keyring cannot list its entries, so the names
//! are kept in one more entry of their own (`corral` / `index`), a JSON list of names.
//!
//! Keyring calls block (D-Bus round trips), so async callers run them on the blocking pool.
//! Index updates are serialized within a process; two processes changing secrets at the same
//! instant could lose a name from the index (never a value): the keyring offers no
//! compare-and-swap, so the CLI and a running broker should not race on purpose.

use keyring::Entry;

const SERVICE: &str = "corral";

/// Serializes read-modify-write of the index within this process.
static INDEX_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
const INDEX: &str = "index";

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
}

impl SecretError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadName(_) => "bad_secret_name",
            Self::NotFound(_) => "secret_not_found",
            Self::Empty => "empty_secret",
            Self::NoKeyring(_) => "keyring_unavailable",
            Self::Keyring(_) => "keyring_failed",
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

fn map(e: keyring::Error, name: &str) -> SecretError {
    match e {
        keyring::Error::NoEntry => SecretError::NotFound(name.to_string()),
        keyring::Error::NoStorageAccess(inner) | keyring::Error::PlatformFailure(inner) => {
            SecretError::NoKeyring(inner.to_string())
        }
        other => SecretError::Keyring(other.to_string()),
    }
}

fn entry(name: &str) -> Result<Entry, SecretError> {
    Entry::new(SERVICE, name).map_err(|e| map(e, name))
}

fn read_index() -> Result<Vec<String>, SecretError> {
    match entry(INDEX)?.get_password() {
        Ok(text) => Ok(serde_json::from_str(&text).unwrap_or_default()),
        Err(keyring::Error::NoEntry) => Ok(Vec::new()),
        Err(e) => Err(map(e, INDEX)),
    }
}

fn write_index(names: &[String]) -> Result<(), SecretError> {
    let text = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
    entry(INDEX)?.set_password(&text).map_err(|e| map(e, INDEX))
}

/// Store `value` under `name`, replacing any earlier value.
pub fn set(name: &str, value: &str) -> Result<(), SecretError> {
    check_name(name)?;
    if value.is_empty() {
        return Err(SecretError::Empty);
    }
    entry(name)?.set_password(value).map_err(|e| map(e, name))?;
    let _serial = INDEX_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut names = read_index()?;
    if !names.iter().any(|n| n == name) {
        names.push(name.to_string());
        names.sort();
        write_index(&names)?;
    }
    tracing::info!(secret = name, "secret stored in the OS keyring");
    Ok(())
}

/// The value of `name`. Only the code that calls a provider should need this.
pub fn get(name: &str) -> Result<String, SecretError> {
    check_name(name)?;
    entry(name)?.get_password().map_err(|e| map(e, name))
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
    check_name(name)?;
    entry(name)?.delete_credential().map_err(|e| map(e, name))?;
    let _serial = INDEX_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let names: Vec<String> = read_index()?.into_iter().filter(|n| n != name).collect();
    write_index(&names)?;
    tracing::info!(secret = name, "secret deleted from the OS keyring");
    Ok(())
}

/// Names of the stored secrets, sorted. Never values.
pub fn list() -> Result<Vec<String>, SecretError> {
    read_index()
}

/// The admin API's token, kept in the keyring so the desktop app hands the same one to its
/// window on every start (and a person never types it). Created on first use; not listed
/// among the provider secrets.
pub fn admin_token() -> Result<String, SecretError> {
    let entry = entry("admin-token")?;
    match entry.get_password() {
        Ok(t) if !t.is_empty() => Ok(t),
        Ok(_) | Err(keyring::Error::NoEntry) => {
            let token = uuid::Uuid::new_v4().simple().to_string();
            entry.set_password(&token).map_err(|e| map(e, "admin-token"))?;
            Ok(token)
        }
        Err(e) => Err(map(e, "admin-token")),
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
    }
}
