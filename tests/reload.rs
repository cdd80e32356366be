//! Config hot reload through the real file system (inotify on Linux).

mod common;

use std::time::Duration;

use common::eventually;
use corral::sim::{SimNode, SimSpec};
use corral::{Broker, Config, StartOptions};

fn config_text(nodes: &[(&str, String)]) -> String {
    let mut t = String::from("[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n");
    for (name, url) in nodes {
        t += &format!("[[nodes]]\nname = \"{name}\"\nurl = \"{url}\"\n\n");
    }
    t
}

#[tokio::test]
async fn good_edits_apply_and_bad_ones_keep_the_running_config() {
    let a = SimNode::start(SimSpec::default()).await.expect("sim");
    let b = SimNode::start(SimSpec::default()).await.expect("sim");
    let dir = std::env::temp_dir().join(format!("corral-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("corral.toml");
    std::fs::write(&path, config_text(&[("a", a.url())])).expect("write");
    let config = Config::load(&path).expect("valid");
    let broker = Broker::start(config, StartOptions { config_path: Some(path.clone()), ..StartOptions::default() })
        .await
        .expect("starts");
    assert_eq!(broker.registry().all().len(), 1);

    std::fs::write(&path, config_text(&[("a", a.url()), ("b", b.url())])).expect("write");
    assert!(eventually(Duration::from_secs(10), || broker.registry().all().len() == 2).await, "the new node is added");

    std::fs::write(&path, "[[nodes]]\nname = \"a\"\nurl = \"not a url\"\n").expect("write");
    let shared = broker.shared().clone();
    assert!(
        eventually(Duration::from_secs(10), || shared.reload.lock().map(|s| s.last_error.is_some()).unwrap_or(false))
            .await,
        "the bad edit is reported"
    );
    let err = shared.reload.lock().map(|s| s.last_error.clone().unwrap_or_default()).unwrap_or_default();
    assert!(err.contains("line 3") && err.contains("nodes[0].url"), "with its line: {err}");
    assert_eq!(broker.registry().all().len(), 2, "the running config stays");
    broker.shutdown().await;
}

/// A config file with one node and the given extra sections; the broker watches it.
struct Watched {
    path: std::path::PathBuf,
    broker: Broker,
    node_url: String,
}

impl Watched {
    async fn start(node_url: String, extra: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("corral-reload-{}-{}", std::process::id(), uuid_like()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("corral.toml");
        std::fs::write(&path, config_text(&[("a", node_url.clone())]) + extra).expect("write");
        let config = Config::load(&path).expect("valid");
        let broker = Broker::start(config, StartOptions { config_path: Some(path.clone()), ..StartOptions::default() })
            .await
            .expect("starts");
        Self { path, broker, node_url }
    }

    /// Rewrite the file and wait until the broker has applied it.
    async fn edit(&self, extra: &str) {
        let before = self.reloads();
        std::fs::write(&self.path, config_text(&[("a", self.node_url.clone())]) + extra).expect("write");
        assert!(eventually(Duration::from_secs(10), || self.reloads() > before).await, "the edit is applied");
        let s = self.broker.shared().reload.lock().map(|s| s.clone()).expect("status");
        assert_eq!(s.last_error, None, "the edit is valid");
    }

    fn reloads(&self) -> u64 {
        self.broker.shared().reload.lock().map(|s| s.reloads).unwrap_or(0)
    }

    async fn chat(&self) -> reqwest::Response {
        let url = format!("http://{}/api/chat", self.broker.proxy_addr());
        let body =
            serde_json::json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}]});
        reqwest::Client::new().post(url).json(&body).send().await.expect("answered")
    }
}

fn uuid_like() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test]
async fn a_breaker_threshold_edited_in_the_file_applies_to_a_running_node() {
    let sim = SimNode::start(SimSpec::default()).await.expect("sim");
    sim.set_faults(corral::sim::Faults::statuses(500, 1_000));
    let w = Watched::start(sim.url(), "[retry]\nmax_attempts = 1\n\n[breaker]\nfailures_to_open = 5\n").await;
    for _ in 0..2 {
        assert_eq!(w.chat().await.status(), 502, "the node fails every request");
    }
    let node = w.broker.registry().get("a").expect("node a");
    assert_eq!(node.breaker_state(), corral::breaker::BreakerState::Closed, "2 failures are under the threshold of 5");

    w.edit("[retry]\nmax_attempts = 1\n\n[breaker]\nfailures_to_open = 3\n").await;
    let same = w.broker.registry().get("a").expect("node a");
    assert!(std::sync::Arc::ptr_eq(&node, &same), "the node was retuned in place, not replaced");
    assert_eq!(node.breaker_state(), corral::breaker::BreakerState::Closed, "the edit alone opens nothing");
    w.chat().await;
    assert_eq!(
        node.breaker_state(),
        corral::breaker::BreakerState::Open,
        "the third consecutive failure meets the new threshold of 3 without a restart"
    );
    w.broker.shutdown().await;
}

