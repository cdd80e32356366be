//! Read-ahead for slow readers: a streamed answer is pulled from the node by a task of its own
//! into a bounded buffer, and the client takes it from there at its own pace. A client reading
//! slower than the node produces no longer holds the node's slot: the relay (running in the
//! task) reaches the node's last line, judges the exchange and frees the slot while the client
//! is still reading. The request's record is made when the client has the last byte, with both
//! times (`node_done_ms` and `total_ms`).
//!
//! Bounded twice: per stream (`proxy.stream_buffer_bytes`) and for all streams together
//! (`proxy.stream_buffer_total_bytes`, the semaphore in `Shared`). A chunk holds its bytes'
//! permits until the client side hands it to the connection; when either bound is full the
//! task waits, so backpressure reaches the node as it does without read-ahead. A client that
//! leaves closes the channel, which the task notices at once (not at the next chunk) and drops
//! the relay: the node's connection closes and it stops generating.

use std::sync::Arc;

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
        })
    }
}

/// A chunk's share of both bounds, given back when the client side has passed it on.
struct Held {
    _own: Option<OwnedSemaphorePermit>,
    _all: Option<OwnedSemaphorePermit>,
}

/// The client's body for `source` (the relay), pumped ahead by its own task. `record` brings
/// the relay's judged trace, finished here once the client has the last byte.
pub(crate) fn body<S>(source: S, budget: Budget, record: oneshot::Receiver<Trace>) -> Body
where
    S: Stream<Item = Item> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let own = Arc::new(Semaphore::new(budget.per_stream as usize));
    tokio::spawn(pump(source, tx, own, budget));
    let reader = Reader { rx, record: Some(record) };
    Body::from_stream(futures_util::stream::unfold(reader, Reader::next))
}

/// Pull `source` as fast as the node sends, within the bounds, until it ends or the client
/// goes. Returning drops `source`, and with it the relay and the node's connection.
async fn pump<S>(source: S, tx: mpsc::UnboundedSender<(Item, Held)>, own: Arc<Semaphore>, budget: Budget)
where
    S: Stream<Item = Item> + Send + 'static,
{
    let mut source = std::pin::pin!(source);
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

impl Reader {
    async fn next(mut self) -> Option<(Item, Self)> {
        match self.rx.recv().await {
            Some((item, held)) => {
                drop(held);
                Some((item, self))
            }
            None => {
                // The relay judged the exchange before it ended; the client now has it all.
                if let Some(Ok(trace)) = self.record.take().map(|mut r| r.try_recv()) {
                    trace.finish_judged();
                }
                None
            }
        }
    }
}
