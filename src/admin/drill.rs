//! `POST /admin/drill`: rehearse failover. Take one node out, send a small batch of tiny
//! requests through each category as a client would, put the node back, and answer what the
//! clients saw: per request the status, who served it (`X-Corral-Node`, or the provider of
//! `X-Corral-Fallback`), the attempts (`X-Corral-Attempts`), the time and any error code; per
//! category the tally. Operators do this before they need failover, not during.
//!
//! The batch goes through the broker's own proxy listener on loopback (one that takes requests
//! without a client key), so each request runs the whole request path, classify, admit, route,
//! retry, fall back, record, exactly as a client's would: the answer is what a client gets, not
//! what the router would pick. The requests are recorded like any other, with an
//! `X-Request-Id` starting `drill-`.
//!
//! Invariants: one drill at a time per broker (a second gets 409 `drill_running`); the batch is
//! bounded (at most [`MAX_REQUESTS`] per category, sent together, each bounded by
//! [`SHOT_TIMEOUT`], one category after the other); the node taken out is always put back as it was, on success, on error and
//! when the admin client goes away mid-drill (a guard restores it on drop). "Taking out" is
//! the runtime drain (`PATCH /admin/nodes/{name}` with `draining`: the router sends the node
//! nothing), or, on a simulated node, a fault set through its `/_sim/faults` (every inference
//! request answers 500, so requests still reach it and fail over, breaker and retries
//! included); the sim's own faults are saved first and put back after. Neither is a config
//! change, so nothing of the drill survives a restart. The drill decides nothing about routing
//! itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{parse, AdminError, AdminState};
use crate::config::{CategoryConfig, Config};
use crate::node::{Admin, Node, NodeState, Registry};

/// Requests per category when the caller names no number.
pub const DEFAULT_REQUESTS: usize = 3;
/// The most requests per category one drill sends.
pub const MAX_REQUESTS: usize = 20;
/// The longest the drill waits for one answer before it counts the request as `client_timeout`.
pub const SHOT_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a sim's control endpoint may take to answer.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a drill is running on this broker: one at a time.
#[derive(Debug, Clone, Default)]
pub struct Drills(Arc<AtomicBool>);

/// Held while a drill runs; dropping it lets the next one start.
struct Running(Arc<AtomicBool>);

impl Drills {
    fn begin(&self) -> Option<Running> {
        let free = self.0.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok();
        free.then(|| Running(Arc::clone(&self.0)))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The body of `POST /admin/drill`; every field may be left out.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = DrillRequest)]
pub(super) struct Ask {
    /// The node to take out; default: the busiest serving node (the first, on a tie).
    node: Option<String>,
    /// Only this category; default: every category.
    category: Option<String>,
    /// Requests per category, 1 to [`MAX_REQUESTS`].
    requests: Option<usize>,
    /// How to take the node out; default: drain.
    take_out: Option<How>,
}

/// How the node is taken out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum How {
    /// The runtime drain: no new requests go to it; what the router does when a node leaves.
    #[default]
    Drain,
    /// A simulated node (`corral sim`) answers every inference request with HTTP 500 through
    /// its `/_sim/faults` control endpoint: requests still reach it and fail over, as they
    /// would when a node breaks without warning.
    Fault,
}

/// The node taken out, put back as it was by [`TakenOut::put_back`], or, when the drill ends
/// any other way (an error, the admin client gone), when this is dropped.
struct TakenOut {
    node: Arc<Node>,
    /// For a fault: the control URL, the faults the sim had before, and the client to restore
    /// them with; `None` once they are restored.
    fault: Option<(String, Value, reqwest::Client)>,
}

impl TakenOut {
    fn drain(node: &Arc<Node>) -> Self {
        node.set_admin(Admin::Draining);
        Self { node: Arc::clone(node), fault: None }
    }

    /// Make the sim fail every inference request, keeping what it had to put back.
    async fn fault(node: &Arc<Node>, client: &reqwest::Client) -> Result<Self, AdminError> {
        let url = format!("{}/_sim/faults", node.config.url.trim_end_matches('/'));
        let not_sim = || AdminError::DrillNotSim(node.name().to_string());
        let r = client.get(&url).timeout(CONTROL_TIMEOUT).send().await.map_err(|_| not_sim())?;
        let saved: Value = match r.status().is_success() {
            true => r.json().await.map_err(|_| not_sim())?,
            false => return Err(not_sim()),
        };
        let mut broken = saved.clone();
        broken["script"] = json!([{ "status": 500, "times": 1_000_000 }]);
        let set = client.post(&url).timeout(CONTROL_TIMEOUT).json(&broken).send().await;
        if !set.is_ok_and(|r| r.status().is_success()) {
            return Err(not_sim());
        }
        Ok(Self { node: Arc::clone(node), fault: Some((url, saved, client.clone())) })
    }