#[tokio::test]
async fn a_retry_budget_edited_in_the_file_applies_without_a_restart() {
    let sim = SimNode::start(SimSpec::default()).await.expect("sim");
    sim.set_faults(corral::sim::Faults::statuses(500, 1_000));
    let no_budget = "[retry]\nmax_attempts = 3\nbackoff_base_ms = 1\nbudget_ratio = 0.0\nbudget_min_per_sec = 0\n\n[breaker]\nfailures_to_open = 1000\n";
    let w = Watched::start(sim.url(), no_budget).await;
    let r = w.chat().await;
    assert_eq!(r.headers()["x-corral-attempts"], "1", "a budget of 0 allows no retry");
    let tried = sim.inference_count();
    assert_eq!(tried, 1);

    w.edit(&no_budget.replace("budget_ratio = 0.0", "budget_ratio = 1.0")).await;
    let r = w.chat().await;
    assert_eq!(r.headers()["x-corral-attempts"], "3", "a ratio of 1 allows the retries now");
    assert_eq!(sim.inference_count() - tried, 3, "the node saw every attempt");
    w.broker.shutdown().await;
}

#[tokio::test]
async fn keys_bound_at_start_are_reported_as_needing_a_restart() {
    let sim = SimNode::start(SimSpec::default()).await.expect("sim");
    let w = Watched::start(sim.url(), "").await;
    w.edit("[proxy]\nconnect_timeout_ms = 1234\n").await;
    let s = w.broker.shared().reload.lock().map(|s| s.clone()).expect("status");
    assert_eq!(s.pending_restart, vec!["proxy.connect_timeout_ms".to_string()]);
    assert_ne!(w.broker.config().proxy.connect_timeout_ms, 1234, "the running value stays until a restart");
    // The trace exporter is started with the broker: a new collector waits for a restart too.
    w.edit("[proxy]\nconnect_timeout_ms = 1234\n\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n").await;
    let s = w.broker.shared().reload.lock().map(|s| s.clone()).expect("status");
    assert_eq!(s.pending_restart, ["proxy.connect_timeout_ms", "telemetry.otlp_endpoint"]);
    assert_eq!(w.broker.config().telemetry.otlp_endpoint, None, "not exporting until a restart");
    w.broker.shutdown().await;
}

#[tokio::test]
async fn a_probe_interval_edited_in_the_file_reschedules_the_probes() {
    let sim = SimNode::start(SimSpec::default()).await.expect("sim");
    let w = Watched::start(sim.url(), "[health]\ninterval_ms = 600000\n").await;
    assert!(
        eventually(Duration::from_secs(5), || sim.count("/api/version") >= 1).await,
        "the first probe runs at start"
    );
    w.edit("[health]\ninterval_ms = 20\n").await;
    assert!(
        eventually(Duration::from_secs(5), || sim.count("/api/version") >= 4).await,
        "probes follow the new 20 ms interval, not the 10 minutes the broker started with"
    );
    w.broker.shutdown().await;
}

