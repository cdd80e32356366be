//! Continuing a broken stream on another node (category `continue_on_cut`).
//!
//! When an `/api/chat` stream breaks or stalls after it started, the client already holds part
//! of the answer and no retry is possible. With `continue_on_cut`, Corral asks another node to
//! go on from there instead: the same request with what the client received as a trailing
//! assistant message (Ollama continues a trailing assistant message; OpenAI-compatible servers
//! that accept an assistant prefill do too), streamed to the client as the rest of one answer
//! whose `done: true` line counts both parts. While it may be needed, only whole lines leave
//! (a line cut in half is never shown), and their text is noted. An answer that streamed tool
//! calls or thinking is not continued: a prefill carries only text. When the next node refuses
//! or none is left, the stream ends with the error line as without this option.

use axum::body::Bytes;
use futures_util::future::BoxFuture;

use crate::node::InFlight;
use crate::upstream::assemble::Line;
use crate::upstream::Answer;

/// Asks another node to continue, given the text the client has: its answer up to the first
/// chunk and its slot, or why not.
pub(crate) type Continue = Box<dyn FnOnce(String) -> BoxFuture<'static, Result<(Answer, InFlight), String>> + Send>;

/// The state of an answer that may be continued.
pub(crate) struct Resume {
    next: Option<Continue>,
    /// The answer's text the client has.
    said: String,
    /// Tokens (content chunks) the first part produced, added to the continuation's count.
    tokens: i64,
    /// A line whose end has not come yet: held back from the client.
    partial: Vec<u8>,
    /// False once tool calls or thinking were streamed: a prefill cannot carry them.
    usable: bool,
    /// The node continuing the answer, once one is.
    pub continued_by: Option<String>,
}

impl Resume {
    pub fn new(next: Continue) -> Self {
        Self { next: Some(next), said: String::new(), tokens: 0, partial: Vec::new(), usable: true, continued_by: None }
    }

    /// Whether a continuation may still be asked for.
    pub fn can_continue(&self) -> bool {
        self.next.is_some() && self.usable
    }

    /// The whole lines of `chunk` (with any held before it), to pass to the client now; the
    /// rest waits for its newline. First-part lines are noted; the continuation's last line
    /// gets the first part's tokens added to its `eval_count`.
    pub fn lines(&mut self, chunk: Bytes) -> Bytes {
        let Some(end) = chunk.iter().rposition(|&b| b == b'\n') else {
            self.partial.extend_from_slice(&chunk);
            return Bytes::new();
        };
        let mut whole = std::mem::take(&mut self.partial);
        whole.extend_from_slice(&chunk[..=end]);
        self.partial.extend_from_slice(&chunk[end + 1..]);
        let mut out = Vec::with_capacity(whole.len());
        for line in whole.split_inclusive(|&b| b == b'\n') {
            out.extend_from_slice(&self.line(line));
        }
        Bytes::from(out)
    }

    /// What is held back when the stream ends cleanly (a last line with no newline).
    pub fn rest(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.partial))
    }

    fn line(&mut self, line: &[u8]) -> Vec<u8> {
        let Ok(parsed) = serde_json::from_slice::<Line<'_>>(line) else { return line.to_vec() };
        if self.continued_by.is_some() {
            if parsed.done {
                let body = line.strip_suffix(b"\n").unwrap_or(line);
                if let Some(mut sum) = crate::upstream::assemble::add_to_field(body, "eval_count", self.tokens) {
                    sum.push(b'\n');
                    return sum;
                }
            }
            return line.to_vec();
        }
        if let Some(m) = parsed.message {
            if m.tool_calls.is_some() || m.thinking.as_deref().is_some_and(|t| !t.is_empty()) {
                self.usable = false;
            }
            if let Some(c) = m.content.filter(|c| !c.is_empty()) {
                self.said.push_str(&c);
                self.tokens += 1;
            }
        }
        line.to_vec()
    }

    /// Ask for the continuation (once); the half line held back is dropped, as the client
    /// never saw it.
    pub async fn ask(&mut self) -> Result<(Answer, InFlight), String> {
        let next = self.next.take().ok_or_else(|| "already continued once".to_string())?;
        self.partial.clear();
        let (answer, guard) = next(self.said.clone()).await?;
        self.continued_by = Some(guard.node().name().to_string());
        Ok((answer, guard))
    }
}

/// `body` (a chat request) with `said` as a trailing assistant message, asking for a stream.
pub(crate) fn prefilled(body: &[u8], said: &str) -> Option<Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if !said.is_empty() {
        v.get_mut("messages")?.as_array_mut()?.push(serde_json::json!({ "role": "assistant", "content": said }));
    }
    v["stream"] = serde_json::Value::Bool(true);
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resume() -> Resume {
        Resume::new(Box::new(|_| Box::pin(async { Err("unused".to_string()) })))
    }

    #[test]
    fn only_whole_lines_leave_and_their_text_is_noted() {
        let mut r = resume();
        let a = r.lines(Bytes::from_static(b"{\"message\":{\"content\":\"Hel\"},\"done\":false}\n{\"message\":{\"con"));
        assert_eq!(&a[..], b"{\"message\":{\"content\":\"Hel\"},\"done\":false}\n");
        assert!(r.lines(Bytes::from_static(b"tent\":\"lo\"}")).is_empty(), "half a line waits");
        let b = r.lines(Bytes::from_static(b",\"done\":false}\n"));
        assert_eq!(&b[..], b"{\"message\":{\"content\":\"lo\"},\"done\":false}\n");
        assert_eq!((r.said.as_str(), r.tokens), ("Hello", 2));
        assert!(r.can_continue());
    }

    #[test]
    fn the_continuations_last_line_counts_both_parts() {
        let mut r = resume();
        r.lines(Bytes::from_static(b"{\"message\":{\"content\":\"a\"},\"done\":false}\n"));
        r.continued_by = Some("n1".into());
        let end = r.lines(Bytes::from_static(b"{\"message\":{\"content\":\"\"},\"done\":true,\"eval_count\":4}\n"));
        assert_eq!(&end[..], b"{\"message\":{\"content\":\"\"},\"done\":true,\"eval_count\":5}\n");
    }

    #[test]
    fn tool_calls_or_thinking_make_an_answer_one_that_is_not_continued() {
        let mut r = resume();
        r.lines(Bytes::from_static(b"{\"message\":{\"content\":\"\",\"thinking\":\"hm\"},\"done\":false}\n"));
        assert!(!r.can_continue());
    }

    #[test]
    fn a_prefill_is_the_received_text_as_the_last_assistant_message() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let v: serde_json::Value = serde_json::from_slice(&prefilled(body, "Hello").expect("body")).expect("json");
        assert_eq!(v["messages"][1], serde_json::json!({"role": "assistant", "content": "Hello"}));
    }
}
