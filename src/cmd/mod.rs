//! Subcommands of the `corral` binary that talk to a running broker over HTTP.

pub mod history;
pub mod models;
