//! `/admin/models/pull`: pull a model onto chosen nodes (all serving nodes when none are
//! named), streaming each node's progress as NDJSON. The pulling itself is the proxy's fan-out,
//! recorded like a client's pull: an unknown node name is refused before anything starts (400
//! `unknown_node`, naming the nodes there are), and a pull no node could start is one JSON error
//! naming each node and why (503 `no_node_reachable` when none could be reached).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{parse, AdminError, AdminState};
use crate::proxy::pull;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PullRequest {
    name: String,
    #[serde(default)]
    nodes: Vec<String>,
}

/// Pull a model onto the named nodes (all serving nodes when none are named), streaming each
/// node's progress as NDJSON lines (`{"node": ..., "status": ..., "completed": ..., "total": ...}`).
pub(super) async fn pull_model(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Response, AdminError> {
    let req: PullRequest = parse(&body)?;
    Ok(pull(&s.shared, &req.name, &req.nodes).await.into_response())
}
