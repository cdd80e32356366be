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
    /// No first byte, or silence between chunks, past the configured timeout.
    TimedOut,
    /// The answer started and then broke off.
    StreamCut,
    /// The client went away; says nothing about the node.
    ClientGone,
    /// The node answered 404 "model not found": its model list was stale. Not a failure.
    ModelMissing,
}

impl Outcome {
    pub fn is_node_failure(self) -> bool {
        matches!(self, Self::ConnectFailed | Self::Failed | Self::TimedOut | Self::StreamCut)
    }
}
