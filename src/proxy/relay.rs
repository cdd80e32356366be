//! The streaming relay: an upstream's answer passed to the client chunk by chunk as it
//! arrives (no buffering; frames that are already there leave as one write), and the one
//! verdict on the exchange when it ends.
//!
//! If the upstream breaks off or falls silent past the idle timeout, the stream ends with one
//! more line in the stream's own framing, `{"error": ..., "code": ...}`; never a fake
//! `done:true`. The exchange is judged once, when its stream ends or is dropped: that one
//! `Outcome` feeds the node's passive health and the request's record. The in-flight guard
//! lives here, so a node's slot is held until the client has the last byte or has gone away;
//! dropping the relay drops the upstream response, which closes the connection and makes
//! Ollama stop generating. With read-ahead (`readahead`), the relay runs in a task of its
//! own ahead of a slow client, so "the end" is the node's last line, not the client's read.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use http::{header, HeaderMap, StatusCode};
use tokio::time::Instant;

use super::readahead::Budget;
use super::resume::Resume;
use crate::node::InFlight;
use crate::outcome::Outcome;
use crate::telemetry::{status_for, Trace};
use crate::upstream::{Answer, BodyError, BodyStream};

/// Who produced an answer: a node (whose slot is held until the end, and which is judged by
/// how the answer ends) or a cloud provider.
pub(crate) enum Source {
    Node(InFlight),
    Provider(String),
}

/// The client's response for `answer`, relayed as it arrives; `trace` is finished when the
/// body ends.
pub(crate) fn respond(
    answer: Answer,
    source: Source,
    trace: Option<Trace>,
    request_id: &str,
    idle: Duration,
    resume: Option<Resume>,
    read_ahead: Option<Budget>,
) -> Response {
    let framing = Framing::of(&answer.headers);
    let whole = answer.whole;
    // Only a stream of lines can be continued, and only one that is still arriving.
    let resume = resume.filter(|_| framing == Framing::Ndjson && !whole);
    // Only streams are read ahead: a single document arrives whole, assembled or not.
    let read_ahead = read_ahead.filter(|_| framing != Framing::Opaque && !whole);
    let (handoff, record) = match read_ahead.is_some() && trace.is_some() {
        true => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        }
        false => (None, None),
    };
    let relay = Relay {
        resume,
        upstream: answer.body,
        first: answer.first,
        source: Some(source),
        trace,
        status: answer.status,
        idle,
        framing,
        ends_with_newline: true,
        done: false,
        request_id: request_id.to_string(),
        bytes: 0,
        tail: std::collections::VecDeque::with_capacity(TAIL_CHUNKS),
        silence: Box::pin(tokio::time::sleep(idle)),
        stashed: None,
        began: Instant::now(),
        handoff,
    };
    let body = match (whole, read_ahead, record) {
        (true, ..) => Body::new(Document::new(relay)),
        (false, read_ahead, record) => streamed(relay, read_ahead, record),
    };
    let mut response = Response::new(body);
    *response.status_mut() = answer.status;
    *response.headers_mut() = answer.headers;
    response
}

/// The body of an answer still arriving: relayed chunk by chunk, read ahead of a slow client
/// when there is a budget for it.
fn streamed(relay: Relay, read_ahead: Option<Budget>, record: Option<tokio::sync::oneshot::Receiver<Trace>>) -> Body {
    let stream = futures_util::stream::unfold(relay, Relay::next);
    match (read_ahead, record) {
        (Some(budget), Some(record)) => super::readahead::body(stream, budget, record),
        (Some(budget), None) => super::readahead::body(stream, budget, tokio::sync::oneshot::channel().1),
        _ => Body::from_stream(stream),
    }
}

