//! What the broker reads from a request body, without building its tree.
//!
//! A body may be 32 MiB of JSON; parsed into a `serde_json::Value` tree, an array of small
//! numbers costs about 30 times its size (a 30 MiB body took 1.3 GB). The broker needs only a
//! handful of facts to route and guard a request: the model, whether it streams, the size of
//! its prompt text and `options.num_ctx`. `Peek` reads those in one streaming pass over the
//! body, keeping nothing else: every other field is skipped as it is read (still checked for
//! syntax), so the extra memory is the model name, not the body. The bytes forwarded to a node
//! are still the client's own.
//!
//! Invariants: the whole body must be UTF-8 and one JSON object, nested at most `MAX_DEPTH`
//! deep (the limit `serde_json` puts on a tree; skipped fields are checked by a byte scan, as
//! serde_json's skipping has no depth limit). A field named twice is refused, so Corral never
//! routes on one copy while a node reads the other.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Deepest nesting accepted, as serde_json's own tree limit.
pub const MAX_DEPTH: usize = 128;

/// What a request body says about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peek {
    /// `model`, else `name`, else `source`, as the body names them.
    pub names: [Named; 3],
    /// `stream`, when it is a boolean.
    pub stream: Option<bool>,
    /// `truncate`, when it is a boolean (Ollama: false means "refuse what does not fit").
    pub truncate: Option<bool>,
    /// `options.num_ctx`, when it is a whole number.
    pub num_ctx: Option<u64>,
    /// UTF-8 bytes of the text in `messages[].content` (a string, or parts with `text`).
    pub chat_text: usize,
    /// UTF-8 bytes of `prompt` plus `system`.
    pub generate_text: usize,
}

/// One of the fields that may name the model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Named {
    /// Absent or `null`.
    #[default]
    Absent,
    Text(String),
    /// Present but not a string: the kind, for the error message.
    Other(&'static str),
}

impl Peek {
    /// Read `body`; the error is a message for a `malformed_json` answer.
    pub fn read(body: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(body).map_err(|e| format!("not UTF-8: {e}"))?;
        if depth(body) > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let peek = de.deserialize_map(Top).map_err(|e| e.to_string())?;
        de.end().map_err(|e| e.to_string())?;
        Ok(peek)
    }
}

/// Deepest `[` / `{` nesting in `body`, outside strings. One pass, no allocation. A string's
/// inside is crossed with `memchr2` to its next quote or backslash: a prompt is most of a
/// body, and a byte-at-a-time walk through it was half of a chat request's read (callgrind,
/// issue 16).
fn depth(body: &[u8]) -> usize {
    let (mut depth, mut deepest, mut at) = (0usize, 0usize, 0usize);
    while let Some(&b) = body.get(at) {
        at += 1;
        match b {
            b'"' => at = string_end(body, at),
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Where the string whose inside begins at `at` ends: just past its closing quote, or the
/// body's end when it has none.
fn string_end(body: &[u8], mut at: usize) -> usize {
    while let Some(i) = body.get(at..).and_then(|rest| memchr::memchr2(b'"', b'\\', rest)) {
        match body[at + i] {
            // A backslash escapes the byte after it, whatever it is.
            b'\\' => at += i + 2,
            _ => return at + i + 1,
        }
    }
    body.len()
}

/// An object's key, borrowed from the body unless it has escapes. serde's own `Cow<str>`
/// always copies: an allocation per key of every body (callgrind, issue 16).
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl std::ops::Deref for Key<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(s))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Scalars a visitor does not want: `$v` for each.
macro_rules! scalars {
    ($v:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($v)
        }
    };
}

/// Arrays and objects a visitor does not want: skipped, `$v`.
macro_rules! containers {
    ($v:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($v)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($v)
        }
    };
}

