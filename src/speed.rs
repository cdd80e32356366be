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

use std::sync::atomic::{fence, AtomicI64, AtomicU64, Ordering};
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

/// Fastest decode believed of one answer, in tokens per second: far above any GPU's single
/// stream, it keeps a node that reports a nanosecond `eval_duration` from drawing every request
/// under `fastest-finish` (such a sample is dropped, not folded in).
pub const MAX_DECODE_TPS: f64 = 20_000.0;
/// Fastest prompt processing believed, likewise.
pub const MAX_PREFILL_TPS: f64 = 1_000_000.0;

/// The decode time to learn from: what the node reported, unless Corral saw its tokens arrive
/// over more than twice as long (`streamed`: first token to last), which a report cannot
/// undercut. An honest report is close to what is seen; a lie is far below it.
pub fn believable_eval(reported: Option<Duration>, streamed: Option<Duration>) -> Option<Duration> {
    match (reported, streamed) {
        (Some(r), Some(s)) if r < s / 2 => Some(s),
        (None, s) => s,
        (r, _) => r,
    }
}

/// For each quoted key, the unsigned integer after its last `"key":` in `hay` (as
/// [`number_after`] finds it), in one backward walk over the colons that stops once every key
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

/// The unsigned integer after the last `key` in `hay`, without copying `hay`. `key` is a
/// searcher made once and kept (the keys are fixed): memchr's SIMD search, as a window-by-window
/// compare was one `memcmp` call per byte of the tail, per key, a measurable share of each
/// request (issue 16).
pub fn number_after(hay: &[u8], key: &memchr::memmem::FinderRev<'_>) -> Option<u64> {
    let at = key.rfind(hay)? + key.needle().len();
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

/// A speed as time per token, in nanoseconds, what finish-time planning multiplies by
/// (`crate::plan`): a division and a unit conversion per candidate per decision were most of
/// what `fastest-finish` spent once the lock was gone. NaN for unknown, so a card stores it as
/// plain words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Nanoseconds per generated token.
    pub per_output: f64,
    /// Nanoseconds per prompt token.
    pub per_prompt: f64,
    /// Nanoseconds a cold load takes.
    pub load: f64,
    /// Output tokens of a typical answer.
    pub typical_output: f64,
    /// `stamp` of the last answer; `i64::MIN` for none.
    pub last: i64,
}

impl Pace {
    pub const UNKNOWN: Pace =
        Pace { per_output: f64::NAN, per_prompt: f64::NAN, load: f64::NAN, typical_output: f64::NAN, last: i64::MIN };

    /// Per-token times from `s`; a speed is taken as at least 0.001 tokens/s.
    pub fn of(s: &Speed) -> Self {
        let per = |tps: Option<f64>| tps.map_or(f64::NAN, |v| 1e9 / v.max(0.001));
        Self {
            per_output: per(s.decode_tps),
            per_prompt: per(s.prefill_tps),
            load: s.load_ms.map_or(f64::NAN, |ms| ms * 1e6),
            typical_output: s.typical_output_tokens.unwrap_or(f64::NAN),
            last: s.last.map_or(i64::MIN, stamp),
        }
    }
}

impl Estimate {
    /// What `read` says at any instant while every field is within `FRESH_FOR`.
    fn fresh(&self) -> Speed {
        let v = |l: Option<Learned>| l.map(|l| l.value);
        Speed {
            prefill_tps: v(self.prefill),
            decode_tps: v(self.decode),
            load_ms: v(self.load),
            typical_output_tokens: v(self.output),
            confidence: if self.decode.is_some() { 1.0 } else { 0.0 },
            samples: self.samples,
            last: self.last,
        }
    }

