//! The simulated model catalogue: what a model's name says about it (family, parameter size,
//! quantisation, its layers and their sizes, digests), so every node and every run agree, as
//! nodes that pulled the same model from the same registry do.
//!
//! The facts follow the library's naming: the tag's size (`qwen2.5:7b` -> "7.0B", `:0.5b` ->
//! "500M"), its quantisation suffix (`-q8_0`, `-fp16`, default Q4_K_M, F16 for
//! embedding models), and a size of parameters x bits per weight. A model's layers are
//! Ollama's: the weights, then template, license and params, then the config blob
//! (`server/images.go` `PullModel` pulls `mf.Layers` then `mf.Config`). The digest `/api/tags`
//! shows is the manifest's: it changes with the model's revision, so a node that holds an older
//! revision (`SimSpec::older`) lists another digest until it pulls again, and a copy keeps its
//! source's.

use serde_json::{json, Value};

use super::text;

/// The revision every registry pull brings now.
pub(super) const CURRENT: u32 = 2;

/// Where a held model comes from: the catalogue entry it was pulled as, and which revision.
/// A copy (`/api/copy`) holds its source's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Origin {
    pub base: String,
    pub revision: u32,
}

impl Origin {
    pub fn current(base: &str) -> Self {
        Self { base: base.to_string(), revision: CURRENT }
    }

    /// The manifest digest `/api/tags` shows (64 hex digits, no `sha256:`).
    pub fn digest(&self) -> String {
        hex(&[&self.base, "manifest", &self.revision.to_string()])
    }

    pub fn facts(&self) -> Facts {
        Facts::of(&self.base)
    }
}

/// One blob of a model, pulled in order.
#[derive(Debug, Clone)]
pub(super) struct Layer {
    /// `sha256:<64 hex>`.
    pub digest: String,
    pub size: u64,
}

/// What a model's name says about it.
#[derive(Debug, Clone)]
pub(super) struct Facts {
    pub family: &'static str,
    pub parameter_size: String,
    pub parameter_count: u64,
    pub quantization: &'static str,
}

impl Facts {
    pub fn of(model: &str) -> Self {
        let name = crate::config::normalize_model(model);
        let (repo, tag) = name.rsplit_once(':').unwrap_or((&name, "latest"));
        let base = repo.rsplit('/').next().unwrap_or(repo);
        let embedding = base.contains("embed");
        let parameter_count = tag_size(tag).unwrap_or(if embedding {
            137_000_000
        } else if base.starts_with("llama3.2") {
            3_200_000_000
        } else {
            7_600_000_000
        });
        Self {
            family: family(base),
            parameter_size: parameter_size(parameter_count),
            parameter_count,
            quantization: quantization(tag, embedding),
        }
    }

    /// Bytes on disk: parameters x bits per weight, plus a little per model.
    pub fn size(&self) -> u64 {
        let bits = match self.quantization {
            "F16" => 16.0,
            "Q8_0" => 8.5,
            "Q5_K_M" => 5.7,
            "Q4_0" => 4.5,
            _ => 4.85,
        };
        (self.parameter_count as f64 * bits / 8.0) as u64 + 1_202_450
    }

    /// Ollama's `ModelDetails`.
    pub fn details(&self) -> Value {
        json!({
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization,
        })
    }
}

/// The layers a pull of `origin` fetches, weights first; their sizes add up to `/api/tags` size.
pub(super) fn layers(origin: &Origin) -> Vec<Layer> {
    let total = origin.facts().size();
    let small = [("template", 1_429u64), ("license", 7_711), ("params", 96), ("config", 561)];
    let rest: u64 = small.iter().map(|(_, s)| s).sum();
    let rev = origin.revision.to_string();
    let mut out =
        vec![Layer { digest: format!("sha256:{}", hex(&[&origin.base, "weights", &rev])), size: total - rest }];
    out.extend(
        small
            .iter()
            .map(|(kind, size)| Layer { digest: format!("sha256:{}", hex(&[&origin.base, kind, &rev])), size: *size }),
    );
    out
}

fn hex(parts: &[&str]) -> String {
    let mut r = text::SplitMix::new(text::hash(parts));
    (0..4).map(|_| format!("{:016x}", r.next_u64())).collect()
}

fn family(base: &str) -> &'static str {
    const FAMILIES: [(&str, &str); 9] = [
        ("nomic-embed", "nomic-bert"),
        ("mxbai-embed", "bert"),
        ("qwen3", "qwen3"),
        ("qwen", "qwen2"),
        ("gemma3", "gemma3"),
        ("gemma", "gemma"),
        ("phi", "phi3"),
        ("deepseek", "qwen2"),
        ("mistral", "llama"),
    ];
    FAMILIES
        .iter()
        .find(|(p, _)| base.starts_with(p))
        .map_or(if base.contains("embed") { "bert" } else { "llama" }, |(_, f)| f)
}

/// "7b" -> 7e9, "0.5b" -> 5e8, "135m" -> 1.35e8, from the start of a tag ("8b-instruct-q8_0").
fn tag_size(tag: &str) -> Option<u64> {
    let num: String = tag.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let unit = tag[num.len()..].chars().next()?;
    let n: f64 = num.parse().ok()?;
    match unit {
        'b' => Some((n * 1e9) as u64),
        'm' => Some((n * 1e6) as u64),
        _ => None,
    }
}

/// Ollama's `parameter_size` words: "3.2B", "500M".
fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", n / 1_000_000)
    }
}

fn quantization(tag: &str, embedding: bool) -> &'static str {
    for (suffix, level) in [("q8_0", "Q8_0"), ("fp16", "F16"), ("f16", "F16"), ("q5_k_m", "Q5_K_M"), ("q4_0", "Q4_0")] {
        if tag.ends_with(suffix) {
            return level;
        }
    }
    if embedding {
        "F16"
    } else {
        "Q4_K_M"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_family_size_and_quantisation() {
        let f = Facts::of("qwen2.5:7b");
        assert_eq!((f.family, f.parameter_size.as_str(), f.quantization), ("qwen2", "7.0B", "Q4_K_M"));
        let f = Facts::of("llama3.1:8b-instruct-q8_0");
        assert_eq!((f.family, f.parameter_size.as_str(), f.quantization), ("llama", "8.0B", "Q8_0"));
        let f = Facts::of("nomic-embed-text");
        assert_eq!((f.family, f.parameter_size.as_str(), f.quantization), ("nomic-bert", "137M", "F16"));
        assert_eq!(Facts::of("qwen2.5:0.5b").parameter_size, "500M");
        assert_eq!(Facts::of("llama3.2").parameter_size, "3.2B");
    }

    #[test]
    fn layers_add_up_to_the_listed_size_and_revisions_change_the_digest() {
        let now = Origin::current("llama3.2:latest");
        let sum: u64 = layers(&now).iter().map(|l| l.size).sum();
        assert_eq!(sum, now.facts().size(), "a pull's totals add up to what /api/tags says");
        assert!(layers(&now).iter().all(|l| l.digest.len() == 7 + 64));
        let older = Origin { revision: 1, ..now.clone() };
        assert_ne!(older.digest(), now.digest(), "an older revision lists another digest");
        assert_eq!(Origin::current("llama3.2:latest").digest(), now.digest(), "the same on every node");
    }
}
