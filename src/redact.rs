//! PII redaction for requests that leave for a cloud provider, and restoration in the answer.
//!
//! Masked before sending: e-mail addresses, IBANs (mod-97 checked), PRC resident ID numbers
//! (GB 11643 checksum), card numbers (Luhn), US social security numbers (`123-45-6789` or
//! `123 45 6789`, without the never-issued areas 000, 666 and 900-999, group 00 and serial
//! 0000) and phone numbers (E.164, US / NANP with separators such as `(415) 555-2671` or
//! `415.555.2671`, mainland China mobile). Every string of the request is scanned except
//! structural ones (model, roles, types, ids, function names, image and file data): message
//! contents and names, tool-call arguments, tool and schema texts, `user`, `metadata`,
//! `prompt`, `suffix`, `stop`, embeddings `input`. Object keys are not masked.
//!
//! Each distinct value gets a placeholder such as `[EMAIL_1]`, the same one wherever it appears
//! in the request, so the model can still refer to "the same address". The answer's
//! placeholders are put back, also when a stream splits one across chunks: the restorer holds
//! back a tail that could still become a placeholder. Placeholder-like text the client wrote
//! itself is never reused, so restoring gives back exactly what was there.
//!
//! Linear in the text: each detector is one left-to-right pass of the `regex` crate's
//! automata (no backtracking), overlaps between detectors are settled in an ordered map
//! (earlier detectors win: e-mail, IBAN, ID, card, SSN, phone), and the output is built once.
//! What a request may have redacted is bounded by the category's `redact_max_bytes`
//! ([`text_bytes`] measures it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Email,
    Iban,
    Id,
    Card,
    Ssn,
    Phone,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Email => "EMAIL",
            Kind::Iban => "IBAN",
            Kind::Id => "ID",
            Kind::Card => "CARD",
            Kind::Ssn => "SSN",
            Kind::Phone => "PHONE",
        }
    }
}

fn pattern(p: &str) -> Regex {
    Regex::new(p).unwrap_or_else(|e| panic!("redaction pattern {p}: {e}"))
}

static EMAIL: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"));
static IBAN: LazyLock<Regex> = LazyLock::new(|| pattern(r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}"));
static PRC_ID: LazyLock<Regex> = LazyLock::new(|| pattern(r"[0-9]{17}[0-9Xx]"));
static CARD: LazyLock<Regex> = LazyLock::new(|| pattern(r"[0-9](?:[ -]?[0-9]){12,18}"));
static SSN: LazyLock<Regex> = LazyLock::new(|| pattern(r"[0-9]{3}-[0-9]{2}-[0-9]{4}|[0-9]{3} [0-9]{2} [0-9]{4}"));
static E164: LazyLock<Regex> = LazyLock::new(|| pattern(r"\+[1-9](?:[ -]?[0-9]){7,14}"));
static US_PHONE: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"(?:\+?1[ .-]?)?(?:\([2-9][0-9]{2}\) ?|[2-9][0-9]{2}[ .-])[2-9][0-9]{2}[ .-][0-9]{4}"));
static CN_MOBILE: LazyLock<Regex> = LazyLock::new(|| pattern(r"1[3-9][0-9]{9}"));
static PLACEHOLDER: LazyLock<Regex> = LazyLock::new(|| pattern(r"\[(?:EMAIL|IBAN|ID|CARD|SSN|PHONE)_[0-9]+\]"));

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

/// A US social security number outside the ranges never issued: area 000, 666 and 900-999,
/// group 00, serial 0000.
pub fn ssn_valid(s: &str) -> bool {
    let d: String = s.chars().filter(char::is_ascii_digit).collect();
    if d.len() != 9 {
        return false;
    }
    let (area, group, serial) = (&d[..3], &d[3..5], &d[5..]);
    area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
}

/// ISO 13616: 15 to 34 characters (spaces ignored), the first four moved to the end, letters
/// as 10..35, the number mod 97 is 1.
pub fn iban_valid(s: &str) -> bool {
    let compact: Vec<u8> = s.bytes().filter(|b| *b != b' ').collect();
    if !(15..=34).contains(&compact.len())
        || !compact[..2].iter().all(u8::is_ascii_uppercase)
        || !compact[2..4].iter().all(u8::is_ascii_digit)
    {
        return false;
    }
    let mut rem: u32 = 0;
    for &b in compact[4..].iter().chain(&compact[..4]) {
        rem = match b {
            b'0'..=b'9' => (rem * 10 + u32::from(b - b'0')) % 97,
            b'A'..=b'Z' => (rem * 100 + u32::from(b - b'A') + 10) % 97,
            _ => return false,
        };
    }
    rem == 1
}

