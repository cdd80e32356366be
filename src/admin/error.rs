//! The admin API's one error type: a stable `code()` (listed in `docs/errors.md`), an HTTP
//! `status()`, and the one `IntoResponse` that turns it into `{"error", "code"}` (plus
//! `problems` for an invalid config, and `WWW-Authenticate: Bearer` on 401). Secret store
//! failures keep their own codes. Admin errors carry no `forwarded` field: nothing here is
//! ever sent to a node.

use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderValue, StatusCode};
use serde_json::json;

use crate::charts::ChartError;
use crate::config::EditError;
use crate::secrets::SecretError;
use crate::store::StoreError;

/// Errors of the admin API, each with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("missing or wrong admin token; send Authorization: Bearer <token>")]
    Unauthorized,
    #[error("no {kind} named \"{name}\"")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} \"{name}\" already exists")]
    Conflict { kind: &'static str, name: String },
    #[error("the change would make the config invalid: {}", .0.join("; "))]
    Invalid(Vec<String>),
    #[error("body is not valid JSON for this endpoint: {0}")]
    BadBody(String),
    /// A query parameter that cannot be used (`range=` of the chart series); the message
    /// names the parameter and the values it takes.
    #[error("{0}")]
    BadQuery(String),
    #[error("{0}")]
    Secret(#[from] SecretError),
    /// The request store could not answer (a chart's or the requests list's query).
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Chart(#[from] ChartError),
    /// The edit is valid but the config file could not be updated: nothing was applied.
    #[error("{0}")]
    ConfigFile(#[from] EditError),
    /// Called under a name that is not the admin listener's own: a DNS-rebinding web page.
    #[error("Host {0:?} is not a name of the admin listener; use 127.0.0.1, localhost or its bind address")]
    ForbiddenHost(String),
    /// Called from a web page of another origin; the token does not change that.
    #[error("the admin API takes no cross-origin calls (Origin {0:?})")]
    ForbiddenOrigin(String),
    /// `POST /admin/drill` while another drill runs: one at a time.
    #[error("a drill is already running; wait for its answer, then start the next")]
    DrillRunning,
    /// `POST /admin/drill` with no serving node to take out.
    #[error(
        "no node is serving ({nodes} configured), so there is nothing to take out; add, enable or undrain one first"
    )]
    DrillNoNode { nodes: usize },
    /// `POST /admin/drill` naming a node that is already out.
    #[error("node \"{name}\" is already out ({state}); drill a serving node, or undrain / enable it first")]
    DrillNodeOut { name: String, state: &'static str },
    /// `POST /admin/drill` on a broker with no proxy listener bound to send the batch through.
    #[error("no proxy listener is bound, so the drill has nowhere to send its requests")]
    DrillNoListener,
    /// `POST /admin/drill` with `take_out: "fault"` on a node that is not a simulated one.
    #[error(
        "node \"{0}\" does not answer /_sim/faults (only a simulated node takes a fault); take it out by drain instead"
    )]
    DrillNotSim(String),
}

