//! Context-length guard: say when a prompt will not fit the context it runs with, and refuse
//! it only where Ollama itself would (`"truncate": false`). By default Ollama truncates: a long
//! chat loses its oldest messages, a long prompt its beginning, and the answer still comes; so
//! such a request passes, with `X-Corral-Context-Warning` saying it will be cut.
//!
//! The context a request runs with is `options.num_ctx` when the request sets it, else the
//! largest `context_length` a node serving the model reports in `/api/ps`, else
//! `proxy.default_num_ctx` (Ollama's default, 4096).
//!
//! The prompt's size is estimated as (UTF-8 bytes of all message and prompt text) / 4, rounded
//! up. That is a lower bound for real tokenizers: English runs about 4 bytes per token, and
//! Chinese about 3 bytes per character with at least one token per one or two characters. So
//! the guard errs towards letting a prompt through: it refuses only prompts that surely do not
//! fit, and warns (`X-Corral-Context-Warning`) above 85%.

use super::peek::Peek;
use crate::config::Config;
use crate::error::BrokerError;
use crate::state::Shared;

/// Share of the context above which a request passes with a warning header.
const WARN_SHARE: f64 = 0.85;

/// Estimated prompt tokens of a request body, or `None` for endpoints without a prompt.
pub fn estimate_tokens(path: &str, body: &Peek) -> Option<u64> {
    let bytes = match path {
        "/api/chat" | "/v1/chat/completions" => body.chat_text,
        "/api/generate" | "/v1/completions" => body.generate_text,
        _ => return None,
    };
    Some(bytes.div_ceil(4) as u64)
}

/// `Ok(Some(warning))` for a prompt above 85% of its context (or over it, to be truncated by the
/// node); `Err` when it cannot fit and the request asked not to be truncated.
pub(super) fn check(
    shared: &Shared,
    config: &Config,
    path: &str,
    model: &str,
    v: &Peek,
) -> Result<Option<String>, BrokerError> {
    let Some(estimated) = estimate_tokens(path, v) else { return Ok(None) };
    let requested = v.num_ctx.filter(|n| *n > 0);
    let key = crate::config::model_key(model);
    let learned = shared.registry.all().iter().filter_map(|n| n.context_length_key(&key)).max();
    let limit = requested.or(learned).unwrap_or(config.proxy.default_num_ctx);
    if estimated > limit {
        if v.truncate == Some(false) {
            return Err(BrokerError::ContextTooLong { estimated, limit });
        }
        return Ok(Some(format!(
            "prompt is about {estimated} of {limit} context tokens; the node will truncate it (send \"truncate\": false to be refused instead)"
        )));
    }
    if estimated as f64 > limit as f64 * WARN_SHARE {
        return Ok(Some(format!("prompt is about {estimated} of {limit} context tokens")));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn estimate_tokens(path: &str, body: &serde_json::Value) -> Option<u64> {
        super::estimate_tokens(path, &Peek::read(body.to_string().as_bytes()).expect("valid JSON"))
    }

    #[test]
    fn estimate_is_a_lower_bound_by_bytes() {
        let body = json!({"messages": [{"role": "system", "content": "abcd"}, {"role": "user", "content": "abcde"}]});
        assert_eq!(estimate_tokens("/api/chat", &body), Some(3));
        let zh = json!({"prompt": "你好世界"});
        assert_eq!(
            estimate_tokens("/api/generate", &zh),
            Some(3),
            "12 bytes of Chinese count as 3 tokens, fewer than real"
        );
        assert_eq!(estimate_tokens("/api/embed", &json!({"input": "x"})), None);
        let parts = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}]});
        assert_eq!(estimate_tokens("/v1/chat/completions", &parts), Some(2));
    }
}
