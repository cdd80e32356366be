//! Plain-`http` nodes' HTTP/1.1, driven inline by the request's own task.
//!
//! Why not hyper's pooled client, as `https` nodes still use: it gives every connection its own
//! task and hands each request, answer head and body chunk across channels between that task
//! and the request's, a few task switches and wake-ups per request that the profile put at
//! about an eighth of the broker's CPU per forwarded request (issue 16). Here the request's
//! task writes the head and body with one write, parses the answer's head with `httparse` (the
//! parser hyper uses) and reads the body itself, as the relay polls it: the connection goes
//! back to its node's idle list the moment the body's last byte is read.
//!
//! What a client of nodes needs and no more: HTTP/1.1 keep-alive, `Content-Length`, chunked
//! and close-delimited bodies, bounded heads. No `Expect`, no upgrades, no redirects (a node's
//! redirect is its answer). A connection whose answer was not read to its end is closed, never
//! reused.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Longest answer head read (status line and headers).
const MAX_HEAD: usize = 64 * 1024;
/// Most headers an answer may have.
const MAX_HEADERS: usize = 100;
/// Most informational (1xx) heads skipped before the answer's own.
const MAX_INFORMATIONAL: usize = 8;
/// Longest chunk-size line or trailer section of a chunked body.
const MAX_FRAMING: usize = 16 * 1024;
/// Idle connections kept per node: more than any node's useful concurrency.
const MAX_IDLE_PER_NODE: usize = 256;
/// A body up to this size is copied behind the head for one write; a larger one is written
/// after it.
const COPY_BODY_UNDER: usize = 16 * 1024;
/// Read buffer's starting size.
const READ_BUF: usize = 8 * 1024;

/// Why a request got no answer's head.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Failed(String),
}

/// Why an answer's body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyFault {
    #[error("the node closed the connection {0} bytes before the answer's end")]
    Truncated(u64),
    #[error("the node closed the connection inside a chunked answer")]
    ChunkTruncated,
    #[error("the node's chunked answer is malformed ({0})")]
    BadChunk(&'static str),
    #[error("reading the node's answer failed ({0})")]
    Io(#[from] std::io::Error),
}

/// Idle connections per node (`host:port`), most recently used last.
#[derive(Debug)]
pub struct Pool {
    idle: Mutex<Idle>,
    connect_timeout: Duration,
    keep_idle: Duration,
}

#[derive(Debug, Default)]
struct Idle {
    by_node: foldhash::HashMap<Box<str>, Vec<Parked>>,
    swept: Option<Instant>,
}

/// An idle connection. Its read buffer is not kept: idle connections cost a socket each, not
/// a socket and a buffer (the buffer's memory is usually still shared with the last answer's
/// chunks anyway).
#[derive(Debug)]
struct Parked {
    stream: TcpStream,
    since: Instant,
}

/// An open connection and its read buffer.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    reused: bool,
}

/// Where a connection goes when its answer has been read: back to its node's idle list.
struct Home {
    pool: Arc<Pool>,
    node: Box<str>,
}

impl Pool {
    pub fn new(connect_timeout: Duration, keep_idle: Duration) -> Arc<Self> {
        Arc::new(Self { idle: Mutex::new(Idle::default()), connect_timeout, keep_idle })
    }

