//! Admission: a request runs only when a node that can serve it has a free slot
//! (`max_concurrency`) and its breaker lets it through; otherwise it waits in the broker's
//! queue.
//!
//! The queue is ordered by category priority (0 first), then origin (`local` before `remote`,
//! taken from the listener that accepted the socket, never from headers), then arrival (FIFO).
//! It is bounded by count and by total queued body bytes; past either bound a request is
//! refused at once with 429. Requests from remote listeners may hold at most
//! `queue.remote_share` of either bound, so remote clients can never crowd out the owner's. A waiting request leaves the queue when it is placed, when its
//! queue timeout passes (503), or when its client goes away. A running request is never
//! pre-empted: priority only decides who gets the next free slot.
//!
//! Placement is work-conserving: whenever a slot frees or a node changes state, the dispatcher
//! walks the queue in order and places every waiter that fits somewhere, so a high-priority
//! request for a busy model does not hold up a low-priority one for an idle node.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Origin, Policy, QueueConfig};
use crate::error::BrokerError;
use crate::node::{Glance, InFlight, Node, Registry};
use crate::plan::{Board, Plan, Work};
use crate::route::{self, NoCandidate, PickCtx, Router};

/// How often waiters planned onto a busy node are re-planned while nothing else wakes the
/// queue (a node slower than its estimate frees its slot later than planned).
pub const REPLAN_EVERY: Duration = Duration::from_millis(250);

/// What admission needs to know about a request.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub model: Option<String>,
    /// `model` as routing compares it (`config::model_key`), found once per request.
    pub key: Option<String>,
    pub session: Option<String>,
    pub tried: Vec<Arc<Node>>,
    pub router: Arc<Router>,
    pub priority: u32,
    pub origin: Origin,
    pub body_bytes: usize,
    /// Nodes never to be tried again for this request (they timed out on it), even when no
    /// other node is left.
    pub excluded: Vec<Arc<Node>>,
    /// Whether the request has somewhere else to go when no node can take it (a cloud
    /// provider): then a node whose breaker is open is never forced through.
    pub has_alternative: bool,
    /// How much work it is (prompt size, `num_predict`), for `fastest-finish`.
    pub work: Work,
    /// When the request arrived: its estimate (`X-Corral-Estimate-Ms`) counts from here.
    pub arrived: Instant,
}

impl Ticket {
    /// `n` may take this request by every measure but its free slots: up, not tried or
    /// excluded for it, not held off, its breaker letting requests through.
    #[inline]
    fn plainly_routable(&self, n: &Node, now: Instant) -> bool {
        self.plainly_routable_at(n, n.glance(), now)
    }

    /// `plainly_routable` with the node's state already read: a usual one (`Glance::is_usual`)
    /// needs no second look at its marks.
    #[inline(always)]
    fn plainly_routable_at(&self, n: &Node, glance: Glance, now: Instant) -> bool {
        let listed = |list: &[Arc<Node>]| list.iter().any(|t| std::ptr::eq(&**t, n));
        let clear = glance.is_usual()
            || (glance.is_available()
                && !(glance.held() && n.held_now(now))
                && (glance.breaker_closed() || n.breaker_would_allow(now)));
        clear && !listed(&self.tried) && !listed(&self.excluded)
    }
}

type Key = (u32, u8, u64);

struct Waiter {
    ticket: Ticket,
    tx: oneshot::Sender<Result<InFlight, BrokerError>>,
}

#[derive(Default)]
struct Queue {
    waiters: BTreeMap<Key, Waiter>,
    bytes: usize,
    /// What requests from remote listeners hold of the above.
    remote: usize,
    remote_bytes: usize,
}

impl Queue {
    fn take(&mut self, key: &Key) -> Option<Waiter> {
        let w = self.waiters.remove(key)?;
        self.bytes = self.bytes.saturating_sub(w.ticket.body_bytes);
        if w.ticket.origin == Origin::Remote {
            self.remote = self.remote.saturating_sub(1);
            self.remote_bytes = self.remote_bytes.saturating_sub(w.ticket.body_bytes);
        }
        Some(w)
    }

