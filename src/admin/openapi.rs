//! The admin listener's OpenAPI 3.1 description (`GET /openapi.json`), built from
//! [`ROUTES`](super::ROUTES), the table the router is built from.
//!
//! Each row carries a [`Doc`]: its summary, the Rust types of its body, query and answer (their
//! schemas derived with `utoipa::ToSchema` / `IntoParams` from the types the handlers parse),
//! and the status and media type it answers with. The error body is [`AdminError`]'s
//! (`{"error", "code"}`, with `problems` for a refused config). Built once, on first ask.
//!
//! [`AdminError`]: super::AdminError

use std::sync::OnceLock;

use axum::response::Response;
use utoipa::openapi::path::{Operation, OperationBuilder, Parameter, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ComponentsBuilder, Content, InfoBuilder, OpenApiBuilder, Paths, ResponseBuilder};
use utoipa::{IntoParams, ToSchema};

use super::{Access, Route, ROUTES};
use crate::openapi::{self as doc, Components, SchemaOf};

/// The query parameters of a type that derives `IntoParams`.
pub type ParamsOf = fn() -> Vec<Parameter>;

/// [`ParamsOf`] for a query type.
pub fn query<T: IntoParams>() -> Vec<Parameter> {
    T::into_params(|| Some(ParameterIn::Query))
}

/// What the description says of one route: a row of [`ROUTES`] holds one.
#[derive(Clone, Copy)]
pub struct Doc {
    pub summary: &'static str,
    body: Option<SchemaOf>,
    query: Option<ParamsOf>,
    answer: Option<SchemaOf>,
    status: u16,
    /// The answer's media type; empty for none.
    media: &'static str,
}

/// A route that answers 200 with JSON.
pub const fn says(summary: &'static str) -> Doc {
    Doc { summary, body: None, query: None, answer: None, status: 200, media: "application/json" }
}

impl Doc {
    /// Its JSON body is `T` (`doc::schema::<T>`).
    pub const fn takes(self, body: SchemaOf) -> Self {
        Doc { body: Some(body), ..self }
    }

    /// Its query string is `T` (`query::<T>`).
    pub const fn asks(self, query: ParamsOf) -> Self {
        Doc { query: Some(query), ..self }
    }

    /// Its JSON answer is `T`.
    pub const fn gives(self, answer: SchemaOf) -> Self {
        Doc { answer: Some(answer), ..self }
    }

    /// It answers `status` with `media` (empty: no body).
    pub const fn answers(self, status: u16, media: &'static str) -> Self {
        Doc { status, media, ..self }
    }
}

/// The error body of the admin API.
#[derive(ToSchema)]
#[allow(dead_code)] // the shape `AdminError::into_response` writes; described, not built
struct AdminErrorBody {
    error: String,
    /// Stable, listed in docs/errors.md.
    code: String,
    /// `invalid_config`: every problem, each with its path.
    problems: Option<Vec<String>>,
}

/// The document, rendered once.
pub(super) async fn serve() -> Response {
    static DOC: OnceLock<Vec<u8>> = OnceLock::new();
    doc::respond(DOC.get_or_init(|| doc::render(&document())))
}

/// The admin listener's description, one operation per row of [`ROUTES`].
pub fn document() -> utoipa::openapi::OpenApi {
    let mut schemas = Components::new();
    doc::schema::<AdminErrorBody>(&mut schemas);
    let mut paths = Paths::new();
    for route in ROUTES {
        if let Some(method) = doc::method(&route.method) {
            paths.add_path_operation(doc::template(route.path), vec![method], operation(route, &mut schemas));
        }
    }
    let token = SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer));
    let components = ComponentsBuilder::new().schemas_from_iter(schemas).security_scheme("admin_token", token).build();
    let info = InfoBuilder::new()
        .title("Corral admin")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "The admin listener's JSON API (the UI, the CLI and scripts use only this). Every route but \
             /healthz and the UI's files needs `Authorization: Bearer <admin token>`.",
        ))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .paths(paths)
        .components(Some(components))
        .security(Some([SecurityRequirement::new("admin_token", Vec::<String>::new())]))
        .build()
}

fn operation(route: &Route, schemas: &mut Components) -> Operation {
    let d = &route.doc;
    let mut op = OperationBuilder::new().summary(Some(d.summary)).tag(tag(route.path));
    let mut params = doc::path_parameters(route.path);
    params.extend(d.query.map(|q| q()).unwrap_or_default());
    op = op.parameters(Some(params));
    if route.access == Access::Public {
        op = op.securities(Some(Vec::new()));
    }
    if let Some(body) = d.body {
        let name = body(schemas);
        op = op.request_body(Some(RequestBodyBuilder::new().content("application/json", doc::json(&name)).build()));
    }
    let mut ok = ResponseBuilder::new().description(d.summary);
    if !d.media.is_empty() {
        let content = match d.answer {
            Some(answer) => doc::json(&answer(schemas)),
            None => Content::default(),
        };
        ok = ok.content(d.media, content);
    }
    let error = ResponseBuilder::new()
        .description("An error (its code says which): 400, 401 (no token or a wrong one), 403, 404, 409, 500, 503")
        .content("application/json", doc::json("AdminErrorBody"));
    op.response(d.status.to_string(), ok.build()).response("default", error.build()).build()
}

fn tag(path: &str) -> &'static str {
    match path.split('/').nth(1) {
        Some("admin") => path.split('/').nth(2).map_or("admin", resource),
        Some("ui") | Some("") => "ui",
        _ => "broker",
    }
}

/// The tag of an `/admin/<resource>` path.
fn resource(name: &str) -> &'static str {
    match name {
        "nodes" => "nodes",
        "categories" => "categories",
        "providers" => "providers",
        "secrets" | "client-keys" => "secrets",
        "requests" | "charts" | "events" | "latency" => "records",
        "models" => "models",
        "config" | "settings" => "config",
        _ => "admin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_once_and_its_schema_names_are_its_own() {
        let d = document();
        let mut n = 0;
        for route in ROUTES {
            let item = d.paths.paths.get(&doc::template(route.path)).expect("every table path is described");
            let method = serde_json::to_value(doc::method(&route.method)).expect("a method");
            let item = serde_json::to_value(item).expect("a path item");
            assert!(item.get(method.as_str().unwrap_or_default()).is_some(), "{} {}", route.method, route.path);
            n += 1;
        }
        let ops: usize = d
            .paths
            .paths
            .values()
            .map(|p| serde_json::to_value(p).map_or(0, |v| v.as_object().map_or(0, |o| o.len())))
            .sum();
        assert_eq!(ops, n, "one operation per row, nothing else");
        let mut seen = Components::new();
        for route in ROUTES {
            let d = &route.doc;
            for f in [d.body, d.answer].into_iter().flatten() {
                f(&mut seen);
            }
        }
        for (name, schema) in &seen {
            let same: Vec<_> = seen.iter().filter(|(n, _)| n == name).collect();
            assert!(same.iter().all(|(_, s)| s == schema), "two types are described as {name}");
        }
    }
}