    /// An idle connection to `node` young enough to reuse.
    fn take(&self, node: &str) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.by_node.get_mut(node)?;
        while let Some(p) = list.pop() {
            if p.since.elapsed() < self.keep_idle && quiet(&p.stream) {
                return Some(Conn { stream: p.stream, buf: BytesMut::with_capacity(READ_BUF), reused: true });
            }
        }
        None
    }

    /// Park a connection whose answer was read to its end. Expired ones go on the way: this
    /// node's each time, every node's once per `keep_idle`.
    fn park(&self, node: Box<str>, stream: TcpStream) {
        let now = Instant::now();
        let keep = self.keep_idle;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.swept.is_none_or(|t| now.duration_since(t) >= keep) {
            idle.swept = Some(now);
            idle.by_node.retain(|_, list| {
                list.retain(|p| now.duration_since(p.since) < keep);
                !list.is_empty()
            });
        }
        let list = idle.by_node.entry(node).or_default();
        list.retain(|p| now.duration_since(p.since) < keep);
        if list.len() < MAX_IDLE_PER_NODE {
            list.push(Parked { stream, since: now });
        }
    }

    async fn connect(&self, node: &str) -> Result<Conn, ExchangeError> {
        let stream = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(node)).await {
            Err(_) => {
                let ms = self.connect_timeout.as_millis();
                return Err(ExchangeError::Connect(format!("no connection within {ms} ms")));
            }
            Ok(Err(e)) => return Err(ExchangeError::Connect(e.to_string())),
            Ok(Ok(s)) => s,
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%node, error = %e, "TCP_NODELAY not set");
        }
        Ok(Conn { stream, buf: BytesMut::with_capacity(READ_BUF), reused: false })
    }

    /// Send `request` to the plain-`http` node at `node` (`host:port`) and read its answer's
    /// head. A reused connection that the node had closed (nothing at all came back) is
    /// replaced by a new one and the request sent again, once: the node never saw it.
    pub async fn send(
        self: &Arc<Self>,
        request: &http::Request<Bytes>,
    ) -> Result<http::Response<AnswerBody>, ExchangeError> {
        let Some(authority) = request.uri().authority() else {
            return Err(ExchangeError::Failed("the node's URL has no host".into()));
        };
        let with_port;
        let node = match authority.port_u16() {
            Some(_) => authority.as_str(),
            None => {
                with_port = format!("{}:80", authority.host());
                with_port.as_str()
            }
        };
        let wire = Wire::of(authority.as_str(), request);
        if let Some(conn) = self.take(node) {
            match self.exchange(conn, node, request.method(), &wire).await {
                Err(Exchange::Stale(why)) => tracing::debug!(%node, %why, "idle connection was closed; reconnecting"),
                Err(Exchange::Failed(e)) => return Err(e),
                Ok(answer) => return Ok(answer),
            }
        }
        let conn = self.connect(node).await?;
        match self.exchange(conn, node, request.method(), &wire).await {
            Ok(answer) => Ok(answer),
            Err(Exchange::Stale(why)) => Err(ExchangeError::Failed(why)),
            Err(Exchange::Failed(e)) => Err(e),
        }
    }

    async fn exchange(
        self: &Arc<Self>,
        mut conn: Conn,
        node: &str,
        method: &Method,
        wire: &Wire<'_>,
    ) -> Result<http::Response<AnswerBody>, Exchange> {
        let stale = |reused: bool, why: String| match reused {
            true => Exchange::Stale(why),
            false => Exchange::Failed(ExchangeError::Failed(why)),
        };
        if let Err(e) = wire.write(&mut conn.stream).await {
            // A node may answer before it has read the whole body (a 413 for a body over its
            // limit) and close: its answer is the one to relay, not the failed write.
            return match read_head(&mut conn).await {
                Ok(head) => self.answer(conn, node, method, head, false),
                Err(_) => Err(stale(conn.reused, format!("sending the request failed ({e})"))),
            };
        }
        let head = match read_head(&mut conn).await {
            Ok(head) => head,
            Err(HeadFault::Closed) => return Err(stale(conn.reused, "the node closed the connection".into())),
            Err(HeadFault::Io(e)) if conn.buf.is_empty() => return Err(stale(conn.reused, e.to_string())),
            Err(e) => return Err(Exchange::Failed(ExchangeError::Failed(e.to_string()))),
        };
        self.answer(conn, node, method, head, true)
    }

    /// The answer whose `head` was read off `conn`; `whole` when the request was written whole
    /// (else the connection cannot carry another).
    fn answer(
        self: &Arc<Self>,
        conn: Conn,
        node: &str,
        method: &Method,
        head: Head,
        whole: bool,
    ) -> Result<http::Response<AnswerBody>, Exchange> {
        let framing = Framing::of(method, &head).map_err(|why| Exchange::Failed(ExchangeError::Failed(why)))?;
        // Both framings at once is how responses are smuggled: read it as chunked (RFC 9112
        // 6.3), then close the connection rather than trust what follows.
        let both =
            head.headers.contains_key(header::TRANSFER_ENCODING) && head.headers.contains_key(header::CONTENT_LENGTH);
        let reusable = whole && head.keep_alive && !both;
        let home = Home { pool: Arc::clone(self), node: node.into() };
        let mut body = AnswerBody { conn: Some(conn), framing, home: reusable.then_some(home) };
        body.park_if_done();
        let mut resp = http::Response::new(body);
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        Ok(resp)
    }
}

enum Exchange {
    /// A reused connection gave nothing back: the node had closed it.
    Stale(String),
    Failed(ExchangeError),
}

