//! PII redaction for requests that leave for a cloud provider, and restoration in the answer.
//!
//! Masked before sending: e-mail addresses, phone numbers (E.164 and mainland China mobile),
//! PRC resident ID numbers (checksum verified), and card numbers (Luhn verified). Each distinct
//! value gets a placeholder such as `[EMAIL_1]`, the same one wherever it appears in the
//! request, so the model can still refer to "the same address". The answer's placeholders are
//! put back, also when a stream splits one across chunks: the restorer holds back a tail that
//! could still become a placeholder. Placeholder-like text the client wrote itself is never
//! reused, so restoring gives back exactly what was there.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Email,
    Id,
    Card,
    Phone,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Email => "EMAIL",
            Kind::Id => "ID",
            Kind::Card => "CARD",
            Kind::Phone => "PHONE",
        }
    }
}

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}").expect("email pattern")
});
static PRC_ID: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"[0-9]{17}[0-9Xx]").expect("id pattern"));
static CARD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"[0-9](?:[ -]?[0-9]){12,18}").expect("card pattern"));
static E164: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\+[1-9](?:[ -]?[0-9]){7,14}").expect("e164 pattern"));
static CN_MOBILE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"1[3-9][0-9]{9}").expect("mobile pattern"));
static PLACEHOLDER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\[(?:EMAIL|ID|CARD|PHONE)_[0-9]+\]").expect("placeholder pattern"));

/// Longest placeholder looked for when holding back a stream's tail.
const PLACEHOLDER_MAX: usize = 24;

fn digits(s: &str) -> Vec<u32> {
    s.chars().filter_map(|c| c.to_digit(10)).collect()
}

/// GB 11643: 17 digits weighted, mod 11, mapped to the check character.
pub fn prc_id_valid(s: &str) -> bool {
    const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    const CHECK: &[u8; 11] = b"10X98765432";
    let b = s.as_bytes();
    if b.len() != 18 || !b[..17].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let sum: u32 = b[..17].iter().zip(W).map(|(d, w)| u32::from(d - b'0') * w).sum();
    CHECK[(sum % 11) as usize] == b[17].to_ascii_uppercase()
}

pub fn luhn_valid(s: &str) -> bool {
    let d = digits(s);
    if !(13..=19).contains(&d.len()) {
        return false;
    }
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| {
            if i % 2 == 1 {
                if x * 2 > 9 {
                    x * 2 - 9
                } else {
                    x * 2
                }
            } else {
                x
            }
        })
        .sum();
    sum % 10 == 0
}

/// No digit (or, for IDs, check letter) right before or after the match: "13800138000" inside
/// a longer number is not a phone number.
fn bounded(text: &str, start: usize, end: usize) -> bool {
    let before = text[..start].chars().next_back();
    let after = text[end..].chars().next();
    !before.is_some_and(|c| c.is_ascii_digit() || c == '+') && !after.is_some_and(|c| c.is_ascii_alphanumeric())
}

/// Spans of PII in `text`, earlier detectors winning overlaps.
fn find(text: &str) -> Vec<(usize, usize, Kind)> {
    let mut spans: Vec<(usize, usize, Kind)> = Vec::new();
    let add = |s: usize, e: usize, k: Kind, spans: &mut Vec<(usize, usize, Kind)>| {
        if !spans.iter().any(|&(a, b, _)| s < b && a < e) {
            spans.push((s, e, k));
        }
    };
    for m in EMAIL.find_iter(text) {
        add(m.start(), m.end(), Kind::Email, &mut spans);
    }
    for m in PRC_ID.find_iter(text) {
        if bounded(text, m.start(), m.end()) && prc_id_valid(m.as_str()) {
            add(m.start(), m.end(), Kind::Id, &mut spans);
        }
    }
    for m in CARD.find_iter(text) {
        if bounded(text, m.start(), m.end()) && luhn_valid(m.as_str()) {
            add(m.start(), m.end(), Kind::Card, &mut spans);
        }
    }
    for m in E164.find_iter(text) {
        if bounded(text, m.start(), m.end()) {
            add(m.start(), m.end(), Kind::Phone, &mut spans);
        }
    }
    for m in CN_MOBILE.find_iter(text) {
        if bounded(text, m.start(), m.end()) {
            add(m.start(), m.end(), Kind::Phone, &mut spans);
        }
    }
    spans.sort_unstable_by_key(|s| s.0);
    spans
}

/// Masks one request. Holds the mapping its `Restorer` needs to undo it.
#[derive(Debug, Default)]
pub struct Redactor {
    to_placeholder: HashMap<String, String>,
    to_original: HashMap<String, String>,
    counters: HashMap<Kind, usize>,
    /// Placeholder-shaped text already in the request: never handed out.
    taken: HashSet<String>,
}

