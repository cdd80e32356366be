//! A node's `max_concurrency` is a fleet-wide limit (issue 18, item 4): two brokers on one
//! PostgreSQL in front of one node share its slots through the database, so together they
//! never send it more than its limit, and an idle broker's share flows to a busy one.
//! Skipped without a test server (tests/common/pg.rs); `CORRAL_PG=required` fails instead.

mod common;

use std::time::Duration;

use common::{cluster, TOKEN};
use corral::{Broker, StartOptions};
use serde_json::{json, Value};

/// The second broker of the fleet: the first one's config under another name.
async fn second_broker(first: &Broker, name: &str) -> Broker {
    let mut config = (*first.config()).clone();
    config.store.broker = Some(name.into());
    let options = StartOptions { seed: Some(8), admin_token: Some(TOKEN.into()), ..StartOptions::default() };
    Broker::start(config, options).await.expect("the second broker starts")
}

async fn brokers(client: &reqwest::Client, admin: std::net::SocketAddr) -> Value {
    let r = client.get(format!("http://{admin}/admin/brokers")).bearer_auth(TOKEN).send().await.expect("answer");
    r.json().await.expect("json")
}

/// `n` chats at once through `proxy`; the statuses.
async fn burst(client: &reqwest::Client, proxy: std::net::SocketAddr, n: usize) -> Vec<u16> {
    let asks = (0..n).map(|_| {
        let req = client.post(format!("http://{proxy}/api/chat")).json(&json!({
            "model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false
        }));
        async move {
            match req.send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let _ = r.bytes().await;
                    status
                }
                Err(_) => 0,
            }
        }
    });
    futures_util::future::join_all(asks).await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_brokers_together_never_send_a_node_more_than_its_limit() {
    let Some(url) = common::pg::fresh_database("fleet_capacity").await else { return };
    let a = cluster(1)
        .spec(0, |s| {
            // The node itself would take 16 at once: only the brokers' shares can keep it at 4.
            s.parallel = 16;
            s.ttft = Duration::from_millis(150);
        })
        .config(move |cfg| {
            cfg.store.url = Some(url);
            cfg.store.broker = Some("gw-a".into());
            cfg.nodes[0].max_concurrency = 4;
        })
        .start()
        .await;
    let b = second_broker(&a.broker, "gw-b").await;
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = brokers(&client, b.admin_addr()).await;
        let live = list["brokers"].as_array().map_or(0, |l| l.iter().filter(|m| m["gone"] == false).count());
        if live == 2 {
            assert_eq!(list["fleet"], true, "{list}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "both brokers never showed as live: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Twenty at once on each broker.
    let (on_a, on_b) = tokio::join!(burst(&client, a.broker.proxy_addr(), 20), burst(&client, b.proxy_addr(), 20));
    assert!(on_a.iter().chain(&on_b).all(|s| *s == 200), "every client served: A {on_a:?}, B {on_b:?}");
    let peak = a.sims[0].max_in_flight();
    eprintln!("FLEET | capacity | 2 brokers x 20 concurrent on a node with max_concurrency 4 | node's peak in flight {peak} | 40/40 served");
    assert!(peak <= 4, "the node saw {peak} requests at once, past its limit of 4");
    assert!(peak >= 2, "the node was used ({peak} at once at most)");

    // B idle, A busy: A's share grows to the whole limit.
    let shares = a.broker.registry().all()[0].clone();
    let load = tokio::spawn({
        let client = client.clone();
        let proxy = a.broker.proxy_addr();
        async move { burst(&client, proxy, 80).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while shares.fleet_share() != Some(4) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle broker's share never flowed to the busy one: A holds {:?}",
            shares.fleet_share()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let statuses = load.await.expect("load");
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(a.sims[0].max_in_flight() <= 4, "still within the limit: {}", a.sims[0].max_in_flight());
    b.shutdown().await;
}
