//! The HTTP server under every listener: hyper (HTTP/1.1 and h2c) with the protections
//! `axum::serve` leaves out, so no client can hold what others need.
//!
//! - Head timeout: a new connection must deliver its first request head within
//!   `head_timeout`, protocol detection and the HTTP/2 preface and SETTINGS included (hyper's
//!   own `header_read_timeout` starts only once HTTP/1 was detected, and h2 has none); one that
//!   sends nothing, half a preface or only SETTINGS is closed. Later HTTP/1.1 heads are bounded
//!   by hyper's `header_read_timeout` (slowloris).
//! - Keep-alive timeout: a connection with no request in flight for `keep_alive_timeout` is
//!   shut down gracefully (h2: GOAWAY). A request counts as in flight from its head until its
//!   response body ends or is dropped, so a long answer is never cut.
//! - Connection caps: at most `max_connections` open per listener and `max_connections_per_ip`
//!   per client address (IPv6: per /64). A connection over a cap gets a fixed HTTP/1.1 503
//!   (`too_many_connections`) and is closed at once, so a flood costs no file descriptors it
//!   can keep; refusals are logged once per burst, not per connection.
//! - Graceful shutdown: on `stop` the listener stops accepting, requests in flight finish,
//!   idle connections close.
//!
//! Each listener has its own accept loop, caps and task, so a flood on one listener cannot
//! starve another (the broker keeps the proxy's caps below the open-file limit, leaving the
//! admin listener's budget free).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::error::BrokerError;

/// The token of an `Authorization: Bearer <token>` header. The scheme is case-insensitive
/// (RFC 9110 11.1: `bearer` and `BEARER` are `Bearer`); the token is taken as sent, trimmed.
pub fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// What one listener allows its connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub head_timeout: Duration,
    pub keep_alive_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
}

/// Serve `app` on `listener` until `stop`, then let open requests finish.
pub async fn serve(listener: TcpListener, app: axum::Router, limits: Limits, stop: CancellationToken) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.head_timeout);
    // Many clients multiplex over a few h2c connections: let a connection carry as many
    // requests as the queue can hold, not h2's conservative default.
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(4096);
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let gate = Arc::new(Gate { limits, open: Mutex::new((0, HashMap::new())) });
    let mut burst = Burst::default();
    let connections = TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let slot = match gate.enter(peer.ip()) {
            Ok(slot) => slot,
            Err(scope) => {
                burst.refused(&addr, scope, &limits);
                refuse(tcp, scope);
                continue;
            }
        };
        burst.accepted(&addr);
        // Small writes (a token, a chunk terminator) must not wait for Nagle + delayed ACK.
        let _ = tcp.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let service = TowerToHyperService::new(tracked(app.clone(), Arc::clone(&activity)));
        let conn = Box::pin(builder.serve_connection_with_upgrades(TokioIo::new(tcp), service).into_owned());
        let watch = Watch { activity, limits, stop: stop.clone(), peer, _slot: slot };
        connections.spawn(watch.drive(conn, |c| c.graceful_shutdown()));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// The app, counting each request in flight on `activity` until its response body is done.
fn tracked(
    app: axum::Router,
    activity: Arc<Activity>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |req: Request<Incoming>| {
        let guard = activity.begin();
        let app = app.clone();
        async move {
            let response = app.oneshot(req.map(Body::new)).await?;
            // The guard lives as long as the body: dropped when the answer ends or is cut.
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(body.map_frame(move |f| {
                    let _ = &guard;
                    f
                }))
            }))
        }
    })
}

/// Which cap a refused connection hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    Listener,
    Address,
}

impl Full {
    fn scope(self) -> &'static str {
        match self {
            Full::Listener => "on this listener",
            Full::Address => "from this address",
        }
    }
}

/// Open connections per listener and per address.
struct Gate {
    limits: Limits,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One open connection, counted until dropped.
struct Slot {
    gate: Arc<Gate>,
    key: IpAddr,
}

/// The address a per-address cap counts: IPv6 clients by their /64, as one host usually has
/// a whole /64 to pick from.
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

impl Gate {
    fn enter(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Full> {
        let key = address_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.0 >= self.limits.max_connections {
            return Err(Full::Listener);
        }
        let mine = open.1.entry(key).or_insert(0);
        if *mine >= self.limits.max_connections_per_ip {
            return Err(Full::Address);
        }
        *mine += 1;
        open.0 += 1;
        Ok(Slot { gate: Arc::clone(self), key })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(n) = open.1.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.1.remove(&self.key);
            }
        }
    }
}

