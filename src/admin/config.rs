//! `/admin/config/export` and `/admin/config/import`: the running config as TOML, and a TOML
//! file merged into (or replacing) it. An import always shows its preview (added, changed,
//! removed, each changed field old -> new, the trust changes in words, secrets needed); unless
//! it is a dry run, the result is validated whole and swapped in, and a broken file leaves the
//! running config as it was. Trust changes apply only when accepted by id (`accept=a,b`) or all
//! at once (`accept_all=true`); the others are held back and the answer lists them.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{edit, validate, AdminError, AdminState};
use crate::config::{Accept, ImportMode};

/// `POST /admin/config/save`: a broker started without a config file (the demo, a first
/// desktop start) writes what it runs into this machine's config file, and from then on every
/// edit goes there too and hand edits of it are reloaded. An existing file is never overwritten
/// (start with `--config` to use it).
pub(super) async fn save(State(s): State<AdminState>) -> Result<Json<Value>, AdminError> {
    if let Some(path) = s.shared.config_file() {
        return Ok(Json(json!({ "saved_to": path.display().to_string(), "new": false })));
    }
    let write_error = |path: &std::path::Path, detail: String| {
        AdminError::ConfigFile(crate::config::EditError::Write { path: path.display().to_string(), detail })
    };
    let Some(path) = crate::config::default_path() else {
        return Err(write_error(std::path::Path::new("corral.toml"), "this machine has no config directory".into()));
    };
    if path.exists() {
        return Err(AdminError::Conflict { kind: "config file", name: path.display().to_string() });
    }
    let text = crate::config::export_text(&s.shared.config());
    crate::config::write_private(&path, &text).map_err(|e| write_error(&path, e.to_string()))?;
    s.shared.set_config_file(path.clone());
    let shared = std::sync::Arc::clone(&s.shared);
    match crate::reload::watch(path.clone(), shared, std::sync::Arc::clone(&s.shared.reload), s.shared.shutdown.clone())
    {
        Ok(task) => {
            s.shared.tasks.spawn(task);
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot watch the saved config; hand edits need a restart")
        }
    }
    tracing::info!(path = %path.display(), "running config saved as this machine's config file");
    Ok(Json(json!({ "saved_to": path.display().to_string(), "new": true })))
}

pub(super) async fn export(State(s): State<AdminState>) -> Response {
    let text = crate::config::share_text(&s.shared.config());
    ([(header::CONTENT_TYPE, "application/toml; charset=utf-8")], text).into_response()
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct ImportQuery {
    #[param(inline)]
    mode: Option<ImportMode>,
    dry_run: Option<bool>,
    /// Trust change ids a person confirmed, comma-separated.
    accept: Option<String>,
    /// Confirm every trust change listed.
    accept_all: Option<bool>,
}

/// `POST /admin/config/import?mode=merge|replace&dry_run=true` with a TOML body: the preview
/// (added, changed, removed, secrets needed) and, unless a dry run, the swap.
pub(super) async fn import(
    State(s): State<AdminState>,
    Query(q): Query<ImportQuery>,
    body: Result<String, axum::extract::rejection::StringRejection>,
) -> Result<Json<Value>, AdminError> {
    // Past the listener's body limit (2 MB) axum's own plain-text 413 would answer: say it as
    // every other refusal is said.
    let body = body.map_err(|e| AdminError::Invalid(vec![e.body_text()]))?;
    let mode = q.mode.unwrap_or(ImportMode::Merge);
    let accept = if q.accept_all.unwrap_or(false) {
        Accept::All
    } else {
        let ids = q.accept.unwrap_or_default();
        Accept::Ids(ids.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
    };
    let plan_on = |base: &crate::config::Config| {
        crate::config::plan(base, &body, mode, &accept)
            .map_err(|e| AdminError::Invalid(e.problems.iter().map(|p| p.to_string()).collect()))
    };
    let dry_run = q.dry_run.unwrap_or(false);
    let plan = if dry_run {
        let plan = plan_on(&s.shared.config())?;
        validate(&plan.next)?;
        plan
    } else {
        // Planned on the config in force under the edit lock, so an edit made meanwhile is kept.
        let plan = edit(&s, |running| {
            let plan = plan_on(running)?;
            *running = plan.next.clone();
            Ok(plan)
        })?;
        if !plan.held_back.is_empty() {
            tracing::warn!(held_back = ?plan.held_back, "import applied without its unconfirmed trust changes");
        }
        plan
    };
    let secrets = crate::config::secret_names(&plan.next);
    Ok(Json(json!({
        "mode": mode,
        "dry_run": dry_run,
        "changes": plan.changes,
        "trust": plan.trust,
        "held_back": plan.held_back,
        "notes": plan.notes,
        "secrets_needed": secrets,
    })))
}