/// Whether an idle connection is still quiet: nothing to read on it, not even its end. Tokio
/// keeps each socket's readiness from the reactor's events (and clears it on a short read, as
/// the answer's last one is), so this is a load, not a system call. A node that closed the
/// connection while it sat idle (uvicorn and Node.js drop idle keep-alive connections after
/// 5 s) has made it readable: it is let go before anything is written to it. A readiness left
/// set by a full last read lets a good connection go too, at the price of a new one.
fn quiet(stream: &TcpStream) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    stream.poll_read_ready(&mut cx).is_pending()
}

/// The request as written: head, and the body behind it.
struct Wire<'a> {
    head: Vec<u8>,
    body: &'a [u8],
}

impl<'a> Wire<'a> {
    fn of(authority: &str, request: &'a http::Request<Bytes>) -> Self {
        let body = request.body().as_ref();
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let mut head = Vec::with_capacity(256 + if body.len() < COPY_BODY_UNDER { body.len() } else { 0 });
        head.extend_from_slice(request.method().as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        head.extend_from_slice(authority.as_bytes());
        head.extend_from_slice(b"\r\n");
        for (name, value) in request.headers() {
            if framed_here(name) {
                continue;
            }
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        if !body.is_empty() || matches!(*request.method(), Method::POST | Method::PUT | Method::PATCH) {
            head.extend_from_slice(b"content-length: ");
            head.extend_from_slice(body.len().to_string().as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        if body.len() < COPY_BODY_UNDER {
            head.extend_from_slice(body);
            return Self { head, body: &[] };
        }
        Self { head, body }
    }

    async fn write(&self, stream: &mut TcpStream) -> std::io::Result<()> {
        stream.write_all(&self.head).await?;
        if !self.body.is_empty() {
            stream.write_all(self.body).await?;
        }
        Ok(())
    }
}

/// Headers this client writes itself (or never sends): the framing and the connection's own.
fn framed_here(name: &HeaderName) -> bool {
    name == header::HOST
        || name == header::CONTENT_LENGTH
        || name == header::TRANSFER_ENCODING
        || name == header::CONNECTION
        || name == header::EXPECT
        || name == header::UPGRADE
        || name == header::TE
        || name == "keep-alive"
}

#[derive(Debug, thiserror::Error)]
enum HeadFault {
    #[error("the node closed the connection")]
    Closed,
    #[error("the node closed the connection inside the answer's head")]
    Truncated,
    #[error("the answer's head is over {} KiB", MAX_HEAD / 1024)]
    TooLong,
    #[error("the answer's head is malformed ({0})")]
    Malformed(String),
    #[error("reading the answer failed ({0})")]
    Io(#[from] std::io::Error),
}

struct Head {
    status: StatusCode,
    version: http::Version,
    headers: HeaderMap,
    keep_alive: bool,
}

/// Read and parse the answer's head off `conn`, leaving the body's first bytes in its buffer.
/// Informational (1xx) heads are skipped, a few of them.
async fn read_head(conn: &mut Conn) -> Result<Head, HeadFault> {
    let mut informational = 0;
    loop {
        if let Some(head) = parse_head(&mut conn.buf)? {
            if head.status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(HeadFault::Malformed("101 Switching Protocols, though no upgrade was asked".into()));
            }
            if head.status.is_informational() {
                informational += 1;
                if informational > MAX_INFORMATIONAL {
                    return Err(HeadFault::Malformed(format!("over {MAX_INFORMATIONAL} informational heads")));
                }
                continue;
            }
            return Ok(head);
        }
        if conn.buf.len() >= MAX_HEAD {
            return Err(HeadFault::TooLong);
        }
        conn.buf.reserve(READ_BUF);
        let before = conn.buf.len();
        let n = read_more(&mut conn.stream, &mut conn.buf).await?;
        if n == 0 {
            return Err(if before == 0 { HeadFault::Closed } else { HeadFault::Truncated });
        }
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    std::future::poll_fn(|cx| tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, buf)).await
}

/// The head at the front of `buf`, taken off it, or `None` while it is incomplete.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, HeadFault> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(len)) => len,
        Err(e) => return Err(HeadFault::Malformed(e.to_string())),
    };
    let code = parsed.code.unwrap_or_default();
    let status = StatusCode::from_u16(code).map_err(|_| HeadFault::Malformed(format!("status {code}")))?;
    let version = match parsed.version {
        Some(1) => http::Version::HTTP_11,
        _ => http::Version::HTTP_10,
    };
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    // The values are slices of one copy of the head: one allocation for all of them, and the
    // copies made for the client's answer (`forward::answer_headers`) only count references,
    // where a value each was an allocation made and another on its first clone.
    let head = Bytes::copy_from_slice(&buf[..len]);
    // `close` on any `Connection` line wins over `keep-alive` on another.
    let (mut close, mut keep) = (false, version == http::Version::HTTP_11);
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| HeadFault::Malformed(format!("header name {:?}", h.name)))?;
        let value = HeaderValue::from_maybe_shared(within(&head, buf, h.value))
            .map_err(|_| HeadFault::Malformed(format!("value of header {name}")))?;
        if name == header::CONNECTION {
            let says = |word: &str| {
                value.as_bytes().split(|b| *b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(word.as_bytes()))
            };
            close |= says("close");
            keep |= says("keep-alive");
        }
        headers.append(name, value);
    }
    buf.advance(len);
    Ok(Some(Head { status, version, headers, keep_alive: keep && !close }))
}

