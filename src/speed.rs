//! Speed model: how fast one node runs one model, learned from the answers it gives.
//!
//! Every finished exchange ends with Ollama's timing fields in its final chunk
//! (`prompt_eval_count` / `prompt_eval_duration`: prefill, `eval_count` / `eval_duration`:
//! decode, `load_duration`: a cold load); an OpenAI-kind node reports only `usage`, so its decode
//! time is the wall time from the first byte to the end. Each observation is folded into a
//! per-(node, model) estimate with the field report's rule, `new = 0.35 · old + 0.65 · observed`
//! (recent answers dominate, one odd answer does not erase the history).
//!
//! An estimate goes stale: after `FRESH_FOR` without a sample its confidence halves every
//! `HALF_LIFE`, and below `FORGET_BELOW` it reads as unknown (`None`), so a node that was slow an
//! hour ago is explored again rather than avoided forever. A sample arriving on a stale estimate
//! gives the old value only its remaining confidence's share of the 0.35.
//!
//! A cold load is learned only from answers whose `load_duration` says a load happened (above
//! `COLD_LOAD_MIN`); a warm answer's few milliseconds say nothing about the next cold one.
//!
//! The book is small (one entry per model a node served) and touched once per finished
//! exchange; nothing here runs per chunk.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// Weight of the old estimate in one update (the field report's 0.35 / 0.65).
pub const KEEP: f64 = 0.35;
/// An estimate this young is fully trusted.
pub const FRESH_FOR: Duration = Duration::from_secs(10 * 60);
/// Past `FRESH_FOR`, confidence halves every `HALF_LIFE`.
pub const HALF_LIFE: Duration = Duration::from_secs(10 * 60);
/// Below this confidence an estimate reads as unknown.
pub const FORGET_BELOW: f64 = 0.125;
/// A `load_duration` above this means the model was loaded for this request.
pub const COLD_LOAD_MIN: Duration = Duration::from_millis(50);

/// What one finished answer says about the node's speed. Durations from the node's own
/// fields where it reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    pub prompt_tokens: Option<u64>,
    pub prompt: Option<Duration>,
    pub eval_tokens: Option<u64>,
    pub eval: Option<Duration>,
    pub load: Option<Duration>,
}

impl Timing {
    /// The timing fields at the end of an answer (Ollama's final line, or OpenAI's usage event
    /// followed by `[DONE]`), scanning from the back: the last occurrence of each field wins.
    pub fn from_tail(tail: &[u8]) -> Self {
        const KEYS: [&[u8]; 7] = [
            b"\"prompt_eval_count\"",
            b"\"prompt_eval_duration\"",
            b"\"eval_count\"",
            b"\"eval_duration\"",
            b"\"load_duration\"",
            b"\"prompt_tokens\"",
            b"\"completion_tokens\"",
        ];
        // OpenAI's names are read only where Ollama's counts are missing: an Ollama tail (its
        // last line has all five of its own) stops the walk at that line.
        let enough = |seen: &[bool; 7], got: &[Option<u64>; 7]| {
            seen[..5].iter().all(|s| *s) && got[0].is_some() && got[2].is_some()
        };
        let [prompt_eval_count, prompt_eval_duration, eval_count, eval_duration, load, prompt_tokens, completion_tokens] =
            last_numbers(tail, KEYS, enough);
        Timing {
            prompt_tokens: prompt_eval_count.or(prompt_tokens),
            prompt: prompt_eval_duration.map(Duration::from_nanos),
            eval_tokens: eval_count.or(completion_tokens),
            eval: eval_duration.map(Duration::from_nanos),
            load: load.map(Duration::from_nanos),
        }
    }

    /// The record's token counts, `(prompt, completion)`.
    pub fn tokens(&self) -> (Option<i64>, Option<i64>) {
        let count = |n: Option<u64>| n.and_then(|n| i64::try_from(n).ok());
        (count(self.prompt_tokens), count(self.eval_tokens))
    }

    /// Generation time (`eval_duration`, not prompt evaluation) in µs; `None` for an answer
    /// that does not report it (OpenAI's usage has no duration).
    pub fn generation_us(&self) -> Option<i64> {
        self.eval.and_then(|d| i64::try_from(d.as_micros()).ok())
    }
}