/// No digit (or, for IDs, check letter) right before or after the match: "13800138000" inside
/// a longer number is not a phone number.
fn bounded(text: &str, start: usize, end: usize) -> bool {
    let before = text[..start].chars().next_back();
    let after = text[end..].chars().next();
    !before.is_some_and(|c| c.is_ascii_digit() || c == '+') && !after.is_some_and(|c| c.is_ascii_alphanumeric())
}

/// The end of the longest valid IBAN starting at `start` within the candidate `start..end`:
/// the pattern may run on into the next word's capitals (`DE89 3704 ... 00 BIC`), so shorter
/// prefixes ending before a space are tried too (at most a handful: the candidate is at most
/// 64 bytes).
fn iban_end(text: &str, start: usize, end: usize) -> Option<usize> {
    if text[..start].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    let candidate = &text[start..end];
    let cuts = candidate.match_indices(' ').map(|(i, _)| start + i).rev();
    std::iter::once(end)
        .chain(cuts)
        .find(|&e| !text[e..].starts_with(|c: char| c.is_ascii_alphanumeric()) && iban_valid(&text[start..e]))
}

/// Accepted spans by start. They never overlap, so ordering by start orders the ends too, and
/// only the last span starting before a candidate's end can overlap it: each insertion is one
/// ordered-map lookup, not a scan of every span so far.
#[derive(Default)]
struct Spans(BTreeMap<usize, (usize, Kind)>);

impl Spans {
    fn add(&mut self, start: usize, end: usize, kind: Kind) {
        let overlaps = self.0.range(..end).next_back().is_some_and(|(_, &(e, _))| e > start);
        if !overlaps {
            self.0.insert(start, (end, kind));
        }
    }

    /// Every match of `re` that passes `valid` (given the text and the match's bounds).
    fn scan(&mut self, text: &str, re: &Regex, kind: Kind, valid: impl Fn(&str, usize, usize) -> bool) {
        for m in re.find_iter(text) {
            if valid(text, m.start(), m.end()) {
                self.add(m.start(), m.end(), kind);
            }
        }
    }
}

/// Spans of PII in `text`, earlier detectors winning overlaps, in order.
fn find(text: &str) -> Vec<(usize, usize, Kind)> {
    let mut spans = Spans::default();
    spans.scan(text, &EMAIL, Kind::Email, |_, _, _| true);
    // An IBAN candidate may be cut short, so the next search starts where the IBAN ended (or
    // one letter on when there was none), never past a second IBAN it ran into.
    let mut at = 0;
    while let Some(m) = IBAN.find_at(text, at) {
        match iban_end(text, m.start(), m.end()) {
            Some(e) => {
                spans.add(m.start(), e, Kind::Iban);
                at = e;
            }
            None => at = m.start() + 1,
        }
    }
    spans.scan(text, &PRC_ID, Kind::Id, |t, s, e| bounded(t, s, e) && prc_id_valid(&t[s..e]));
    spans.scan(text, &CARD, Kind::Card, |t, s, e| bounded(t, s, e) && luhn_valid(&t[s..e]));
    spans.scan(text, &SSN, Kind::Ssn, |t, s, e| bounded(t, s, e) && ssn_valid(&t[s..e]));
    for re in [&*E164, &*US_PHONE, &*CN_MOBILE] {
        spans.scan(text, re, Kind::Phone, bounded);
    }
    spans.0.into_iter().map(|(s, (e, k))| (s, e, k)).collect()
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
        let mut r = Self::default();
        texts.into_iter().for_each(|t| r.take_lookalikes(t));
        r
    }

    fn take_lookalikes(&mut self, text: &str) {
        self.taken.extend(PLACEHOLDER.find_iter(text).map(|m| m.as_str().to_string()));
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
            match self.to_placeholder.get(original) {
                Some(p) => out.push_str(p),
                None => {
                    let p = self.next(kind);
                    out.push_str(&p);
                    self.to_placeholder.insert(original.to_string(), p.clone());
                    self.to_original.insert(p, original.to_string());
                }
            }
            at = e;
        }
        out.push_str(&text[at..]);
        out
    }

    /// The next free placeholder of `kind`. Each look-alike the client wrote is skipped at most
    /// once per kind, so handing out n placeholders costs O(n + look-alikes).
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

    /// Mask every text a Chat Completions / Completions / Embeddings request sends (see the
    /// module notes for what is left as it is).
    pub fn redact_request(body: &mut Value) -> Self {
        let mut r = Self::default();
        each_text(body, "", &mut |s| r.take_lookalikes(s));
        each_text_mut(body, "", &mut |s| *s = r.redact(s));
        r
    }
}

