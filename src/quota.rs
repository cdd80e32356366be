//! Client-key quotas (`[[quotas]]`): at most so many requests, and so many prompt plus output
//! tokens, per fixed window (from the unix epoch: `window_s = 86400` is each UTC day) for one
//! client key, or for each key on its own (`key = "*"`).
//!
//! A request is counted when it is admitted, so requests running at once count at once; its
//! tokens are counted when it finishes (only then are they known), so a token quota is checked
//! at admission and the last request may take it past the limit by its own size. On a broker
//! alone the counts are this process's (a restart starts the window afresh). In a fleet each
//! broker also writes its own counts for the window into the database and reads the others'
//! about once a second (`fleet::keys`), so the limit holds across brokers within what the other
//! brokers admit in that time (docs/fleet.md states the tolerance). A refusal is 429
//! `quota_exceeded` with `Retry-After` until the window ends.

use std::collections::HashMap;
use std::sync::Mutex;

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::config::{QuotaConfig, ANY_FLEET_KEY};

/// Unix seconds now: quota windows are on the wall clock (a day is a UTC day).
pub fn now_s() -> u64 {
    u64::try_from(crate::store::now_ms() / 1000).unwrap_or(0)
}

/// What a key used in one window.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Use {
    pub requests: u64,
    pub tokens: u64,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub key: String,
    /// "requests" or "tokens".
    pub limit: &'static str,
    pub used: u64,
    pub of: u64,
    /// Seconds until the window ends.
    pub retry_after_s: u64,
}

/// One key's window: what this broker admitted and what the others did, as last read.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    start_s: u64,
    window_s: u64,
    mine: Use,
    others: Use,
}

/// A key's quota and window, as the admin listing shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct QuotaView {
    pub key: String,
    /// Fleet-wide use in this window, as this broker knows it.
    pub used: Use,
    /// 0: no limit.
    pub requests: u64,
    pub tokens: u64,
    pub window_s: u64,
    /// Unix seconds when the window ends.
    pub window_ends_s: u64,
}

/// The quotas in force and every key's current window.
#[derive(Debug, Default)]
pub struct Quotas {
    rules: ArcSwap<Vec<QuotaConfig>>,
    windows: Mutex<HashMap<String, Window>>,
}

impl Quotas {
    pub fn set_rules(&self, rules: Vec<QuotaConfig>) {
        self.rules.store(std::sync::Arc::new(rules));
    }

    /// The rule for `key`: its own, else the one for every key.
    fn rule(&self, key: &str) -> Option<QuotaConfig> {
        let rules = self.rules.load();
        rules.iter().find(|r| r.key == key).or_else(|| rules.iter().find(|r| r.key == ANY_FLEET_KEY)).cloned()
    }

    fn windows(&self) -> std::sync::MutexGuard<'_, HashMap<String, Window>> {
        self.windows.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admit one request of `key` at `now_s` (unix seconds), counting it; or say why not.
    pub fn admit(&self, key: &str, now_s: u64) -> Result<(), Refusal> {
        let Some(rule) = self.rule(key) else { return Ok(()) };
        let mut windows = self.windows();
        let w = current(&mut windows, key, rule.window_s, now_s);
        let retry_after_s = (w.start_s + w.window_s).saturating_sub(now_s).max(1);
        let used = Use { requests: w.mine.requests + w.others.requests, tokens: w.mine.tokens + w.others.tokens };
        let refuse = |limit, used, of| Err(Refusal { key: key.to_string(), limit, used, of, retry_after_s });
        if rule.requests > 0 && used.requests >= rule.requests {
            return refuse("requests", used.requests, rule.requests);
        }
        if rule.tokens > 0 && used.tokens >= rule.tokens {
            return refuse("tokens", used.tokens, rule.tokens);
        }
        w.mine.requests += 1;
        Ok(())
    }

    /// A finished request of `key` used `tokens`.
    pub fn add_tokens(&self, key: &str, tokens: u64, now_s: u64) {
        let Some(rule) = self.rule(key) else { return };
        if rule.tokens == 0 || tokens == 0 {
            return;
        }
        current(&mut self.windows(), key, rule.window_s, now_s).mine.tokens += tokens;
    }

    /// This broker's counts per key for the windows current at `now_s`: (key, window_s,
    /// window start, use), for the fleet's database.
    pub fn mine(&self, now_s: u64) -> Vec<(String, u64, u64, Use)> {
        let mut windows = self.windows();
        windows.retain(|_, w| w.start_s + w.window_s > now_s);
        windows.iter().map(|(k, w)| (k.clone(), w.window_s, w.start_s, w.mine)).collect()
    }

    /// The window lengths of the rules, so the fleet reads every current window (also of keys
    /// this broker has not seen yet).
    pub fn window_lengths(&self) -> Vec<u64> {
        let mut lengths: Vec<u64> = self.rules.load().iter().map(|r| r.window_s).collect();
        lengths.sort_unstable();
        lengths.dedup();
        lengths
    }

