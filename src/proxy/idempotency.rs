//! Idempotent retries: a request sent again (a client that timed out and retried, a queue that
//! redelivered) never runs upstream a second time.
//!
//! A request is named by its `Idempotency-Key` header or, without one, by its `X-Request-Id`,
//! always within a scope: the client key it authenticated with (or none) and the listener's
//! origin, so one client can never join or read another's answer. The name is bound to what was
//! asked (method, path and a hash of the body): the same `Idempotency-Key` with another request
//! is refused (422 `idempotency_key_reused`); the same `X-Request-Id` with another request is
//! simply another request.
//!
//! The first request (the lead) runs on its own task, so its client leaving does not cancel it;
//! its answer is pumped into an entry that keeps every byte (up to the per-entry and global
//! bounds, `Limits`) and passes each chunk to every client attached to it, the lead's own
//! client included. A duplicate that arrives while it runs is attached: it gets what was
//! buffered from the start, then follows live. After the lead finished, within the category's
//! `idempotency_window_ms`, a duplicate is answered from memory when the category says
//! `replay_finished = true`, else with 409 `duplicate_request` naming the first request's id
//! and how it ended. (A duplicate by `X-Request-Id` alone runs anew instead of a 409: that
//! header is a trace id, not a promise.) Answers are never written to disk; the record keeps
//! metadata only.
//!
//! Bounds: an entry past `entry_bytes`, or a buffer that would pass `total_bytes` across all
//! entries, drops its bytes: clients already attached keep following live, but it can no
//! longer be joined or replayed (a duplicate gets 409). At most `entries` names are held;
//! past that the oldest finished one is forgotten, and with none finished a new request runs
//! untracked. A slow attached client slows the pump (and the node) as a slow single client
//! does, within a queue of `FOLLOWER_QUEUE` chunks each. The lead keeps running with nobody
//! attached only while it could still be joined; an answer that ended broken, or with 429 or
//! 5xx ("try again"), is forgotten at once, so a retry runs again.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::BrokerError;

/// Memory bounds of the idempotency store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one answer kept for joining and replay.
    pub entry_bytes: usize,
    /// Bytes kept across all answers.
    pub total_bytes: usize,
    /// Names (running or finished) held at once.
    pub entries: usize,
}

impl Limits {
    pub const DEFAULT: Self = Self { entry_bytes: 4 << 20, total_bytes: 64 << 20, entries: 1024 };
}

/// Chunks queued for one attached client before the pump waits for it.
const FOLLOWER_QUEUE: usize = 16;

/// What names a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// `Idempotency-Key`: the client promises it is the same request.
    Explicit(String),
    /// `X-Request-Id`: the same trace id and the same request.
    RequestId(String),
}

/// One request asking to be deduplicated.
#[derive(Debug, Clone)]
pub struct Ask {
    /// Who may share answers: origin and client key name.
    pub scope: String,
    pub key: Key,
    /// Method, path and body, hashed.
    pub fingerprint: u64,
    /// Corral's id of this request (it becomes "the first" if it leads).
    pub id: String,
    pub window: Duration,
    pub replay: bool,
}

/// What to do with a request.
pub enum Claim {
    /// Not tracked (no room): run it as any other request.
    Untracked,
    /// The first: run it on its own task through `Lead::run`; the client reads the follower.
    Lead(Lead, Follower),
    /// A duplicate of a running request: read the follower.
    Follow(Follower),
    /// A duplicate of a finished request, answered from memory.
    Replay(Response),
    Refused(BrokerError),
}

/// A hash of what the request asks (method, path and query, body).
pub fn fingerprint(method: &http::Method, path_and_query: &str, body: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (method.as_str(), path_and_query, body).hash(&mut h);
    h.finish()
}

type Name = (String, Key);

/// The store: names of recent requests and their answers' bytes.
#[derive(Debug)]
pub struct Idempotency {
    limits: Limits,
    /// Bytes buffered across all entries.
    buffered: AtomicUsize,
    entries: Mutex<HashMap<Name, Arc<Entry>>>,
}

