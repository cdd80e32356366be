//! `/admin/models/pull`: pull a model onto chosen nodes (all serving nodes when none are
//! named), streaming each node's progress as NDJSON. Unknown node names are refused before
//! anything starts; the pulling itself is the proxy's fan-out.

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
    for n in &req.nodes {
        if s.shared.registry.get(n).is_none() {
            return Err(AdminError::NotFound { kind: "node", name: n.clone() });
        }
    }
    Ok(pull(&s.shared, &req.name, &req.nodes).await.into_response())
}
