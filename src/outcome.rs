//! How one exchange with an upstream ended: the one verdict that the breaker, the node's
//! passive health, the latency estimate, telemetry and the retry decision all read (linkerd's
//! `classify`). A leaf: it imports nothing of the crate, so every layer may use it.

use serde::Serialize;

/// How one exchange with a node ended, judged once at the end of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The node answered (any 2xx/4xx) and the body ended cleanly.
    Success,
    /// The node is saturated ("server busy"): try elsewhere, not a failure.
    Busy,
    /// The TCP connection could not be made: the node is not there.
    ConnectFailed,
    /// 5xx, or the transport broke before the answer started.
    Failed,
    /// Silence between chunks of a started answer past the stream idle timeout.
    TimedOut,
    /// Accepted the request and sent nothing within the first-byte timeout: a node that hangs
    /// like that would hold every request sent to it, so one such silence opens its breaker.
    Silent,
    /// No first token within the category's `first_token_timeout_ms`: too slow for this
    /// request, tried elsewhere, but not a fault of the node (another category may wait).
    Slow,
    /// The answer started and then broke off.
    StreamCut,
    /// The client went away; says nothing about the node.
    ClientGone,
    /// The node answered 404 "model not found": its model list was stale. Not a failure.
    ModelMissing,
}

impl Outcome {
    pub fn is_node_failure(self) -> bool {
        matches!(self, Self::ConnectFailed | Self::Failed | Self::TimedOut | Self::Silent | Self::StreamCut)
    }

    /// The name records and metrics use (the serialized form).
    pub fn name(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Busy => "busy",
            Self::ConnectFailed => "connect_failed",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Silent => "silent",
            Self::Slow => "slow",
            Self::StreamCut => "stream_cut",
            Self::ClientGone => "client_gone",
            Self::ModelMissing => "model_missing",
        }
    }

    /// A timeout before the first byte: a second wait would double what the client waits.
    pub fn is_timeout(self) -> bool {
        matches!(self, Self::TimedOut | Self::Silent | Self::Slow)
    }

    /// The node is not asked again for the same request: it let a deadline pass, or it said
    /// it lacks the model (a probe re-learning its list meanwhile does not change its answer).
    pub fn rules_the_node_out(self) -> bool {
        self.is_timeout() || self == Self::ModelMissing
    }
}