    /// Put the node back and say how that went.
    async fn put_back(mut self) -> Result<(), String> {
        let Some((url, saved, client)) = self.fault.take() else { return Ok(()) };
        match client.post(&url).timeout(CONTROL_TIMEOUT).json(&saved).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("{url} answered HTTP {} to the restore", r.status().as_u16())),
            Err(e) => Err(format!("cannot restore the faults at {url}: {e}")),
        }
    }
}

impl Drop for TakenOut {
    fn drop(&mut self) {
        if let Some((url, saved, client)) = self.fault.take() {
            // The drill was cut short: restore on a task of its own.
            tokio::spawn(async move { client.post(&url).timeout(CONTROL_TIMEOUT).json(&saved).send().await });
            return;
        }
        // An operator who disabled the node meanwhile keeps it disabled.
        if self.node.admin() == Admin::Draining {
            self.node.set_admin(Admin::Active);
        }
    }
}

/// What one category's requests look like: which model, which endpoint, through which listener.
#[derive(Debug, Clone)]
struct Plan {
    category: String,
    model: String,
    path: &'static str,
    front: String,
}

/// One request as its client saw it.
#[derive(Debug, Clone, Serialize)]
struct Shot {
    category: String,
    n: usize,
    model: String,
    /// HTTP status; none when no answer came at all.
    status: Option<u16>,
    /// The node that served it, or `cloud:<provider>` for a fallback; only on success.
    served_by: Option<String>,
    fallback: Option<String>,
    degraded: Option<String>,
    attempts: Option<u32>,
    ms: f64,
    /// Corral's error code (`{"code"}` of its error body), `http_<status>` for an error without
    /// one, `client_timeout` or `no_answer` when no answer came.
    code: Option<String>,
    error: Option<String>,
}