/// `part` (a slice of `buf` that httparse handed back) as the same bytes of `head`, the copy
/// of `buf`'s start; copied on its own should it not lie there.
fn within(head: &Bytes, buf: &[u8], part: &[u8]) -> Bytes {
    let at = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    match at.checked_add(part.len()) {
        Some(end) if end <= head.len() => head.slice(at..end),
        _ => Bytes::copy_from_slice(part),
    }
}

/// How the answer's body ends (RFC 9112, section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes are still to come.
    Length(u64),
    Chunked(Chunk),
    /// Until the node closes the connection (which cannot be reused).
    Close,
    Done,
}

/// Where a chunked body's reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

impl Framing {
    fn of(method: &Method, head: &Head) -> Result<Self, String> {
        let status = head.status;
        if method == Method::HEAD
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Ok(Self::Done);
        }
        let headers = &head.headers;
        if let Some(last) = headers.get_all(header::TRANSFER_ENCODING).iter().next_back() {
            let chunked = last
                .as_bytes()
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            return Ok(if chunked { Self::Chunked(Chunk::Size) } else { Self::Close });
        }
        // `Content-Length: 5, 5` (or two lines of 5) is one length (RFC 9110 8.6); two
        // different ones are refused.
        let mut len = None;
        for value in headers.get_all(header::CONTENT_LENGTH) {
            let s = value.to_str().unwrap_or_default();
            for one in s.split(',') {
                let n = content_length(one.trim())?;
                if len.is_some_and(|l| l != n) {
                    return Err("the answer has conflicting Content-Length headers".into());
                }
                len = Some(n);
            }
        }
        Ok(match len {
            None => Self::Close,
            Some(0) => Self::Done,
            Some(n) => Self::Length(n),
        })
    }
}

fn content_length(s: &str) -> Result<u64, String> {
    match !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        true => s.parse().map_err(|_| format!("the answer's Content-Length {s:?} is not a length")),
        false => Err(format!("the answer's Content-Length {s:?} is not a length")),
    }
}

/// An answer's body, read off the connection as it is polled.
pub struct AnswerBody {
    conn: Option<Conn>,
    framing: Framing,
    /// Where the connection goes once the body is read; `None` when it cannot be reused.
    home: Option<Home>,
}

impl std::fmt::Debug for AnswerBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerBody").field("framing", &self.framing).finish_non_exhaustive()
    }
}

impl AnswerBody {
    /// Hand the connection back once the body is complete and nothing follows it.
    fn park_if_done(&mut self) {
        if self.framing != Framing::Done {
            return;
        }
        let Some(conn) = self.conn.take() else { return };
        if let Some(home) = self.home.take() {
            if conn.buf.is_empty() {
                home.pool.park(home.node, conn.stream);
            }
        }
    }