/// The body of an answer the broker holds whole (assembled from a node's stream, read whole,
/// or made by the broker): one frame of known length, so it goes out with `Content-Length` as
/// Ollama sends it. Relayed as a stream it went out chunked, through an unfold, a stream body
/// and its boxes (issue 16).
///
/// The exchange is judged once the frame is handed over, but not before the server has
/// written it: the server drops the body as it takes the last frame and writes after, so the
/// verdict (the speed model, the record, the log line) is made in a task of its own that runs
/// once the connection's task yields, not ahead of the client's bytes. Dropped before it is
/// polled, the relay inside judges the exchange as the client's leaving. Its frame taken
/// (`first` empty) is what "handed over" means.
struct Document {
    /// Always there until the document is dropped.
    relay: Option<Relay>,
}

impl Document {
    fn new(mut relay: Relay) -> Self {
        relay.first = Some(relay.first.take().unwrap_or_default());
        Self { relay: Some(relay) }
    }
}

impl http_body::Body for Document {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let Some(relay) = self.get_mut().relay.as_mut() else { return std::task::Poll::Ready(None) };
        let Some(data) = relay.first.take() else { return std::task::Poll::Ready(None) };
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(relay.pass(data)))))
    }

    fn is_end_stream(&self) -> bool {
        self.relay.as_ref().is_none_or(|r| r.first.is_none())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let len = self.relay.as_ref().and_then(|r| r.first.as_ref()).map_or(0, |d| d.len() as u64);
        http_body::SizeHint::with_exact(len)
    }
}

impl Drop for Document {
    fn drop(&mut self) {
        let Some(relay) = self.relay.take().filter(|r| r.first.is_none()) else { return };
        let handed = Handed(relay);
        match tokio::runtime::Handle::try_current() {
            // A runtime shutting down drops the task unrun: `Handed` judges it all the same.
            Ok(runtime) => drop(runtime.spawn(async move { drop(handed) })),
            Err(_) => drop(handed),
        }
    }
}

/// A relay whose whole answer the server has taken: a success, judged when this is dropped,
/// in the task made for it or wherever that task is let go.
struct Handed(Relay);

impl Drop for Handed {
    fn drop(&mut self) {
        self.0.finish(Outcome::Success, "");
    }
}

/// How the answer is framed, which decides how a mid-stream failure is told to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Ollama's streams: one JSON object per line.
    Ndjson,
    /// `/v1` streams: `data: {...}` events.
    Sse,
    /// A single document: a break cannot be marked inside it, so the connection is aborted.
    Opaque,
}

impl Framing {
    fn of(headers: &HeaderMap) -> Self {
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if ct.starts_with("application/x-ndjson") {
            Self::Ndjson
        } else if ct.starts_with("text/event-stream") {
            Self::Sse
        } else {
            Self::Opaque
        }
    }
}

/// Largest write made by joining frames that are already there.
const COALESCE_MAX: usize = 64 * 1024;

/// Chunks kept for reading token counts at the end: Ollama's final line, or OpenAI's usage
/// event followed by `[DONE]`.
const TAIL_CHUNKS: usize = 4;

/// Relays an answer's body and judges the exchange when it ends.
struct Relay {
    upstream: BodyStream,
    first: Option<Bytes>,
    source: Option<Source>,
    trace: Option<Trace>,
    status: StatusCode,
    /// The last chunks relayed (shared, not copied), where the token counts are.
    tail: std::collections::VecDeque<Bytes>,
    /// One timer for the idle timeout, re-armed per chunk rather than allocated per chunk.
    silence: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// The end of the body, or an error, met while coalescing; handled on the next call.
    stashed: Option<Option<Result<Bytes, BodyError>>>,
    idle: Duration,
    framing: Framing,
    ends_with_newline: bool,
    done: bool,
    request_id: String,
    bytes: usize,
    /// Set for an answer that another node may continue if it breaks (`continue_on_cut`).
    resume: Option<Resume>,
    /// When the first byte was here: the decode time of a node that reports no durations.
    began: Instant,
    /// With read-ahead, the judged trace goes here when the node is done; the client side
    /// makes the record once it has the last byte.
    handoff: Option<tokio::sync::oneshot::Sender<Trace>>,
}

