//! One probe exchange and, when it fails, the concrete reason a person reads: "connection
//! refused", "timed out after 300 ms", "HTTP 500: <what the body said>". Node state, the
//! latency test and notifications show this reason, so it names the cause the way an
//! operator would look for it (`curl` words), never a generic "probe failed".
//!
//! It only says what happened; whether that makes the node down is `node`'s hysteresis.

use std::time::Duration;

use futures_util::StreamExt;

/// Longest excerpt of an error body kept in a reason.
const EXCERPT: usize = 120;

/// Why a probe got no good answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// Nothing listens there (the process is gone, or the port is wrong).
    #[error("connection refused")]
    Refused,
    /// No answer within the probe's timeout.
    #[error("timed out after {0} ms")]
    TimedOut(u64),
    /// It answered, with a status that is not 2xx; `excerpt` is what its body said.
    #[error("HTTP {status}{}", if .excerpt.is_empty() { String::new() } else { format!(": {}", .excerpt) })]
    Status { status: u16, excerpt: String },
    /// The connection could not be made for another reason (DNS, unreachable, TLS).
    #[error("cannot connect ({0})")]
    Connect(String),
    /// The node closed the connection under the request (it crashed, or restarted).
    #[error("connection reset")]
    Reset,
    /// The exchange broke after connecting.
    #[error("{0}")]
    Transport(String),
}

impl ProbeError {
    /// The reason as node state shows it: the cause, where, and what the node said.
    /// `url` must already be redacted of credentials.
    pub fn at(&self, url: &str) -> String {
        match self {
            Self::Status { status, excerpt } if !excerpt.is_empty() => format!("HTTP {status} at {url}: {excerpt}"),
            other => format!("{other} at {url}"),
        }
    }

    /// From a failed send.
    pub fn of(e: &reqwest::Error, timeout: Duration) -> Self {
        if e.is_timeout() {
            return Self::TimedOut(timeout.as_millis() as u64);
        }
        match io_kind(e) {
            Some(std::io::ErrorKind::ConnectionRefused) => Self::Refused,
            Some(std::io::ErrorKind::TimedOut) => Self::TimedOut(timeout.as_millis() as u64),
            Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted) => Self::Reset,
            _ if e.is_connect() => Self::Connect(super::root_cause(e)),
            _ => Self::Transport(super::root_cause(e)),
        }
    }
}

/// The kind of the first I/O error in `e`'s chain of causes.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}

/// Send `request` and wait for a 2xx head within `timeout`; on a non-2xx, read a short excerpt
/// of the body within what is left of it.
///
/// A reset is asked once more within the same timeout: it usually comes from a pooled
/// keep-alive connection the node dropped, and only a fresh connection says what is true now
/// ("connection refused" for a node that is gone, an answer for one that restarted).
pub async fn exchange(request: reqwest::RequestBuilder, timeout: Duration) -> Result<(), ProbeError> {
    let started = tokio::time::Instant::now();
    let again = request.try_clone();
    let mut sent = tokio::time::timeout(timeout, request.send()).await;
    if let (Ok(Err(e)), Some(again)) = (&sent, again) {
        if ProbeError::of(e, timeout) == ProbeError::Reset {
            sent = tokio::time::timeout(timeout.saturating_sub(started.elapsed()), again.send()).await;
        }
    }
    let resp = match sent {
        Err(_) => return Err(ProbeError::TimedOut(timeout.as_millis() as u64)),
        Ok(Err(e)) => return Err(ProbeError::of(&e, timeout)),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(50));
    Err(ProbeError::Status { status: status.as_u16(), excerpt: excerpt(&head_of(resp, left).await) })
}

/// What a first-token probe measured: when the answer's head came, and when its first
/// content chunk did (ms from sending).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirstToken {
    pub head_ms: f64,
    pub first_token_ms: f64,
}

