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
//!
//! A fleet of brokers on one PostgreSQL (`fleet::keys`) adds *verifiers*: for each live key the
//! fleet's database holds the SHA-256 of the key, never the key, and every broker follows
//! them. A bearer whose SHA-256 matches a verifier passes as that key's name, under the same
//! rule (the listener must name it), so a key created on one broker works on all. This module
//! stays the one place that checks a bearer: the keyring's values and the fleet's verifiers
//! are both compared here, each in constant time, every entry every time. [`Usage`] counts
//! what each key's requests used, for the fleet to flush; a broker alone counts nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
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

pub use crate::config::ANY_FLEET_KEY;

fn any_fleet_key(allowed: &[String]) -> bool {
    allowed.iter().any(|a| a == ANY_FLEET_KEY)
}

/// A key known by its verifier only: the fleet's database holds it (`fleet::keys`).
#[derive(Debug)]
struct Verified {
    name: String,
    digest: Digest,
    last_used: AtomicI64,
}

/// The SHA-256 of a key: what the fleet's database holds instead of the key.
pub type Digest = [u8; 32];

/// Every client key any listener names, by name: values from the keyring and, in a fleet,
/// verifiers from the shared database.
#[derive(Debug, Default)]
pub struct ClientKeys {
    keys: ArcSwap<Vec<Arc<Key>>>,
    verified: ArcSwap<Vec<Arc<Verified>>>,
}

/// The SHA-256 of `key`.
pub fn digest(key: &[u8]) -> Digest {
    use sha2::Digest as _;
    sha2::Sha256::digest(key).into()
}

