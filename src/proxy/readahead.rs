//! Read-ahead for slow readers: a streamed answer is pulled from the node by a task of its own
//! into a bounded buffer, and the client takes it from there at its own pace. A client reading
//! slower than the node produces no longer holds the node's slot: the relay (running in the
//! task) reaches the node's last line, judges the exchange and frees the slot while the client
//! is still reading. The request's record is made when the client has the last byte, with both
//! times (`node_done_ms` and `total_ms`).
//!
//! On HTTP/1 the task starts late, after `INLINE_FRAMES` frames or `INLINE_BYTES` bytes
//! relayed in step with the client's connection: most answers end before that, and a task per
//! stream, its channel and its permits were a tenth of a proxied stream's CPU (issue 16). Late
//! is still in time: hyper's HTTP/1 connection keeps taking frames until 16 wait unsent or
//! 400 KiB do (`MAX_BUF_LIST_BUFFERS`, `DEFAULT_MAX_BUFFER_SIZE`), more than both thresholds,
//! so a client that stops reading cannot stop the hand-over. HTTP/2 takes frames only as the
//! client's flow-control window allows, which a client may keep at zero: there the task starts
//! at once.
//!
//! Bounded twice: per stream (`proxy.stream_buffer_bytes`) and for all streams together
//! (`proxy.stream_buffer_total_bytes`, the semaphore in `Shared`). A chunk holds its bytes'
//! permits until the client side hands it to the connection; when either bound is full the
//! task waits, so backpressure reaches the node as it does without read-ahead. A client that
//! leaves closes the channel, which the task notices at once (not at the next chunk) and drops
//! the relay: the node's connection closes and it stops generating.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::state::Shared;
use crate::telemetry::Trace;

type Item = Result<Bytes, std::io::Error>;

/// How much one stream may hold for its client, and the bound of all streams together.
#[derive(Clone)]
pub(crate) struct Budget {
    per_stream: u32,
    total: Arc<Semaphore>,
    /// The global bound's size: no chunk asks for more than there can ever be.
    total_max: u32,
    /// Start the task only once the answer outgrows the inline thresholds (HTTP/1 clients).
    late: bool,
}

impl Budget {
    /// The budget in force, or `None` when read-ahead is off (`stream_buffer_bytes = 0`).
    pub(crate) fn of(shared: &Shared) -> Option<Self> {
        let per_stream = shared.config().proxy.stream_buffer_bytes;
        let cap = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (per_stream > 0).then(|| Self {
            per_stream: cap(per_stream.min(Semaphore::MAX_PERMITS)),
            total: Arc::clone(&shared.read_ahead),
            total_max: cap(shared.read_ahead_use().1),
            late: false,
        })
    }

    /// For a client on HTTP/1 (`http1`), the task starts late (see the module's doc).
    pub(crate) fn late_for(mut self, http1: bool) -> Self {
        self.late = http1;
        self
    }
}

/// A chunk's share of both bounds, given back when the client side has passed it on.
struct Held {
    _own: Option<OwnedSemaphorePermit>,
    _all: Option<OwnedSemaphorePermit>,
}

/// Frames relayed in step with an HTTP/1 client before the read-ahead task takes over: below
/// hyper's 16 queued buffers.
const INLINE_FRAMES: u32 = 8;
/// Bytes relayed in step before the task takes over: with one more coalesced frame (at most
/// 64 KiB) still below hyper's 400 KiB.
const INLINE_BYTES: usize = 128 * 1024;

/// The client's body for `source` (the relay), pumped ahead by its own task, from the first
/// frame or (`Budget::late`, for HTTP/1 clients) once the answer outgrows the inline thresholds.
/// `record` brings the relay's judged trace, finished here once the client has the last byte.
pub(crate) fn body<S>(source: S, budget: Budget, record: oneshot::Receiver<Trace>) -> Body
where
    S: Stream<Item = Item> + Send + 'static,
{
    let source: Source = Box::pin(source);
    let phase = match budget.late {
        true => Phase::Inline { source, frames: 0, bytes: 0, budget, record },
        false => pumped(source, budget, record),
    };
    Body::from_stream(Ahead { phase })
}

type Source = std::pin::Pin<Box<dyn Stream<Item = Item> + Send>>;

/// The client's side of one answer.
struct Ahead {
    phase: Phase,
}

enum Phase {
    /// Relayed as the client's connection asks, no task yet.
    Inline {
        source: Source,
        frames: u32,
        bytes: usize,
        budget: Budget,
        record: oneshot::Receiver<Trace>,
    },
    /// The task pulls the node ahead; the client takes from its channel.
    Pumped(Reader),
    Ended,
}