/// A visitor that reads any JSON value is its own seed.
macro_rules! seed {
    ($t:ty) => {
        impl<'de> DeserializeSeed<'de> for $t {
            type Value = <$t as Visitor<'de>>::Value;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
}

/// The top level: one object.
struct Top;

impl<'de> Visitor<'de> for Top {
    type Value = Peek;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the body to be a JSON object")
    }
    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Peek, M::Error> {
        const READ: [&str; 9] =
            ["model", "name", "source", "stream", "options", "messages", "prompt", "system", "truncate"];
        let mut peek = Peek::default();
        let mut seen = [false; READ.len()];
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let Some(i) = READ.iter().position(|k| *k == &*key) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(de::Error::custom(format!("the field \"{}\" is given twice", &*key)));
            }
            match i {
                0..=2 => peek.names[i] = map.next_value_seed(Name)?,
                3 => peek.stream = map.next_value_seed(Loose)?.0,
                4 => peek.num_ctx = map.next_value_seed(Options)?,
                5 => peek.chat_text = map.next_value_seed(Messages)?,
                8 => peek.truncate = map.next_value_seed(Loose)?.0,
                _ => peek.generate_text += map.next_value_seed(TextLen)?,
            }
        }
        Ok(peek)
    }
}

/// `model`, `name`, `source`.
struct Name;
seed!(Name);