/// A key's verifier as the fleet's database stores it: its SHA-256, lowercase hex.
pub fn verifier(key: &str) -> String {
    digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A stored verifier back to its digest; `None` unless it is 64 hex digits.
pub fn parse_verifier(hex: &str) -> Option<Digest> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
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
    /// Checked against every keyring value, then (in a fleet) the bearer's SHA-256 against every
    /// verifier: constant time per entry, no early exit.
    pub fn check(&self, allowed: &[String], bearer: &[u8]) -> Option<String> {
        use subtle::ConstantTimeEq;
        let keys = self.keys.load();
        let mut found: Option<(&str, &AtomicI64)> = None;
        for k in keys.iter() {
            if bool::from(k.value.as_bytes().ct_eq(bearer)) && allowed.contains(&k.name) {
                found = Some((&k.name, &k.last_used));
            }
        }
        let verified = self.verified.load();
        if !verified.is_empty() {
            let d = digest(bearer);
            for v in verified.iter() {
                if bool::from(v.digest[..].ct_eq(&d[..])) && (allowed.contains(&v.name) || any_fleet_key(allowed)) {
                    found = Some((&v.name, &v.last_used));
                }
            }
        }
        let (name, last_used) = found?;
        last_used.store(crate::store::now_ms(), Ordering::Relaxed);
        Some(name.to_string())
    }

    /// The loaded keys, by name, with their last use: the keyring's, then the fleet's others.
    pub fn info(&self) -> Vec<KeyInfo> {
        let used = |a: &AtomicI64| Some(a.load(Ordering::Relaxed)).filter(|u| *u > 0);
        let mut out: Vec<KeyInfo> =
            self.keys.load().iter().map(|k| KeyInfo { name: k.name.clone(), last_used: used(&k.last_used) }).collect();
        for v in self.verified.load().iter() {
            match out.iter_mut().find(|k| k.name == v.name) {
                Some(k) => k.last_used = k.last_used.max(used(&v.last_used)),
                None => out.push(KeyInfo { name: v.name.clone(), last_used: used(&v.last_used) }),
            }
        }
        out
    }

    /// Replace the fleet's verifiers (name, digest); last-used times survive for unchanged
    /// ones. Returns whether anything changed.
    pub fn set_verifiers(&self, loaded: Vec<(String, Digest)>) -> bool {
        let current = self.verified.load();
        let same = current.len() == loaded.len()
            && current.iter().zip(&loaded).all(|(v, (n, d))| &v.name == n && &v.digest == d);
        if same {
            return false;
        }
        let next = loaded
            .into_iter()
            .map(|(name, digest)| {
                let used = current
                    .iter()
                    .find(|v| v.name == name && v.digest == digest)
                    .map_or(0, |v| v.last_used.load(Ordering::Relaxed));
                Arc::new(Verified { name, digest, last_used: AtomicI64::new(used) })
            })
            .collect();
        self.verified.store(Arc::new(next));
        true
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

/// What one key's requests used: requests, prompt tokens, output (completion) tokens.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub requests: i64,
    pub prompt_tokens: i64,
    pub output_tokens: i64,
}

/// Per-key usage on this broker since the last flush. Off (counting nothing) until a fleet
/// turns it on; then each finished request adds to its key's counts under a short lock (no
/// I/O), and `fleet::keys` takes the counts every second to add them to the database.
#[derive(Debug, Default)]
pub struct Usage {
    counting: AtomicBool,
    counts: std::sync::Mutex<HashMap<String, Counts>>,
}

impl Usage {
    /// Start counting (a fleet's store is there to flush to).
    pub fn start_counting(&self) {
        self.counting.store(true, Ordering::Relaxed);
    }

    /// One finished request of client `name`, with the tokens its answer reported.
    pub fn count(&self, name: &str, prompt_tokens: Option<i64>, output_tokens: Option<i64>) {
        if !self.counting.load(Ordering::Relaxed) {
            return;
        }
        let mut map = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let c = match map.get_mut(name) {
            Some(c) => c,
            None => map.entry(name.to_string()).or_default(),
        };
        c.requests += 1;
        c.prompt_tokens += prompt_tokens.unwrap_or(0).max(0);
        c.output_tokens += output_tokens.unwrap_or(0).max(0);
    }

    /// Everything counted since the last take, leaving zero.
    pub fn take(&self) -> Vec<(String, Counts)> {
        let mut map = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        map.drain().collect()
    }

    /// Put back what a failed flush took, so it goes with the next one.
    pub fn give_back(&self, taken: Vec<(String, Counts)>) {
        let mut map = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        for (name, t) in taken {
            let c = map.entry(name).or_default();
            c.requests += t.requests;
            c.prompt_tokens += t.prompt_tokens;
            c.output_tokens += t.output_tokens;
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

    #[test]
    fn a_fleet_verifier_passes_its_key_where_the_listener_names_it_and_never_a_near_miss() {
        let k = keys(&[("team-a", "key-a")]);
        let fleet = vec!["team-a".to_string(), "team-b".to_string()];
        assert!(k.set_verifiers(vec![("team-b".into(), digest(b"ck-team-b"))]));
        assert_eq!(k.check(&fleet, b"ck-team-b").as_deref(), Some("team-b"), "known by its verifier only");
        assert_eq!(k.check(&fleet, b"key-a").as_deref(), Some("team-a"), "the keyring's keys still pass");
        assert_eq!(k.check(&fleet, b"ck-team-"), None, "a prefix is not a key");
        assert_eq!(k.check(&["team-a".to_string()], b"ck-team-b"), None, "team-b is not allowed here");
        assert!(k.info().iter().any(|i| i.name == "team-b" && i.last_used.is_some()), "{:?}", k.info());
        assert!(!k.set_verifiers(vec![("team-b".into(), digest(b"ck-team-b"))]), "nothing changed");
        assert!(k.set_verifiers(Vec::new()), "team-b revoked fleet-wide");
        assert_eq!(k.check(&fleet, b"ck-team-b"), None, "a revoked verifier no longer passes");
    }

    #[test]
    fn a_verifier_is_the_sha256_hex_of_the_key_and_reads_back() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(verifier("abc"), abc);
        assert_eq!(parse_verifier(abc), Some(digest(b"abc")));
        assert_eq!(parse_verifier(&abc[1..]), None, "63 digits");
        assert_eq!(parse_verifier(&abc.replace('b', "g")), None, "not hex");
    }

    #[test]
    fn usage_counts_only_once_on_and_survives_a_failed_flush() {
        let u = Usage::default();
        u.count("team-a", Some(5), Some(7));
        assert!(u.take().is_empty(), "a broker alone counts nothing");
        u.start_counting();
        u.count("team-a", Some(5), Some(7));
        u.count("team-a", None, Some(3));
        let taken = u.take();
        assert_eq!(taken, vec![("team-a".to_string(), Counts { requests: 2, prompt_tokens: 5, output_tokens: 10 })]);
        u.count("team-a", Some(1), Some(1));
        u.give_back(taken);
        assert_eq!(u.take(), vec![("team-a".to_string(), Counts { requests: 3, prompt_tokens: 6, output_tokens: 11 })]);
        assert!(u.take().is_empty(), "taken once");
    }
}