    pub fn observe(&mut self, t: &Timing, now: Instant) {
        let rate = |n: Option<u64>, d: Option<Duration>| match (n, d) {
            (Some(n), Some(d)) if n > 0 && !d.is_zero() => Some(n as f64 / d.as_secs_f64()),
            _ => None,
        };
        if let Some(r) = rate(t.prompt_tokens, t.prompt).filter(|r| *r <= MAX_PREFILL_TPS) {
            Learned::fold(&mut self.prefill, r, now);
        }
        if let Some(r) = rate(t.eval_tokens, t.eval).filter(|r| *r <= MAX_DECODE_TPS) {
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
    models: foldhash::HashMap<String, Estimate>,
}

impl Book {
    /// Fold `t` into `model`'s estimate; returns the estimate as it now stands.
    pub fn observe(&mut self, model: &str, t: &Timing, now: Instant) -> Estimate {
        // Allocates a key only the first time a model is seen.
        let e = match self.models.get_mut(model) {
            Some(e) => e,
            None => self.models.entry(model.to_string()).or_default(),
        };
        e.observe(t, now);
        *e
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

/// How many models' estimates a node publishes for reading without its lock (`Cards`); the
/// estimates of a node's further models are read from its book.
pub const CARDS: usize = 4;

/// The instant `stamp`s count from (any fixed instant will do; earlier ones are negative).
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// `at` as signed nanoseconds from a fixed instant: what `Cards` store instants as, and what
/// a reader passes once per decision rather than once per card.
pub fn stamp(at: Instant) -> i64 {
    let e = epoch();
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    if at >= e {
        nanos(at - e)
    } else {
        -nanos(e - at)
    }
}

fn unstamp(n: i64) -> Instant {
    let e = epoch();
    let d = Duration::from_nanos(n.unsigned_abs());
    if n >= 0 {
        e + d
    } else {
        e - d
    }
}

/// What a `Cards` lookup found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Card {
    /// The estimate, exactly as `Book::read` reads it now.
    Speed(Speed),
    /// The model never answered on this node (a free card is left, so it would have one).
    Never,
    /// The cards cannot say (the model has no card, the estimate has aged, a write was under
    /// way): read the book.
    AskTheBook,
}

/// A node's estimates as routing reads them: for up to `CARDS` models, the estimate copied out
/// after every `Book::observe` behind a sequence lock, so `fastest-finish` reads every
/// candidate's speed with a few loads, without the node's lock or hashing a model name (the
/// lock and the name hash per candidate were most of a 10 µs decision at 100 nodes, issue 16).
/// Written only under the book's lock (one writer at a time); a card is read as fresh only
/// while every field of it is within `FRESH_FOR`, where `Book::read` applies no decay, so
/// the two read alike.
#[derive(Debug, Default)]
pub struct Cards {
    cards: [CardSlot; CARDS],
}

/// One model's card. What `Cards::pace` reads comes first and fills one cache line.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct CardSlot {
    /// Odd while the writer copies; a reader that sees it odd or changed asks the book.
    seq: AtomicU64,
    /// The model's signature (never 0: 0 is a free card).
    sig: AtomicU64,
    /// Stamp past which some field of the estimate has aged and the book must decay it.
    fresh_until: AtomicI64,
    /// Stamp of the last answer; `i64::MIN` for none.
    last: AtomicI64,
    /// `Pace::of` the estimate, f64 bits.
    per_output: AtomicU64,
    per_prompt: AtomicU64,
    load_s: AtomicU64,
    /// The estimate's fields, f64 bits; NaN for unknown.
    output: AtomicU64,
    prefill: AtomicU64,
    decode: AtomicU64,
    load: AtomicU64,
    samples: AtomicU64,
}

const NONE_F64: u64 = 0x7ff8_0000_0000_0000;

impl Cards {
    /// The model signatures `Card` compares by: never 0, which marks a free card.
    fn sig(sig: u64) -> u64 {
        sig.max(1)
    }

    /// Publish `e`, `sig`'s estimate as it now stands. Call with the book's lock held.
    pub fn publish(&self, sig: u64, e: &Estimate) {
        let sig = Self::sig(sig);
        let slot = self.cards.iter().find(|c| c.sig.load(Ordering::Relaxed) == sig).or_else(|| {
            self.cards.iter().find(|c| c.sig.load(Ordering::Relaxed) == 0).or_else(|| {
                // All taken: the card whose model answered least recently goes to this one.
                self.cards.iter().min_by_key(|c| c.last.load(Ordering::Relaxed))
            })
        });
        let Some(slot) = slot else { return };
        let fields = [e.prefill, e.decode, e.load, e.output];
        let fresh_for = i64::try_from(FRESH_FOR.as_nanos()).unwrap_or(i64::MAX);
        let fresh_until = fields.iter().flatten().map(|l| stamp(l.at).saturating_add(fresh_for)).min();
        let f = |l: Option<Learned>| l.map_or(NONE_F64, |l| l.value.to_bits());
        let pace = Pace::of(&e.fresh());
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        slot.sig.store(sig, Ordering::Relaxed);
        slot.fresh_until.store(fresh_until.unwrap_or(i64::MAX), Ordering::Relaxed);
        slot.last.store(e.last.map_or(i64::MIN, stamp), Ordering::Relaxed);
        slot.samples.store(e.samples, Ordering::Relaxed);
        slot.prefill.store(f(e.prefill), Ordering::Relaxed);
        slot.decode.store(f(e.decode), Ordering::Relaxed);
        slot.load.store(f(e.load), Ordering::Relaxed);
        slot.output.store(f(e.output), Ordering::Relaxed);
        slot.per_output.store(pace.per_output.to_bits(), Ordering::Relaxed);
        slot.per_prompt.store(pace.per_prompt.to_bits(), Ordering::Relaxed);
        slot.load_s.store(pace.load.to_bits(), Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// `sig`'s estimate at the instant whose `stamp` is `now` (taken once by the caller).
    #[inline]
    pub fn read(&self, sig: u64, now: i64) -> Card {
        let sig = Self::sig(sig);
        for slot in &self.cards {
            let seq = slot.seq.load(Ordering::Acquire);
            let held = slot.sig.load(Ordering::Relaxed);
            if held == 0 {
                // Cards fill in order and are never freed: a free one means no later one is
                // taken either, unless a write to it is under way.
                fence(Ordering::Acquire);
                let settled = seq & 1 == 0 && slot.seq.load(Ordering::Relaxed) == seq;
                return if settled { Card::Never } else { Card::AskTheBook };
            }
            if held != sig {
                continue;
            }
            let fresh_until = slot.fresh_until.load(Ordering::Relaxed);
            let last = slot.last.load(Ordering::Relaxed);
            let samples = slot.samples.load(Ordering::Relaxed);
            let value = |bits: u64| Some(f64::from_bits(bits)).filter(|v| !v.is_nan());
            let (prefill, decode, load) = (
                value(slot.prefill.load(Ordering::Relaxed)),
                value(slot.decode.load(Ordering::Relaxed)),
                value(slot.load.load(Ordering::Relaxed)),
            );
            let output = value(slot.output.load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if seq & 1 == 1 || slot.seq.load(Ordering::Relaxed) != seq || now > fresh_until {
                return Card::AskTheBook;
            }
            return Card::Speed(Speed {
                prefill_tps: prefill,
                decode_tps: decode,
                load_ms: load,
                typical_output_tokens: output,
                confidence: if decode.is_some() { 1.0 } else { 0.0 },
                samples,
                last: (last != i64::MIN).then(|| unstamp(last)),
            });
        }
        Card::AskTheBook
    }

    /// `Pace::of` what `read` would find, when it finds a `Card::Speed`; `None` otherwise
    /// (read the book). The fewest loads: this runs for every candidate of a decision.
    ///
    /// The sequence-lock read is spelled out here again rather than shared with `read`
    /// through a generic reader taking a closure: that version made the fastest-finish
    /// decision at 100 nodes 1.05 us instead of 0.95 (criterion, tried in two sessions), over
    /// the 1 us the routing decision must stay under (issue 16).
    #[inline]
    pub fn pace(&self, sig: u64, now: i64) -> Option<Pace> {
        let sig = Self::sig(sig);
        for slot in &self.cards {
            let seq = slot.seq.load(Ordering::Acquire);
            let held = slot.sig.load(Ordering::Relaxed);
            if held != sig {
                if held == 0 {
                    return None;
                }
                continue;
            }
            let fresh_until = slot.fresh_until.load(Ordering::Relaxed);
            let f = |w: &AtomicU64| f64::from_bits(w.load(Ordering::Relaxed));
            let pace = Pace {
                per_output: f(&slot.per_output),
                per_prompt: f(&slot.per_prompt),
                load: f(&slot.load_s),
                typical_output: f(&slot.output),
                last: slot.last.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            let settled = seq & 1 == 0 && slot.seq.load(Ordering::Relaxed) == seq;
            return (settled && now <= fresh_until).then_some(pace);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// [`number_after`] with a searcher made for the one call.
    fn last_number(hay: &[u8], key: &[u8]) -> Option<u64> {
        number_after(hay, &memchr::memmem::FinderRev::new(key))
    }

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
    fn an_impossible_speed_is_not_learned_and_a_report_cannot_undercut_what_was_seen() {
        let mut e = Estimate::default();
        let now = Instant::now();
        let lie = Timing { eval_tokens: Some(50), eval: Some(Duration::from_nanos(1000)), ..Timing::default() };
        e.observe(&lie, now);
        assert_eq!(e.read(now).decode_tps, None, "50 tokens in a microsecond is not believed");
        e.observe(&decode(50, 1000), now);
        assert!(e.read(now).decode_tps.is_some_and(|t| (t - 50.0).abs() < 1e-6), "an honest one is");
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        assert_eq!(believable_eval(Some(ms(1)), Some(s(2))), Some(s(2)), "seen over 2 s, reported 1 ms");
        assert_eq!(believable_eval(Some(ms(1900)), Some(s(2))), Some(ms(1900)), "close to what was seen");
        assert_eq!(believable_eval(None, Some(s(2))), Some(s(2)));
        assert_eq!(believable_eval(Some(ms(5)), None), Some(ms(5)), "nothing seen to compare");
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

    /// A book with its cards, as a node keeps them (signatures here: the model's index + 1).
    fn observe(book: &mut Book, cards: &Cards, model: usize, t: &Timing, now: Instant) {
        let e = book.observe(&format!("m{model}"), t, now);
        cards.publish(model as u64 + 1, &e);
    }

    #[tokio::test(start_paused = true)]
    async fn a_card_reads_as_the_book_while_fresh_and_sends_the_reader_to_the_book_after() {
        let (mut book, cards, start) = (Book::default(), Cards::default(), Instant::now());
        assert_eq!(cards.read(1, stamp(start)), Card::Never, "nothing learned yet");
        observe(&mut book, &cards, 0, &decode(40, 1000), start);
        let read = |at: Instant| cards.read(1, stamp(at));
        assert_eq!(read(start), Card::Speed(book.read("m0", start).expect("known")));
        assert_eq!(read(start + FRESH_FOR), Card::Speed(book.read("m0", start + FRESH_FOR).expect("known")));
        assert_eq!(read(start + FRESH_FOR + Duration::from_nanos(1)), Card::AskTheBook, "decay is the book's");
        assert_eq!(cards.read(2, stamp(start)), Card::Never, "another model, a free card left");
        // Five models on four cards: the one that answered least recently loses its card.
        for m in 1..5 {
            observe(&mut book, &cards, m, &decode(10 + m as u64, 1000), start + Duration::from_secs(m as u64));
        }
        assert_eq!(read(start + Duration::from_secs(5)), Card::AskTheBook, "m0's card went to m4");
        let at = start + Duration::from_secs(5);
        assert_eq!(cards.read(5, stamp(at)), Card::Speed(book.read("m4", at).expect("known")));
        assert_eq!(cards.read(9, stamp(at)), Card::AskTheBook, "every card taken: only the book knows");
    }

    /// Readers racing one writer never see a card half written: every estimate published has
    /// all four fields equal, so a read mixing two of them would show unequal fields.
    #[test]
    fn a_card_read_during_writes_is_one_estimate_or_none() {
        let cards = Arc::new(Cards::default());
        let at = Instant::now();
        let estimate = |v: f64| {
            let l = Some(Learned { value: v, at });
            Estimate { prefill: l, decode: l, load: l, output: l, last: Some(at), samples: v as u64 }
        };
        cards.publish(7, &estimate(1.0));
        let now = stamp(at);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (cards, stop) = (Arc::clone(&cards), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let (mut whole, mut torn) = (0u64, 0u64);
                    // At least one pass after the writer stops, whenever this thread first runs.
                    loop {
                        let last = stop.load(Ordering::Relaxed);
                        if let Card::Speed(s) = cards.read(7, now) {
                            let v = s.decode_tps;
                            let same = [s.prefill_tps, s.load_ms, s.typical_output_tokens].iter().all(|x| *x == v)
                                && v.map(|v| v as u64) == Some(s.samples);
                            if same {
                                whole += 1
                            } else {
                                torn += 1
                            }
                        }
                        if let Some(p) = cards.pace(7, now) {
                            let v = p.typical_output;
                            if p.per_output.to_bits() != (1e9 / v.max(0.001)).to_bits()
                                || p.load.to_bits() != (v * 1e6).to_bits()
                            {
                                torn += 1;
                            }
                        }
                        if last {
                            break;
                        }
                    }
                    (whole, torn)
                })
            })
            .collect();
        for i in 0..200_000u64 {
            cards.publish(7, &estimate(1.0 + (i % 1000) as f64));
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            let (whole, torn) = r.join().expect("reader");
            assert_eq!(torn, 0, "a reader saw fields of two estimates ({whole} whole reads)");
            assert!(whole > 0, "a settled card reads whole");
        }
    }

    #[test]
    fn stamps_round_trip_before_and_after_the_epoch() {
        let now = Instant::now();
        for at in [now, now + Duration::from_nanos(1), now - Duration::from_secs(3600), now + Duration::from_secs(1)] {
            assert_eq!(unstamp(stamp(at)), at);
        }
        assert!(stamp(now - Duration::from_secs(1)) < stamp(now));
    }

    proptest::proptest! {
        /// Whatever the cards say agrees with the book: any models (more than there are
        /// cards), any timings, reads at any age, fresh or decayed.
        #[test]
        fn what_a_card_says_is_what_the_book_says(
            steps in proptest::collection::vec(
                (0usize..6, 0u64..400, 0u64..3000, 0u64..2000, 0u64..3000, 0u64..1500),
                1..40,
            ),
            reads in proptest::collection::vec((0usize..7, 0u64..3000), 1..20),
        ) {
            let (mut book, cards, start) = (Book::default(), Cards::default(), Instant::now());
            let mut now = start;
            for (model, advance_s, prompt_ms, tokens, eval_ms, load_ms) in steps {
                now += Duration::from_secs(advance_s);
                let t = Timing {
                    prompt_tokens: Some(tokens / 2),
                    prompt: Some(Duration::from_millis(prompt_ms)),
                    eval_tokens: Some(tokens),
                    eval: Some(Duration::from_millis(eval_ms)),
                    load: Some(Duration::from_millis(load_ms)),
                };
                observe(&mut book, &cards, model, &t, now);
            }
            for (model, later_s) in reads {
                let at = now + Duration::from_secs(later_s);
                let want = book.read(&format!("m{model}"), at);
                match cards.read(model as u64 + 1, stamp(at)) {
                    Card::Speed(s) => proptest::prop_assert_eq!(Some(s), want),
                    Card::Never => proptest::prop_assert_eq!(None, want),
                    Card::AskTheBook => {}
                }
                if let Some(pace) = cards.pace(model as u64 + 1, stamp(at)) {
                    let want = Pace::of(&want.expect("a pace only for a known estimate"));
                    let bits = |p: Pace| (p.per_output.to_bits(), p.per_prompt.to_bits(), p.load.to_bits(), p.typical_output.to_bits(), p.last);
                    proptest::prop_assert_eq!(bits(pace), bits(want));
                }
            }
        }
    }
}