impl Shot {
    fn served(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

pub(super) async fn drill(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let ask: Ask = if body.iter().all(u8::is_ascii_whitespace) { Ask::default() } else { parse(&body)? };
    let per = ask.requests.unwrap_or(DEFAULT_REQUESTS);
    if !(1..=MAX_REQUESTS).contains(&per) {
        return Err(AdminError::BadBody(format!("requests must be 1 to {MAX_REQUESTS}, not {per}")));
    }
    let config = s.shared.config();
    let categories = categories(&config, ask.category.as_deref())?;
    let registry = &s.shared.registry;
    let node = pick(registry, ask.node.as_deref())?;
    let (front, _) = s.shared.front();
    if front.is_empty() {
        return Err(AdminError::DrillNoListener);
    }
    let _running = s.drills.begin().ok_or(AdminError::DrillRunning)?;
    let (plans, skipped) = plans(&config, front, registry, &node, &categories);
    let others = registry.all().iter().filter(|n| n.name() != node.name() && n.is_available()).count();
    let how = ask.take_out.unwrap_or_default();
    let started = Instant::now();
    let out = match how {
        How::Drain => TakenOut::drain(&node),
        How::Fault => TakenOut::fault(&node, &s.shared.client).await?,
    };
    tracing::info!(node = %node.name(), ?how, categories = plans.len(), per, "drill: node taken out");
    let shots = batch(&s.shared.client, &plans, per).await;
    let restore = out.put_back().await;
    match &restore {
        Ok(()) => tracing::info!(node = %node.name(), state = node.state().name(), "drill: node put back"),
        Err(e) => tracing::warn!(node = %node.name(), error = %e, "drill: node not put back"),
    }
    let mut v = answer(&node, others, &plans, &skipped, &shots, started.elapsed());
    v["taken_out"] = json!(how);
    v["restore_error"] = json!(restore.err());
    Ok(Json(v))
}

/// Each plan's requests at once, as a burst of clients would send them (so they spread over
/// the nodes as real traffic does), one category after the other.
async fn batch(client: &reqwest::Client, plans: &[Plan], per: usize) -> Vec<Shot> {
    let mut shots = Vec::with_capacity(plans.len() * per);
    for plan in plans {
        shots.extend(futures_util::future::join_all((1..=per).map(|n| shoot(client, plan, n))).await);
    }
    shots
}

/// The categories to drill: the one named, or all of them.
fn categories(config: &Config, only: Option<&str>) -> Result<Vec<CategoryConfig>, AdminError> {
    match only {
        Some(name) => match config.category(name) {
            Some(c) => Ok(vec![c.clone()]),
            None => Err(AdminError::NotFound { kind: "category", name: name.to_string() }),
        },
        None => Ok(config.categories.clone()),
    }
}

/// The node named (it must be serving: a node already out teaches nothing), else the busiest
/// serving node, the first of them on a tie.
fn pick(registry: &Registry, name: Option<&str>) -> Result<Arc<Node>, AdminError> {
    let all = registry.all();
    if let Some(name) = name {
        let node = registry.get(name).ok_or_else(|| AdminError::NotFound { kind: "node", name: name.to_string() })?;
        return match node.state() {
            NodeState::Draining | NodeState::Disabled => {
                Err(AdminError::DrillNodeOut { name: name.to_string(), state: node.state().name() })
            }
            _ => Ok(node),
        };
    }
    let serving = all.iter().filter(|n| n.is_available());
    let busiest = serving.fold(None::<&Arc<Node>>, |best, n| match best {
        Some(b) if b.in_flight() >= n.in_flight() => Some(b),
        _ => Some(n),
    });
    busiest.cloned().ok_or(AdminError::DrillNoNode { nodes: all.len() })
}

/// One plan per category that can be drilled, and why each other one cannot.
fn plans(
    config: &Config,
    front: &[String],
    registry: &Registry,
    node: &Node,
    categories: &[CategoryConfig],
) -> (Vec<Plan>, Vec<(String, String)>) {
    let (mut plans, mut skipped) = (Vec::new(), Vec::new());
    for c in categories {
        let Some(front) = front_for(config, front, &c.name) else {
            skipped.push((c.name.clone(), "no proxy listener takes this category without a client key".into()));
            continue;
        };
        let Some(model) = model_for(c, registry, node) else {
            let why = "no node lists a model for this category yet (wait for the first deep probe)";
            skipped.push((c.name.clone(), why.into()));
            continue;
        };
        let path = if is_embedding(&model) { "/api/embed" } else { "/api/chat" };
        plans.push(Plan { category: c.name.clone(), model, path, front });
    }
    (plans, skipped)
}

/// The proxy URL for `category`: a listener with no client keys that allows the category, a
/// `local` one first. Listeners and the URLs they were bound to are in the same order; an
/// unspecified bind address (`0.0.0.0`, `[::]`) is reached on loopback.
fn front_for(config: &Config, front: &[String], category: &str) -> Option<String> {
    let open = |l: &crate::config::ListenerConfig| {
        l.api_keys.is_empty() && (l.categories.is_empty() || l.categories.iter().any(|c| c == category))
    };
    let mut fit: Vec<(&crate::config::ListenerConfig, &String)> =
        config.listeners.iter().zip(front).filter(|(l, _)| open(l)).collect();
    fit.sort_by_key(|(l, _)| l.origin != crate::config::Origin::Local);
    let url = fit.first()?.1;
    let addr: std::net::SocketAddr = url.strip_prefix("http://")?.parse().ok()?;
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    Some(format!("http://{}", std::net::SocketAddr::new(ip, addr.port())))
}

/// The model a category's requests ask for: the first that places a request in the category
/// (its `models` patterns; any chat model when it has none), from the node taken out when it
/// has one (that is the traffic being rehearsed), else from any node.
fn model_for(category: &CategoryConfig, registry: &Registry, node: &Node) -> Option<String> {
    let fits = |m: &str| {
        if category.models.is_empty() {
            !is_embedding(m)
        } else {
            category.models.iter().any(|p| crate::proxy::glob(p, m))
        }
    };
    let first = |n: &Node| n.models().and_then(|ms| ms.into_iter().find(|m| fits(m)));
    first(node).or_else(|| registry.all().iter().find_map(|n| first(n)))
}

/// Ollama's own rule of thumb: an embedding model says so in its name.
fn is_embedding(model: &str) -> bool {
    model.contains("embed")
}

/// Send one tiny request and note what came back.
async fn shoot(client: &reqwest::Client, plan: &Plan, n: usize) -> Shot {
    let body = if plan.path == "/api/embed" {
        json!({ "model": plan.model, "input": "corral drill" })
    } else {
        json!({
            "model": plan.model,
            "messages": [{ "role": "user", "content": "corral drill: answer with one word" }],
            "stream": false,
            "options": { "num_predict": 8 },
        })
    };
    let started = Instant::now();
    let sent = client
        .post(format!("{}{}", plan.front, plan.path))
        .header("x-corral-category", &plan.category)
        .header("x-request-id", format!("drill-{}-{n}", plan.category))
        .timeout(SHOT_TIMEOUT)
        .json(&body)
        .send()
        .await;
    let mut shot = Shot {
        category: plan.category.clone(),
        n,
        model: plan.model.clone(),
        status: None,
        served_by: None,
        fallback: None,
        degraded: None,
        attempts: None,
        ms: 0.0,
        code: None,
        error: None,
    };
    match sent {
        Ok(r) => read_answer(&mut shot, r).await,
        Err(e) => {
            shot.code = Some(if e.is_timeout() { "client_timeout" } else { "no_answer" }.into());
            shot.error = Some(e.to_string());
        }
    }
    shot.ms = started.elapsed().as_secs_f64() * 1000.0;
    shot
}

/// Fill in what the answer's headers and body say.
async fn read_answer(shot: &mut Shot, r: reqwest::Response) {
    let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let status = r.status().as_u16();
    shot.status = Some(status);
    shot.attempts = header("x-corral-attempts").and_then(|a| a.parse().ok());
    shot.fallback = header("x-corral-fallback");
    shot.degraded = header("x-corral-degraded");
    let node = header("x-corral-node");
    let body = match r.bytes().await {
        Ok(b) => b,
        Err(e) => {
            // The head said one thing, the body never came: the client saw a failure.
            shot.code = Some("no_answer".into());
            shot.error = Some(format!("the answer broke off: {e}"));
            shot.status = None;
            return;
        }
    };
    if shot.served() {
        shot.served_by = shot.fallback.as_ref().map(|p| format!("cloud:{p}")).or(node);
        return;
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shot.code = Some(v["code"].as_str().map_or_else(|| format!("http_{status}"), str::to_string));
    let text = v["error"].as_str().or(v["error"]["message"].as_str()).map(str::to_string);
    shot.error = Some(text.unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect()));
}

/// The drill's answer: the node, every request, and a tally per category.
fn answer(
    node: &Node,
    others: usize,
    plans: &[Plan],
    skipped: &[(String, String)],
    shots: &[Shot],
    took: Duration,
) -> Value {
    let mut per_category: Vec<Value> = plans.iter().map(|p| tally(p, shots)).collect();
    for (category, why) in skipped {
        per_category.push(json!({ "category": category, "sent": 0, "served": 0, "skipped": why }));
    }
    let note = (others == 0).then(|| {
        format!("{} was the only serving node: these are the answers clients get when no node can serve", node.name())
    });
    json!({
        "node": node.name(),
        "restored": node.state(),
        "breaker": node.breaker_state(),
        "other_serving_nodes": others,
        "note": note,
        "took_ms": took.as_secs_f64() * 1000.0,
        "results": shots,
        "per_category": per_category,
    })
}

/// One category's requests, summed up.
fn tally(plan: &Plan, shots: &[Shot]) -> Value {
    let mine: Vec<&Shot> = shots.iter().filter(|s| s.category == plan.category).collect();
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &mine {
        if let Some(who) = s.served_by.as_deref().filter(|_| s.served()) {
            *by.entry(who).or_default() += 1;
        }
        if let Some(code) = s.code.as_deref() {
            *errors.entry(code).or_default() += 1;
        }
    }
    let mut ms: Vec<f64> = mine.iter().map(|s| s.ms).collect();
    ms.sort_by(f64::total_cmp);
    let p50 = ms.get(ms.len().saturating_sub(1) / 2).copied();
    json!({
        "category": plan.category,
        "model": plan.model,
        "sent": mine.len(),
        "served": mine.iter().filter(|s| s.served()).count(),
        "by": by,
        "p50_ms": p50,
        "max_ms": ms.last().copied(),
        "errors": errors.into_iter().map(|(code, count)| json!({ "code": code, "count": count })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::Drills;

    #[test]
    fn one_drill_at_a_time_and_the_next_may_start_when_it_ends() {
        let drills = Drills::default();
        let first = drills.begin().expect("no drill is running");
        assert!(drills.begin().is_none(), "a second drill must wait for the first");
        drop(first);
        assert!(drills.begin().is_some(), "the first drill ended, so the next may start");
    }
}
