//! `GET /admin/brokers`: the fleet's brokers (several brokers on one PostgreSQL) as this
//! broker last read them, at most one heartbeat old: address, version, config version, last
//! seen, in-flight, queue, keeper, gone. Served from memory: the page never waits on the
//! database, and says how old its view is. A broker alone lists only itself.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::AdminState;
use crate::fleet::members::Member;

/// The answer of `GET /admin/brokers`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Brokers {
    /// Whether this broker is one of a fleet (`[store] url` on PostgreSQL).
    pub fleet: bool,
    /// This broker's name.
    pub this: String,
    /// Since the list was read from the database; `None` alone or before the first read.
    pub read_ms_ago: Option<u64>,
    /// The last error reading it, while reads fail (the list is then the last one read).
    pub error: Option<String>,
    pub brokers: Vec<Member>,
}

pub(super) async fn list(State(s): State<AdminState>) -> Json<Brokers> {
    let Some(fleet) = &s.fleet else { return Json(alone(&s)) };
    let seen = fleet.members();
    Json(Brokers {
        fleet: true,
        this: fleet.name().to_string(),
        read_ms_ago: seen.read_at.map(|t| t.elapsed().as_millis() as u64),
        error: seen.last_error,
        brokers: seen.members,
    })
}

/// A broker without a fleet: itself, live now.
fn alone(s: &AdminState) -> Brokers {
    let now = crate::store::now_ms();
    let name = s.shared.telemetry.store().map(|st| st.broker().to_string()).unwrap_or_else(|| "corral".into());
    let (front, _) = s.shared.front();
    let me = Member {
        name: name.clone(),
        admin_url: s.shared.admin_addr().map(|a| format!("http://{a}")).unwrap_or_default(),
        proxy_url: front.first().cloned().unwrap_or_default(),
        version: env!("CARGO_PKG_VERSION").into(),
        config_version: None,
        started_at_ms: s.shared.started_at_ms(),
        last_seen_ms: now,
        last_seen_ms_ago: 0,
        in_flight: s.shared.registry.all().iter().map(|n| n.in_flight() as i64).sum(),
        queued: s.shared.admission.depth() as i64,
        keeper: true,
        gone: false,
    };
    Brokers { fleet: false, this: name, read_ms_ago: None, error: None, brokers: vec![me] }
}
