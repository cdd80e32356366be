//! Desktop notifications caught by a real notification server (dunst) on the session bus.
//!
//! `#[ignore]`d in the plain run: needs a D-Bus session with a notification server on an X
//! display. `scripts/test` runs it inside `dbus-run-session` with Xvfb and dunst
//! (`cargo test --test notifications -- --ignored`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tokio::time::Instant;

use common::process::Proc;

/// Every Notify call on the session bus, as dbus-monitor prints it, line by line.
struct Monitor {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Monitor {
    fn start() -> Monitor {
        let mut child = Command::new("dbus-monitor")
            .args(["--session", "type='method_call',interface='org.freedesktop.Notifications',member='Notify'"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-monitor runs (package dbus)");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Monitor { child, lines, seen: Vec::new() }
    }

    /// Wait (at most `within`) until a notification with this summary has been seen.
    fn wait_for(&mut self, summary: &str, within: Duration) {
        let needle = format!("string \"{summary}\"");
        let deadline = Instant::now() + within;
        while !self.seen.iter().any(|l| l.contains(&needle)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!("no notification {summary:?}; saw: {:#?}", self.seen),
            }
        }
    }

    fn count(&mut self, summary: &str) -> usize {
        self.seen.extend(self.lines.try_iter());
        let needle = format!("string \"{summary}\"");
        self.seen.iter().filter(|l| l.contains(&needle)).count()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a session bus with a notification server: run by scripts/test"]
async fn a_killed_node_raises_one_down_and_one_back_notification() {
    let mut monitor = Monitor::start();
    let sims: Vec<Proc> = (0..2).map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "0"])).collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let dir = std::env::temp_dir().join(format!("corral-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("corral.toml");
    let mut text = format!(
        "[[listeners]]\naddr = \"127.0.0.1:0\"\n[admin]\naddr = \"127.0.0.1:0\"\n[store]\npath = \"{}\"\n\
         [health]\ninterval_ms = 100\ntimeout_ms = 200\nfailures_to_down = 1\nsuccesses_to_up = 1\n",
        dir.join("corral.db").display()
    );
    for (i, u) in urls.iter().enumerate() {
        text += &format!("[[nodes]]\nname = \"gpu{i}\"\nurl = \"{u}\"\n");
    }
    std::fs::write(&cfg, text).expect("config");
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default(), "--notify"]);
    serve.wait_for("desktop notifications on");
    serve.wait_for("node health changed");

    // Down for 1.5 s, as a crash and a restart would be.
    let r = reqwest::Client::new()
        .post(format!("{}/_sim/down", urls[1]))
        .body(r#"{"for_ms": 1500}"#)
        .send()
        .await
        .expect("sim control");
    assert!(r.status().is_success());
    monitor.wait_for("Node gpu1 is down", Duration::from_secs(10));
    monitor.wait_for("Node gpu1 is back", Duration::from_secs(10));
    assert_eq!(monitor.count("Node gpu1 is down"), 1, "exactly one down notice");
    assert_eq!(monitor.count("Node gpu1 is back"), 1, "exactly one back notice");
    assert_eq!(monitor.count("Node gpu0 is down"), 0, "the healthy node says nothing");
    drop(serve);
}