    /// Whether `ticket` fits under the bounds; remote clients only within their share.
    fn has_room(&self, ticket: &Ticket, limits: &QueueConfig) -> bool {
        if self.waiters.len() >= limits.max_requests || self.bytes + ticket.body_bytes > limits.max_bytes {
            return false;
        }
        if ticket.origin == Origin::Local {
            return true;
        }
        let share = limits.remote_share.clamp(0.0, 1.0);
        let (max, max_bytes) =
            ((limits.max_requests as f64 * share) as usize, (limits.max_bytes as f64 * share) as usize);
        self.remote < max && self.remote_bytes + ticket.body_bytes <= max_bytes
    }
}

enum Placement {
    Placed(InFlight),
    Full,
    Impossible(BrokerError),
}

pub struct Admission {
    registry: Arc<Registry>,
    limits: ArcSwap<QueueConfig>,
    queue: Mutex<Queue>,
    seq: AtomicU64,
    /// Set while a waiter is planned onto a node's future slot: the dispatcher then re-plans
    /// every `REPLAN_EVERY`.
    planned: AtomicBool,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").field("depth", &self.depth()).finish()
    }
}

impl Admission {
    pub fn new(registry: Arc<Registry>, limits: QueueConfig) -> Self {
        Self {
            registry,
            limits: ArcSwap::from_pointee(limits),
            queue: Mutex::new(Queue::default()),
            seq: AtomicU64::new(0),
            planned: AtomicBool::new(false),
        }
    }

    pub fn set_limits(&self, limits: QueueConfig) {
        self.limits.store(Arc::new(limits));
    }