/// For each quoted key, the unsigned integer after its last `"key":` in `hay` (as
/// [`last_number`] finds it), in one backward walk over the colons that stops once every key
/// is seen or `enough` says the rest cannot matter: five separate searches each built a
/// substring finder, a tenth of the broker's own instructions per request (callgrind, issue 16).
pub fn last_numbers<const N: usize>(
    hay: &[u8],
    keys: [&[u8]; N],
    enough: impl Fn(&[bool; N], &[Option<u64>; N]) -> bool,
) -> [Option<u64>; N] {
    let mut out = [None; N];
    let mut seen = [false; N];
    for colon in memchr::memrchr_iter(b':', hay) {
        // Every key ends in a quote: most colons (inside text, after other values) stop here.
        if colon == 0 || hay[colon - 1] != b'"' {
            continue;
        }
        let before = &hay[..colon];
        let Some(i) = (0..N).find(|&i| !seen[i] && before.ends_with(keys[i])) else { continue };
        seen[i] = true;
        out[i] = number_at(&hay[colon + 1..]);
        if seen.iter().all(|s| *s) || enough(&seen, &out) {
            break;
        }
    }
    out
}

/// The unsigned integer at the start of `rest`, after whitespace.
fn number_at(rest: &[u8]) -> Option<u64> {
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let digits = rest[start..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[start..start + digits]).ok()?.parse().ok()
}

/// The unsigned integer after the last `key` in `hay`, without copying `hay`.
pub fn last_number(hay: &[u8], key: &[u8]) -> Option<u64> {
    // memchr's SIMD search: a window-by-window compare was one `memcmp` call per byte of the
    // tail, per key, a measurable share of each request (issue 16).
    let at = memchr::memmem::rfind(hay, key)? + key.len();
    number_at(&hay[at..])
}

/// One EWMA value and when it was last fed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Learned {
    value: f64,
    at: Instant,
}

/// How much an estimate last fed at `at` is still trusted at `now`: 1 while fresh, then halving.
pub fn confidence(at: Instant, now: Instant) -> f64 {
    let age = now.saturating_duration_since(at);
    match age.checked_sub(FRESH_FOR) {
        None => 1.0,
        Some(over) => 0.5f64.powf(over.as_secs_f64() / HALF_LIFE.as_secs_f64()),
    }
}

impl Learned {
    fn fold(slot: &mut Option<Learned>, observed: f64, now: Instant) {
        if !observed.is_finite() || observed <= 0.0 {
            return;
        }
        let value = match *slot {
            Some(old) => {
                let keep = KEEP * confidence(old.at, now);
                keep * old.value + (1.0 - keep) * observed
            }
            None => observed,
        };
        *slot = Some(Learned { value, at: now });
    }

    fn read(slot: Option<Learned>, now: Instant) -> Option<f64> {
        slot.filter(|l| confidence(l.at, now) >= FORGET_BELOW).map(|l| l.value)
    }
}

/// One (node, model) estimate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimate {
    prefill: Option<Learned>,
    decode: Option<Learned>,
    load: Option<Learned>,
    /// Output tokens of a typical answer (EWMA of `eval_count`).
    output: Option<Learned>,
    /// When the model last answered here (it is resident for a while after).
    last: Option<Instant>,
    samples: u64,
}

/// What an estimate reads now; `None` fields are unknown (never seen, or forgotten).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Speed {
    pub prefill_tps: Option<f64>,
    pub decode_tps: Option<f64>,
    pub load_ms: Option<f64>,
    pub typical_output_tokens: Option<f64>,
    /// Confidence of the decode estimate, 0..1 (1 while fresh).
    pub confidence: f64,
    pub samples: u64,
    #[serde(skip)]
    pub last: Option<Instant>,
}

impl Estimate {
    pub fn observe(&mut self, t: &Timing, now: Instant) {
        let rate = |n: Option<u64>, d: Option<Duration>| match (n, d) {
            (Some(n), Some(d)) if n > 0 && !d.is_zero() => Some(n as f64 / d.as_secs_f64()),
            _ => None,
        };
        if let Some(r) = rate(t.prompt_tokens, t.prompt) {
            Learned::fold(&mut self.prefill, r, now);
        }
        if let Some(r) = rate(t.eval_tokens, t.eval) {
            Learned::fold(&mut self.decode, r, now);
        }
        if let Some(l) = t.load.filter(|l| *l >= COLD_LOAD_MIN) {
            Learned::fold(&mut self.load, l.as_secs_f64() * 1000.0, now);
        }
        if let Some(n) = t.eval_tokens.filter(|n| *n > 0) {
            Learned::fold(&mut self.output, n as f64, now);
        }
        self.last = Some(now);
        self.samples += 1;
    }