    /// The fleet's rows for the current windows: (key, window_s, window start, broker is this
    /// one, use). Others' use replaces what was known; this broker's own row (written before a
    /// restart) raises its count, never lowers it.
    pub fn set_fleet(&self, rows: &[(String, u64, u64, bool, Use)], now_s: u64) {
        let mut others: HashMap<&str, Use> = HashMap::new();
        let mut windows = self.windows();
        for (key, window_s, start_s, own, used) in rows {
            let Some(rule) = self.rule(key) else { continue };
            if rule.window_s != *window_s || now_s / window_s * window_s != *start_s {
                continue;
            }
            let w = current(&mut windows, key, rule.window_s, now_s);
            if *own {
                w.mine.requests = w.mine.requests.max(used.requests);
                w.mine.tokens = w.mine.tokens.max(used.tokens);
            } else {
                let o = others.entry(key).or_default();
                o.requests += used.requests;
                o.tokens += used.tokens;
            }
        }
        for (key, w) in windows.iter_mut() {
            w.others = others.get(key.as_str()).copied().unwrap_or_default();
        }
    }

    /// Every key with a window now, for the admin listing.
    pub fn view(&self, now_s: u64) -> Vec<QuotaView> {
        let windows = self.windows();
        let mut out: Vec<QuotaView> = windows
            .iter()
            .filter(|(_, w)| w.start_s + w.window_s > now_s)
            .filter_map(|(key, w)| {
                let rule = self.rule(key)?;
                Some(QuotaView {
                    key: key.clone(),
                    used: Use {
                        requests: w.mine.requests + w.others.requests,
                        tokens: w.mine.tokens + w.others.tokens,
                    },
                    requests: rule.requests,
                    tokens: rule.tokens,
                    window_s: w.window_s,
                    window_ends_s: w.start_s + w.window_s,
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

/// `key`'s window at `now_s`, started afresh when the last one ended (or the length changed).
fn current<'a>(windows: &'a mut HashMap<String, Window>, key: &str, window_s: u64, now_s: u64) -> &'a mut Window {
    let window_s = window_s.max(1);
    let start_s = now_s / window_s * window_s;
    let w = windows.entry(key.to_string()).or_default();
    if w.start_s != start_s || w.window_s != window_s {
        *w = Window { start_s, window_s, ..Window::default() };
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(rules: &[(&str, u64, u64, u64)]) -> Quotas {
        let q = Quotas::default();
        q.set_rules(
            rules
                .iter()
                .map(|(key, requests, tokens, window_s)| QuotaConfig {
                    key: key.to_string(),
                    requests: *requests,
                    tokens: *tokens,
                    window_s: *window_s,
                })
                .collect(),
        );
        q
    }

    #[test]
    fn a_key_gets_its_requests_per_window_and_then_a_retry_after_to_the_window_end() {
        let q = quotas(&[("team-a", 2, 0, 60)]);
        assert_eq!(q.admit("team-a", 120), Ok(()));
        assert_eq!(q.admit("team-a", 130), Ok(()));
        let no = q.admit("team-a", 150).expect_err("third in the window");
        assert_eq!((no.limit, no.used, no.of, no.retry_after_s), ("requests", 2, 2, 30));
        assert_eq!(q.admit("team-b", 150), Ok(()), "another key has no rule");
        assert_eq!(q.admit("team-a", 180), Ok(()), "a new window");
    }

    #[test]
    fn tokens_count_at_the_end_and_the_star_rule_holds_for_each_key_alone() {
        let q = quotas(&[("*", 0, 100, 3600)]);
        assert_eq!(q.admit("x", 10), Ok(()));
        q.add_tokens("x", 100, 11);
        assert_eq!(q.admit("x", 12).map_err(|r| r.limit), Err("tokens"));
        assert_eq!(q.admit("y", 12), Ok(()), "each key has its own window under \"*\"");
    }

    #[test]
    fn the_other_brokers_use_counts_and_this_brokers_own_row_never_lowers_its_count() {
        let q = quotas(&[("team-a", 5, 0, 60)]);
        assert_eq!(q.admit("team-a", 60), Ok(()));
        let rows = vec![
            ("team-a".to_string(), 60, 60, false, Use { requests: 3, tokens: 0 }),
            ("team-a".to_string(), 60, 60, true, Use { requests: 0, tokens: 0 }),
            ("team-a".to_string(), 60, 0, false, Use { requests: 50, tokens: 0 }),
        ];
        q.set_fleet(&rows, 61);
        assert_eq!(q.view(61)[0].used.requests, 4, "mine 1 + the others' 3 (last window's row ignored)");
        assert_eq!(q.admit("team-a", 62), Ok(()));
        assert_eq!(q.admit("team-a", 62).map_err(|r| r.used), Err(5));
        assert_eq!(q.mine(62), vec![("team-a".to_string(), 60, 60, Use { requests: 2, tokens: 0 })]);
        let restarted = quotas(&[("team-a", 5, 0, 60)]);
        restarted.set_fleet(&[("team-a".to_string(), 60, 60, true, Use { requests: 2, tokens: 0 })], 63);
        assert_eq!(restarted.view(63)[0].used.requests, 2, "a restarted broker takes its own count back");
    }
}