    /// The next piece of body in the buffer, if the framing allows one without reading.
    fn next_piece(&mut self) -> Result<Option<Bytes>, BodyFault> {
        let Some(conn) = self.conn.as_mut() else { return Ok(None) };
        let buf = &mut conn.buf;
        loop {
            match self.framing {
                Framing::Done => return Ok(None),
                Framing::Close => return Ok((!buf.is_empty()).then(|| buf.split().freeze())),
                Framing::Length(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(buf.len() as u64);
                    self.framing = if n == left { Framing::Done } else { Framing::Length(left - n) };
                    return Ok(Some(buf.split_to(n as usize).freeze()));
                }
                Framing::Chunked(Chunk::Data(left)) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(buf.len() as u64);
                    self.framing = Framing::Chunked(if n == left { Chunk::DataEnd } else { Chunk::Data(left - n) });
                    return Ok(Some(buf.split_to(n as usize).freeze()));
                }
                Framing::Chunked(Chunk::Size) => match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Partial) if buf.len() > MAX_FRAMING => {
                        return Err(BodyFault::BadChunk("chunk size line too long"))
                    }
                    Ok(httparse::Status::Partial) => return Ok(None),
                    Err(_) => return Err(BodyFault::BadChunk("invalid chunk size")),
                    Ok(httparse::Status::Complete((used, 0))) => {
                        buf.advance(used);
                        self.framing = Framing::Chunked(Chunk::Trailers);
                    }
                    Ok(httparse::Status::Complete((used, size))) => {
                        buf.advance(used);
                        self.framing = Framing::Chunked(Chunk::Data(size));
                    }
                },
                Framing::Chunked(Chunk::DataEnd) => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(BodyFault::BadChunk("no CRLF after a chunk"));
                    }
                    buf.advance(2);
                    self.framing = Framing::Chunked(Chunk::Size);
                }
                Framing::Chunked(Chunk::Trailers) => {
                    let Some(end) = trailers_end(buf) else {
                        return match buf.len() > MAX_FRAMING {
                            true => Err(BodyFault::BadChunk("trailers too long")),
                            false => Ok(None),
                        };
                    };
                    buf.advance(end);
                    self.framing = Framing::Done;
                }
            }
        }
    }

    /// What the node's closing the connection means at this point of the body.
    fn closed(&mut self) -> Result<(), BodyFault> {
        let framing = std::mem::replace(&mut self.framing, Framing::Done);
        self.home = None;
        match framing {
            Framing::Close | Framing::Done => Ok(()),
            Framing::Length(left) => Err(BodyFault::Truncated(left)),
            Framing::Chunked(_) => Err(BodyFault::ChunkTruncated),
        }
    }
}

