//! Ollama's load and unload requests (ollama/ollama `server/routes.go`, GenerateHandler and
//! ChatHandler): a `/api/generate` with no prompt (or a `/api/chat` with no messages) only
//! loads the model and answers at once with `done_reason: "load"`; with `keep_alive: 0` it
//! unloads the model (`ollama stop`) and answers `done_reason: "unload"`. Neither generates a
//! token, so neither may become a generation on an OpenAI-compatible server or a cloud call.

use serde_json::{json, Value};

/// What a request without a prompt asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Load,
    Unload,
}

/// Bodies larger than this carry a prompt (or images): never a bare load or unload.
const MAX_LIFECYCLE_BODY: usize = 16 * 1024;

impl Lifecycle {
    /// The lifecycle request `body` is on `path`, if it is one.
    pub fn of(path: &str, body: &[u8]) -> Option<Self> {
        if body.len() > MAX_LIFECYCLE_BODY || !matches!(path, "/api/generate" | "/api/chat") {
            return None;
        }
        let v: Value = serde_json::from_slice(body).ok()?;
        let empty = |key: &str| match v.get(key) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            Some(_) => false,
        };
        let bare = match path {
            "/api/generate" => empty("prompt") && empty("images") && empty("suffix"),
            _ => empty("messages"),
        };
        if !bare {
            return None;
        }
        Some(if keeps_nothing(v.get("keep_alive")) { Self::Unload } else { Self::Load })
    }

    /// Ollama's own answer: one JSON document, `done: true`, with the reason.
    pub fn answer(self, path: &str, model: &str) -> Value {
        let reason = match self {
            Self::Load => "load",
            Self::Unload => "unload",
        };
        let created_at =
            time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
        match path {
            "/api/chat" => json!({
                "model": model, "created_at": created_at,
                "message": { "role": "assistant", "content": "" },
                "done_reason": reason, "done": true,
            }),
            _ => {
                json!({ "model": model, "created_at": created_at, "response": "", "done": true, "done_reason": reason })
            }
        }
    }
}

/// `keep_alive` of zero: `0`, `"0"`, `"0s"`, `"0m"` (Ollama parses durations and bare seconds).
fn keeps_nothing(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => {
            let digits = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
            !digits.is_empty() && digits.parse::<f64>().ok() == Some(0.0)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_requests_load_and_keep_alive_zero_unloads() {
        assert_eq!(Lifecycle::of("/api/generate", br#"{"model":"m"}"#), Some(Lifecycle::Load));
        assert_eq!(Lifecycle::of("/api/chat", br#"{"model":"m","messages":[]}"#), Some(Lifecycle::Load));
        for unload in [
            r#"{"model":"m","keep_alive":0}"#,
            r#"{"model":"m","keep_alive":"0s"}"#,
            r#"{"model":"m","prompt":"","keep_alive":"0"}"#,
        ] {
            assert_eq!(Lifecycle::of("/api/generate", unload.as_bytes()), Some(Lifecycle::Unload), "{unload}");
        }
        assert_eq!(Lifecycle::of("/api/generate", br#"{"model":"m","prompt":"hi"}"#), None, "a prompt is a generation");
        assert_eq!(Lifecycle::of("/api/chat", br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#), None);
        assert_eq!(Lifecycle::of("/api/embed", br#"{"model":"m"}"#), None);
        assert_eq!(Lifecycle::of("/api/generate", br#"{"model":"m","keep_alive":"5m"}"#), Some(Lifecycle::Load));
    }

    #[test]
    fn the_answers_are_ollamas() {
        let a = Lifecycle::Unload.answer("/api/generate", "m");
        assert_eq!(
            (a["done"].clone(), a["done_reason"].clone(), a["response"].clone()),
            (json!(true), json!("unload"), json!(""))
        );
        let c = Lifecycle::Load.answer("/api/chat", "m");
        assert_eq!((c["message"]["role"].clone(), c["done_reason"].clone()), (json!("assistant"), json!("load")));
    }
}
