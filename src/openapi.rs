//! OpenAPI 3.1 descriptions of Corral's listeners (`GET /openapi.json` on the proxy and the admin
//! listener), built with utoipa's document model.
//!
//! Each listener describes itself from the route table its requests are dispatched by (the
//! proxy's `proxy::routes::ROUTES`, the admin's `admin::ROUTES`), so a route cannot be served
//! without being described, nor described without being served; `tests/openapi.rs` checks both
//! directions against a running broker. This module holds only what both descriptions share:
//! path templates and their parameters, schema components from Rust types, the error body and
//! the answer that serves a finished document. It knows no route of its own.

use std::borrow::Cow;

use axum::response::{IntoResponse, Response};
use http::{header, Method};
use utoipa::openapi::path::{HttpMethod, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{Ref, Schema, Type};
use utoipa::openapi::{Content, ObjectBuilder, RefOr, Required};
use utoipa::ToSchema;

/// Component schemas collected while a document is built: (name, schema).
pub type Components = Vec<(String, RefOr<Schema>)>;

/// Registers a type's schema (and every schema it refers to) and names it: what a route table
/// row holds to say which Rust type a body is (`schema::<NodePatch>`).
pub type SchemaOf = fn(&mut Components) -> Cow<'static, str>;

/// [`SchemaOf`] for a type that derives `ToSchema`.
pub fn schema<T: ToSchema>(out: &mut Components) -> Cow<'static, str> {
    out.push((T::name().into_owned(), T::schema()));
    T::schemas(out);
    T::name()
}

/// A `$ref` to a component schema by name.
pub fn reference(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

/// A JSON body of the named component schema.
pub fn json(name: &str) -> Content {
    Content::new(Some(reference(name)))
}

/// A string schema (a header's or a parameter's value).
pub fn string() -> RefOr<Schema> {
    RefOr::T(Schema::Object(ObjectBuilder::new().schema_type(Type::String).build()))
}

/// OpenAPI's name for an HTTP method; `None` for one it has no field for.
pub fn method(m: &Method) -> Option<HttpMethod> {
    Some(match *m {
        Method::GET => HttpMethod::Get,
        Method::HEAD => HttpMethod::Head,
        Method::POST => HttpMethod::Post,
        Method::PUT => HttpMethod::Put,
        Method::PATCH => HttpMethod::Patch,
        Method::DELETE => HttpMethod::Delete,
        Method::OPTIONS => HttpMethod::Options,
        Method::TRACE => HttpMethod::Trace,
        _ => return None,
    })
}

/// An OpenAPI path template from a route's path: axum's rest segment `{*file}` is `{file}`.
pub fn template(path: &str) -> String {
    path.replace("{*", "{")
}

/// The path parameters a route's path names (`{name}`, `{*file}`), each a required string.
pub fn path_parameters(path: &str) -> Vec<Parameter> {
    path.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}'))
        .map(|(name, _)| {
            ParameterBuilder::new()
                .name(name.trim_start_matches('*'))
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .schema(Some(string()))
                .build()
        })
        .collect()
}

/// A finished document as the answer to `GET /openapi.json`.
pub fn respond(doc: &'static [u8]) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}

/// A document rendered once; a document that cannot be rendered (it always can: it is built
/// from constant tables) is an empty object rather than a panic in a handler.
pub fn render(doc: &utoipa::openapi::OpenApi) -> Vec<u8> {
    serde_json::to_vec(doc).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the OpenAPI document does not serialize");
        b"{}".to_vec()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_their_parameters_come_from_the_route_path() {
        assert_eq!(template("/ui/{*file}"), "/ui/{file}");
        assert_eq!(template("/admin/nodes/{name}/test"), "/admin/nodes/{name}/test");
        let names: Vec<String> = path_parameters("/a/{name}/b/{*rest}").into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["name", "rest"]);
        assert!(path_parameters("/admin/nodes").is_empty());
    }

    #[test]
    fn every_standard_method_but_connect_has_an_openapi_name() {
        assert!(method(&Method::GET).is_some() && method(&Method::DELETE).is_some());
        assert!(method(&Method::CONNECT).is_none(), "OpenAPI 3.1 has no field for CONNECT");
    }
}
