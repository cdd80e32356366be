//! Deterministic "generation": the same seed (or, without one, the same model and prompt) always
//! gives the same words, so tests can compare answers across nodes and runs.

const WORDS: &[&str] = &[
    "the", "cluster", "answers", "quickly", "while", "every", "node", "keeps", "its", "model", "warm", "and", "ready",
    "a", "request", "flows", "through", "corral", "to", "one", "of", "many", "machines", "that", "share", "load",
    "fairly", "tokens", "stream", "back", "as", "soon", "they", "exist", "llamas", "graze", "in", "quiet", "fields",
    "under", "bright", "sky", "with", "patience", "latency", "stays", "low", "when", "work", "spreads", "evenly",
    "across", "gpus", "so", "nobody", "waits", "long", "for", "an", "answer", "here", "today",
];

/// SplitMix64: tiny, fast, good enough for filler text and vectors.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// FNV-1a, for seeding from text.
pub fn hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The tokens of one answer and why it stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub tokens: Vec<String>,
    /// "stop" (natural end) or "length" (hit `num_predict`).
    pub done_reason: &'static str,
}

/// Longest answer the sim gives, whatever `num_predict` asks: a long context's worth (Ollama
/// stops at the context length), enough for an answer bigger than every socket buffer on the
/// way (the slow-reader test), and bounded for a demo sim facing a careless client.
const MAX_TOKENS: usize = 256 * 1024;

/// Generate an answer: its natural length (8 to 31 tokens), or `num_predict` tokens when asked.
pub fn complete(seed: u64, num_predict: Option<i64>) -> Completion {
    let mut rng = SplitMix::new(seed);
    let natural = 8 + (rng.next_u64() % 24) as usize;
    // Asked for `num_predict` tokens, the sim's model always has that much to say (so a test can
    // ask for a 60-token answer); otherwise it stops after its own natural length.
    let (n, done_reason) = match num_predict {
        Some(p) if p > 0 => ((p as usize).min(MAX_TOKENS), "length"),
        _ => (natural, "stop"),
    };
    let tokens = (0..n)
        .map(|i| {
            let w = WORDS[(rng.next_u64() % WORDS.len() as u64) as usize];
            if i == 0 {
                w.to_string()
            } else {
                format!(" {w}")
            }
        })
        .collect();
    Completion { tokens, done_reason }
}

/// A deterministic unit vector for an input text.
pub fn embedding(model: &str, input: &str, dims: usize) -> Vec<f32> {
    let mut rng = SplitMix::new(hash(&[model, input]));
    let v: Vec<f32> = (0..dims).map(|_| rng.next_f32() * 2.0 - 1.0).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::EPSILON);
    v.into_iter().map(|x| x / norm).collect()
}

/// Rough token count of a prompt, for the `prompt_eval_count` fields.
pub fn count_tokens(text: &str) -> usize {
    text.split_whitespace().count().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_text() {
        assert_eq!(complete(42, None), complete(42, None));
        assert_ne!(complete(42, None).tokens, complete(43, None).tokens);
    }

    #[test]
    fn num_predict_caps_the_answer() {
        let c = complete(1, Some(3));
        assert_eq!(c.tokens.len(), 3);
        assert_eq!(c.done_reason, "length");
        let free = complete(1, None);
        assert_eq!(free.done_reason, "stop");
        assert!(free.tokens.len() >= 8);
    }

    #[test]
    fn embeddings_are_unit_length() {
        let v = embedding("m", "hello", 16);
        let n: f32 = v.iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-4);
        assert_eq!(v, embedding("m", "hello", 16));
    }
}