/// The fixed answer to a connection over a cap: HTTP/1.1 503 with the usual error body.
fn refusal(scope: Full) -> String {
    let e = BrokerError::TooManyConnections { scope: scope.scope() };
    let body = e.body().to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nx-corral-forwarded: false\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Answer 503 and close, without waiting on the client: whatever it already sent is read
/// (so the close is a FIN, not a reset that could eat the answer), the answer fits an empty
/// send buffer, and the socket is gone before the next accept.
fn refuse(tcp: TcpStream, scope: Full) {
    let mut sink = [0u8; 4096];
    let _ = tcp.try_read(&mut sink);
    let _ = tcp.try_write(refusal(scope).as_bytes());
}

/// Refusals are logged once per burst: the first refusal says so, the rest are counted, and
/// the count is logged when the listener accepts again after a quiet second.
#[derive(Default)]
struct Burst {
    refused: u64,
    last: Option<Instant>,
}

impl Burst {
    fn refused(&mut self, addr: &str, scope: Full, limits: &Limits) {
        if self.refused == 0 {
            tracing::warn!(
                listener = addr,
                cap = scope.scope(),
                max_connections = limits.max_connections,
                max_connections_per_ip = limits.max_connections_per_ip,
                "connection cap reached: refusing new connections with 503 (logged once per burst)"
            );
        }
        self.refused += 1;
        self.last = Some(Instant::now());
    }

    fn accepted(&mut self, addr: &str) {
        if self.refused > 0 && self.last.is_some_and(|t| t.elapsed() >= Duration::from_secs(1)) {
            tracing::info!(listener = addr, refused = self.refused, "connection cap burst over");
            *self = Self::default();
        }
    }
}

/// What a connection is doing, for its timeouts: requests in flight, and since when idle.
struct Activity {
    accepted: Instant,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    /// Milliseconds after `accepted` when the last request ended.
    idle_since_ms: AtomicU64,
}

/// Decrements `in_flight` when the request's answer is done.
struct InFlight(Arc<Activity>);

impl Activity {
    fn new() -> Self {
        Self {
            accepted: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.requests.fetch_add(1, Ordering::SeqCst);
        crate::memory::request_began();
        InFlight(Arc::clone(self))
    }

    /// When to look again, and whether the connection has outstayed its welcome by `now`.
    fn check(&self, limits: &Limits, now: Instant) -> (Instant, Verdict) {
        if self.requests.load(Ordering::SeqCst) == 0 {
            let deadline = self.accepted + limits.head_timeout;
            return (deadline, if now >= deadline { Verdict::NoHead } else { Verdict::Wait });
        }
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return (now + limits.keep_alive_timeout, Verdict::Wait);
        }
        let idle_since = self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
        let deadline = idle_since + limits.keep_alive_timeout;
        (deadline, if now >= deadline { Verdict::Idle } else { Verdict::Wait })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.idle_since_ms.store(a.accepted.elapsed().as_millis() as u64, Ordering::SeqCst);
        a.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Verdict {
    Wait,
    /// No request head arrived within the head timeout.
    NoHead,
    /// No request in flight for the keep-alive timeout.
    Idle,
}

/// One connection's timeouts, driven next to hyper's connection future.
struct Watch {
    activity: Arc<Activity>,
    limits: Limits,
    stop: CancellationToken,
    peer: SocketAddr,
    _slot: Slot,
}

impl Watch {
    async fn drive<C, E>(self, mut conn: Pin<Box<C>>, graceful: impl Fn(Pin<&mut C>))
    where
        C: std::future::Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let peer = self.peer;
        let mut closing = false;
        loop {
            let (wake, _) = self.activity.check(&self.limits, Instant::now());
            tokio::select! {
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = self.stop.cancelled(), if !closing => {
                    graceful(conn.as_mut());
                    closing = true;
                }
                _ = tokio::time::sleep_until(wake) => match self.activity.check(&self.limits, Instant::now()).1 {
                    Verdict::Wait => {}
                    Verdict::NoHead => {
                        tracing::debug!(%peer, "no request head within the head timeout; closing");
                        return;
                    }
                    // A second idle period after the graceful shutdown: the client ignored it.
                    Verdict::Idle if closing => return,
                    Verdict::Idle => {
                        tracing::debug!(%peer, "idle keep-alive connection; closing");
                        graceful(conn.as_mut());
                        closing = true;
                        self.activity.idle_since_ms.store(self.activity.accepted.elapsed().as_millis() as u64, Ordering::SeqCst);
                    }
                },
            }
        }
    }
}

/// The soft limit on open files, where the platform says (Linux: `/proc/self/limits`).
pub fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_other_schemes_are_not_bearer() {
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, v.parse().expect("header"));
            super::bearer_token(&h).map(str::to_string)
        };
        for v in ["Bearer abc", "bearer abc", "BEARER  abc "] {
            assert_eq!(with(v).as_deref(), Some("abc"), "{v}");
        }
        for v in ["Basic abc", "Bearerabc", "abc"] {
            assert_eq!(with(v), None, "{v}");
        }
    }

    use super::*;

    fn limits(max: usize, per_ip: usize) -> Limits {
        Limits {
            head_timeout: Duration::from_millis(500),
            keep_alive_timeout: Duration::from_secs(2),
            max_connections: max,
            max_connections_per_ip: per_ip,
        }
    }

    #[test]
    fn caps_count_per_listener_and_per_address_and_free_on_drop() {
        let gate = Arc::new(Gate { limits: limits(3, 2), open: Mutex::new((0, HashMap::new())) });
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = gate.enter(a).expect("room");
        let _second = gate.enter(a).expect("room");
        assert_eq!(gate.enter(a).err(), Some(Full::Address), "two per address");
        let _third = gate.enter(b).expect("another address has room");
        assert_eq!(gate.enter(b).err(), Some(Full::Listener), "three per listener");
        drop(first);
        assert!(gate.enter(a).is_ok(), "a closed connection frees its slot");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(address_key(v6), address_key("2001:db8::ffff".parse().unwrap()), "one /64 is one address");
    }

    #[test]
    fn the_refusal_is_a_whole_http_answer_with_its_code() {
        let text = refusal(Full::Address);
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(body.contains("\"code\":\"too_many_connections\""), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_follow_what_the_connection_does() {
        let l = limits(1, 1);
        let a = Arc::new(Activity::new());
        assert!(matches!(a.check(&l, Instant::now()).1, Verdict::Wait));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(matches!(a.check(&l, Instant::now()).1, Verdict::NoHead), "no head within 500 ms");
        let request = a.begin();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(matches!(a.check(&l, Instant::now()).1, Verdict::Wait), "a request in flight is never idle");
        drop(request);
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert!(matches!(a.check(&l, Instant::now()).1, Verdict::Wait));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(matches!(a.check(&l, Instant::now()).1, Verdict::Idle), "idle for the keep-alive timeout");
    }
}