/// Bytes of text [`Redactor::redact_request`] would scan in `body`: what `redact_max_bytes`
/// bounds.
pub fn text_bytes(body: &Value) -> usize {
    let mut n = 0;
    each_text(body, "", &mut |s| n += s.len());
    n
}

/// Keys whose values are structure, not text anyone wrote: never scanned, never changed.
const SKIP_KEYS: [&str; 12] = [
    "model",
    "images",
    "role",
    "type",
    "id",
    "tool_call_id",
    "image_url",
    "url",
    "input_audio",
    "file_data",
    "file_id",
    "b64_json",
];

/// Whether `key` of `obj` (itself under `parent`) is left alone. A `name` is a person's or
/// participant's name, except that of a function or schema, which the provider must see as it
/// is (and which cannot hold an address: function names are `[A-Za-z0-9_-]`).
fn skipped(key: &str, parent: &str, obj: &Map<String, Value>) -> bool {
    SKIP_KEYS.contains(&key)
        || (key == "name"
            && (matches!(parent, "function" | "json_schema" | "function_call")
                || obj.contains_key("parameters")
                || obj.contains_key("arguments")
                || obj.contains_key("schema")))
}

fn each_text<'a>(v: &'a Value, parent: &str, f: &mut impl FnMut(&'a str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| each_text(x, parent, f)),
        Value::Object(m) => {
            for (k, x) in m {
                if !skipped(k, parent, m) {
                    each_text(x, k, f);
                }
            }
        }
        _ => {}
    }
}