impl Redactor {
    /// A redactor for a request whose texts are `texts` (scanned for placeholder look-alikes).
    pub fn new<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let taken = texts.into_iter().flat_map(|t| PLACEHOLDER.find_iter(t).map(|m| m.as_str().to_string())).collect();
        Self { taken, ..Self::default() }
    }

    pub fn redact(&mut self, text: &str) -> String {
        let spans = find(text);
        if spans.is_empty() {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for (s, e, kind) in spans {
            out.push_str(&text[at..s]);
            let original = &text[s..e];
            let placeholder = match self.to_placeholder.get(original) {
                Some(p) => p.clone(),
                None => {
                    let p = self.next(kind);
                    self.to_placeholder.insert(original.to_string(), p.clone());
                    self.to_original.insert(p.clone(), original.to_string());
                    p
                }
            };
            out.push_str(&placeholder);
            at = e;
        }
        out.push_str(&text[at..]);
        out
    }

    fn next(&mut self, kind: Kind) -> String {
        loop {
            let n = self.counters.entry(kind).or_insert(0);
            *n += 1;
            let p = format!("[{}_{}]", kind.label(), n);
            if !self.taken.contains(&p) {
                return p;
            }
        }
    }

    /// How many distinct values were masked.
    pub fn masked(&self) -> usize {
        self.to_original.len()
    }

    pub fn restorer(&self) -> Restorer {
        Restorer { map: Arc::new(self.to_original.clone()), pending: String::new() }
    }

    /// Mask every text a Chat Completions / Completions / Embeddings request sends: message
    /// contents (plain or parts), tool-call arguments, prompts and inputs. Ids, roles, names
    /// and image data stay as they are.
    pub fn redact_request(body: &mut Value) -> Self {
        let mut texts = Vec::new();
        for key in ["messages", "prompt", "input"] {
            if let Some(v) = body.get(key) {
                collect(v, &mut texts);
            }
        }
        let mut r = Self::new(texts.iter().map(String::as_str));
        for key in ["messages", "prompt", "input"] {
            if let Some(v) = body.get_mut(key) {
                r.walk(v);
            }
        }
        r
    }

    fn walk(&mut self, v: &mut Value) {
        match v {
            Value::String(s) => *s = self.redact(s),
            Value::Array(a) => a.iter_mut().for_each(|x| self.walk(x)),
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if !SKIP_KEYS.contains(&k.as_str()) {
                        self.walk(x);
                    }
                }
            }
            _ => {}
        }
    }
}

const SKIP_KEYS: [&str; 7] = ["role", "type", "id", "tool_call_id", "name", "image_url", "url"];

fn collect(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
        Value::Object(m) => {
            m.iter().filter(|(k, _)| !SKIP_KEYS.contains(&k.as_str())).for_each(|(_, x)| collect(x, out))
        }
        _ => {}
    }
}

/// Puts originals back in an answer, whole or streamed.
#[derive(Debug, Clone)]
pub struct Restorer {
    map: Arc<HashMap<String, String>>,
    pending: String,
}

impl Restorer {
    /// Same mapping, nothing held back (for another choice of the same answer).
    pub fn fresh(&self) -> Self {
        Self { map: Arc::clone(&self.map), pending: String::new() }
    }

    pub fn restore_all(&self, text: &str) -> String {
        if self.map.is_empty() {
            return text.to_string();
        }
        PLACEHOLDER
            .replace_all(text, |c: &regex::Captures<'_>| {
                let p = &c[0];
                self.map.get(p).cloned().unwrap_or_else(|| p.to_string())
            })
            .into_owned()
    }

    /// The next piece of a stream; returns what is safe to send now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.map.is_empty() {
            return piece.to_string();
        }
        self.pending.push_str(piece);
        let hold = held_tail(&self.pending);
        let ready: String = self.pending.drain(..self.pending.len() - hold).collect();
        self.restore_all(&ready)
    }

    /// The stream ended: whatever was held back.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        self.restore_all(&rest)
    }
}

/// Length of the tail of `s` that could still grow into a placeholder.
fn held_tail(s: &str) -> usize {
    let Some(open) = s.rfind('[') else { return 0 };
    let tail = &s[open..];
    if tail.len() > PLACEHOLDER_MAX || tail.contains(']') {
        return 0;
    }
    let body = &tail[1..];
    let could_grow = LABELS.iter().any(|l| {
        l.starts_with(body)
            || body
                .strip_prefix(l)
                .and_then(|r| r.strip_prefix('_'))
                .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
    });
    if could_grow {
        tail.len()
    } else {
        0
    }
}

