//! `/admin/secrets`: cloud API keys in the OS keyring, through `crate::secrets` (the only code
//! that touches values). The API stores and deletes values but never returns one: a read
//! gives names, and for each secret the config names, whether it is set. Keyring calls block
//! on D-Bus, so they run on the blocking pool.

use axum::extract::{Path, State};
use axum::Json;
use http::StatusCode;
use serde_json::{json, Value};

use super::{AdminError, AdminState};
use crate::secrets::SecretError;

/// Keyring calls block on D-Bus: run them off the async workers.
async fn keyring<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SecretError> + Send + 'static,
) -> Result<T, AdminError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AdminError::Secret(SecretError::Keyring(e.to_string())))?
        .map_err(AdminError::from)
}

/// `GET /admin/secrets`: the stored names, and for every secret the config names, whether it
/// is set. Never a value.
pub(super) async fn list(State(s): State<AdminState>) -> Result<Json<Value>, AdminError> {
    let needed = crate::config::secret_names(&s.shared.config());
    let stored = keyring(crate::secrets::list).await?;
    let status: serde_json::Map<String, Value> = needed
        .iter()
        .map(|n| (n.clone(), Value::String(if stored.contains(n) { "set" } else { "missing" }.into())))
        .collect();
    Ok(Json(json!({ "stored": stored, "needed": status })))
}

/// `PUT /admin/secrets/{name}`: the body is the value (plain text, or JSON `{"value": ...}`).
pub(super) async fn put(Path(name): Path<String>, body: String) -> Result<StatusCode, AdminError> {
    let value = match serde_json::from_str::<Value>(&body) {
        Ok(Value::Object(o)) => o.get("value").and_then(Value::as_str).map(str::to_string).unwrap_or_default(),
        _ => body.trim_end_matches(['\r', '\n']).to_string(),
    };
    keyring(move || crate::secrets::set(&name, &value)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn delete(Path(name): Path<String>) -> Result<StatusCode, AdminError> {
    keyring(move || crate::secrets::delete(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