/// Start the task pulling `source` ahead of the client.
fn pumped(source: Source, budget: Budget, record: oneshot::Receiver<Trace>) -> Phase {
    let (tx, rx) = mpsc::unbounded_channel();
    let own = Arc::new(Semaphore::new(budget.per_stream as usize));
    tokio::spawn(pump(source, tx, own, budget));
    Phase::Pumped(Reader { rx, record: Some(record) })
}

/// The relay judged the exchange before it ended; the client now has it all.
fn finish(record: Option<oneshot::Receiver<Trace>>) {
    if let Some(Ok(trace)) = record.map(|mut r| r.try_recv()) {
        trace.finish_judged();
    }
}

impl Stream for Ahead {
    type Item = Item;

    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        loop {
            match &mut self.phase {
                Phase::Inline { frames, bytes, .. } if *frames >= INLINE_FRAMES || *bytes >= INLINE_BYTES => {
                    let Phase::Inline { source, budget, record, .. } = std::mem::replace(&mut self.phase, Phase::Ended)
                    else {
                        return Poll::Ready(None);
                    };
                    self.phase = pumped(source, budget, record);
                }
                Phase::Inline { source, frames, bytes, .. } => match std::task::ready!(source.as_mut().poll_next(cx)) {
                    Some(item) => {
                        *frames += 1;
                        *bytes += item.as_ref().map_or(0, Bytes::len);
                        return Poll::Ready(Some(item));
                    }
                    None => {
                        if let Phase::Inline { record, .. } = std::mem::replace(&mut self.phase, Phase::Ended) {
                            finish(Some(record));
                        }
                        return Poll::Ready(None);
                    }
                },
                Phase::Pumped(reader) => match std::task::ready!(reader.rx.poll_recv(cx)) {
                    Some((item, held)) => {
                        drop(held);
                        return Poll::Ready(Some(item));
                    }
                    None => {
                        finish(reader.record.take());
                        self.phase = Phase::Ended;
                        return Poll::Ready(None);
                    }
                },
                Phase::Ended => return Poll::Ready(None),
            }
        }
    }
}

/// Pull `source` as fast as the node sends, within the bounds, until it ends or the client
/// goes. Returning drops `source`, and with it the relay and the node's connection.
async fn pump(mut source: Source, tx: mpsc::UnboundedSender<(Item, Held)>, own: Arc<Semaphore>, budget: Budget) {
    loop {
        let item = tokio::select! {
            biased;
            () = tx.closed() => return,
            item = source.next() => item,
        };
        let Some(item) = item else { return };
        let len = item.as_ref().map_or(0, Bytes::len);
        let held = tokio::select! {
            biased;
            () = tx.closed() => return,
            held = hold(&own, &budget, len) => held,
        };
        if tx.send((item, held)).is_err() {
            return;
        }
    }
}

/// Wait for `len` bytes of room in this stream's bound and then in the global one (a chunk
/// bigger than a bound takes all of it).
async fn hold(own: &Arc<Semaphore>, budget: &Budget, len: usize) -> Held {
    let n = |cap: u32| u32::try_from(len).unwrap_or(u32::MAX).min(cap);
    let own = Arc::clone(own).acquire_many_owned(n(budget.per_stream)).await.ok();
    let all = Arc::clone(&budget.total).acquire_many_owned(n(budget.total_max)).await.ok();
    Held { _own: own, _all: all }
}

/// The client's side: chunks in order, each one's room given back as it leaves.
struct Reader {
    rx: mpsc::UnboundedReceiver<(Item, Held)>,
    record: Option<oneshot::Receiver<Trace>>,
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http_body_util::BodyExt;

    use super::*;

    fn budget(late: bool) -> Budget {
        budget_of(late, 1 << 20)
    }

    /// Room for `bytes` per stream, and for four such streams in all.
    fn budget_of(late: bool, bytes: u32) -> Budget {
        Budget { per_stream: bytes, total: Arc::new(Semaphore::new(4 * bytes as usize)), total_max: 4 * bytes, late }
    }

