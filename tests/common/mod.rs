//! Test harness: simulated nodes on loopback plus a broker in front of them.
#![allow(dead_code)]

pub mod fleet;
pub mod pg;
pub mod process;

use std::time::Duration;

use corral::config::{Config, NodeConfig, Policy};
use corral::sim::{SimNode, SimSpec};
use corral::{Broker, StartOptions};

pub const TOKEN: &str = "test-admin-token-7d2f9a41c0b3e865";

pub struct Cluster {
    pub sims: Vec<SimNode>,
    pub broker: Broker,
    pub client: reqwest::Client,
}

type Tweak = Box<dyn FnOnce(&mut Config)>;

pub struct ClusterBuilder {
    specs: Vec<SimSpec>,
    config: Config,
    /// Applied once the nodes exist, so tests can tweak node entries too.
    tweaks: Vec<Tweak>,
}

pub fn cluster(n: usize) -> ClusterBuilder {
    let mut config = Config::default();
    config.listeners[0].addr = "127.0.0.1:0".into();
    config.admin.addr = "127.0.0.1:0".into();
    config.store.path = Some(temp_db().display().to_string());
    // Probes are driven explicitly by the tests that need them.
    config.health.interval_ms = 3_600_000;
    config.health.deep_interval_ms = 3_600_000;
    config.retry.backoff_base_ms = 1;
    config.retry.backoff_cap_ms = 5;
    // Which node has a model loaded depends on probe timing; tests that want affinity say so.
    config.categories[0].affinity = false;
    ClusterBuilder { specs: vec![SimSpec::default(); n], config, tweaks: Vec::new() }
}

impl ClusterBuilder {
    pub fn models(mut self, node: usize, models: &[&str]) -> Self {
        self.specs[node].models = models.iter().map(|m| m.to_string()).collect();
        self
    }

    pub fn spec(mut self, node: usize, f: impl FnOnce(&mut SimSpec)) -> Self {
        f(&mut self.specs[node]);
        self
    }

    pub fn config(mut self, f: impl FnOnce(&mut Config) + 'static) -> Self {
        self.tweaks.push(Box::new(f));
        self
    }

    pub fn policy(self, policy: Policy) -> Self {
        self.config(move |c| c.categories[0].policy = policy)
    }

    pub async fn start(mut self) -> Cluster {
        let mut sims = Vec::new();
        self.config.nodes.clear();
        for (i, spec) in self.specs.into_iter().enumerate() {
            let sim = SimNode::start(spec).await.expect("sim starts on loopback");
            self.config.nodes.push(NodeConfig { name: format!("n{i}"), url: sim.url(), ..NodeConfig::default() });
            sims.push(sim);
        }
        for tweak in self.tweaks {
            tweak(&mut self.config);
        }
        let broker = Broker::start(
            self.config,
            StartOptions { seed: Some(7), admin_token: Some(TOKEN.into()), ..StartOptions::default() },
        )
        .await
        .expect("broker starts");
        let client = reqwest::Client::builder().build().expect("client");
        Cluster { sims, broker, client }
    }
}

impl Cluster {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.broker.proxy_addr(), path)
    }

    /// Run the deep probe on every node now, so routing knows who has which model.
    pub async fn learn_models(&self) {
        let client = reqwest::Client::new();
        for node in self.broker.registry().all().iter() {
            corral::health::probe_deep(&client, node, Duration::from_secs(2)).await;
        }
    }

    /// URL on the `i`-th proxy listener.
    pub fn url_on(&self, i: usize, path: &str) -> String {
        format!("http://{}{}", self.broker.proxy_addrs()[i], path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.broker.admin_addr(), path)
    }

    /// An authorized request to the admin API.
    pub fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.admin_url(path)).bearer_auth(TOKEN)
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.client.post(self.url(path)).json(&body).send().await.expect("broker answers")
    }

    pub async fn chat(&self, model: &str, stream: bool) -> reqwest::Response {
        self.post(
            "/api/chat",
            serde_json::json!({
                "model": model,
                "messages": [{"role": "user", "content": "hello"}],
                "stream": stream,
            }),
        )
        .await
    }

    pub fn node(&self, i: usize) -> std::sync::Arc<corral::node::Node> {
        std::sync::Arc::clone(&self.broker.registry().all()[i])
    }

    /// Inference requests each sim received.
    pub fn inference_counts(&self) -> Vec<usize> {
        self.sims.iter().map(|s| s.inference_count()).collect()
    }
}

/// Poll `cond` until it holds or `within` passes: for effects that happen on another task
/// (a connection closing, a probe landing). Returns whether it held.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Split an NDJSON body into parsed lines.
/// Serve `app` on a free loopback port for the rest of the test: a stand-in node, provider
/// or collector that behaves as a test needs. Its base URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

pub fn ndjson(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad NDJSON line {l:?}: {e}")))
        .collect()
}

/// A seed whose natural answer is at least `min` tokens long.
pub fn long_seed(min: usize) -> u64 {
    (0u64..10_000)
        .find(|s| corral::sim::text::complete(*s, None).tokens.len() >= min)
        .expect("some seed gives a long answer")
}

/// A fresh SQLite path for one test.
pub fn temp_db() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("corral-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("store-{}.db", N.fetch_add(1, Ordering::Relaxed)));
    // A process id is reused: an earlier run's file at this path must not pass for this test's
    // (CI saw a chart of "no traffic yet" count 65 requests from a run before).
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}