    pub fn read(&self, now: Instant) -> Speed {
        Speed {
            prefill_tps: Learned::read(self.prefill, now),
            decode_tps: Learned::read(self.decode, now),
            load_ms: Learned::read(self.load, now),
            typical_output_tokens: Learned::read(self.output, now),
            confidence: self.decode.map_or(0.0, |d| confidence(d.at, now)),
            samples: self.samples,
            last: self.last,
        }
    }
}

/// A node's estimates, per model key.
#[derive(Debug, Default)]
pub struct Book {
    models: HashMap<String, Estimate>,
}

impl Book {
    pub fn observe(&mut self, model: &str, t: &Timing, now: Instant) {
        // Allocates a key only the first time a model is seen.
        match self.models.get_mut(model) {
            Some(e) => e.observe(t, now),
            None => self.models.entry(model.to_string()).or_default().observe(t, now),
        }
    }

    pub fn read(&self, model: &str, now: Instant) -> Option<Speed> {
        self.models.get(model).map(|e| e.read(now))
    }

    /// Every model's estimate, sorted by model.
    pub fn all(&self, now: Instant) -> Vec<(String, Speed)> {
        let mut v: Vec<_> = self.models.iter().map(|(k, e)| (k.clone(), e.read(now))).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_occurrence_of_a_key_wins_and_a_key_without_digits_is_none() {
        let tail = b"{\"eval_count\":3}\n{\"eval_count\": 41}\n{\"x\":1}";
        assert_eq!(last_number(tail, b"\"eval_count\":"), Some(41), "the later line, whitespace skipped");
        assert_eq!(last_number(b"{\"eval_count\":\"x\"}", b"\"eval_count\":"), None);
        assert_eq!(last_number(b"\"eval_count\":", b"\"eval_count\":"), None, "the key at the very end");
        assert_eq!(last_number(b"", b"\"eval_count\":"), None);
    }

    proptest::proptest! {
        /// The one backward walk finds what a search per key finds, on any bytes: keys
        /// repeated, cut, inside other keys, numbers missing or malformed.
        #[test]
        fn one_walk_finds_what_a_search_per_key_finds(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(&b"\"eval_count\":"[..]),
                    proptest::strategy::Just(&b"\"prompt_eval_count\": "[..]),
                    proptest::strategy::Just(&b"\"eval_duration\":"[..]),
                    proptest::strategy::Just(&b"eval_count\":"[..]),
                    proptest::strategy::Just(&b"\"load_duration\" :"[..]),
                    proptest::strategy::Just(&b"\"load_duration\":"[..]),
                    proptest::strategy::Just(&b"\"prompt_eval_duration\":"[..]),
                    proptest::strategy::Just(&b"\"prompt_tokens\":"[..]),
                    proptest::strategy::Just(&b"\"completion_tokens\": "[..]),
                    proptest::strategy::Just(&b"12"[..]),
                    proptest::strategy::Just(&b"x"[..]),
                    proptest::strategy::Just(&b","[..]),
                    proptest::strategy::Just(&b":"[..]),
                    proptest::strategy::Just(&b"99999999999999999999999"[..]),
                ],
                0..24,
            )
        ) {
            let hay: Vec<u8> = pieces.concat();
            let num = |key: &[u8]| last_number(&hay, key);
            let reference = Timing {
                prompt_tokens: num(b"\"prompt_eval_count\":").or_else(|| num(b"\"prompt_tokens\":")),
                prompt: num(b"\"prompt_eval_duration\":").map(Duration::from_nanos),
                eval_tokens: num(b"\"eval_count\":").or_else(|| num(b"\"completion_tokens\":")),
                eval: num(b"\"eval_duration\":").map(Duration::from_nanos),
                load: num(b"\"load_duration\":").map(Duration::from_nanos),
            };
            proptest::prop_assert_eq!(Timing::from_tail(&hay), reference, "{}", String::from_utf8_lossy(&hay));
            let keys: [&[u8]; 4] = [b"\"eval_count\"", b"\"prompt_eval_count\"", b"\"eval_duration\"", b"\"load_duration\""];
            let walked = last_numbers(&hay, keys, |_, _| false);
            for (key, got) in keys.iter().zip(walked) {
                let with_colon = [*key, b":"].concat();
                proptest::prop_assert_eq!(got, last_number(&hay, &with_colon), "{}", String::from_utf8_lossy(&hay));
            }
        }
    }

    #[test]
    fn tokens_are_found_in_ollama_and_openai_tails() {
        let ollama = br#"{"done":true,"eval_count":12,"prompt_eval_count":7,"total_duration":5}"#;
        assert_eq!(Timing::from_tail(ollama).tokens(), (Some(7), Some(12)));
        let openai = br#"data: {"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}"#;
        assert_eq!(Timing::from_tail(openai).tokens(), (Some(3), Some(9)));
        assert_eq!(Timing::from_tail(b"nothing here").tokens(), (None, None));
    }

    #[test]
    fn generation_time_is_eval_duration_not_prompt_eval_duration() {
        let ollama = br#"{"done":true,"prompt_eval_duration":9000000,"eval_count":12,"eval_duration":250000000}"#;
        assert_eq!(Timing::from_tail(ollama).generation_us(), Some(250_000), "250 ms of generation");
        let only_prompt = br#"{"done":true,"prompt_eval_duration":9000000}"#;
        assert_eq!(Timing::from_tail(only_prompt).generation_us(), None, "prompt evaluation is not generation");
        let openai = br#"data: {"usage":{"completion_tokens":9}}"#;
        assert_eq!(Timing::from_tail(openai).generation_us(), None);
    }

    fn decode(tokens: u64, ms: u64) -> Timing {
        Timing { eval_tokens: Some(tokens), eval: Some(Duration::from_millis(ms)), ..Timing::default() }
    }

    #[test]
    fn timing_fields_are_read_from_an_ollama_final_line() {
        let line = br#"{"done":true,"total_duration":9,"load_duration":900000000,"prompt_eval_count":20,"prompt_eval_duration":100000000,"eval_count":50,"eval_duration":1000000000}"#;
        let t = Timing::from_tail(line);
        assert_eq!(t.prompt_tokens, Some(20));
        assert_eq!(t.prompt, Some(Duration::from_millis(100)));
        assert_eq!(t.eval_tokens, Some(50), "eval_count, not prompt_eval_count");
        assert_eq!(t.eval, Some(Duration::from_secs(1)), "eval_duration, not prompt_eval_duration");
        assert_eq!(t.load, Some(Duration::from_millis(900)));
        let usage = b"data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n";
        let u = Timing::from_tail(usage);
        assert_eq!((u.prompt_tokens, u.eval_tokens, u.eval), (Some(3), Some(9), None));
    }

    #[tokio::test(start_paused = true)]
    async fn ewma_keeps_a_third_of_the_old_estimate() {
        let now = Instant::now();
        let mut e = Estimate::default();
        e.observe(&decode(100, 1000), now);
        assert_eq!(e.read(now).decode_tps, Some(100.0), "the first sample is the estimate");
        e.observe(&decode(200, 1000), now);
        let got = e.read(now).decode_tps.expect("known");
        assert!((got - (0.35 * 100.0 + 0.65 * 200.0)).abs() < 1e-9, "0.35 old + 0.65 new: {got}");
        assert_eq!(e.read(now).prefill_tps, None, "no prefill fields, no prefill estimate");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_estimate_decays_to_unknown_and_counts_less_when_fed_again() {
        let start = Instant::now();
        let mut e = Estimate::default();
        e.observe(&decode(100, 1000), start);
        assert_eq!(e.read(start + FRESH_FOR).confidence, 1.0, "fully trusted while fresh");
        let half = e.read(start + FRESH_FOR + HALF_LIFE);
        assert!((half.confidence - 0.5).abs() < 1e-9, "{half:?}");
        assert_eq!(half.decode_tps, Some(100.0), "still known at half confidence");
        assert_eq!(e.read(start + FRESH_FOR + HALF_LIFE * 4).decode_tps, None, "forgotten: unknown again");
        // Fed again at half confidence: the old value keeps 0.175, not 0.35.
        e.observe(&decode(200, 1000), start + FRESH_FOR + HALF_LIFE);
        let got = e.read(start + FRESH_FOR + HALF_LIFE).decode_tps.expect("known");
        assert!((got - (0.175 * 100.0 + 0.825 * 200.0)).abs() < 1e-6, "{got}");
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_real_load_teaches_the_cold_load_time() {
        let now = Instant::now();
        let mut e = Estimate::default();
        e.observe(&Timing { load: Some(Duration::from_millis(2)), ..decode(10, 100) }, now);
        assert_eq!(e.read(now).load_ms, None, "a warm answer's 2 ms is no cold load");
        e.observe(&Timing { load: Some(Duration::from_millis(1500)), ..decode(10, 100) }, now);
        assert_eq!(e.read(now).load_ms, Some(1500.0));
        assert_eq!(e.read(now).samples, 2);
    }
}