const LABELS: [&str; 4] = ["EMAIL", "ID", "CARD", "PHONE"];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_kind_is_found_and_checksums_are_checked() {
        let text = "mail li.wei@example.com.cn, call +8613800138000 or 13912345678, id 11010519491231002X, \
                    card 4111 1111 1111 1111; not an id 110105194912310021, not a card 4111111111111112";
        let mut r = Redactor::new([text]);
        let out = r.redact(text);
        for gone in
            ["li.wei@example.com.cn", "+8613800138000", "13912345678", "11010519491231002X", "4111 1111 1111 1111"]
        {
            assert!(!out.contains(gone), "{gone} leaked: {out}");
        }
        assert!(out.contains("110105194912310021"), "a bad checksum is not an id: {out}");
        assert!(out.contains("4111111111111112"), "a bad Luhn sum is not a card: {out}");
        assert!(
            out.contains("[EMAIL_1]")
                && out.contains("[ID_1]")
                && out.contains("[CARD_1]")
                && out.contains("[PHONE_2]")
        );
        assert_eq!(r.masked(), 5);
    }

    #[test]
    fn the_same_value_gets_the_same_placeholder() {
        let mut r = Redactor::new(["a@b.io and a@b.io"]);
        assert_eq!(r.redact("a@b.io and a@b.io"), "[EMAIL_1] and [EMAIL_1]");
        assert_eq!(r.redact("again a@b.io, new c@d.io"), "again [EMAIL_1], new [EMAIL_2]");
    }

    #[test]
    fn digits_inside_longer_numbers_are_left_alone() {
        let mut r = Redactor::new([""]);
        assert_eq!(r.redact("order 9913800138000123"), "order 9913800138000123");
        assert_eq!(r.redact("手机13800138000。"), "手机[PHONE_1]。");
    }

    #[test]
    fn placeholders_the_client_wrote_survive_the_round_trip() {
        let text = "literal [EMAIL_1] and real x@y.org";
        let mut r = Redactor::new([text]);
        let out = r.redact(text);
        assert_eq!(out, "literal [EMAIL_1] and real [EMAIL_2]");
        assert_eq!(r.restorer().restore_all(&out), text);
    }

    #[test]
    fn requests_are_masked_in_contents_but_not_in_roles_or_images() {
        let mut body = serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "mail a@b.io"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,4111111111111111"}}]},
                {"role": "system", "content": "card 4111111111111111"},
            ]
        });
        let r = Redactor::redact_request(&mut body);
        assert_eq!(body["messages"][0]["content"][0]["text"], "mail [EMAIL_1]");
        assert_eq!(body["messages"][0]["content"][1]["image_url"]["url"], "data:image/png;base64,4111111111111111");
        assert_eq!(body["messages"][1]["content"], "card [CARD_1]");
        assert_eq!(r.masked(), 2);
    }

    fn pii() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z]{1,8}(\\.[a-z]{1,5})?@[a-z]{2,8}\\.(com|org|cn)",
            "1[3-9][0-9]{9}",
            "\\+[1-9][0-9]{9,12}",
            "[0-9]{17}".prop_map(|s| {
                const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
                let sum: u32 = s.bytes().zip(W).map(|(d, w)| u32::from(d - b'0') * w).sum();
                format!("{s}{}", b"10X98765432"[(sum % 11) as usize] as char)
            }),
            "[0-9]{15}"
                .prop_map(|s| { (0..10).map(|d| format!("{s}{d}")).find(|c| luhn_valid(c)).unwrap_or_default() }),
        ]
    }

    fn text_with_pii() -> impl Strategy<Value = (String, Vec<String>)> {
        proptest::collection::vec(("[ a-zA-Z,.!?\\[\\]_电话]{0,12}", pii()), 0..6).prop_map(|parts| {
            let values: Vec<String> = parts.iter().map(|(_, p)| p.clone()).collect();
            let text = parts.iter().map(|(filler, p)| format!("{filler} {p} ")).collect::<String>();
            (text, values)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn redact_then_restore_is_the_identity_and_hides_every_value((text, values) in text_with_pii()) {
            let mut r = Redactor::new([text.as_str()]);
            let masked = r.redact(&text);
            for v in &values {
                prop_assert!(!masked.contains(v.as_str()), "{} leaked in {}", v, masked);
            }
            prop_assert_eq!(r.restorer().restore_all(&masked), text);
        }

        #[test]
        fn a_stream_split_anywhere_restores_the_same((text, _) in text_with_pii(), cuts in proptest::collection::vec(0usize..200, 0..12)) {
            let mut r = Redactor::new([text.as_str()]);
            let masked = r.redact(&text);
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (masked.len() + 1)).filter(|&c| masked.is_char_boundary(c)).collect();
            bounds.sort_unstable();
            let mut restorer = r.restorer();
            let mut out = String::new();
            let mut at = 0;
            for b in bounds {
                out.push_str(&restorer.push(&masked[at..b]));
                at = b;
            }
            out.push_str(&restorer.push(&masked[at..]));
            out.push_str(&restorer.finish());
            prop_assert_eq!(out, text);
        }
    }
}
