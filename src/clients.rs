//! Client keys: who may use a listener that names `api_keys`.
//!
//! The key *names* a listener accepts come from its config; the key *values* live in the OS
//! keyring and are re-read every second (`watch`), so a key added with `corral secret set`, the
//! admin API or the UI starts working, and a revoked one stops, within a second and without a
//! restart. Comparison is constant time against every key, so timing tells nothing about which
//! one almost matched. Each key remembers when it was last used (unix ms), for the operator.
//!
//! Values are held only as long as they are valid; a key that can no longer be read is dropped
//! (fail closed).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// One client key as loaded from the keyring.
#[derive(Debug)]
struct Key {
    name: String,
    value: String,
    last_used: AtomicI64,
}

/// Every client key any listener names, by name.
#[derive(Debug, Default)]
pub struct ClientKeys {
    keys: ArcSwap<Vec<Arc<Key>>>,
}

/// What `/admin/status` shows of a key: never its value.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyInfo {
    pub name: String,
    /// Unix ms of the last request it authenticated; `None` if never since start.
    pub last_used: Option<i64>,
}

impl ClientKeys {
    /// The name of the client whose key `bearer` is, among the names `allowed`.
    pub fn check(&self, allowed: &[String], bearer: &[u8]) -> Option<String> {
        use subtle::ConstantTimeEq;
        let keys = self.keys.load();
        let mut found: Option<&Arc<Key>> = None;
        for k in keys.iter() {
            if bool::from(k.value.as_bytes().ct_eq(bearer)) && allowed.contains(&k.name) {
                found = Some(k);
            }
        }
        let k = found?;
        k.last_used.store(crate::store::now_ms(), Ordering::Relaxed);
        Some(k.name.clone())
    }

    /// The loaded keys, by name, with their last use.
    pub fn info(&self) -> Vec<KeyInfo> {
        self.keys
            .load()
            .iter()
            .map(|k| {
                let used = k.last_used.load(Ordering::Relaxed);
                KeyInfo { name: k.name.clone(), last_used: (used > 0).then_some(used) }
            })
            .collect()
    }

    /// Replace the values; last-used times survive for keys whose value did not change.
    /// Returns whether anything changed.
    pub fn set(&self, loaded: Vec<(String, String)>) -> bool {
        let current = self.keys.load();
        let same = current.len() == loaded.len()
            && current.iter().zip(&loaded).all(|(k, (n, v))| &k.name == n && &k.value == v);
        if same {
            return false;
        }
        let next = loaded
            .into_iter()
            .map(|(name, value)| {
                let used = current
                    .iter()
                    .find(|k| k.name == name && k.value == value)
                    .map_or(0, |k| k.last_used.load(Ordering::Relaxed));
                Arc::new(Key { name, value, last_used: AtomicI64::new(used) })
            })
            .collect();
        self.keys.store(Arc::new(next));
        true
    }
}

/// Read the keys named in `names` from the keyring (off the async workers). A key that cannot
/// be read is left out, so its listener fails closed for that client.
pub async fn load(names: BTreeSet<String>) -> Vec<(String, String)> {
    let got = tokio::task::spawn_blocking(move || {
        names.into_iter().map(|n| (crate::secrets::client_key(&n), n)).collect::<Vec<_>>()
    })
    .await;
    let Ok(got) = got else { return Vec::new() };
    got.into_iter().filter_map(|(r, n)| r.ok().map(|v| (n, v))).collect()
}

/// Keep `keys` in step with the keyring for the names `names()` gives, once a second, until
/// `cancel` fires.
pub async fn watch(
    keys: Arc<ClientKeys>,
    names: impl Fn() -> BTreeSet<String> + Send + 'static,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                let wanted = names();
                if wanted.is_empty() {
                    continue;
                }
                let loaded = load(wanted.clone()).await;
                let missing: Vec<&String> = wanted.iter().filter(|n| !loaded.iter().any(|(l, _)| l == *n)).collect();
                if keys.set(loaded) {
                    tracing::info!(missing = ?missing, "client keys changed in the keyring; applied");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(pairs: &[(&str, &str)]) -> ClientKeys {
        let k = ClientKeys::default();
        k.set(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect());
        k
    }

    #[test]
    fn a_key_names_its_client_only_where_the_listener_allows_it() {
        let k = keys(&[("team-a", "key-a"), ("team-b", "key-b")]);
        let both = vec!["team-a".to_string(), "team-b".to_string()];
        assert_eq!(k.check(&both, b"key-b").as_deref(), Some("team-b"));
        assert_eq!(k.check(&both, b"key-"), None, "a prefix is not a key");
        assert_eq!(k.check(&["team-a".to_string()], b"key-b"), None, "team-b is not allowed here");
        assert_eq!(ClientKeys::default().check(&both, b""), None, "no keys loaded: nobody passes");
    }

    #[test]
    fn revoking_a_key_stops_it_and_last_use_is_kept_for_the_others() {
        let k = keys(&[("team-a", "key-a"), ("team-b", "key-b")]);
        let both = vec!["team-a".to_string(), "team-b".to_string()];
        assert!(k.check(&both, b"key-a").is_some());
        assert!(k.info()[0].last_used.is_some(), "used just now");
        assert!(k.set(vec![("team-a".into(), "key-a".into())]), "team-b revoked");
        assert_eq!(k.check(&both, b"key-b"), None, "a revoked key no longer passes");
        assert!(k.info()[0].last_used.is_some(), "team-a keeps its last use");
        assert!(!k.set(vec![("team-a".into(), "key-a".into())]), "nothing changed");
    }
}