    /// Requests waiting right now.
    pub fn depth(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Requests waiting right now, by the origin of the listener they came in through:
    /// `(local, remote)`.
    pub fn depth_by_origin(&self) -> (usize, usize) {
        let q = self.lock();
        (q.waiters.len().saturating_sub(q.remote), q.remote)
    }

    /// For each node, how many waiting requests it could serve (a request counts for every
    /// node it could go to): with the nodes' in-flight requests, the demand a fleet's capacity
    /// shares follow (`crate::fleet::shares`).
    pub fn queued_by_node(&self) -> std::collections::HashMap<String, usize> {
        let q = self.lock();
        let mut out = std::collections::HashMap::new();
        for w in q.waiters.values() {
            for node in self.candidates(&w.ticket).unwrap_or_default().iter() {
                *out.entry(node.config.name.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// Body bytes waiting right now.
    pub fn queued_bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a slot until `deadline`. The returned guard holds it.
    pub async fn admit(
        &self,
        ticket: &Ticket,
        deadline: Instant,
        shutdown: &CancellationToken,
    ) -> Result<InFlight, BrokerError> {
        let started = Instant::now();
        let (key, mut rx) = {
            let mut q = self.lock();
            if q.waiters.is_empty() {
                // Nobody ahead: take a slot directly if there is one.
                if let Some(g) = self.place_now(ticket)? {
                    return Ok(g);
                }
            } else {
                self.candidates(ticket)?;
            }
            if !q.has_room(ticket, &self.limits.load()) {
                return Err(BrokerError::QueueFull { depth: q.waiters.len(), bytes: q.bytes });
            }
            let origin = match ticket.origin {
                Origin::Local => 0,
                Origin::Remote => 1,
            };
            let key = (ticket.priority, origin, self.seq.fetch_add(1, Ordering::Relaxed));
            let (tx, rx) = oneshot::channel();
            q.bytes += ticket.body_bytes;
            if ticket.origin == Origin::Remote {
                q.remote += 1;
                q.remote_bytes += ticket.body_bytes;
            }
            // Copied only here: a request placed at once (the usual case) never is.
            q.waiters.insert(key, Waiter { ticket: ticket.clone(), tx });
            self.registry.wake().queued();
            (key, rx)
        };
        // Leaves the queue however this future ends (placed, timed out, client gone).
        let _slot = QueueSlot { admission: self, key };
        self.dispatch();
        tokio::select! {
            placed = &mut rx => placed.unwrap_or(Err(BrokerError::ShuttingDown)),
            _ = tokio::time::sleep_until(deadline) => {
                let still_queued = self.remove(key);
                match rx.try_recv() {
                    // Placed in the same instant the timeout fired: take the slot.
                    Ok(placed) if !still_queued => placed,
                    _ => Err(BrokerError::QueueTimeout { waited_ms: started.elapsed().as_millis() as u64 }),
                }
            }
            _ = shutdown.cancelled() => Err(BrokerError::ShuttingDown),
        }
    }

    /// The decision `admit` makes for a request with nobody queued ahead: its slot now, or
    /// `None` when it would wait. The routing benchmark (`benches/route.rs`) measures this.
    pub fn place_now(&self, ticket: &Ticket) -> Result<Option<InFlight>, BrokerError> {
        match self.place(ticket, &mut Board::once()) {
            Placement::Placed(g) => Ok(Some(g)),
            Placement::Full => Ok(None),
            Placement::Impossible(e) => Err(e),
        }
    }

    fn remove(&self, key: Key) -> bool {
        let removed = self.lock().take(&key).is_some();
        if removed {
            self.registry.wake().unqueued();
        }
        removed
    }

    /// Place every waiter that fits, in queue order.
    pub fn dispatch(&self) {
        let mut undeliverable = Vec::new();
        {
            let mut q = self.lock();
            self.planned.store(false, Ordering::Release);
            // One timetable for the whole walk: a waiter planned onto a future slot holds it
            // against the waiters behind it.
            let mut board = Board::new();
            let keys: Vec<Key> = q.waiters.keys().copied().collect();
            for key in keys {
                let Some(w) = q.waiters.get(&key) else { continue };
                let result = match self.place(&w.ticket, &mut board) {
                    Placement::Full => continue,
                    Placement::Placed(g) => Ok(g),
                    Placement::Impossible(e) => Err(e),
                };
                if let Some(w) = q.take(&key) {
                    self.registry.wake().unqueued();
                    if let Err(Ok(guard)) = w.tx.send(result) {
                        undeliverable.push(guard);
                    }
                }
            }
        }
        // Slots of waiters that left in the meantime are freed outside the lock.
        drop(undeliverable);
    }

    fn candidates(&self, ticket: &Ticket) -> Result<route::Nodes, BrokerError> {
        let model = ticket.model.as_deref();
        let none_healthy = || BrokerError::NoHealthyNode { model: model.unwrap_or_default().to_string() };
        let mut nodes = route::candidates(&self.registry, model, &ticket.tried).map_err(|why| match (why, model) {
            (NoCandidate::UnknownModel, Some(m)) => BrokerError::model_not_found(m),
            _ => none_healthy(),
        })?;
        if !ticket.excluded.is_empty() {
            Arc::make_mut(&mut nodes).retain(|n| !ticket.excluded.iter().any(|x| Arc::ptr_eq(x, n)));
        }
        if nodes.is_empty() {
            return Err(none_healthy());
        }
        Ok(nodes)
    }

    /// When every node that could serve `ticket` sits out a 429's `Retry-After`: how long until
    /// the first of them may be asked again. `None` when one can be asked now.
    pub fn held_off_for(&self, ticket: &Ticket, now: Instant) -> Option<Duration> {
        let nodes = self.candidates(&Ticket { tried: Vec::new(), ..ticket.clone() }).ok()?;
        nodes.iter().map(|n| n.held_off_left(now)).collect::<Option<Vec<_>>>()?.into_iter().min()
    }

    /// Try to give `ticket` a slot now; what it takes or plans is counted on `board`.
    ///
    /// Each narrowing below (hold-offs, breakers, free slots) copies the list only when it
    /// removes a node: in the common case the policy sees the per-model index's own list.
    fn place(&self, ticket: &Ticket, board: &mut Board) -> Placement {
        let direct = if ticket.router.policy() == Policy::FastestFinish {
            self.place_planned_direct(ticket, board)
        } else {
            self.place_direct(ticket, board)
        };
        if let Some(placed) = direct {
            return placed;
        }
        let model = ticket.model.as_deref();
        let candidates = match self.candidates(ticket) {
            Ok(c) => c,
            Err(e) => return Placement::Impossible(e),
        };
        let now = Instant::now();
        // A node that answered 429 sits out its Retry-After while any other can serve.
        let ready = match narrow(&candidates, |n| !n.held_off(now)) {
            Cow::Owned(ready) if ready.is_empty() => Cow::Borrowed(&candidates[..]),
            ready => ready,
        };
        // An open breaker means out: with every one open the request goes where else it can
        // (the cloud); only with nowhere else is the last node standing forced through.
        let allowed = narrow(&ready, |n| n.breaker_allows(now));
        let force = allowed.is_empty();
        if force && ticket.has_alternative {
            return Placement::Impossible(BrokerError::NoHealthyNode { model: model.unwrap_or_default().to_string() });
        }
        let eligible: &[Arc<Node>] = if force { &ready } else { &allowed };
        if ticket.router.policy() == Policy::FastestFinish {
            return self.place_planned(ticket, eligible, force, board, now);
        }
        let free = narrow(eligible, |n| n.has_capacity());
        let ctx = PickCtx { model, session: ticket.session.as_deref(), now, work: ticket.work };
        let Some(i) = ticket.router.pick(&free, &ctx) else { return Placement::Full };
        take_slot(&free, i, force, ticket, ticket.key.as_deref(), board, now)
    }

    /// `place` in one pass over the model's nodes when at least one of them is plainly
    /// routable (available, untried, not excluded, not held off, its breaker letting it
    /// through): the filters that then drop nothing else need no list of their own. `None`
    /// when no node is: the careful path decides what that means (a hold-off sat out, a
    /// forced node, which error).
    fn place_direct(&self, ticket: &Ticket, board: &mut Board) -> Option<Placement> {
        let (model, key) = (ticket.model.as_deref(), ticket.key.as_deref());
        let index = self.registry.by_model();
        let nodes = index.serving(key);
        let now = Instant::now();
        let ctx = PickCtx { model, session: ticket.session.as_deref(), now, work: ticket.work };
        // A first try (no node tried or excluded yet) over usual nodes: the tight pass.
        if ticket.tried.is_empty() && ticket.excluded.is_empty() && !nodes.is_empty() {
            // Every node usual: each one is plainly routable, so none free is a wait.
            match ticket.router.pick_usual(nodes, &ctx, key) {
                Some(Some(i)) => return Some(take_slot(nodes, i, false, ticket, key, board, now)),
                Some(None) => return Some(Placement::Full),
                None => {}
            }
        }
        let keep = |n: &Node, glance: Glance| glance.has_room() && ticket.plainly_routable_at(n, glance, now);
        match ticket.router.pick_among(nodes, &ctx, key, keep) {
            Some(i) => Some(take_slot(nodes, i, false, ticket, key, board, now)),
            // Every node full is a wait; none plainly routable is the careful path's to judge.
            None if nodes.iter().any(|n| ticket.plainly_routable(n, now)) => Some(Placement::Full),
            None => None,
        }
    }

    /// `fastest-finish`: the node where `ticket` is estimated to end first, busy or not. Free
    /// there now: placed. Busy: the request keeps waiting, that node's next slot booked for it
    /// on `board`, and is re-planned on the next walk (a slot freeing, or `REPLAN_EVERY`).
    fn place_planned(
        &self,
        ticket: &Ticket,
        eligible: &[Arc<Node>],
        force: bool,
        board: &mut Board,
        now: Instant,
    ) -> Placement {
        let key = ticket.key.as_deref();
        let model_ref = key.map(crate::node::ModelRef::new);
        let Some(plan) = board.plan(eligible, key, &ticket.work, now, |n| route::occupancy(n, model_ref)) else {
            return Placement::Full;
        };
        self.take_plan(ticket, eligible, plan, force, board, now)
    }

    /// `place_planned` over the model's nodes in one pass, when every one of them is plainly
    /// routable (available, untried, not excluded, not held off, its breaker letting it
    /// through): the candidates and every narrowing would then be that same list, in the same
    /// order. `None` as soon as one is not: the careful path decides.
    fn place_planned_direct(&self, ticket: &Ticket, board: &mut Board) -> Option<Placement> {
        let key = ticket.key.as_deref();
        let index = self.registry.by_model();
        let nodes = index.serving(key);
        if nodes.is_empty() {
            return None;
        }
        let now = Instant::now();
        // A first try over usual nodes: the tight pass (usual and untried is plainly routable).
        if ticket.tried.is_empty() && ticket.excluded.is_empty() {
            if let Some(plan) = board.plan_usual(nodes, key, &ticket.work, now) {
                return Some(self.take_plan(ticket, nodes, plan, false, board, now));
            }
        }
        let plain = |n: &Node| ticket.plainly_routable(n, now);
        let model_ref = key.map(crate::node::ModelRef::new);
        let plan = board.plan_plain(nodes, key, &ticket.work, now, |n| route::occupancy(n, model_ref), plain)?;
        Some(self.take_plan(ticket, nodes, plan, false, board, now))
    }

    /// Act on `plan` (an index into `eligible`): start now where its slot is free, else book
    /// the slot and keep waiting.
    fn take_plan(
        &self,
        ticket: &Ticket,
        eligible: &[Arc<Node>],
        plan: Plan,
        force: bool,
        board: &mut Board,
        now: Instant,
    ) -> Placement {
        let model = ticket.model.as_deref();
        let node = &eligible[plan.index];
        board.book(node, &plan, now);
        if plan.starts_now(now) {
            if let Some(mut g) = node.try_dispatch_at(force, now) {
                g.plan(model, Some(plan.finish));
                g.set_estimate(plan.finish.saturating_duration_since(ticket.arrived));
                return Placement::Placed(g);
            }
        }
        self.planned.store(true, Ordering::Release);
        Placement::Full
    }

    /// Run the dispatcher whenever a slot frees or a node changes, until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let wake = Arc::clone(self.registry.wake());
        loop {
            let replan = self.planned.load(Ordering::Acquire);
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = wake.notified() => self.dispatch(),
                _ = tokio::time::sleep(REPLAN_EVERY), if replan => self.dispatch(),
            }
        }
    }
}

/// Take a slot on `nodes[i]` for `ticket`, booked with what it should take there, so
/// `fastest-finish` requests know when this slot frees. `key` is the ticket's model key.
fn take_slot(
    nodes: &[Arc<Node>],
    i: usize,
    force: bool,
    ticket: &Ticket,
    key: Option<&str>,
    board: &mut Board,
    now: Instant,
) -> Placement {
    let service = board.quote_one(nodes, i, key, &ticket.work, now).service;
    match nodes[i].try_dispatch_at(force, now) {
        Some(mut g) => {
            let finish = now + service;
            g.plan(ticket.model.as_deref(), Some(finish));
            board.book(&nodes[i], &Plan { index: i, start: now, finish, service }, now);
            Placement::Placed(g)
        }
        None => Placement::Full,
    }
}

/// `nodes` without the ones `keep` rejects: borrowed as it is when it rejects none.
fn narrow<'a>(nodes: &'a [Arc<Node>], keep: impl Fn(&Node) -> bool) -> Cow<'a, [Arc<Node>]> {
    if nodes.iter().all(|n| keep(n)) {
        Cow::Borrowed(nodes)
    } else {
        Cow::Owned(nodes.iter().filter(|n| keep(n)).cloned().collect())
    }
}

struct QueueSlot<'a> {
    admission: &'a Admission,
    key: Key,
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.admission.remove(self.key);
    }
}