fn each_text_mut(v: &mut Value, parent: &str, f: &mut impl FnMut(&mut String)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter_mut().for_each(|x| each_text_mut(x, parent, f)),
        Value::Object(m) => {
            let keep: HashSet<String> = m.keys().filter(|k| skipped(k, parent, m)).cloned().collect();
            for (k, x) in m.iter_mut() {
                if !keep.contains(k) {
                    each_text_mut(x, k, f);
                }
            }
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

const LABELS: [&str; 6] = ["EMAIL", "IBAN", "ID", "CARD", "SSN", "PHONE"];

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

    #[test]
    fn us_phones_ssns_and_ibans_are_found_and_checked() {
        let text = "call (415) 555-2671 or 212.555.0199 or 1-800-555-0123; ssn 123-45-6789 and 078 05 1120; \
                    iban DE89 3704 0044 0532 0130 00 and GB82WEST12345698765432. \
                    Not: ssn 666-12-3456, 000-12-3456, 912-34-5678, 123-00-4567, 123-45-0000; \
                    iban DE89 3704 0044 0532 0130 01; phone (115) 555-2671";
        let mut r = Redactor::new([text]);
        let out = r.redact(text);
        for gone in [
            "(415) 555-2671",
            "212.555.0199",
            "1-800-555-0123",
            "123-45-6789",
            "078 05 1120",
            "DE89 3704 0044 0532 0130 00",
            "GB82WEST12345698765432",
        ] {
            assert!(!out.contains(gone), "{gone} leaked: {out}");
        }
        for kept in
            ["666-12-3456", "000-12-3456", "912-34-5678", "123-00-4567", "123-45-0000", "0130 01", "(115) 555-2671"]
        {
            assert!(out.contains(kept), "{kept} is not PII (never issued / bad check / no such area code): {out}");
        }
        assert!(out.contains("[IBAN_2]") && out.contains("[SSN_2]") && out.contains("[PHONE_3]"), "{out}");
        assert_eq!(r.restorer().restore_all(&out), text);
    }

    #[test]
    fn an_iban_that_runs_into_capitals_is_cut_at_the_last_valid_group() {
        let text = "to DE89 3704 0044 0532 0130 00 BIC COBADEFF FR14 2004 1010 0505 0001 3M02 606 ok";
        let mut r = Redactor::new([text]);
        assert_eq!(r.redact(text), "to [IBAN_1] BIC COBADEFF [IBAN_2] ok");
    }

    #[test]
    fn checksums_match_their_standards() {
        assert!(iban_valid("GB82 WEST 1234 5698 7654 32") && !iban_valid("GB83 WEST 1234 5698 7654 32"));
        assert!(!iban_valid("GB82WEST"), "too short");
        assert!(ssn_valid("001-01-0001") && !ssn_valid("666-01-0001") && !ssn_valid("900-01-0001"));
        assert!(luhn_valid("4111111111111111") && prc_id_valid("11010519491231002X"));
    }

    #[test]
    fn overlaps_go_to_the_earlier_detector_whatever_the_order_found() {
        // The address starts with a mobile number; the IBAN's digits are scanned by later detectors too.
        let text = "13800138000@example.com; NL91 ABNA 0417 1643 00";
        let mut r = Redactor::new([text]);
        assert_eq!(r.redact(text), "[EMAIL_1]; [IBAN_1]");
    }

    #[test]
    fn every_text_field_that_leaves_is_masked_and_structure_is_not() {
        let mut body = serde_json::json!({
            "model": "gpt-4o-mini", "user": "a@b.io", "metadata": {"customer": "c@d.io"}, "suffix": "e@f.io",
            "stop": ["g@h.io"], "input": ["i@j.io"], "prompt": "k@l.io",
            "messages": [
                {"role": "user", "name": "m@n.io", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "send_mail", "arguments": "{\"to\":\"o@p.io\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sent to q@r.io"}]},
            ],
            "tools": [{"type": "function", "function": {"name": "send_mail", "description": "default s@t.io",
                "parameters": {"type": "object", "properties": {"to": {"type": "string", "enum": ["u@v.io"]}}}}}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "reply",
                "schema": {"type": "object", "description": "owner w@x.io"}}},
        });
        let before = text_bytes(&body);
        let r = Redactor::redact_request(&mut body);
        let sent = body.to_string();
        for v in ["a@b", "c@d", "e@f", "g@h", "i@j", "k@l", "m@n", "o@p", "q@r", "s@t", "u@v", "w@x"] {
            assert!(!sent.contains(v), "{v} left in {sent}");
        }
        assert_eq!(r.masked(), 12);
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["messages"][1]["tool_calls"][0]["function"]["name"], "send_mail", "function names stay");
        assert_eq!(body["messages"][1]["tool_calls"][0]["id"], "call_1");
        assert_eq!(body["response_format"]["json_schema"]["name"], "reply");
        assert!(before > 0 && text_bytes(&body) > 0);
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
            ("[2-9][0-9]{2}", "[2-9][0-9]{2}", "[0-9]{4}", 0..3usize).prop_map(|(a, x, s, style)| match style {
                0 => format!("({a}) {x}-{s}"),
                1 => format!("{a}-{x}-{s}"),
                _ => format!("{a}.{x}.{s}"),
            }),
            (1u32..900, 1u32..100, 1u32..10_000)
                .prop_filter("never-issued area", |(a, _, _)| *a != 666)
                .prop_map(|(a, g, s)| format!("{a:03}-{g:02}-{s:04}")),
            ("[A-Z]{2}", "[0-9]{4}[0-9A-Z]{8,20}", any::<bool>())
                .prop_map(|(c, bban, spaced)| iban_of(&c, &bban, spaced)),
        ]
    }

    /// A valid IBAN for country `c` and `bban`: check digits 98 - (bban, c, "00") mod 97.
    fn iban_of(c: &str, bban: &str, spaced: bool) -> String {
        let rem = format!("{bban}{c}00").bytes().fold(0u32, |r, b| match b {
            b'0'..=b'9' => (r * 10 + u32::from(b - b'0')) % 97,
            _ => (r * 100 + u32::from(b - b'A') + 10) % 97,
        });
        let compact = format!("{c}{:02}{bban}", 98 - rem);
        if !spaced {
            return compact;
        }
        let chars: Vec<char> = compact.chars().collect();
        chars.chunks(4).map(|g| g.iter().collect::<String>()).collect::<Vec<_>>().join(" ")
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
