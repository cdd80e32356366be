//! A database of its own on the test PostgreSQL for each fleet test (issue 18).
//!
//! `scripts/test` starts a throwaway cluster (`scripts/pg-cluster`) and exports its URL as
//! `CORRAL_TEST_PG_URL`, with `CORRAL_PG=required` so that a missing server fails the run
//! instead of skipping. Run alone without a server, a fleet test says it was skipped.

use sqlx::{Connection, Executor, PgConnection};

/// A fresh, empty database's URL, or `None` (after saying so) when no test server is set.
pub async fn fresh_database(prefix: &str) -> Option<String> {
    let Ok(server) = std::env::var("CORRAL_TEST_PG_URL") else {
        assert!(
            std::env::var("CORRAL_PG").as_deref() != Ok("required"),
            "CORRAL_PG=required but CORRAL_TEST_PG_URL is not set: start one with scripts/pg-cluster"
        );
        eprintln!("skipped: no CORRAL_TEST_PG_URL (scripts/pg-cluster start DIR prints one)");
        return None;
    };
    let name = format!("{prefix}_{}_{}", std::process::id(), unique());
    let mut admin = PgConnection::connect(&server).await.expect("connect to the test PostgreSQL");
    admin.execute(format!("CREATE DATABASE \"{name}\"").as_str()).await.expect("create a test database");
    let mut url = url::Url::parse(&server).expect("CORRAL_TEST_PG_URL is a URL");
    url.set_path(&format!("/{name}"));
    Some(url.to_string())
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
