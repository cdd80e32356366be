//! `/admin/providers`: the cloud providers a category may fall back to. Reads say, per
//! provider, whether its key is set in the keyring and bound to its origin (never the value):
//! `set`, `missing`, `unbound` (stored for another origin: a person confirms it with
//! `POST /admin/secrets/{name}/bind`) or `wrong_purpose`; a test asks the provider for one
//! token with its key, to check URL, key and model map together. Its error text never carries
//! the key (`cloud::mask_key`).

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::{edit, parse, AdminError, AdminState};
use crate::cloud::probe;
use crate::config::ProviderConfig;
use crate::secrets::KeyState;

pub(super) async fn list(State(s): State<AdminState>) -> Json<Value> {
    let config = s.shared.config();
    let needed: Vec<(String, String)> = config
        .providers
        .iter()
        .filter(|p| !p.secret.is_empty())
        .map(|p| (p.secret.clone(), p.base_url.clone()))
        .collect();
    // Keyring calls block on D-Bus: run them off the async workers.
    let states = tokio::task::spawn_blocking(move || {
        needed
            .into_iter()
            .map(|(n, url)| {
                let state = match crate::secrets::provider_key_state(&n, &url) {
                    Ok(KeyState::Set) => "set",
                    Ok(KeyState::Missing) => "missing",
                    Ok(KeyState::Unbound) => "unbound",
                    Ok(KeyState::WrongPurpose) => "wrong_purpose",
                    Err(_) => "unknown",
                };
                let bound = crate::secrets::bindings(&n).unwrap_or_default();
                ((n, url), (state, bound))
            })
            .collect::<std::collections::HashMap<_, _>>()
    })
    .await
    .unwrap_or_default();
    Json(json!(config
        .providers
        .iter()
        .map(|p| {
            let mut v = json!(p);
            let found = states.get(&(p.secret.clone(), p.base_url.clone()));
            v["secret_state"] =
                json!(if p.secret.is_empty() { "none" } else { found.map_or("unknown", |(state, _)| *state) });
            v["origin"] = json!(crate::secrets::origin_of(&p.base_url).ok());
            v["bound_origins"] = json!(found.map(|(_, b)| b.clone()).unwrap_or_default());
            v
        })
        .collect::<Vec<_>>()))
}

/// `PUT /admin/providers`: replace the whole list.
pub(super) async fn put_all(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let providers: Vec<ProviderConfig> = parse(&body)?;
    edit(&s, |next| {
        next.providers = providers;
        Ok(())
    })?;
    Ok(Json(json!(s.shared.config().providers)))
}

/// Ask a provider for one token with its key: does the URL, the key and the model map work?
pub(super) async fn test(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    let config = s.shared.config();
    let p = config.providers.iter().find(|p| p.name == name).ok_or(AdminError::NotFound { kind: "provider", name })?;
    let started = tokio::time::Instant::now();
    let result = probe(&s.shared.cloud_clients, p).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(Json(match result {
        Ok(model) => json!({ "name": p.name, "ok": true, "ms": ms, "model": model }),
        Err(e) => json!({ "name": p.name, "ok": false, "ms": ms, "error": e.to_string(), "code": e.code() }),
    }))
}
