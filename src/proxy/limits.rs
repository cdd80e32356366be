//! Per-category request limits: caps and defaults for how long an answer may be
//! (`num_predict`, OpenAI's `max_tokens`), how large a context (`num_ctx`), how long a node keeps
//! the model loaded (`keep_alive`), and a `temperature` range, applied by the broker before a
//! request leaves (`[categories.limits]`, `config::RequestLimits`).
//!
//! A value over a cap is lowered to it (`over_limit = "clamp"`, the default: the response says
//! `X-Corral-Clamped: num_predict=512`) or refused (`over_limit = "refuse"`: 400 `over_limit`,
//! nothing sent). "No limit" values count as over a cap: `num_predict` -1 or -2, a negative
//! (forever) `keep_alive`. A field the request leaves out gets the category's default, if any.
//! Values that are not numbers are left for the node to judge.
//!
//! Where the fields are: Ollama's `/api/chat` and `/api/generate` take `options.num_predict`,
//! `options.num_ctx`, `options.temperature` and a top-level `keep_alive` (seconds or a Go
//! duration like "5m"); `/v1/chat/completions` and `/v1/completions` take top-level
//! `max_tokens` / `max_completion_tokens` and `temperature` (no context or keep-alive there),
//! `/v1/responses` `max_output_tokens`, and Anthropic's `/v1/messages` `max_tokens`.
//! The body is parsed and written once, only in a category that sets a limit and only when
//! something changes; otherwise the client's bytes go as they came.

use axum::body::Bytes;
use serde_json::{Map, Value};

use crate::config::{OverLimit, RequestLimits};
use crate::error::BrokerError;

/// A body the limits changed, and what was clamped ("num_predict=512").
#[derive(Debug)]
pub struct Applied {
    pub body: Bytes,
    pub clamped: Vec<String>,
}

/// Apply `limits` of `category` to a request for `path`; `None` when the body is unchanged.
pub fn apply(limits: &RequestLimits, category: &str, path: &str, body: &[u8]) -> Result<Option<Applied>, BrokerError> {
    // The names of the answer-length field, per API: Ollama's (in `options`), Chat
    // Completions' two, the Responses API's, Anthropic Messages'.
    let lengths: &[&str] = match path {
        "/api/chat" | "/api/generate" => &[],
        "/v1/chat/completions" | "/v1/completions" => &["max_tokens", "max_completion_tokens"],
        "/v1/responses" => &["max_output_tokens"],
        "/v1/messages" => &["max_tokens"],
        _ => return Ok(None),
    };
    let native = lengths.is_empty();
    if !limits.is_active() {
        return Ok(None);
    }
    let mut v: Value = serde_json::from_slice(body).map_err(|e| BrokerError::MalformedJson(e.to_string()))?;
    let Some(top) = v.as_object_mut() else { return Ok(None) };
    let mut edit = Edit { limits, category, clamped: Vec::new(), changed: false };
    if native {
        edit.native(top)?;
    } else {
        edit.top_level(top, lengths)?;
    }
    if !edit.changed {
        return Ok(None);
    }
    let body = serde_json::to_vec(&v).map_err(|e| BrokerError::MalformedJson(e.to_string()))?;
    Ok(Some(Applied { body: Bytes::from(body), clamped: edit.clamped }))
}

struct Edit<'a> {
    limits: &'a RequestLimits,
    category: &'a str,
    clamped: Vec<String>,
    changed: bool,
}

