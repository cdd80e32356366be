//! Broker membership (issue 18, item 3): brokers heartbeat into the fleet's PostgreSQL, list
//! each other (`GET /admin/brokers`), and when one dies the keeper, a surviving broker chosen
//! by an advisory lock, shows it gone and marks its `running` requests `unknown`, while the
//! survivor's clients see no error. Skipped without a test server (tests/common/pg.rs);
//! `CORRAL_PG=required` fails instead.

mod common;

use std::time::Duration;

use common::fleet::until;
use common::process::Proc;
use common::{cluster, TOKEN};
use corral::sim::Faults;
use serde_json::{json, Value};

/// From a SIGKILL to the survivor showing the broker gone and its running rows `unknown`:
/// 5 s without a heartbeat (gone), one heartbeat (1 s) for the list, one keeper period
/// (0.5 s) for the rows, and 1.5 s for a loaded machine (docs/fleet.md says 8 s).
const GONE_BOUND: Duration = Duration::from_secs(8);

/// A's file: the same nodes as B (a fleet shares its config; B published it first, and A takes
/// the fleet's at start whatever its file says).
fn config_file(nodes: [&str; 2], db: &str) -> std::path::PathBuf {
    let text = format!(
        "[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n\
         [store]\nurl = \"{db}\"\nbroker = \"gw-a\"\n\n[[nodes]]\nname = \"n0\"\nurl = \"{}\"\n\n\
         [[nodes]]\nname = \"n1\"\nurl = \"{}\"\n",
        nodes[0], nodes[1]
    );
    let dir = std::env::temp_dir().join(format!("corral-fleet-members-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("corral.toml");
    std::fs::write(&path, text).expect("write");
    path
}

async fn scalar(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_broker_is_shown_gone_and_its_running_requests_unknown() {
    let Some(db) = common::pg::fresh_database("fleet_members").await else { return };
    // B in this process, A a `corral serve` process, both in front of n0 (llama3.2, B's
    // clients) and n1 (slow:1b, whose streams stall after three chunks so that A's are
    // running when A dies).
    let b_db = db.clone();
    let b = cluster(2)
        .models(1, &["slow:1b"])
        .config(move |cfg| {
            cfg.store.url = Some(b_db);
            cfg.store.broker = Some("gw-b".into());
            cfg.nodes[1].max_concurrency = 16;
        })
        .start()
        .await;
    b.learn_models().await;
    b.sims[1].set_faults(Faults { hang_after: Some(3), ..Faults::default() });
    let pool = sqlx::PgPool::connect(&db).await.expect("connect");
    let cfg = config_file([&b.sims[0].url(), &b.sims[1].url()], &db);
    let mut a =
        Proc::spawn_env(&["serve", "--config", cfg.to_str().unwrap_or_default()], &[("CORRAL_ADMIN_TOKEN", TOKEN)]);
    let a_proxy = a.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    let listed = until(Duration::from_secs(15), || async {
        let l: Value = match b.admin(reqwest::Method::GET, "/admin/brokers").send().await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => return false,
        };
        l["brokers"].as_array().is_some_and(|m| m.iter().filter(|m| m["gone"] == false).count() == 2)
    })
    .await;
    assert!(listed.is_some(), "B never listed both brokers live");
    let list: Value =
        b.admin(reqwest::Method::GET, "/admin/brokers").send().await.expect("list").json().await.expect("json");
    let a_row =
        list["brokers"].as_array().and_then(|m| m.iter().find(|m| m["name"] == "gw-a").cloned()).expect("gw-a listed");
    assert_eq!(a_row["proxy_url"], a_proxy.as_str(), "its address: {a_row}");
    assert_eq!(a_row["version"], env!("CARGO_PKG_VERSION"), "{a_row}");
    assert_eq!(list["this"], "gw-b", "{list}");

    // Three streams running on A.
    let streams: Vec<_> = (0..3)
        .map(|i| {
            let req = client
                .post(format!("{a_proxy}/api/generate"))
                .json(&json!({"model": "slow:1b", "prompt": format!("long {i}")}));
            tokio::spawn(async move {
                if let Ok(r) = req.send().await {
                    let _ = r.bytes().await;
                }
            })
        })
        .collect();
    let running = "SELECT COUNT(*) FROM requests WHERE broker = 'gw-a' AND status = 'running'";
    assert!(
        until(Duration::from_secs(15), || async { scalar(&pool, running).await == 3 }).await.is_some(),
        "A's three streams never showed as running"
    );

    // B's clients, all along.
    let stop = tokio_util::sync::CancellationToken::new();
    let load = tokio::spawn({
        let (stop, url) = (stop.clone(), b.url("/api/chat"));
        async move {
            let client = reqwest::Client::new();
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.is_cancelled() {
                let body =
                    json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false});
                match client.post(&url).json(&body).send().await {
                    Ok(r) if r.status().is_success() => ok += 1,
                    Ok(r) => failed.push(r.status().to_string()),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        }
    });
    a.kill();
    let gone = until(GONE_BOUND, || async {
        let l: Value = match b.admin(reqwest::Method::GET, "/admin/brokers").send().await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => return false,
        };
        l["brokers"].as_array().is_some_and(|m| m.iter().any(|m| m["name"] == "gw-a" && m["gone"] == true))
    })
    .await;
    let unknown = "SELECT COUNT(*) FROM requests WHERE broker = 'gw-a' AND status = 'unknown'";
    let marked = until(GONE_BOUND.saturating_sub(gone.unwrap_or_default()), || async {
        scalar(&pool, running).await == 0 && scalar(&pool, unknown).await == 3
    })
    .await;
    stop.cancel();
    let (ok, failed) = load.await.expect("load");
    for s in streams {
        s.abort();
    }
    let status: Value =
        b.admin(reqwest::Method::GET, "/admin/status").send().await.expect("status").json().await.expect("json");
    eprintln!("FLEET | broker SIGKILLed | 3 streams running on it; a survivor with clients | shown gone after {gone:?}, rows unknown {marked:?} later | survivor's clients {ok} ok, {} failed", failed.len());
    assert!(gone.is_some(), "B did not show A gone within {GONE_BOUND:?}");
    assert!(marked.is_some(), "A's running rows were not marked unknown within {GONE_BOUND:?} of the kill");
    assert!(failed.is_empty(), "B's clients saw errors: {failed:?}");
    assert!(ok > 0, "B served its clients meanwhile");
    assert_eq!(status["fleet"]["keeper"], true, "the survivor is the keeper now: {}", status["fleet"]);
}
