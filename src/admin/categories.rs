//! `/admin/categories`: the request classes (policy, priority, queue timeout, cloud rule).
//! Every edit is applied to a copy of the running config, validated whole, then swapped in, so
//! the categories' routers are rebuilt only from a config `corral config check` would accept.

use axum::extract::{Path, State};
use axum::Json;
use http::StatusCode;
use serde_json::{json, Value};

use super::{edit, parse, AdminError, AdminState};
use crate::config::CategoryConfig;

pub(super) async fn list(State(s): State<AdminState>) -> Json<Value> {
    Json(json!(s.shared.config().categories))
}

pub(super) async fn get(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    let config = s.shared.config();
    let c = config.category(&name).ok_or(AdminError::NotFound { kind: "category", name })?;
    Ok(Json(json!(c)))
}

/// `PUT /admin/categories`: replace the whole list.
pub(super) async fn put_all(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let categories: Vec<CategoryConfig> = parse(&body)?;
    edit(&s, |next| {
        next.categories = categories;
        Ok(())
    })?;
    Ok(Json(json!(s.shared.config().categories)))
}

/// `PUT /admin/categories/{name}`: replace one, or add it; the path names it.
pub(super) async fn put(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, AdminError> {
    let mut category: CategoryConfig = parse(&body)?;
    category.name = name.clone();
    edit(&s, |next| {
        match next.categories.iter_mut().find(|c| c.name == name) {
            Some(slot) => *slot = category,
            None => next.categories.push(category),
        }
        Ok(())
    })?;
    let config = s.shared.config();
    Ok(Json(json!(config.category(&name))))
}

pub(super) async fn delete(State(s): State<AdminState>, Path(name): Path<String>) -> Result<StatusCode, AdminError> {
    edit(&s, |next| {
        let before = next.categories.len();
        next.categories.retain(|c| c.name != name);
        if next.categories.len() == before {
            return Err(AdminError::NotFound { kind: "category", name: name.clone() });
        }
        Ok(())
    })?;
    Ok(StatusCode::NO_CONTENT)
}
