//! `/admin/providers`: the cloud providers a category may fall back to. Reads say, per
//! provider, whether its secret is set in the keyring (never the value); a test asks the
//! provider for one token with its key, to check URL, key and model map together.

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::{commit, parse, AdminError, AdminState};
use crate::cloud::probe;
use crate::config::{Config, ProviderConfig};

pub(super) async fn list(State(s): State<AdminState>) -> Json<Value> {
    let config = s.shared.config();
    let needed: Vec<String> = config.providers.iter().map(|p| p.secret.clone()).filter(|n| !n.is_empty()).collect();
    // Keyring calls block on D-Bus: run them off the async workers.
    let states = tokio::task::spawn_blocking(move || {
        needed
            .into_iter()
            .map(|n| {
                let state = match crate::secrets::is_set(&n) {
                    Ok(true) => "set",
                    Ok(false) => "missing",
                    Err(_) => "unknown",
                };
                (n, state)
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
            v["secret_state"] =
                json!(if p.secret.is_empty() { "none" } else { states.get(&p.secret).copied().unwrap_or("unknown") });
            v
        })
        .collect::<Vec<_>>()))
}

/// `PUT /admin/providers`: replace the whole list.
pub(super) async fn put_all(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let providers: Vec<ProviderConfig> = parse(&body)?;
    let mut next = Config::clone(&s.shared.config());
    next.providers = providers;
    commit(&s, next)?;
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
