//! Corral: one endpoint in front of a cluster of Ollama nodes.
//!
//! The broker library. The `corral` binary and the desktop shell are thin layers over it: they
//! parse arguments, set up tracing, start a [`broker::Broker`] and translate lifecycle events.
//! See DESIGN.md for the request path; each module's doc says what its concept is.

pub mod admin;
pub mod admit;
pub mod alerts;
pub mod bench;
pub mod breaker;
pub mod broker;
pub mod catalog;
pub mod charts;
pub mod clients;
pub mod cloud;
pub mod config;
pub mod error;
pub mod ewma;
pub mod fleet;
pub mod health;
pub mod log_format;
pub mod log_writer;
pub mod memory;
pub mod node;
pub mod openapi;
pub mod otlp;
pub mod outcome;
pub mod plan;
pub mod proxy;
pub mod quota;
pub mod redact;
pub mod reload;
pub mod retry;
pub mod route;
pub mod secrets;
pub mod server;
pub mod sim;
pub mod speed;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod ui;
pub mod upstream;

pub use broker::{Broker, StartOptions};
pub use config::Config;
