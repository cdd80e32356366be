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
