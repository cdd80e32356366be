//! Client keys in a fleet (`[store] url`): a key is created once for every broker. Its value
//! goes to the caller (once) and its SHA-256 verifier into the fleet's database, never into a
//! keyring or a file, so it works at once on every listener of every broker whose `api_keys`
//! name it or say `"*"` (`config::ANY_FLEET_KEY`). Revoking removes the verifier: it stops on
//! every broker within a second. Reads add the fleet's names and usage summed over brokers.

use axum::Json;
use http::StatusCode;
use serde_json::{json, Value};

use super::{AdminError, AdminState};
use crate::fleet::{keys, Fleet};
use crate::store::StoreError;

fn db(e: sqlx::Error) -> AdminError {
    AdminError::Store(StoreError::from(e))
}

/// The listeners (indexes) of this broker that accept the fleet key `name`.
fn accepting(s: &AdminState, name: &str) -> Vec<usize> {
    let config = s.shared.config();
    let takes =
        |l: &crate::config::ListenerConfig| l.api_keys.iter().any(|k| k == name || k == crate::config::ANY_FLEET_KEY);
    config.listeners.iter().enumerate().filter(|(_, l)| takes(l)).map(|(i, _)| i).collect()
}

/// `POST /admin/client-keys` in a fleet: the verifier into the database, the value back once.
pub(super) async fn create(
    s: &AdminState,
    fleet: &Fleet,
    name: String,
    value: String,
    listeners: Option<Vec<usize>>,
) -> Result<(StatusCode, Json<Value>), AdminError> {
    if listeners.is_some() {
        return Err(AdminError::Invalid(vec![format!(
            "listeners: in a fleet a client key is for every broker; each listener whose api_keys name \"{name}\" or say \"*\" takes it"
        )]));
    }
    if !keys::create(fleet, &name, &crate::clients::verifier(&value)).await.map_err(db)? {
        return Err(AdminError::Conflict { kind: "client key", name });
    }
    // In force here at once; the other brokers follow the database's notification.
    if let Ok(loaded) = keys::load(fleet.pool()).await {
        s.shared.client_keys.set_verifiers(loaded);
    }
    let on = accepting(s, &name);
    tracing::info!(client_key = %name, listeners = ?on, "fleet client key created");
    let note = on
        .is_empty()
        .then(|| format!("no listener of this broker takes it yet: add \"{name}\" or \"*\" to a listener's api_keys"));
    let answer = json!({
        "name": name, "key": value, "listeners": on, "fleet": true,
        "saved_to": null, "restart_needed": false, "note": note,
    });
    Ok((StatusCode::CREATED, Json(answer)))
}

/// `DELETE /admin/client-keys/{name}` in a fleet: whether a verifier was removed.
pub(super) async fn revoke(fleet: &Fleet, s: &AdminState, name: &str) -> Result<bool, AdminError> {
    let removed = keys::revoke(fleet, name).await.map_err(db)?;
    if removed {
        if let Ok(loaded) = keys::load(fleet.pool()).await {
            s.shared.client_keys.set_verifiers(loaded);
        }
        tracing::info!(client_key = %name, "fleet client key revoked");
    }
    Ok(removed)
}

/// The fleet's key names and each key's usage over every broker (`None` while the database
/// does not answer, with the error).
pub(super) async fn listed(fleet: &Fleet) -> (Vec<String>, Vec<keys::KeyUsage>, Option<String>) {
    match (keys::names(fleet).await, keys::usage(fleet).await) {
        (Ok(n), Ok(u)) => (n, u, None),
        (Err(e), _) | (_, Err(e)) => (Vec::new(), Vec::new(), Some(e.to_string())),
    }
}

/// A key's row in the listing, with its fleet-wide usage where there is one.
pub(super) fn with_usage(mut row: Value, usage: &[keys::KeyUsage], fleet_names: &[String]) -> Value {
    let name = row["name"].as_str().unwrap_or_default().to_string();
    row["fleet"] = json!(fleet_names.contains(&name));
    if let Some(u) = usage.iter().find(|u| u.name == name) {
        row["usage"] =
            json!({ "requests": u.requests, "prompt_tokens": u.prompt_tokens, "output_tokens": u.output_tokens });
    }
    row
}