/// Length of the trailer section at the front of `buf` (ending with an empty line), if whole.
fn trailers_end(buf: &[u8]) -> Option<usize> {
    if buf.starts_with(b"\r\n") {
        return Some(2);
    }
    memchr::memmem::find(buf, b"\r\n\r\n").map(|i| i + 4)
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = BodyFault;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BodyFault>>> {
        let this = &mut *self;
        loop {
            let piece = this.next_piece();
            this.park_if_done();
            match piece {
                Err(e) => {
                    this.conn = None;
                    this.framing = Framing::Done;
                    return Poll::Ready(Some(Err(e)));
                }
                Ok(Some(data)) => return Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
                Ok(None) => {}
            }
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            conn.buf.reserve(READ_BUF);
            match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut conn.stream), cx, &mut conn.buf)) {
                Ok(0) => {
                    this.conn = None;
                    return Poll::Ready(this.closed().err().map(Err));
                }
                Ok(_) => {}
                Err(e) => {
                    this.conn = None;
                    this.framing = Framing::Done;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.framing {
            Framing::Length(n) => http_body::SizeHint::with_exact(n),
            Framing::Done => http_body::SizeHint::with_exact(0),
            _ => http_body::SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;

    #[test]
    fn a_header_value_is_a_slice_of_the_head_copy_and_anything_else_is_copied() {
        let buf = b"HTTP/1.1 200 OK\r\nx-a: one\r\n\r\n".to_vec();
        let head = Bytes::copy_from_slice(&buf);
        let at = buf.windows(3).position(|w| w == b"one").expect("value");
        let inside = within(&head, &buf, &buf[at..at + 3]);
        assert_eq!(&inside[..], b"one");
        assert_eq!(inside.as_ptr(), head[at..].as_ptr(), "shared with the head, not copied");
        let elsewhere = b"two".to_vec();
        assert_eq!(&within(&head, &buf, &elsewhere)[..], b"two", "not in the head: copied");
        assert_eq!(&within(&head, &buf, &buf[buf.len()..])[..], b"", "an empty value at the end");
    }

    /// What the scripted node does with its `n`th request (counted over all connections).
    struct Reply {
        pieces: Vec<Vec<u8>>,
        close: bool,
    }

    fn reply(text: &str) -> Reply {
        Reply { pieces: vec![text.as_bytes().to_vec()], close: false }
    }

    /// A node answering from a script; counts the connections it accepted and keeps each
    /// request's head as it came.
    struct Scripted {
        addr: std::net::SocketAddr,
        accepted: Arc<AtomicUsize>,
        heads: Arc<Mutex<Vec<String>>>,
    }

    async fn scripted(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Scripted {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (accepted, heads) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
        let script: Arc<dyn Fn(usize) -> Reply + Send + Sync> = Arc::new(script);
        let (a, h) = (Arc::clone(&accepted), Arc::clone(&heads));
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_conn(s, Arc::clone(&h), Arc::clone(&script)));
            }
        });
        Scripted { addr, accepted, heads }
    }

    async fn serve_conn(
        mut s: TcpStream,
        heads: Arc<Mutex<Vec<String>>>,
        script: Arc<dyn Fn(usize) -> Reply + Send + Sync>,
    ) {
        let mut got = Vec::new();
        loop {
            let Some(end) = memchr::memmem::find(&got, b"\r\n\r\n").map(|i| i + 4) else {
                let mut buf = [0u8; 4096];
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().expect("length"));
            while got.len() < end + len {
                let mut buf = [0u8; 4096];
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            got.drain(..end + len);
            let n = {
                let mut heads = heads.lock().expect("heads");
                heads.push(head);
                heads.len() - 1
            };
            let r = script(n);
            for piece in r.pieces {
                if s.write_all(&piece).await.is_err() {
                    return;
                }
                let _ = s.flush().await;
                tokio::task::yield_now().await;
            }
            if r.close {
                return;
            }
        }
    }

    fn post(addr: std::net::SocketAddr, body: &'static str) -> http::Request<Bytes> {
        http::Request::post(format!("http://{addr}/api/chat"))
            .header("x-request-id", "r1")
            .header(header::CONTENT_LENGTH, "999")
            .header(header::HOST, "elsewhere.example")
            .body(Bytes::from_static(body.as_bytes()))
            .expect("request")
    }

    async fn read_all(resp: http::Response<AnswerBody>) -> Result<Bytes, BodyFault> {
        resp.into_body().collect().await.map(|c| c.to_bytes())
    }

    fn pool() -> Arc<Pool> {
        Pool::new(Duration::from_secs(1), Duration::from_secs(60))
    }

    #[tokio::test]
    async fn a_length_answer_reads_back_and_its_connection_carries_the_next_request() {
        let node = scripted(|n| reply(&format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nr{n}"))).await;
        let pool = pool();
        for n in 0..3 {
            let resp = pool.send(&post(node.addr, "hello")).await.expect("answer");
            assert_eq!(resp.status(), 200);
            assert_eq!(read_all(resp).await.expect("body"), format!("r{n}"));
        }
        assert_eq!(node.accepted.load(Ordering::SeqCst), 1, "one connection for three requests");
        let head = node.heads.lock().expect("heads")[0].clone();
        assert!(head.starts_with("post /api/chat http/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: {}\r\n", node.addr)), "the node's own authority: {head}");
        assert!(!head.contains("elsewhere") && !head.contains("999"), "a client's framing is not passed: {head}");
        assert_eq!(head.matches("content-length: 5\r\n").count(), 1, "{head}");
        assert!(head.contains("x-request-id: r1\r\n"), "{head}");
    }

    #[tokio::test]
    async fn a_chunked_answer_with_trailers_in_odd_pieces_decodes_and_the_connection_is_reused() {
        let wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-t: 1\r\n\r\n";
        let node =
            scripted(move |_| Reply { pieces: wire.chunks(3).map(<[u8]>::to_vec).collect(), close: false }).await;
        let pool = pool();
        for _ in 0..2 {
            let resp = pool.send(&post(node.addr, "hi")).await.expect("answer");
            assert_eq!(read_all(resp).await.expect("body"), "hello, world");
        }
        assert_eq!(node.accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn connection_close_or_an_unread_answer_is_never_reused() {
        let node = scripted(|n| match n {
            0 => Reply {
                pieces: vec![b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\na".to_vec()],
                close: true,
            },
            _ => reply("HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nabcdef"),
        })
        .await;
        let pool = pool();
        let first = pool.send(&post(node.addr, "x")).await.expect("answer");
        assert_eq!(read_all(first).await.expect("body"), "a");
        let second = pool.send(&post(node.addr, "x")).await.expect("answer");
        drop(second);
        let third = pool.send(&post(node.addr, "x")).await.expect("answer");
        assert_eq!(read_all(third).await.expect("body"), "abcdef");
        assert_eq!(node.accepted.load(Ordering::SeqCst), 3, "closed, then dropped unread: a new connection each time");
    }

    #[tokio::test]
    async fn a_connection_idle_past_its_time_is_not_reused() {
        let node = scripted(|_| reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")).await;
        let pool = Pool::new(Duration::from_secs(1), Duration::ZERO);
        for _ in 0..3 {
            let resp = pool.send(&post(node.addr, "x")).await.expect("answer");
            assert_eq!(read_all(resp).await.expect("body"), "ok");
        }
        assert_eq!(node.accepted.load(Ordering::SeqCst), 3);
        let idle = pool.idle.lock().expect("idle");
        assert!(idle.by_node.values().all(|l| l.len() <= 1), "expired connections are let go as new ones park");
    }

    #[tokio::test]
    async fn an_idle_connection_the_node_closed_is_replaced_and_the_request_sent_once_more() {
        let node = scripted(|n| Reply {
            pieces: vec![format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nr{n}").into_bytes()],
            close: true,
        })
        .await;
        let pool = pool();
        let first = pool.send(&post(node.addr, "x")).await.expect("answer");
        assert_eq!(read_all(first).await.expect("body"), "r0");
        let second = pool.send(&post(node.addr, "x")).await.expect("a stale connection is not a failure");
        assert_eq!(read_all(second).await.expect("body"), "r1");
        assert_eq!(node.heads.lock().expect("heads").len(), 2, "the node saw each request once");
    }

    #[tokio::test]
    async fn an_answer_with_both_framings_is_read_as_chunked_and_its_connection_closed() {
        let smuggled = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        let node = scripted(move |_| reply(smuggled)).await;
        let pool = pool();
        for _ in 0..2 {
            let resp = pool.send(&post(node.addr, "x")).await.expect("answer");
            assert_eq!(read_all(resp).await.expect("body"), "ok");
        }
        assert_eq!(node.accepted.load(Ordering::SeqCst), 2, "not reused");
    }

    #[tokio::test]
    async fn a_connection_the_node_closed_while_idle_is_let_go_before_anything_is_written() {
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
        let closed_tx = Mutex::new(Some(closed_tx));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.expect("write");
            drop(s);
            if let Some(tx) = closed_tx.lock().expect("tx").take() {
                let _ = tx.send(());
            }
        });
        let pool = pool();
        let resp = pool.send(&post(addr, "x")).await.expect("answer");
        assert_eq!(read_all(resp).await.expect("body"), "ok");
        let node = addr.to_string();
        closed_rx.await.expect("closed");
        // A yielded task runs again after the reactor has been polled: the close is seen.
        tokio::task::yield_now().await;
        assert!(pool.take(&node).is_none(), "the closed connection is not handed out");
        let idle = pool.idle.lock().expect("idle");
        assert!(idle.by_node.get(node.as_str()).is_none_or(Vec::is_empty), "and not kept either");
    }

    #[tokio::test]
    async fn a_quiet_idle_connection_is_handed_out() {
        let node = scripted(|_| reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")).await;
        let pool = pool();
        let resp = pool.send(&post(node.addr, "x")).await.expect("answer");
        assert_eq!(read_all(resp).await.expect("body"), "ok");
        tokio::task::yield_now().await;
        assert!(pool.take(&node.addr.to_string()).is_some(), "the answer's last short read left it quiet");
    }

    #[tokio::test]
    async fn an_answer_sent_before_the_body_was_read_is_relayed_not_the_failed_write() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let refusal = "HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 8\r\n\r\ntoo big!";
            s.write_all(refusal.as_bytes()).await.expect("write");
            // Closed with most of the body unread: the sender's writes fail.
        });
        let body = Bytes::from(vec![b'x'; 16 << 20]);
        let request = http::Request::post(format!("http://{addr}/api/chat")).body(body).expect("request");
        let resp = pool().send(&request).await.expect("the node's answer, not the write's failure");
        assert_eq!(resp.status(), 413);
        assert_eq!(read_all(resp).await.expect("body"), "too big!");
    }

    #[tokio::test]
    async fn close_on_any_connection_line_wins_and_a_repeated_length_is_one_length() {
        let node = scripted(|n| match n % 2 {
            0 => reply("HTTP/1.1 200 OK\r\nconnection: close\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\na"),
            _ => reply("HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\ncontent-length: 2\r\n\r\nbb"),
        })
        .await;
        let pool = pool();
        for want in ["a", "bb", "a", "bb"] {
            let resp = pool.send(&post(node.addr, "x")).await.expect("answer");
            assert_eq!(read_all(resp).await.expect("body"), want);
        }
        // a (closed) | bb, a (closed) | bb: a new connection after each `close`, none after `2, 2`.
        assert_eq!(node.accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_not_an_end() {
        for wire in [
            "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n",
        ] {
            let node = scripted(move |_| Reply { pieces: vec![wire.as_bytes().to_vec()], close: true }).await;
            let resp = pool().send(&post(node.addr, "x")).await.expect("head");
            assert!(read_all(resp).await.is_err(), "{wire:?}");
        }
    }

    #[tokio::test]
    async fn a_close_delimited_body_ends_at_close_and_empty_answers_have_no_body() {
        let node = scripted(|n| match n {
            0 => Reply { pieces: vec![b"HTTP/1.1 200 OK\r\n\r\nuntil the end".to_vec()], close: true },
            _ => reply("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"),
        })
        .await;
        let pool = pool();
        let resp = pool.send(&post(node.addr, "x")).await.expect("answer");
        assert_eq!(read_all(resp).await.expect("body"), "until the end");
        let resp = pool.send(&post(node.addr, "x")).await.expect("answer");
        assert_eq!(resp.status(), 204, "the informational head is skipped");
        assert_eq!(read_all(resp).await.expect("body"), "");
    }

    #[tokio::test]
    async fn bad_heads_are_refused_in_words_at_bounded_cost() {
        let long = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        let cases: Vec<(String, &str)> = vec![
            (long, "over 64 KiB"),
            ("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nab".into(), "conflicting"),
            ("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n".into(), "not a length"),
            ("HTTP/1.1 200 OK\r\ncontent-length: 2, 3\r\n\r\nab".into(), "conflicting"),
            ("HTTP/1.1 200 OK\r\ncontent-length: 2,\r\n\r\nab".into(), "not a length"),
            ("SMTP ready\r\n\r\n".into(), "malformed"),
            ("HTTP/1.1 200 OK\r\ncontent-le".into(), "inside the answer's head"),
            ("HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n".into(), "no upgrade was asked"),
            ("HTTP/1.1 100 Continue\r\n\r\n".repeat(9) + "HTTP/1.1 200 OK\r\n\r\n", "over 8 informational"),
        ];
        for (wire, says) in cases {
            let w = wire.clone();
            let node = scripted(move |_| Reply { pieces: vec![w.clone().into_bytes()], close: true }).await;
            match pool().send(&post(node.addr, "x")).await {
                Err(ExchangeError::Failed(why)) => {
                    assert!(why.contains(says), "{why} for {}", &wire[..wire.len().min(60)])
                }
                other => panic!("expected a failure, got {other:?}"),
            }
        }
    }

    /// Encode `data` as chunks of the given sizes.
    fn chunked(data: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        let mut rest = data;
        for &size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (chunk, tail) = rest.split_at(size.clamp(1, rest.len()));
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
            rest = tail;
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        /// A node that lies: a valid chunked answer with bytes overwritten, then the connection
        /// closed. Whatever comes, the answer ends (with its bytes or an error), without a panic.
        #[test]
        fn a_garbled_answer_ends_in_an_answer_or_an_error(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            sizes in proptest::collection::vec(1usize..100, 1..4),
            garble in proptest::collection::vec((0usize..2000, proptest::prelude::any::<u8>()), 1..6),
        ) {
            let mut wire = chunked(&data, &sizes);
            for (at, byte) in garble {
                let at = at % wire.len();
                wire[at] = byte;
            }
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let node = scripted(move |_| Reply { pieces: vec![wire.clone()], close: true }).await;
                let answer = pool().send(&post(node.addr, "x")).await;
                if let Ok(resp) = answer {
                    let _ = read_all(resp).await;
                }
            });
        }

        #[test]
        fn any_chunking_read_in_any_pieces_gives_back_the_body(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2000),
            sizes in proptest::collection::vec(1usize..300, 1..8),
            piece in 1usize..500,
        ) {
            let wire = chunked(&data, &sizes);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let got = rt.block_on(async move {
                let node = scripted(move |_| Reply { pieces: wire.chunks(piece).map(<[u8]>::to_vec).collect(), close: false }).await;
                let pool = pool();
                let resp = pool.send(&post(node.addr, "x")).await.expect("head");
                let body = read_all(resp).await.expect("body");
                let again = pool.send(&post(node.addr, "x")).await.expect("head");
                assert_eq!(read_all(again).await.expect("body"), body);
                assert_eq!(node.accepted.load(Ordering::SeqCst), 1);
                body
            });
            proptest::prop_assert_eq!(got.as_ref(), data.as_slice());
        }
    }
}