#[derive(Debug)]
struct Entry {
    first_id: String,
    fingerprint: u64,
    replay: bool,
    window: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    head: Option<(StatusCode, HeaderMap)>,
    chunks: Vec<Bytes>,
    bytes: usize,
    /// The answer outgrew a bound: its bytes are gone, it cannot be joined or replayed.
    overflowed: bool,
    /// The last chunk, kept whatever the bounds, to tell a broken stream's end.
    last: Bytes,
    followers: Vec<mpsc::Sender<Item>>,
    ended: Option<(Ending, Instant)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Complete,
    Broken,
    Abandoned,
}

#[derive(Debug)]
enum Item {
    Head(StatusCode, HeaderMap),
    Chunk(Bytes),
    Broke(String),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Default for Idempotency {
    fn default() -> Self {
        Self::new(Limits::DEFAULT)
    }
}

impl Idempotency {
    pub fn new(limits: Limits) -> Self {
        Self { limits, buffered: AtomicUsize::new(0), entries: Mutex::new(HashMap::new()) }
    }

    /// Bytes buffered now, across all entries.
    pub fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Acquire)
    }

    /// Names held now.
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decide what `ask` is: the first of its name, a duplicate, or untracked.
    pub fn claim(self: &Arc<Self>, ask: Ask, now: Instant) -> Claim {
        let mut entries = lock(&self.entries);
        self.expire(&mut entries, now);
        let name: Name = (ask.scope.clone(), ask.key.clone());
        if let Some(entry) = entries.get(&name).cloned() {
            let explicit = matches!(ask.key, Key::Explicit(_));
            if entry.fingerprint != ask.fingerprint {
                if explicit {
                    return Claim::Refused(BrokerError::IdempotencyKeyReused { first: entry.first_id.clone() });
                }
                return Claim::Untracked;
            }
            if let Some(claim) = entry.join(explicit) {
                return claim;
            }
            self.forget(&mut entries, &name);
        }
        if entries.len() >= self.limits.entries && !self.evict_oldest(&mut entries) {
            tracing::debug!(request_id = %ask.id, "idempotency store full of running requests: not tracked");
            return Claim::Untracked;
        }
        let entry = Arc::new(Entry {
            first_id: ask.id,
            fingerprint: ask.fingerprint,
            replay: ask.replay,
            window: ask.window,
            state: Mutex::new(State::default()),
        });
        let follower = entry.subscribe(&mut lock(&entry.state), None);
        entries.insert(name.clone(), Arc::clone(&entry));
        Claim::Lead(Lead { store: Arc::clone(self), name, entry, ended: false }, follower)
    }

    fn expire(&self, entries: &mut HashMap<Name, Arc<Entry>>, now: Instant) {
        let stale: Vec<Name> = entries
            .iter()
            .filter(|(_, e)| lock(&e.state).ended.is_some_and(|(_, at)| at + e.window <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for name in stale {
            self.forget(entries, &name);
        }
    }

    /// Forget the finished entry that ended first; `false` when every entry is running.
    fn evict_oldest(&self, entries: &mut HashMap<Name, Arc<Entry>>) -> bool {
        let oldest = entries
            .iter()
            .filter_map(|(n, e)| lock(&e.state).ended.map(|(_, at)| (at, n.clone())))
            .min_by_key(|(at, _)| *at);
        match oldest {
            Some((_, name)) => {
                self.forget(entries, &name);
                true
            }
            None => false,
        }
    }

    fn forget(&self, entries: &mut HashMap<Name, Arc<Entry>>, name: &Name) {
        if let Some(e) = entries.remove(name) {
            self.release(&mut lock(&e.state));
        }
    }

    /// Drop an entry's bytes and take them off the global count.
    fn release(&self, st: &mut State) {
        self.buffered.fetch_sub(st.bytes, Ordering::AcqRel);
        st.bytes = 0;
        st.chunks = Vec::new();
    }

    /// Keep `chunk` in `st` if the bounds allow; past them the entry gives its bytes up.
    fn keep(&self, st: &mut State, chunk: &Bytes) {
        st.last = chunk.clone();
        if st.overflowed {
            return;
        }
        let global = self.buffered.load(Ordering::Acquire);
        if st.bytes + chunk.len() > self.limits.entry_bytes || global + chunk.len() > self.limits.total_bytes {
            tracing::debug!(bytes = st.bytes, "answer outgrew the idempotency bounds: it can no longer be joined");
            self.release(st);
            st.overflowed = true;
            return;
        }
        self.buffered.fetch_add(chunk.len(), Ordering::AcqRel);
        st.bytes += chunk.len();
        st.chunks.push(chunk.clone());
    }
}

impl Entry {
    /// A duplicate's answer; `None` when the old entry should make way for a new run.
    fn join(&self, explicit: bool) -> Option<Claim> {
        let mut st = lock(&self.state);
        let Some((ending, _)) = st.ended else {
            if st.overflowed {
                let outcome = "still running, and its answer is past the memory bound for joining".to_string();
                return Some(Claim::Refused(self.duplicate(outcome)));
            }
            return Some(Claim::Follow(self.subscribe(&mut st, Some("attached"))));
        };
        if self.replay && !st.overflowed && ending == Ending::Complete {
            return Some(Claim::Replay(self.replayed(&st)));
        }
        if !explicit {
            return None;
        }
        let status = st.head.as_ref().map_or(0, |(s, _)| s.as_u16());
        let outcome = match ending {
            Ending::Complete => format!("completed with HTTP {status}"),
            Ending::Broken => format!("broke off after HTTP {status}"),
            Ending::Abandoned => "was cancelled".to_string(),
        };
        Some(Claim::Refused(self.duplicate(outcome)))
    }

    fn duplicate(&self, outcome: String) -> BrokerError {
        BrokerError::DuplicateRequest { first: self.first_id.clone(), outcome }
    }

    /// A client following this entry: what was buffered, then live. `how` marks a duplicate.
    fn subscribe(&self, st: &mut State, how: Option<&'static str>) -> Follower {
        let (tx, rx) = mpsc::channel(FOLLOWER_QUEUE);
        let mut pending = VecDeque::new();
        if let Some((status, headers)) = &st.head {
            pending.push_back(Item::Head(*status, headers.clone()));
            pending.extend(st.chunks.iter().cloned().map(Item::Chunk));
        }
        st.followers.push(tx);
        Follower { pending, rx, first_id: self.first_id.clone(), how }
    }

    fn replayed(&self, st: &State) -> Response {
        let (status, headers) = st.head.clone().unwrap_or_default();
        let chunks: Vec<Result<Bytes, std::io::Error>> = st.chunks.iter().cloned().map(Ok).collect();
        let mut r = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        mark(&mut r, "replayed", &self.first_id);
        r
    }
}

fn mark(r: &mut Response, how: &'static str, first: &str) {
    let h = r.headers_mut();
    h.insert("x-corral-idempotent", HeaderValue::from_static(how));
    if let Ok(v) = HeaderValue::from_str(first) {
        h.insert("x-corral-first-request-id", v);
    }
}

/// The first request of a name: it feeds its answer to every follower.
pub struct Lead {
    store: Arc<Idempotency>,
    name: Name,
    entry: Arc<Entry>,
    /// Set once the entry is marked ended (by `run`, or on drop).
    ended: bool,
}

impl Lead {
    /// Pump `response` to the followers and into the entry, until it ends, nobody can use it
    /// any more, or the broker shuts down with no client reading it.
    pub async fn run(mut self, response: Response, shutdown: &CancellationToken) {
        let (parts, body) = response.into_parts();
        {
            let mut st = lock(&self.entry.state);
            let (status, headers) = (parts.status, parts.headers);
            // The first item of every channel, so there is room; a client already gone is dropped.
            st.followers.retain(|f| f.try_send(Item::Head(status, headers.clone())).is_ok());
            st.head = Some((status, headers));
        }
        let mut body = body.into_data_stream();
        let ending = loop {
            // On shutdown an answer drains as any other while a client reads it; with nobody
            // left it stops at once rather than hold the drain up for a retry that won't come.
            let alone = lock(&self.entry.state).followers.is_empty();
            let next = tokio::select! {
                n = body.next() => n,
                _ = shutdown.cancelled(), if alone => break Ending::Abandoned,
            };
            match next {
                None => break self.ending(),
                Some(Ok(chunk)) => {
                    if !self.pass(chunk).await {
                        break Ending::Abandoned;
                    }
                }
                Some(Err(e)) => {
                    self.send_all(|| Item::Broke(e.to_string())).await;
                    break Ending::Broken;
                }
            }
        };
        self.end(ending);
    }

    /// How a body that ended on its own ended: broken when its last line is the relay's
    /// mid-stream error line.
    fn ending(&self) -> Ending {
        let st = lock(&self.entry.state);
        let tail = String::from_utf8_lossy(&st.last[st.last.len().saturating_sub(512)..]).into_owned();
        let broke =
            ["stream_interrupted", "stream_idle_timeout"].iter().any(|c| tail.contains(&format!("\"code\":\"{c}\"")));
        if broke {
            Ending::Broken
        } else {
            Ending::Complete
        }
    }

    /// Keep and pass one chunk; `false` when nobody follows and nobody could join any more.
    async fn pass(&mut self, chunk: Bytes) -> bool {
        self.store.keep(&mut lock(&self.entry.state), &chunk);
        self.send_all(|| Item::Chunk(chunk.clone())).await;
        let st = lock(&self.entry.state);
        !(st.followers.is_empty() && st.overflowed)
    }

    async fn send_all(&mut self, item: impl Fn() -> Item) {
        let followers = lock(&self.entry.state).followers.clone();
        for f in &followers {
            // A client that left is dropped below; the others go on.
            let _ = f.send(item()).await;
        }
        lock(&self.entry.state).followers.retain(|f| !f.is_closed());
    }

    fn end(&mut self, ending: Ending) {
        self.ended = true;
        let mut entries = lock(&self.store.entries);
        let mut st = lock(&self.entry.state);
        st.ended = Some((ending, Instant::now()));
        st.followers.clear();
        let status = st.head.as_ref().map(|(s, _)| *s);
        let again = status.is_none_or(|s| s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error());
        let ours = entries.get(&self.name).is_some_and(|e| Arc::ptr_eq(e, &self.entry));
        if ending != Ending::Complete || again {
            drop(st);
            if ours {
                self.store.forget(&mut entries, &self.name);
            }
            return;
        }
        if !self.entry.replay {
            // A duplicate gets 409, never these bytes: only the metadata stays.
            self.store.release(&mut st);
        }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if !self.ended {
            self.end(Ending::Abandoned);
        }
    }
}

/// One client's copy of a led answer.
pub struct Follower {
    pending: VecDeque<Item>,
    rx: mpsc::Receiver<Item>,
    first_id: String,
    how: Option<&'static str>,
}

impl Follower {
    async fn next(&mut self) -> Option<Item> {
        match self.pending.pop_front() {
            Some(item) => Some(item),
            None => self.rx.recv().await,
        }
    }

    /// The response, once the lead's head is known.
    pub async fn response(mut self) -> Result<Response, BrokerError> {
        let (status, headers) = loop {
            match self.next().await {
                Some(Item::Head(s, h)) => break (s, h),
                Some(_) => continue,
                None => {
                    let outcome = "was cancelled before it answered".to_string();
                    return Err(BrokerError::DuplicateRequest { first: self.first_id.clone(), outcome });
                }
            }
        };
        let (how, first) = (self.how, self.first_id.clone());
        let body = futures_util::stream::unfold(self, |mut f| async move {
            match f.next().await? {
                Item::Chunk(c) => Some((Ok(c), f)),
                Item::Broke(why) => Some((Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, why)), f)),
                Item::Head(..) => Some((Ok(Bytes::new()), f)),
            }
        });
        let mut r = Response::new(Body::from_stream(body));
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        if let Some(how) = how {
            mark(&mut r, how, &first);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(key: &str, replay: bool) -> Ask {
        Ask {
            scope: "local/".into(),
            key: Key::Explicit(key.into()),
            fingerprint: 7,
            id: format!("id-{key}"),
            window: Duration::from_secs(60),
            replay,
        }
    }

    fn answer(chunks: &[&'static str]) -> Response {
        let items: Vec<Result<Bytes, std::io::Error>> =
            chunks.iter().map(|c| Ok(Bytes::from_static(c.as_bytes()))).collect();
        Response::new(Body::from_stream(futures_util::stream::iter(items)))
    }

    fn lead(store: &Arc<Idempotency>, a: Ask) -> (Lead, Follower) {
        match store.claim(a, Instant::now()) {
            Claim::Lead(l, f) => (l, f),
            _ => panic!("the first of a name leads"),
        }
    }

    fn refused_code(c: Claim) -> &'static str {
        match c {
            Claim::Refused(e) => e.code(),
            _ => panic!("expected a refusal"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_past_the_entry_bound_is_not_kept_and_cannot_be_joined() {
        let limits = Limits { entry_bytes: 8, total_bytes: 1024, entries: 8 };
        let store = Arc::new(Idempotency::new(limits));
        // Its client is still reading, so it runs to the end (unread chunks queue for it).
        let (l, _reading) = lead(&store, ask("a", true));
        l.run(answer(&["12345", "67890"]), &CancellationToken::new()).await;
        assert_eq!(store.buffered(), 0, "10 bytes do not fit an 8-byte entry: nothing is kept");
        assert_eq!(refused_code(store.claim(ask("a", true), Instant::now())), "duplicate_request");
        // With nobody reading, an answer nobody could join is stopped, and its name freed.
        let (l, f) = lead(&store, ask("z", true));
        drop(f);
        l.run(answer(&["12345", "67890"]), &CancellationToken::new()).await;
        assert!(matches!(store.claim(ask("z", true), Instant::now()), Claim::Lead(..)), "a retry runs");
        let (l, f) = lead(&store, ask("b", true));
        drop(f);
        l.run(answer(&["1234", "5678"]), &CancellationToken::new()).await;
        assert_eq!(store.buffered(), 8, "an answer within the bound is kept for replay");
        assert!(matches!(store.claim(ask("b", true), Instant::now()), Claim::Replay(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_global_bound_counts_every_entry_and_the_window_frees_it() {
        let limits = Limits { entry_bytes: 8, total_bytes: 12, entries: 8 };
        let store = Arc::new(Idempotency::new(limits));
        let mut readers = Vec::new();
        for (key, want) in [("a", 8), ("b", 8)] {
            let (l, f) = lead(&store, ask(key, true));
            readers.push(f);
            l.run(answer(&["1234", "5678"]), &CancellationToken::new()).await;
            assert_eq!(store.buffered(), want, "a second 8 bytes would pass the 12-byte total");
        }
        assert!(matches!(store.claim(ask("b", true), Instant::now()), Claim::Refused(_)), "b was not kept");
        tokio::time::advance(Duration::from_secs(61)).await;
        let c = store.claim(ask("c", true), Instant::now());
        assert!(matches!(c, Claim::Lead(..)));
        assert_eq!(store.buffered(), 0, "past the window, the bytes are gone");
        assert_eq!(store.len(), 1, "and so are the names; only c's is held");
    }

    #[tokio::test(start_paused = true)]
    async fn without_replay_only_metadata_stays_and_a_full_store_tracks_nothing_new() {
        let limits = Limits { entry_bytes: 64, total_bytes: 64, entries: 2 };
        let store = Arc::new(Idempotency::new(limits));
        let (l, f) = lead(&store, ask("a", false));
        drop(f);
        l.run(answer(&["abc"]), &CancellationToken::new()).await;
        assert_eq!(store.buffered(), 0, "a 409 never needs the bytes");
        // Two running names fill the store after a's is evicted.
        let (_b, _fb) = lead(&store, ask("b", false));
        let (_c, _fc) = lead(&store, ask("c", false));
        assert!(matches!(store.claim(ask("d", false), Instant::now()), Claim::Untracked), "all running: untracked");
        assert!(matches!(store.claim(ask("b", false), Instant::now()), Claim::Follow(_)), "b still joinable");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lead_dropped_before_it_answered_frees_its_name() {
        let store = Arc::new(Idempotency::default());
        let (l, f) = lead(&store, ask("a", false));
        let Claim::Follow(dup) = store.claim(ask("a", false), Instant::now()) else { panic!("joins") };
        drop(l);
        assert_eq!(dup.response().await.err().map(|e| e.code()), Some("duplicate_request"));
        drop(f);
        assert!(matches!(store.claim(ask("a", false), Instant::now()), Claim::Lead(..)), "a retry runs");
    }
}
