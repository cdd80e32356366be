//! `/admin/secrets`: keys in the OS keyring, through `crate::secrets` (the only code that
//! touches values). The API stores and deletes values but never returns one: a read gives
//! names, what each is for and where a provider key may go, and for each secret the config
//! names, whether it is set. A key stored for a name that providers use is bound to those
//! providers' origins (and `origin` in the body); `POST .../bind` is a person re-confirming a
//! key for a provider's new origin. Keyring calls block on D-Bus, so they run on the blocking
//! pool.

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
    let entries = keyring(crate::secrets::entries).await?;
    Ok(Json(json!({ "stored": stored, "needed": status, "entries": entries })))
}

#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PutBody {
    value: String,
    /// Also bind the key to this origin (a URL).
    #[serde(default)]
    origin: Option<String>,
    /// "provider" | "client"; default: from the config (who names it).
    #[serde(default)]
    purpose: Option<String>,
}

/// `PUT /admin/secrets/{name}`: the body is the value (plain text, or JSON `{"value": ...,
/// "origin": ..., "purpose": "provider" | "client"}`). A name the config's providers use is
/// stored as a provider key bound to their origins; a listener's as a client key.
pub(super) async fn put(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let put = match serde_json::from_str::<Value>(&body) {
        Ok(v @ Value::Object(_)) => {
            serde_json::from_value::<PutBody>(v).map_err(|e| AdminError::BadBody(e.to_string()))?
        }
        _ => PutBody { value: body.trim_end_matches(['\r', '\n']).to_string(), ..PutBody::default() },
    };
    let config = s.shared.config();
    let mut origins: Vec<String> =
        config.providers.iter().filter(|p| p.secret == name).map(|p| p.base_url.clone()).collect();
    origins.extend(put.origin);
    let client = config.listeners.iter().any(|l| l.api_keys.contains(&name));
    let value = put.value;
    match put.purpose.as_deref() {
        Some("client") => keyring(move || crate::secrets::set_client_key(&name, &value)).await?,
        Some("provider") => keyring(move || crate::secrets::set_provider_key(&name, &value, &origins)).await?,
        Some(other) => return Err(AdminError::BadBody(format!("purpose \"{other}\" is not provider or client"))),
        None if !origins.is_empty() => {
            keyring(move || crate::secrets::set_provider_key(&name, &value, &origins)).await?
        }
        None if client => keyring(move || crate::secrets::set_client_key(&name, &value)).await?,
        None => keyring(move || crate::secrets::set(&name, &value)).await?,
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BindBody {
    /// The origin to confirm (a URL) ...
    #[serde(default)]
    origin: Option<String>,
    /// ... or the provider whose `base_url` it is.
    #[serde(default)]
    provider: Option<String>,
}

/// `POST /admin/secrets/{name}/bind` with `{"origin": URL}` or `{"provider": NAME}`: a person
/// confirms that provider key `name` may be sent to that origin.
pub(super) async fn bind(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, AdminError> {
    let b: BindBody = super::parse(&body)?;
    let origin = match (b.origin, b.provider) {
        (Some(o), _) => o,
        (None, Some(p)) => s
            .shared
            .config()
            .providers
            .iter()
            .find(|x| x.name == p)
            .map(|x| x.base_url.clone())
            .ok_or(AdminError::NotFound { kind: "provider", name: p })?,
        (None, None) => return Err(AdminError::BadBody("send {\"origin\": URL} or {\"provider\": NAME}".into())),
    };
    let n = name.clone();
    let bound = keyring(move || crate::secrets::bind(&n, &origin)).await?;
    let n = name.clone();
    let origins = keyring(move || crate::secrets::bindings(&n)).await?;
    Ok(Json(json!({ "name": name, "bound": bound, "origins": origins })))
}

pub(super) async fn delete(Path(name): Path<String>) -> Result<StatusCode, AdminError> {
    keyring(move || crate::secrets::delete(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