impl AdminError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::NotFound { .. } => "not_found",
            Self::Conflict { .. } => "conflict",
            Self::Invalid(_) => "invalid_config",
            Self::BadBody(_) => "malformed_json",
            Self::BadQuery(_) => "bad_query",
            Self::Secret(e) => e.code(),
            Self::Store(e) => e.code(),
            Self::Chart(e) => e.code(),
            Self::ConfigFile(e) => e.code(),
            Self::ForbiddenHost(_) => "forbidden_host",
            Self::ForbiddenOrigin(_) => "forbidden_origin",
            Self::DrillRunning => "drill_running",
            Self::DrillNoNode { .. } => "drill_no_node",
            Self::DrillNodeOut { .. } => "drill_node_out",
            Self::DrillNoListener => "drill_no_listener",
            Self::DrillNotSim(_) => "drill_not_sim",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::Invalid(_) | Self::BadBody(_) | Self::BadQuery(_) => StatusCode::BAD_REQUEST,
            Self::Secret(SecretError::NotFound(_)) => StatusCode::NOT_FOUND,
            Self::Secret(
                SecretError::BadName(_) | SecretError::Empty | SecretError::Reserved(_) | SecretError::BadOrigin(_),
            ) => StatusCode::BAD_REQUEST,
            Self::Secret(SecretError::WrongPurpose { .. } | SecretError::Unbound { .. }) => StatusCode::CONFLICT,
            Self::Secret(_) | Self::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Chart(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ConfigFile(_) => StatusCode::CONFLICT,
            Self::ForbiddenHost(_) | Self::ForbiddenOrigin(_) => StatusCode::FORBIDDEN,
            Self::DrillRunning | Self::DrillNoNode { .. } | Self::DrillNodeOut { .. } | Self::DrillNotSim(_) => {
                StatusCode::CONFLICT
            }
            Self::DrillNoListener => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.to_string(), "code": self.code() });
        if let Self::Invalid(problems) = &self {
            body["problems"] = json!(problems);
        }
        let mut r = (self.status(), Json(body)).into_response();
        if matches!(self, Self::Unauthorized) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::{AdminError, ChartError, EditError, SecretError, StoreError};
    use crate::error::{assert_documented, every_variant};

    /// One value of every variant, secret errors one by one (each has its own code).
    fn every_admin_error() -> Vec<AdminError> {
        every_variant!(AdminError {
            AdminError::Unauthorized => AdminError::Unauthorized,
            AdminError::NotFound { .. } => AdminError::NotFound { kind: "node", name: String::new() },
            AdminError::Conflict { .. } => AdminError::Conflict { kind: "node", name: String::new() },
            AdminError::Invalid(_) => AdminError::Invalid(Vec::new()),
            AdminError::BadBody(_) => AdminError::BadBody(String::new()),
            AdminError::BadQuery(_) => AdminError::BadQuery(String::new()),
            AdminError::Secret(SecretError::BadName(_)) => AdminError::Secret(SecretError::BadName(String::new())),
            AdminError::Secret(SecretError::NotFound(_)) => AdminError::Secret(SecretError::NotFound(String::new())),
            AdminError::Secret(SecretError::Empty) => AdminError::Secret(SecretError::Empty),
            AdminError::Secret(SecretError::NoKeyring(_)) => AdminError::Secret(SecretError::NoKeyring(String::new())),
            AdminError::Secret(SecretError::Keyring(_)) => AdminError::Secret(SecretError::Keyring(String::new())),
            AdminError::Secret(SecretError::Reserved(_)) => AdminError::Secret(SecretError::Reserved(String::new())),
            AdminError::Secret(SecretError::WrongPurpose { .. }) =>
                AdminError::Secret(SecretError::WrongPurpose { name: String::new(), purpose: "client" }),
            AdminError::Secret(SecretError::Unbound { .. }) =>
                AdminError::Secret(SecretError::Unbound { name: String::new(), origin: String::new() }),
            AdminError::Secret(SecretError::BadOrigin(_)) => AdminError::Secret(SecretError::BadOrigin(String::new())),
            AdminError::Store(StoreError::Open { .. }) =>
                AdminError::Store(StoreError::Open { path: String::new(), source: sqlx::Error::PoolClosed }),
            AdminError::Store(StoreError::Migrate { .. }) => AdminError::Store(StoreError::Migrate {
                path: String::new(),
                source: sqlx::migrate::MigrateError::VersionMissing(1),
            }),
            AdminError::Store(StoreError::Query(_)) => AdminError::Store(StoreError::Query(sqlx::Error::PoolClosed)),
            AdminError::Store(StoreError::Password { .. }) =>
                AdminError::Store(StoreError::Password { name: String::new(), source: SecretError::Empty }),
            AdminError::Chart(ChartError::Draw(_)) => AdminError::Chart(ChartError::Draw(String::new())),
            AdminError::ConfigFile(EditError::Read { .. }) =>
                AdminError::ConfigFile(EditError::Read { path: String::new(), detail: String::new() }),
            AdminError::ConfigFile(EditError::Parse { .. }) =>
                AdminError::ConfigFile(EditError::Parse { path: String::new(), detail: String::new() }),
            AdminError::ConfigFile(EditError::Write { .. }) =>
                AdminError::ConfigFile(EditError::Write { path: String::new(), detail: String::new() }),
            AdminError::ConfigFile(EditError::Drift { .. }) =>
                AdminError::ConfigFile(EditError::Drift { path: String::new(), detail: String::new() }),
            AdminError::Chart(ChartError::Write { .. }) =>
                AdminError::Chart(ChartError::Write { path: Default::default(), detail: String::new() }),
            AdminError::ForbiddenHost(_) => AdminError::ForbiddenHost(String::new()),
            AdminError::ForbiddenOrigin(_) => AdminError::ForbiddenOrigin(String::new()),
            AdminError::DrillRunning => AdminError::DrillRunning,
            AdminError::DrillNoNode { .. } => AdminError::DrillNoNode { nodes: 0 },
            AdminError::DrillNodeOut { .. } => AdminError::DrillNodeOut { name: String::new(), state: "draining" },
            AdminError::DrillNoListener => AdminError::DrillNoListener,
            AdminError::DrillNotSim(_) => AdminError::DrillNotSim(String::new()),
        })
    }

    #[test]
    fn every_admin_error_is_documented_with_its_status() {
        let all = every_admin_error();
        let mut seen = std::collections::HashSet::new();
        for e in &all {
            assert!(seen.insert(e.code()), "two admin errors share the code {}", e.code());
            assert_documented("## Errors of the admin API", e.code(), e.status());
        }
    }

    #[test]
    fn unauthorized_asks_for_a_bearer_token() {
        use axum::response::IntoResponse;
        let r = AdminError::Unauthorized.into_response();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["www-authenticate"], "Bearer", "clients learn which scheme to send");
    }
}
