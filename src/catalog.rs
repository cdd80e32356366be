//! The cluster's model catalogue as far as Corral knows it: every model any configured node
//! lists (its last known list, whatever its health now) plus the names cloud providers map.
//! It answers what routing cannot: which known names are closest to one nobody lists ("did you
//! mean"), so a typo gets a 404 that points at the right name instead of a 503 about health.
//!
//! Names are compared in Ollama's short form (`llama3.2`, not
//! `registry.ollama.ai/library/llama3.2:latest`; `config::model_key` without `:latest`). A known
//! name is close when its Levenshtein distance from the asked one is at most a third of the
//! asked name's length (at least 2), or when it is the same model with another tag
//! (`qwen2.5` -> `qwen2.5:7b`), or starts with the asked name (`llama` -> `llama3.2`). Same
//! model first, then by distance, then by name; at most `MAX_SUGGESTIONS`. Reads node state
//! only; never touches the network.

use std::collections::BTreeSet;

use crate::node::{NodeState, Registry};

/// How many names a "did you mean" offers.
pub const MAX_SUGGESTIONS: usize = 3;

/// Ollama's short form of a model name: `llama3.2` for `llama3.2:latest`.
pub fn short_name(name: &str) -> String {
    let key = crate::config::model_key(name);
    key.strip_suffix(":latest").unwrap_or(&key).to_string()
}

/// Every model name (short form) any node of `registry` has listed, whatever its state now,
/// plus `extra` (the names providers map).
pub fn known_models<'a>(registry: &Registry, extra: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let mut names: BTreeSet<String> =
        registry.all().iter().filter_map(|n| n.models()).flatten().map(|m| short_name(&m)).collect();
    // A pattern (`*`, `gpt-*`) is not a name anyone can ask for.
    names.extend(extra.into_iter().filter(|m| !m.contains(['*', '?'])).map(short_name));
    names
}

/// The names in `known` closest to `model`, closest first, at most `MAX_SUGGESTIONS`.
pub fn closest(model: &str, known: &BTreeSet<String>) -> Vec<String> {
    let asked = short_name(model);
    let base = |n: &str| n.split_once(':').map_or(n, |(b, _)| b).to_string();
    let asked_base = base(&asked);
    let bound = (asked.chars().count() / 3).max(2);
    let mut ranked: Vec<(bool, usize, &String)> = known
        .iter()
        .filter(|k| **k != asked)
        .filter_map(|k| {
            let same_model = base(k) == asked_base;
            let d = distance(&asked, k);
            let prefix = asked.chars().count() >= 3 && k.starts_with(&asked);
            (same_model || prefix || d <= bound).then_some((!same_model, d, k))
        })
        .collect();
    ranked.sort();
    ranked.into_iter().take(MAX_SUGGESTIONS).map(|(_, _, k)| k.clone()).collect()
}

/// Nodes that are down and have never listed their models, each as a person would say it
/// ("gpu1 is down"): what a "not found" could not take into account (`route::candidates`).
pub fn unlisted(registry: &Registry) -> Vec<String> {
    registry
        .all()
        .iter()
        .filter(|n| n.state() == NodeState::Unhealthy && n.models().is_none())
        .map(|n| format!("{} is {}", n.name(), state_word(n.state())))
        .collect()
}

/// A node's state in the words of an error message: "down" rather than "unhealthy".
pub fn state_word(state: NodeState) -> &'static str {
    match state {
        NodeState::Unhealthy => "down",
        other => other.name(),
    }
}

/// Levenshtein distance over chars (two rows).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let swap = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = swap.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| short_name(n)).collect()
    }

    #[test]
    fn a_typo_finds_the_name_it_missed() {
        let k = known(&["llama3.2:latest", "qwen2.5:7b", "nomic-embed-text:latest"]);
        assert_eq!(closest("llama3.3", &k), vec!["llama3.2"]);
        assert_eq!(closest("lama3.2", &k), vec!["llama3.2"]);
        assert_eq!(closest("Llama3.2:LATEST", &k), Vec::<String>::new(), "the same name is no suggestion");
        assert_eq!(closest("nomic-embed", &k), vec!["nomic-embed-text"], "a prefix counts");
    }

    #[test]
    fn another_tag_of_the_same_model_comes_first() {
        let k = known(&["qwen2.5:7b", "qwen2.5:14b", "qwen2:7b", "qwen3:8b", "llama3.2"]);
        assert_eq!(closest("qwen2.5", &k), vec!["qwen2.5:7b", "qwen2.5:14b"]);
        assert_eq!(closest("qwen2.5:8b", &k), vec!["qwen2.5:7b", "qwen2.5:14b", "qwen2:7b"]);
    }

    #[test]
    fn unrelated_names_are_not_offered_and_at_most_three_are() {
        let k = known(&["llama3.2", "qwen2.5:7b"]);
        assert!(closest("mistral", &k).is_empty(), "nothing close: no guess");
        let k = known(&["llama3.1", "llama3.2", "llama3.3", "llama3.4", "llama2"]);
        assert_eq!(closest("llama3.0", &k).len(), MAX_SUGGESTIONS);
    }

    #[test]
    fn short_names_drop_latest_and_the_default_registry() {
        assert_eq!(short_name("registry.ollama.ai/library/Llama3.2:latest"), "llama3.2");
        assert_eq!(short_name("hf.co/bartowski/x:Q4_K_M"), "hf.co/bartowski/x:q4_k_m");
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "ab"), 2);
    }
}