impl Relay {
    async fn next(mut self) -> Option<(Result<Bytes, std::io::Error>, Relay)> {
        loop {
            if self.done {
                return None;
            }
            if let Some(first) = self.first.take() {
                let chunk = self.coalesce(first);
                match self.pass(chunk) {
                    c if c.is_empty() => continue,
                    c => return Some((Ok(c), self)),
                }
            }
            let next = match self.stashed.take() {
                Some(item) => Ok(item),
                None => {
                    let deadline = Instant::now() + self.idle;
                    self.silence.as_mut().reset(deadline);
                    tokio::select! {
                        biased;
                        item = self.upstream.next() => Ok(item),
                        _ = self.silence.as_mut() => Err(()),
                    }
                }
            };
            let (outcome, why, code) = match next {
                Ok(Some(Ok(chunk))) => {
                    let chunk = self.coalesce(chunk);
                    match self.pass(chunk) {
                        c if c.is_empty() => continue,
                        c => return Some((Ok(c), self)),
                    }
                }
                Ok(None) => {
                    // A last line with no newline, held back while a continuation was possible.
                    let rest = self.resume.as_mut().map(Resume::rest).filter(|r| !r.is_empty());
                    if let Some(rest) = rest {
                        self.stashed = Some(None);
                        return Some((Ok(rest), self));
                    }
                    self.finish(Outcome::Success, "");
                    return None;
                }
                Ok(Some(Err(e))) => {
                    (Outcome::StreamCut, format!("the answer stopped mid-stream ({e})"), "stream_interrupted")
                }
                Err(_) => (
                    Outcome::TimedOut,
                    format!("node sent nothing for {} ms mid-stream", self.idle.as_millis()),
                    "stream_idle_timeout",
                ),
            };
            match self.resume.as_ref().is_some_and(Resume::can_continue) {
                true => match self.continue_elsewhere(outcome, &why).await {
                    Ok(()) => continue,
                    Err(refused) => return self.fail(outcome, format!("{why}; {refused}"), code),
                },
                false => return self.fail(outcome, why, code),
            }
        }
    }

    /// The answer broke with `outcome`: judge the node that broke it, and carry on with another
    /// node's continuation, or say why there is none.
    async fn continue_elsewhere(&mut self, outcome: Outcome, why: &str) -> Result<(), String> {
        let Some(resume) = self.resume.as_mut() else { return Err("no continuation".into()) };
        // The node that broke is judged now; its slot is held until the answer has moved on.
        let broke = match self.source.as_mut() {
            Some(Source::Node(g)) => {
                g.judge(outcome);
                g.node().name().to_string()
            }
            Some(Source::Provider(p)) => p.clone(),
            None => String::new(),
        };
        let (answer, guard) = resume.ask().await.map_err(|e| format!("no other node continued it ({e})"))?;
        let by = guard.node().name().to_string();
        tracing::warn!(request_id = %self.request_id, broke = %broke, continued_by = %by, why, "answer continued on another node");
        if let Some(t) = self.trace.as_mut() {
            t.row.continued_by = Some(by);
        }
        self.source = Some(Source::Node(guard));
        self.upstream = answer.body;
        self.first = answer.first;
        self.stashed = None;
        Ok(())
    }

    /// Join `chunk` with whatever the node has already sent after it (never waiting), so a
    /// burst of small frames leaves as one write instead of one syscall each. An end or error
    /// met on the way is kept for the next call.
    fn coalesce(&mut self, chunk: Bytes) -> Bytes {
        use futures_util::FutureExt;
        let mut joined: Option<bytes::BytesMut> = None;
        loop {
            let len = joined.as_ref().map_or(chunk.len(), |j| j.len());
            if len >= COALESCE_MAX {
                break;
            }
            match self.upstream.next().now_or_never() {
                Some(Some(Ok(more))) => {
                    joined.get_or_insert_with(|| bytes::BytesMut::from(&chunk[..])).extend_from_slice(&more)
                }
                Some(other) => {
                    self.stashed = Some(other);
                    break;
                }
                None => break,
            }
        }
        joined.map_or(chunk, bytes::BytesMut::freeze)
    }