/// Send `request` (a streamed one-token generation) and time its answer: the head, then the
/// first line `is_content` takes for content (NDJSON or SSE, one line at a time), all within
/// `timeout`. A non-2xx is `Status` with what the body said; an `error` line, or a stream that
/// ends before any content, is the node's words.
pub async fn first_token(
    request: reqwest::RequestBuilder,
    timeout: Duration,
    is_content: fn(&[u8]) -> bool,
) -> Result<FirstToken, ProbeError> {
    let started = tokio::time::Instant::now();
    let ms = |at: tokio::time::Instant| at.duration_since(started).as_secs_f64() * 1000.0;
    let timed_out = || ProbeError::TimedOut(timeout.as_millis() as u64);
    let resp = match tokio::time::timeout(timeout, request.send()).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(e)) => return Err(ProbeError::of(&e, timeout)),
        Ok(Ok(r)) => r,
    };
    let head_ms = ms(tokio::time::Instant::now());
    let status = resp.status();
    if !status.is_success() {
        let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(50));
        return Err(ProbeError::Status { status: status.as_u16(), excerpt: excerpt(&head_of(resp, left).await) });
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let read = async {
        loop {
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                if said_error(&line) {
                    return Err(ProbeError::Transport(excerpt(&line)));
                }
                if is_content(&line) {
                    return Ok(ms(tokio::time::Instant::now()));
                }
            }
            match stream.next().await {
                Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(ProbeError::of(&e, timeout)),
                None if is_content(&buf) => return Ok(ms(tokio::time::Instant::now())),
                None => return Err(ProbeError::Transport("the answer ended before a first token".into())),
            }
        }
    };
    let left = timeout.saturating_sub(started.elapsed());
    let first_token_ms = tokio::time::timeout(left, read).await.map_err(|_| timed_out())??;
    Ok(FirstToken { head_ms, first_token_ms })
}

/// Whether a stream line (NDJSON, or SSE `data:`) is an error: `{"error": ...}`.
fn said_error(line: &[u8]) -> bool {
    let text = String::from_utf8_lossy(line);
    let json = text.trim().strip_prefix("data:").unwrap_or(text.trim()).trim().to_string();
    serde_json::from_str::<serde_json::Value>(&json).is_ok_and(|v| v.get("error").is_some_and(|e| !e.is_null()))
}

/// The first bytes of a body, waiting at most `within`.
async fn head_of(resp: reqwest::Response, within: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            out.extend_from_slice(&chunk);
            if out.len() > 4 * EXCERPT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
    out
}

/// What an error body says, short: Ollama's and OpenAI's `error` (a string, or an object with
/// a `message`), else the text itself, on one line.
pub fn excerpt(body: &[u8]) -> String {
    let said = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| {
        let e = v.get("error")?;
        e.as_str().or_else(|| e.get("message").and_then(|m| m.as_str())).map(str::to_string)
    });
    let text = said.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(EXCERPT) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_like_the_cause() {
        let url = "http://10.0.0.6:11434";
        assert_eq!(ProbeError::Refused.at(url), "connection refused at http://10.0.0.6:11434");
        assert_eq!(ProbeError::TimedOut(300).at(url), "timed out after 300 ms at http://10.0.0.6:11434");
        let e = ProbeError::Status { status: 500, excerpt: excerpt(br#"{"error":"out of memory"}"#) };
        assert_eq!(e.at(url), "HTTP 500 at http://10.0.0.6:11434: out of memory");
        assert_eq!(e.to_string(), "HTTP 500: out of memory");
        let bare = ProbeError::Status { status: 502, excerpt: String::new() };
        assert_eq!(bare.at(url), "HTTP 502 at http://10.0.0.6:11434");
    }

    #[test]
    fn excerpts_are_short_and_on_one_line() {
        assert_eq!(excerpt(br#"{"error":{"message":"bad key","type":"auth"}}"#), "bad key");
        assert_eq!(
            excerpt(b"<html>\n  <body>Bad   Gateway</body>\n</html>"),
            "<html> <body>Bad Gateway</body> </html>"
        );
        let long = "x".repeat(500);
        assert_eq!(excerpt(long.as_bytes()).chars().count(), EXCERPT + 1, "cut, with an ellipsis");
    }

    #[tokio::test]
    async fn a_closed_port_is_refused_and_a_silent_one_times_out() {
        let client = reqwest::Client::new();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        let got = exchange(client.get(format!("http://127.0.0.1:{port}/")), Duration::from_secs(2)).await;
        assert_eq!(got, Err(ProbeError::Refused));
        // Accepts the connection and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = silent.local_addr().expect("addr");
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let got = exchange(client.get(format!("http://{addr}/")), Duration::from_millis(100)).await;
        assert_eq!(got, Err(ProbeError::TimedOut(100)));
    }
}