    /// An answer of `n` one-byte frames; each frame notes which task pulled it.
    fn answer(n: usize) -> (impl Stream<Item = Item> + Send + 'static, Arc<Mutex<Vec<Option<tokio::task::Id>>>>) {
        let pulled = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&pulled);
        let frames = futures_util::stream::iter(0..n).map(move |_| {
            log.lock().expect("log").push(tokio::task::try_id());
            Ok(Bytes::from_static(b"x"))
        });
        (frames, pulled)
    }

    /// Let the runtime's other tasks run until `done` holds (bounded; no clock involved).
    async fn until(done: impl Fn() -> bool) {
        for _ in 0..100_000 {
            if done() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the read-ahead task never got there");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_http1_answer_is_relayed_in_step_then_read_ahead_of_a_client_that_stopped() {
        let client = tokio::spawn(async {
            let (frames, pulled) = answer(50);
            let mut body = body(frames, budget(true), oneshot::channel().1);
            for _ in 0..=INLINE_FRAMES {
                assert!(body.frame().await.is_some());
            }
            let me = tokio::task::try_id();
            let tasks: Vec<_> = pulled.lock().expect("log").clone();
            assert!(tasks[..INLINE_FRAMES as usize].iter().all(|t| *t == me), "{tasks:?}");
            assert!(tasks[INLINE_FRAMES as usize..].iter().all(|t| t.is_some() && *t != me), "{tasks:?}");
            // The client reads nothing more; the task still pulls the node's answer to its end.
            until(|| pulled.lock().expect("log").len() == 50).await;
            let mut rest = 0;
            while let Some(f) = body.frame().await {
                rest += f.expect("frame").into_data().map_or(0, |d| d.len());
            }
            assert_eq!(rest, 50 - INLINE_FRAMES as usize - 1, "every frame reaches the client once, in order");
        });
        client.await.expect("client");
    }

    /// The argument for starting late, against hyper itself: an HTTP/1 client that reads
    /// nothing after the head (4 KiB receive window), an answer of 100,000 small frames (10 MB)
    /// ready at once, room for all of it in the buffer. hyper's connection pulls the inline frames, the task takes over and pulls the
    /// whole answer into the buffer. (With the thresholds out of reach the answer stalls
    /// within the kernel's and hyper's buffers and this fails.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_hyper_a_client_that_reads_nothing_still_gets_the_hand_over() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const FRAMES: usize = 100_000;
        let pulled = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&pulled);
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(move || {
                let count = Arc::clone(&count);
                async move {
                    let frames = futures_util::stream::iter(0..FRAMES).map(move |_| {
                        count.fetch_add(1, Ordering::Relaxed);
                        Ok(Bytes::from_static(&[b'x'; 100]))
                    });
                    axum::response::Response::new(body(frames, budget_of(true, 64 << 20), oneshot::channel().1))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("small receive buffer");
        let mut client = socket.connect(addr).await.expect("connect");
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("ask");
        let mut head = [0u8; 256];
        let n = client.read(&mut head).await.expect("head");
        assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&head[..n]));
        let all_pulled = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while pulled.load(Ordering::Relaxed) < FRAMES {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        let got = pulled.load(Ordering::Relaxed);
        server.abort();
        assert!(all_pulled.is_ok(), "the answer stalled at frame {got} of {FRAMES}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn large_frames_hand_over_once_their_bytes_pass_the_bound() {
        let client = tokio::spawn(async {
            let me = tokio::task::try_id();
            let pulled = Arc::new(Mutex::new(Vec::new()));
            let log = Arc::clone(&pulled);
            let frames = futures_util::stream::iter(0..4).map(move |_| {
                log.lock().expect("log").push(tokio::task::try_id());
                Ok(Bytes::from(vec![b'x'; 64 * 1024]))
            });
            let all = body(frames, budget(true), oneshot::channel().1).collect().await.expect("body").to_bytes();
            assert_eq!(all.len(), 4 * 64 * 1024);
            let tasks = pulled.lock().expect("log").clone();
            assert_eq!(tasks[..2], [me, me], "two frames make INLINE_BYTES");
            assert!(tasks[2..].iter().all(|t| t.is_some() && *t != me), "{tasks:?}");
        });
        client.await.expect("client");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_short_http1_answer_needs_no_task_and_http2_starts_one_at_once() {
        let client = tokio::spawn(async {
            let me = tokio::task::try_id();
            let (frames, pulled) = answer(3);
            let all = body(frames, budget(true), oneshot::channel().1).collect().await.expect("body").to_bytes();
            assert_eq!(&all[..], b"xxx");
            assert!(pulled.lock().expect("log").iter().all(|t| *t == me));

            let (frames, pulled) = answer(3);
            let all = body(frames, budget(false), oneshot::channel().1).collect().await.expect("body").to_bytes();
            assert_eq!(&all[..], b"xxx");
            assert!(pulled.lock().expect("log").iter().all(|t| t.is_some() && *t != me));
        });
        client.await.expect("client");
    }
}