#[tokio::test]
async fn admin_edits_are_written_into_the_file_and_survive_its_next_reload() {
    let sim = SimNode::start(SimSpec::default()).await.expect("sim");
    let dir = std::env::temp_dir().join(format!("corral-reload-{}-persist", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("corral.toml");
    let text = format!(
        "# our cluster: keep this comment\n{}[[categories]]\nname = \"default\"\npolicy = \"least-connections\" # for now\n",
        config_text(&[("a", sim.url())])
    );
    std::fs::write(&path, &text).expect("write");
    let token = "persist-test-token-0123456789abcdef";
    let broker = Broker::start(
        Config::load(&path).expect("valid"),
        StartOptions { config_path: Some(path.clone()), admin_token: Some(token.into()), ..StartOptions::default() },
    )
    .await
    .expect("starts");
    let admin = |method: reqwest::Method, p: &str| {
        reqwest::Client::new().request(method, format!("http://{}{p}", broker.admin_addr())).bearer_auth(token)
    };
    let r = admin(reqwest::Method::PUT, "/admin/categories/default").json(&serde_json::json!({"policy": "p2c"}));
    assert_eq!(r.send().await.expect("answer").status(), 200);
    let r = admin(reqwest::Method::PATCH, "/admin/nodes/a").json(&serde_json::json!({"weight": 5}));
    assert_eq!(r.send().await.expect("answer").status(), 200);
    let written = std::fs::read_to_string(&path).expect("read");
    assert!(
        written.contains("policy = \"p2c\"") && written.contains("weight = 5"),
        "the edits are in the file:\n{written}"
    );
    assert!(written.contains("# our cluster: keep this comment"), "the user's comments stay:\n{written}");
    assert!(written.lines().count() < text.lines().count() + 4, "no defaults spelled out:\n{written}");

    // The user touches the file by hand: the reload must not undo the edits.
    let reloads = || broker.shared().reload.lock().map(|s| s.reloads).unwrap_or(0);
    let before = reloads();
    std::fs::write(&path, format!("{written}# touched\n")).expect("write");
    assert!(eventually(Duration::from_secs(10), || reloads() > before).await, "the touch is reloaded");
    let config = broker.config();
    assert_eq!(config.categories[0].policy, corral::config::Policy::P2c, "the UI's policy survives the reload");
    assert_eq!(config.nodes[0].weight, 5, "the UI's weight survives the reload");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn edits_made_at_the_same_time_all_land_in_the_file_and_the_running_config() {
    let sims = [
        SimNode::start(SimSpec::default()).await.expect("sim"),
        SimNode::start(SimSpec::default()).await.expect("sim"),
    ];
    let dir = std::env::temp_dir().join(format!("corral-reload-{}-concurrent", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("corral.toml");
    let original = format!("# ours\n{}", config_text(&[("a", sims[0].url()), ("b", sims[1].url())]));
    std::fs::write(&path, &original).expect("write");
    let token = "concurrent-edit-token-0123456789abcdef";
    let broker = Broker::start(
        Config::load(&path).expect("valid"),
        StartOptions { config_path: Some(path.clone()), admin_token: Some(token.into()), ..StartOptions::default() },
    )
    .await
    .expect("starts");
    let client = reqwest::Client::new();
    let edits = (0..16u32).map(|i| {
        let (client, url) =
            (client.clone(), format!("http://{}/admin/nodes/{}", broker.admin_addr(), ["a", "b"][i as usize % 2]));
        async move {
            let r =
                client.patch(url).bearer_auth(token).json(&serde_json::json!({"max_concurrency": 10 + i})).send().await;
            r.map(|r| r.status().as_u16()).unwrap_or(0)
        }
    });
    let statuses = futures_util::future::join_all(edits).await;
    assert!(statuses.iter().all(|s| *s == 200), "every edit was taken: {statuses:?}");
    // Twelve nodes added at once: each edit builds on the one before, none is lost.
    let adds =
        (0..12).map(|i| {
            let (client, url) = (client.clone(), format!("http://{}/admin/nodes", broker.admin_addr()));
            let body = serde_json::json!({"name": format!("added{i}"), "url": sims[0].url()});
            async move {
                client.post(url).bearer_auth(token).json(&body).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
            }
        });
    let statuses = futures_util::future::join_all(adds).await;
    assert!(statuses.iter().all(|s| *s == 201), "every add was taken: {statuses:?}");
    let added = |c: &Config| c.nodes.iter().filter(|n| n.name.starts_with("added")).count();
    assert_eq!(added(&broker.config()), 12, "no add was lost in the running config");
    assert_eq!(added(&Config::load(&path).expect("valid")), 12, "nor in the file");
    let on_disk = Config::load(&path).expect("the file is whole and valid");
    let running = broker.config();
    for (disk, live) in on_disk.nodes.iter().zip(&running.nodes) {
        assert_eq!(disk.max_concurrency, live.max_concurrency, "the file and the broker agree on {}", disk.name);
    }
    assert!(std::fs::read_to_string(&path).expect("read").starts_with("# ours"), "comments kept");
    let strays: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name() != "corral.toml" && e.file_name() != ".corral-backups")
        .collect();
    assert!(strays.is_empty(), "no temp files left behind: {strays:?}");
    // Each edit kept what the file held before it; the oldest backup is the file as written.
    let mut backups: Vec<_> =
        std::fs::read_dir(dir.join(".corral-backups")).expect("backups").flatten().map(|e| e.path()).collect();
    backups.sort();
    assert_eq!(backups.len(), 20, "one backup per edit, the newest 20 kept: {backups:?}");
    assert!(backups.iter().all(|b| Config::load(b).is_ok()), "each backup is a whole config");
    broker.shutdown().await;
}
