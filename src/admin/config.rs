//! `/admin/config/export` and `/admin/config/import`: the running config as TOML, and a TOML
//! file merged into (or replacing) it. An import always shows its preview (added, changed,
//! removed, secrets needed); unless it is a dry run, the result is validated whole and swapped
//! in, and a broken file leaves the running config as it was.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{commit, validate, AdminError, AdminState};
use crate::config::{Config, ImportMode};

pub(super) async fn export(State(s): State<AdminState>) -> Response {
    let text = crate::config::export_text(&s.shared.config());
    ([(header::CONTENT_TYPE, "application/toml; charset=utf-8")], text).into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct ImportQuery {
    mode: Option<ImportMode>,
    dry_run: Option<bool>,
}

/// `POST /admin/config/import?mode=merge|replace&dry_run=true` with a TOML body: the preview
/// (added, changed, removed, secrets needed) and, unless a dry run, the swap.
pub(super) async fn import(
    State(s): State<AdminState>,
    Query(q): Query<ImportQuery>,
    body: String,
) -> Result<Json<Value>, AdminError> {
    let incoming =
        Config::parse(&body).map_err(|e| AdminError::Invalid(e.problems.iter().map(|p| p.to_string()).collect()))?;
    let mode = q.mode.unwrap_or(ImportMode::Merge);
    let (next, changes) = crate::config::import(&s.shared.config(), &incoming, mode);
    let secrets = crate::config::secret_names(&next);
    let dry_run = q.dry_run.unwrap_or(false);
    if dry_run {
        validate(&next)?;
    } else {
        commit(&s, next)?;
    }
    Ok(Json(json!({ "mode": mode, "dry_run": dry_run, "changes": changes, "secrets_needed": secrets })))
}
