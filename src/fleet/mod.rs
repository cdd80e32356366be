//! Several brokers in front of one fleet, sharing one PostgreSQL (`[store] url`).
//!
//! The database is the fleet's meeting place, never the request path: each broker keeps
//! routing in memory and talks to PostgreSQL from background tasks only (config versions
//! through LISTEN/NOTIFY, heartbeats and membership, once-per-fleet jobs under an advisory
//! lock, capacity shares, client-key verifiers and usage). The pool itself is the store's
//! (`crate::store::pg`). With SQLite (no `url`) none of this runs and a broker is on its own.

pub mod capacity;
