//! Routing: which node gets a request.
//!
//! Two steps. `candidates` filters the registry down to nodes that may take this request at
//! all (enabled, not down, serve the model, not already tried for it). A `Pick` policy then
//! chooses one of them. Policies are tiny and stateless but for their own cursor; randomness
//! comes from an injected, seedable RNG so tests are deterministic (tower's
//! `Balance::from_rng`).
//!
//! - `round-robin`: a shared cursor modulo the candidate count.
//! - `least-connections`: fewest in-flight requests; ties are broken at random, so a burst of
//!   simultaneous requests spreads instead of piling onto the first node.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::Policy;
use crate::node::{Node, Registry};

/// Why no candidate could be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCandidate {
    /// No configured node lists the model.
    UnknownModel,
    /// Nodes that have the model exist, but none is enabled and up.
    NoneAvailable,
    /// Every available node was already tried for this request.
    AllTried,
}

/// Nodes that may serve `model` now (ignoring capacity), skipping the ones in `tried`.
pub fn candidates(
    registry: &Registry,
    model: Option<&str>,
    tried: &[Arc<Node>],
) -> Result<Vec<Arc<Node>>, NoCandidate> {
    let serving: Vec<&Arc<Node>> = registry
        .all()
        .iter()
        .filter(|n| match model {
            // A node whose model list is not known yet may have it.
            Some(m) => n.serves(m) != Some(false),
            None => true,
        })
        .collect();
    if serving.is_empty() {
        return Err(NoCandidate::UnknownModel);
    }
    let available: Vec<Arc<Node>> = serving.into_iter().filter(|n| n.is_available()).cloned().collect();
    if available.is_empty() {
        return Err(NoCandidate::NoneAvailable);
    }
    let fresh: Vec<Arc<Node>> =
        available.iter().filter(|n| !tried.iter().any(|t| Arc::ptr_eq(t, n))).cloned().collect();
    if !fresh.is_empty() {
        Ok(fresh)
    } else if available.len() == 1 {
        // The only node there is: trying it again beats giving up.
        Ok(available)
    } else {
        Err(NoCandidate::AllTried)
    }
}

/// A routing policy plus its state.
pub struct Router {
    policy: Policy,
    cursor: AtomicUsize,
    rng: Mutex<SmallRng>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").field("policy", &self.policy).finish()
    }
}

impl Router {
    pub fn new(policy: Policy, seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => SmallRng::seed_from_u64(s),
            None => SmallRng::from_entropy(),
        };
        Self { policy, cursor: AtomicUsize::new(0), rng: Mutex::new(rng) }
    }

    /// Index into `nodes` of the chosen one; `None` only for an empty slice.
    pub fn pick(&self, nodes: &[Arc<Node>]) -> Option<usize> {
        if nodes.is_empty() {
            return None;
        }
        match self.policy {
            Policy::RoundRobin => Some(self.cursor.fetch_add(1, Ordering::Relaxed) % nodes.len()),
            // Config validation admits only implemented policies; the rest cannot get here.
            _ => {
                let least = nodes.iter().map(|n| n.in_flight()).min()?;
                let tied: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].in_flight() == least).collect();
                let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
                Some(tied[rng.gen_range(0..tied.len())])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;
    use proptest::prelude::*;

    fn registry(n: usize) -> Registry {
        let cfgs: Vec<_> = (0..n)
            .map(|i| NodeConfig {
                name: format!("n{i}"),
                url: format!("http://127.0.0.1:{}", 1000 + i),
                ..NodeConfig::default()
            })
            .collect();
        Registry::new(&cfgs).expect("valid urls")
    }

    #[test]
    fn round_robin_cycles() {
        let reg = registry(3);
        let r = Router::new(Policy::RoundRobin, Some(1));
        let picks: Vec<_> = (0..6).map(|_| r.pick(reg.all()).expect("non-empty")).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn least_connections_prefers_idle_and_spreads_ties() {
        let reg = registry(3);
        let r = Router::new(Policy::LeastConnections, Some(7));
        let _busy = reg.all()[0].dispatch();
        let mut seen = [0usize; 3];
        for _ in 0..200 {
            seen[r.pick(reg.all()).expect("non-empty")] += 1;
        }
        assert_eq!(seen[0], 0, "the busy node is never least loaded");
        assert!(seen[1] > 50 && seen[2] > 50, "ties between idle nodes are broken at random: {seen:?}");
    }

    #[test]
    fn candidates_skip_down_disabled_and_modelless_nodes() {
        let reg = registry(3);
        reg.all()[0].set_models(["a".to_string()]);
        reg.all()[1].set_models(["b".to_string()]);
        reg.all()[2].set_models(["a".to_string()]);
        reg.all()[2].set_enabled(false);
        let c = candidates(&reg, Some("a"), &[]).expect("n0 serves a");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name(), "n0");
        assert_eq!(candidates(&reg, Some("zzz"), &[]).err(), Some(NoCandidate::UnknownModel));
        reg.all()[0].record_outcome(crate::node::Outcome::ConnectFailed, 1);
        assert_eq!(candidates(&reg, Some("a"), &[]).err(), Some(NoCandidate::NoneAvailable));
    }

    #[test]
    fn a_tried_node_is_not_picked_again_unless_it_is_the_only_one() {
        let reg = registry(2);
        let first = reg.all()[0].clone();
        let c = candidates(&reg, None, std::slice::from_ref(&first)).expect("n1 left");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name(), "n1");
        let both = [reg.all()[0].clone(), reg.all()[1].clone()];
        assert_eq!(candidates(&reg, None, &both).err(), Some(NoCandidate::AllTried));
        let single = registry(1);
        let only = single.all()[0].clone();
        assert!(candidates(&single, None, &[only]).is_ok());
    }

    proptest! {
        #[test]
        fn pick_is_always_in_range(n in 1usize..16, busy in proptest::collection::vec(0usize..4, 16), seed: u64, rr: bool) {
            let reg = registry(n);
            let mut guards = Vec::new();
            for (i, b) in busy.iter().take(n).enumerate() {
                for _ in 0..*b { guards.push(reg.all()[i].dispatch()); }
            }
            let r = Router::new(if rr { Policy::RoundRobin } else { Policy::LeastConnections }, Some(seed));
            for _ in 0..8 {
                let i = r.pick(reg.all()).expect("non-empty");
                prop_assert!(i < n);
                if !rr {
                    let min = reg.all().iter().map(|x| x.in_flight()).min().unwrap_or(0);
                    prop_assert_eq!(reg.all()[i].in_flight(), min);
                }
            }
        }
    }
}