impl Edit<'_> {
    fn native(&mut self, top: &mut Map<String, Value>) -> Result<(), BrokerError> {
        let l = self.limits;
        let wants_options = l.default_predict > 0 || l.default_num_ctx > 0;
        if wants_options && !top.contains_key("options") {
            top.insert("options".into(), Value::Object(Map::new()));
        }
        if let Some(options) = top.get_mut("options").and_then(Value::as_object_mut) {
            self.count(options, "num_predict", "num_predict", l.max_predict, l.default_predict)?;
            self.count(options, "num_ctx", "num_ctx", l.max_num_ctx, l.default_num_ctx)?;
            self.temperature(options)?;
        }
        self.keep_alive(top)
    }

    /// The `/v1` dialects: the length fields `lengths` (the first one takes the default when
    /// none is named) and `temperature`, at the top level.
    fn top_level(&mut self, top: &mut Map<String, Value>, lengths: &[&str]) -> Result<(), BrokerError> {
        let l = self.limits;
        let named = lengths.iter().any(|k| top.get(*k).is_some_and(|v| !v.is_null()));
        for (i, &key) in lengths.iter().enumerate() {
            let default = if named || i > 0 { 0 } else { l.default_predict };
            self.count(top, key, key, l.max_predict, default)?;
        }
        self.temperature(top)
    }

    fn over(&mut self, field: &str, asked: String, limit: String) -> Result<(), BrokerError> {
        if self.limits.over_limit == OverLimit::Refuse {
            return Err(BrokerError::OverLimit {
                category: self.category.to_string(),
                field: field.to_string(),
                asked,
                limit,
            });
        }
        self.clamped.push(format!("{field}={limit}"));
        self.changed = true;
        Ok(())
    }

    /// A token count: capped at `max` (negatives mean "no limit": over any cap), `default`
    /// when absent.
    fn count(
        &mut self,
        m: &mut Map<String, Value>,
        key: &str,
        field: &str,
        max: u64,
        default: u64,
    ) -> Result<(), BrokerError> {
        match m.get(key) {
            None | Some(Value::Null) if default > 0 => {
                m.insert(key.into(), Value::from(default));
                self.changed = true;
            }
            Some(Value::Number(n)) if max > 0 => {
                let over = n
                    .as_u64()
                    .map_or(n.as_i64().is_some_and(|i| i < 0) || n.as_f64().is_some_and(|f| f > max as f64), |u| {
                        u > max
                    });
                if over {
                    self.over(field, n.to_string(), max.to_string())?;
                    m.insert(key.into(), Value::from(max));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn temperature(&mut self, m: &mut Map<String, Value>) -> Result<(), BrokerError> {
        let (lo, hi) = (self.limits.temperature_min, self.limits.temperature_max);
        let Some(t) = m.get("temperature").and_then(Value::as_f64) else { return Ok(()) };
        let bound = match (lo, hi) {
            (Some(lo), _) if t < lo => lo,
            (_, Some(hi)) if t > hi => hi,
            _ => return Ok(()),
        };
        self.over("temperature", t.to_string(), bound.to_string())?;
        m.insert("temperature".into(), Value::from(bound));
        Ok(())
    }

    fn keep_alive(&mut self, top: &mut Map<String, Value>) -> Result<(), BrokerError> {
        let (max, default) = (self.limits.max_keep_alive_s, self.limits.default_keep_alive_s);
        let asked = match top.get("keep_alive") {
            None | Some(Value::Null) => {
                if let Some(d) = default {
                    top.insert("keep_alive".into(), Value::from(d));
                    self.changed = true;
                }
                return Ok(());
            }
            Some(v) => v.clone(),
        };
        let Some(seconds) = keep_alive_seconds(&asked) else { return Ok(()) };
        if max > 0 && (seconds < 0.0 || seconds > max as f64) {
            let shown = asked.as_str().map_or_else(|| asked.to_string(), str::to_string);
            self.over("keep_alive", shown, max.to_string())?;
            top.insert("keep_alive".into(), Value::from(max));
        }
        Ok(())
    }
}

/// Seconds of a `keep_alive` as Ollama reads it: a number of seconds, or a string that is a
/// number of seconds or a Go duration ("5m", "1h30m", "-1m"); negative means forever.
pub fn keep_alive_seconds(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok().or_else(|| go_duration(s.trim())),
        _ => None,
    }
}

/// Go's `time.ParseDuration`, in seconds: an optional sign, then number-unit pairs.
fn go_duration(s: &str) -> Option<f64> {
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    Some(sign * total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits(f: impl FnOnce(&mut RequestLimits)) -> RequestLimits {
        let mut l = RequestLimits::default();
        f(&mut l);
        l
    }

    fn run(l: &RequestLimits, path: &str, body: Value) -> Result<Option<(Value, Vec<String>)>, BrokerError> {
        let out = apply(l, "c", path, body.to_string().as_bytes())?;
        Ok(out.map(|a| (serde_json::from_slice(&a.body).expect("json"), a.clamped)))
    }

    #[test]
    fn go_durations_read_as_ollama_reads_them() {
        assert_eq!(keep_alive_seconds(&json!("5m")), Some(300.0));
        assert_eq!(keep_alive_seconds(&json!("1h30m")), Some(5400.0));
        assert_eq!(keep_alive_seconds(&json!("-1")), Some(-1.0));
        assert_eq!(keep_alive_seconds(&json!("-1m")), Some(-60.0));
        assert_eq!(keep_alive_seconds(&json!(30)), Some(30.0));
        assert_eq!(keep_alive_seconds(&json!("soon")), None);
    }

    #[test]
    fn no_limit_leaves_the_body_alone() {
        let body = json!({"model": "m", "options": {"num_predict": -1}});
        assert!(run(&RequestLimits::default(), "/api/chat", body.clone()).expect("ok").is_none());
        let l = limits(|l| l.max_predict = 10);
        assert!(run(&l, "/api/embed", body).expect("ok").is_none(), "embeddings generate no tokens");
        assert!(run(&l, "/api/chat", json!({"model": "m"})).expect("ok").is_none(), "nothing asked, no default");
    }

    #[test]
    fn caps_clamp_and_defaults_fill_in() {
        let l = limits(|l| {
            l.max_predict = 512;
            l.default_num_ctx = 4096;
            l.max_keep_alive_s = 600;
            l.temperature_max = Some(1.0);
        });
        let body = json!({"model": "m", "options": {"num_predict": -1, "temperature": 1.7}, "keep_alive": "-1"});
        let (v, clamped) = run(&l, "/api/generate", body).expect("ok").expect("changed");
        assert_eq!(v["options"]["num_predict"], 512, "-1 (no limit) is over any cap");
        assert_eq!(v["options"]["num_ctx"], 4096);
        assert_eq!(v["options"]["temperature"], 1.0);
        assert_eq!(v["keep_alive"], 600);
        assert_eq!(clamped, ["num_predict=512", "temperature=1", "keep_alive=600"]);
        let (v, clamped) =
            run(&l, "/v1/chat/completions", json!({"model": "m", "max_tokens": 4000})).expect("ok").expect("changed");
        assert_eq!(v["max_tokens"], 512);
        assert_eq!(clamped, ["max_tokens=512"]);
        assert!(run(&l, "/api/chat", json!({"model": "m", "options": {"num_predict": 100, "num_ctx": 2048}}))
            .expect("ok")
            .is_none());
    }

    #[test]
    fn the_responses_and_messages_apis_are_capped_by_their_own_field_names() {
        let l = limits(|l| {
            l.max_predict = 256;
            l.default_predict = 64;
            l.temperature_max = Some(0.5);
        });
        let (v, clamped) = run(&l, "/v1/responses", json!({"model": "m", "input": "hi", "max_output_tokens": 9000}))
            .expect("ok")
            .expect("changed");
        assert_eq!((v["max_output_tokens"].clone(), clamped), (json!(256), vec!["max_output_tokens=256".to_string()]));
        let (v, _) = run(&l, "/v1/responses", json!({"model": "m", "input": "hi"})).expect("ok").expect("default");
        assert_eq!(v["max_output_tokens"], 64, "the default under the Responses API's name");
        assert!(v.get("max_tokens").is_none(), "no field of another API added");
        let body = json!({"model": "m", "max_tokens": 4096, "temperature": 0.9, "messages": [{"role": "user", "content": "hi"}]});
        let (v, clamped) = run(&l, "/v1/messages", body).expect("ok").expect("changed");
        assert_eq!((v["max_tokens"].clone(), v["temperature"].clone()), (json!(256), json!(0.5)));
        assert_eq!(clamped, ["max_tokens=256", "temperature=0.5"]);
    }

    #[test]
    fn refuse_says_what_was_over() {
        let l = limits(|l| {
            l.max_num_ctx = 8192;
            l.over_limit = OverLimit::Refuse;
        });
        let e = run(&l, "/api/chat", json!({"model": "m", "options": {"num_ctx": 32768}})).expect_err("over");
        assert_eq!(e.code(), "over_limit");
        assert!(e.to_string().contains("num_ctx") && e.to_string().contains("8192"), "{e}");
    }
}