    fn pass(&mut self, chunk: Bytes) -> Bytes {
        let chunk = match self.resume.as_mut() {
            Some(r) => r.lines(chunk),
            None => chunk,
        };
        if let Some(&last) = chunk.last() {
            self.ends_with_newline = last == b'\n';
        }
        self.bytes += chunk.len();
        if self.tail.len() == TAIL_CHUNKS {
            self.tail.pop_front();
        }
        self.tail.push_back(chunk.clone());
        chunk
    }

    /// The last few KiB relayed, for the token counts in the final chunk or usage event.
    fn tail_bytes(&self) -> Vec<u8> {
        const KEPT: usize = 16 * 1024;
        let mut skip = self.tail.iter().map(Bytes::len).sum::<usize>().saturating_sub(KEPT);
        let mut joined = Vec::with_capacity(KEPT.min(self.bytes));
        for chunk in &self.tail {
            let from = skip.min(chunk.len());
            skip -= from;
            joined.extend_from_slice(&chunk[from..]);
        }
        joined
    }

    /// Feed the node's speed model from the final chunk's timing fields (Ollama's), or from
    /// the usage counts and the wall time since the first byte (an OpenAI-kind node).
    fn teach_speed(&self, guard: &InFlight, mut timing: crate::speed::Timing) {
        // An answer assembled whole arrives at once: its wall time says nothing. A streamed one
        // was seen arriving, which a node's own report cannot undercut.
        let wall = self.began.elapsed();
        let seen = (timing.eval_tokens.is_some() && wall >= Duration::from_millis(20)).then_some(wall);
        timing.eval = crate::speed::believable_eval(timing.eval, seen);
        guard.observe_speed(&timing, Instant::now());
    }