impl<'de> Visitor<'de> for Name {
    type Value = Named;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a model name")
    }
    fn visit_str<E>(self, v: &str) -> Result<Named, E> {
        Ok(Named::Text(v.to_string()))
    }
    fn visit_unit<E>(self) -> Result<Named, E> {
        Ok(Named::Absent)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Named, E> {
        Ok(Named::Other("a boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Named, E> {
        Ok(Named::Other("a number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Named, E> {
        Ok(Named::Other("a number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Named, E> {
        Ok(Named::Other("a number"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Named, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Named::Other("an array"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Named, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Named::Other("an object"))
    }
}

/// `stream`: kept when a boolean.
struct Loose;
seed!(Loose);

/// What `Loose` kept.
struct Flag(Option<bool>);

impl<'de> Visitor<'de> for Loose {
    type Value = Flag;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a boolean")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Flag, E> {
        Ok(Flag(Some(v)))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Flag, E> {
        Ok(Flag(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Flag, E> {
        Ok(Flag(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Flag, E> {
        Ok(Flag(None))
    }
    fn visit_unit<E>(self) -> Result<Flag, E> {
        Ok(Flag(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Flag, E> {
        Ok(Flag(None))
    }
    containers!(Flag(None));
}

/// `options`: keeps `num_ctx` when it is a whole number.
struct Options;
seed!(Options);

impl<'de> Visitor<'de> for Options {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("options")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
        let mut num_ctx = None;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if &*key == "num_ctx" {
                num_ctx = map.next_value_seed(Whole)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(num_ctx)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<u64>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<u64>, E> {
        Ok(None)
    }
    scalars!(None);
}

/// A whole number, else `None`.
struct Whole;
seed!(Whole);

impl<'de> Visitor<'de> for Whole {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a whole number")
    }
    fn visit_u64<E>(self, v: u64) -> Result<Option<u64>, E> {
        Ok(Some(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Option<u64>, E> {
        Ok(u64::try_from(v).ok())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<u64>, E> {
        Ok(None)
    }
    containers!(None);
}

/// `messages`: the text bytes of every message's `content`.
struct Messages;
seed!(Messages);

impl<'de> Visitor<'de> for Messages {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut sum = 0usize;
        while let Some(n) = seq.next_element_seed(Field { name: "content", value: Content })? {
            sum = sum.saturating_add(n);
        }
        Ok(sum)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(0)
    }
    fn visit_str<E>(self, _: &str) -> Result<usize, E> {
        Ok(0)
    }
    scalars!(0);
}

/// A message's `content`: a string, or parts whose `text` strings count.
#[derive(Clone, Copy)]
struct Content;
seed!(Content);

impl<'de> Visitor<'de> for Content {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("message content")
    }
    fn visit_str<E>(self, v: &str) -> Result<usize, E> {
        Ok(v.len())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut sum = 0usize;
        while let Some(n) = seq.next_element_seed(Field { name: "text", value: TextLen })? {
            sum = sum.saturating_add(n);
        }
        Ok(sum)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(0)
    }
    scalars!(0);
}

/// A string's UTF-8 length; 0 for anything else (skipped).
#[derive(Clone, Copy)]
struct TextLen;
seed!(TextLen);

impl<'de> Visitor<'de> for TextLen {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("text")
    }
    fn visit_str<E>(self, v: &str) -> Result<usize, E> {
        Ok(v.len())
    }
    containers!(0);
    scalars!(0);
}

/// An object's field `name`, read by `value` (the last one wins); 0 when the object has none
/// or the value is not an object.
struct Field<V> {
    name: &'static str,
    value: V,
}

impl<'de, V: DeserializeSeed<'de, Value = usize> + Copy> DeserializeSeed<'de> for Field<V> {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, V: DeserializeSeed<'de, Value = usize> + Copy> Visitor<'de> for Field<V> {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an object with \"{}\"", self.name)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let mut n = 0;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if &*key == self.name {
                n = map.next_value_seed(self.value)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(n)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(0)
    }
    fn visit_str<E>(self, _: &str) -> Result<usize, E> {
        Ok(0)
    }
    scalars!(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `depth` as a byte-at-a-time walk: what the `memchr2` crossing must agree with.
    fn depth_by_bytes(body: &[u8]) -> usize {
        let (mut depth, mut deepest, mut in_str, mut escaped) = (0usize, 0usize, false, false);
        for &b in body {
            if in_str {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        deepest
    }

    proptest::proptest! {
        /// Brackets, quotes and backslashes in any order (escaped quotes, a backslash last,
        /// unclosed strings): the string crossing counts what the byte walk counts.
        #[test]
        fn depth_crosses_strings_as_a_byte_walk_does(
            body in proptest::collection::vec(
                proptest::sample::select(vec![b'[', b']', b'{', b'}', b'"', b'\\', b'a', b':']),
                0..64,
            )
        ) {
            proptest::prop_assert_eq!(depth(&body), depth_by_bytes(&body));
        }
    }

    #[test]
    fn a_key_spelled_with_escapes_is_the_same_key() {
        let p = Peek::read(br#"{"mo\u0064el":"m","options":{"num_\u0063tx":8}}"#).expect("valid");
        assert_eq!((p.names[0].clone(), p.num_ctx), (Named::Text("m".into()), Some(8)));
        let twice = Peek::read(br#"{"model":"a","mo\u0064el":"b"}"#).expect_err("given twice");
        assert!(twice.contains("the field \"model\" is given twice"), "{twice}");
    }

    #[test]
    fn reads_what_routing_needs_and_nothing_else() {
        let body = br#"{"model":"m","stream":false,"options":{"num_ctx":8192,"x":[1]},"pad":[1,2,{"a":[]}],
            "messages":[{"role":"user","content":"abcd"},{"content":[{"type":"text","text":"ef"},{"image":1}]},7]}"#;
        let p = Peek::read(body).expect("valid");
        assert_eq!(p.names[0], Named::Text("m".into()));
        assert_eq!((p.stream, p.num_ctx, p.chat_text, p.generate_text), (Some(false), Some(8192), 6, 0));
        let p = Peek::read(br#"{"name":5,"prompt":"abc","system":"de","stream":"yes"}"#).expect("valid");
        assert_eq!((p.names[1].clone(), p.stream, p.generate_text), (Named::Other("a number"), None, 5));
    }

    #[test]
    fn refuses_what_a_tree_parse_refused_and_duplicates() {
        assert!(Peek::read(b"[1,2]").is_err(), "not an object");
        assert!(Peek::read(b"{\"model\":\"m\"} x").is_err(), "trailing bytes");
        assert!(Peek::read(b"{\"model\":\"m\",\"x\":\"\xff\"}").is_err(), "invalid UTF-8 in a skipped field");
        let deep = format!("{{\"model\":\"m\",\"x\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert!(Peek::read(deep.as_bytes()).is_err(), "too deep, even where skipped");
        assert!(Peek::read(b"{\"model\":\"a\",\"model\":\"b\"}").is_err(), "a field given twice");
        let quoted = b"{\"model\":\"m\",\"x\":\"[[[[\\\"[[\"}";
        assert!(Peek::read(quoted).is_ok(), "brackets inside strings do not count as nesting");
    }
}