    fn fail(mut self, outcome: Outcome, why: String, code: &str) -> Option<(Result<Bytes, std::io::Error>, Relay)> {
        let node = self.finish(outcome, &why);
        let message = format!("{why} on {node}; the answer is incomplete");
        let item = match self.framing {
            Framing::Ndjson => {
                let line = serde_json::json!({ "error": message, "code": code });
                let lead = if self.ends_with_newline { "" } else { "\n" };
                Ok(Bytes::from(format!("{lead}{line}\n")))
            }
            Framing::Sse => {
                let event = serde_json::json!({ "error": { "message": message, "type": "api_error", "code": code } });
                let lead = if self.ends_with_newline { "" } else { "\n\n" };
                Ok(Bytes::from(format!("{lead}data: {event}\n\n")))
            }
            Framing::Opaque => Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, message)),
        };
        Some((item, self))
    }

    /// Judge the exchange once and free the node's slot. Returns who answered ("node gpu0",
    /// "provider openai").
    fn finish(&mut self, outcome: Outcome, detail: &str) -> String {
        self.done = true;
        let Some(source) = self.source.take() else { return String::new() };
        // Held to the end of this function: the node's slot frees after the record is made.
        let mut guard = None;
        // Read once: the token counts for the record and the timing for the speed model.
        let timing = crate::speed::Timing::from_tail(&self.tail_bytes());
        let name = match source {
            Source::Node(mut g) => {
                if outcome == Outcome::Success && self.status.is_success() {
                    self.teach_speed(&g, timing);
                }
                g.judge(outcome);
                let name = format!("node {}", g.node().name());
                guard = Some(g);
                name
            }
            Source::Provider(p) => format!("provider {p}"),
        };
        if let Some(mut t) = self.trace.take() {
            (t.row.prompt_tokens, t.row.completion_tokens) = timing.tokens();
            t.row.generation_us = timing.generation_us();
            let (status, code) = match outcome {
                Outcome::Success => (status_for(self.status.as_u16()), None),
                Outcome::ClientGone => ("cancelled", Some("client_gone")),
                Outcome::TimedOut => ("interrupted", Some("stream_idle_timeout")),
                _ => ("interrupted", Some("stream_interrupted")),
            };
            match self.handoff.take() {
                Some(client) => {
                    t.judge(status, Some(self.status.as_u16()), code);
                    // Refused only when the client side is gone: the trace, dropped, is
                    // recorded as cancelled.
                    let _ = client.send(t);
                }
                None => t.finish(status, Some(self.status.as_u16()), code),
            }
        }
        if outcome.is_node_failure() {
            tracing::warn!(request_id = %self.request_id, from = %name, ?outcome, detail, bytes = self.bytes, "answer broke off after it started");
        } else {
            tracing::debug!(request_id = %self.request_id, from = %name, ?outcome, bytes = self.bytes, "answer relayed");
        }
        drop(guard);
        name
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.source.is_some() {
            // Dropped before the end: the client went away. Dropping `upstream` closes the
            // node's connection, so it stops generating.
            self.finish(Outcome::ClientGone, "client disconnected");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use http_body::Body as _;

    use super::*;
    use crate::node::{Node, NodeTuning};

    fn node() -> Arc<Node> {
        let cfg =
            crate::config::NodeConfig { name: "a".into(), url: "http://127.0.0.1:1".into(), ..Default::default() };
        Arc::new(Node::new(cfg, NodeTuning::default(), Arc::default()).expect("valid url"))
    }

    /// A whole answer from `node`, holding one of its slots.
    fn document(node: &Arc<Node>) -> Document {
        let relay = Relay {
            resume: None,
            upstream: Box::pin(futures_util::stream::empty()),
            first: Some(Bytes::from_static(b"{\"done\":true}")),
            source: Some(Source::Node(node.try_dispatch(false).expect("a slot"))),
            trace: None,
            status: StatusCode::OK,
            idle: Duration::from_secs(5),
            framing: Framing::Opaque,
            ends_with_newline: true,
            done: false,
            request_id: "r1".into(),
            bytes: 0,
            tail: std::collections::VecDeque::new(),
            silence: Box::pin(tokio::time::sleep(Duration::from_secs(5))),
            stashed: None,
            began: Instant::now(),
            handoff: None,
        };
        Document::new(relay)
    }

    fn take_frame(doc: &mut Document) {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let frame = std::pin::Pin::new(doc).poll_frame(&mut cx);
        assert!(matches!(frame, Poll::Ready(Some(Ok(_)))), "the one frame");
    }

    #[tokio::test]
    async fn a_document_is_judged_after_the_server_has_written_it_not_before() {
        let node = node();
        let mut doc = document(&node);
        take_frame(&mut doc);
        assert!(doc.is_end_stream());
        assert_eq!(node.in_flight(), 1, "handed over: still held");
        drop(doc);
        assert_eq!(node.in_flight(), 1, "the server drops the body, then writes: the verdict waits");
        tokio::task::yield_now().await;
        assert_eq!(node.in_flight(), 0, "judged once the connection's task has yielded");
        assert_eq!(node.served(), 1, "as a success");
    }

    #[tokio::test]
    async fn a_document_dropped_unread_is_judged_at_once() {
        let node = node();
        drop(document(&node));
        assert_eq!(node.in_flight(), 0, "the client left: the slot frees on the spot");
        assert_eq!(node.served(), 0, "not as a success");
    }

    /// A document whose frame the server has taken, made in a runtime of its own (returned, so
    /// the test decides whether it is still running when the document is dropped).
    fn handed_over(node: &Arc<Node>) -> (tokio::runtime::Runtime, Document) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let mut doc = rt.block_on(async { document(node) });
        take_frame(&mut doc);
        (rt, doc)
    }

    #[test]
    fn a_document_handed_over_as_its_runtime_shuts_down_is_still_judged() {
        let node = node();
        let (rt, doc) = handed_over(&node);
        let handle = rt.handle().clone();
        drop(rt);
        let _inside = handle.enter();
        drop(doc);
        assert_eq!(node.in_flight(), 0, "the verdict's task was dropped unrun, and judged on the way");
        assert_eq!(node.served(), 1, "as the success it was, not as the client's leaving");
    }

    #[test]
    fn a_document_handed_over_outside_a_runtime_is_judged_on_the_spot() {
        let node = node();
        let (_rt, doc) = handed_over(&node);
        drop(doc);
        assert_eq!(node.in_flight(), 0);
        assert_eq!(node.served(), 1);
    }
}
