//! A `corral` child process for tests: output lines collected on a channel, killed on drop.
//!
//! A child process runs in real time, not on a test's paused tokio clock, so the waits here
//! use std's clock and a blocking poll (clippy.toml bans both elsewhere).
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_corral");

/// A child process whose output lines are collected on a channel; killed on drop.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(args: &[&str]) -> Proc {
        Self::spawn_with(args, "info")
    }

    /// Spawn with `CORRAL_LOG` set to `log` (e.g. "debug", to check what logs may contain).
    pub fn spawn_with(args: &[&str], log: &str) -> Proc {
        Self::spawn_env(args, &[("CORRAL_LOG", log)])
    }

    /// Spawn with these environment variables set.
    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(BIN)
            .args(args)
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("corral runs");
        let (tx, lines) = mpsc::channel();
        for out in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as _),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Proc { child, lines }
    }

    /// The first line containing `needle`, within 30 s. On failure the lines passed over are
    /// in the panic message: a child that exited early usually said why.
    pub fn wait_for(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut passed = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => passed.push(line),
                Err(e) => panic!("no line containing {needle:?}: {e}; lines before: {passed:#?}"),
            }
        }
    }

    /// The first line containing each of `needles`, whichever comes first, within 30 s: stdout
    /// and stderr are two pipes, so lines printed on one and logged on the other may arrive in
    /// either order.
    pub fn wait_for_each<const N: usize>(&self, needles: [&str; N]) -> [String; N] {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
        while found.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|e| panic!("no line for each of {needles:?}: {e}"));
            if let Some(i) = (0..N).find(|&i| found[i].is_none() && line.contains(needles[i])) {
                found[i] = Some(line);
            }
        }
        found.map(Option::unwrap_or_default)
    }

    /// The `http://127.0.0.1:PORT` in the first line containing `needle`.
    pub fn url(&self, needle: &str) -> String {
        let line = self.wait_for(needle);
        let start = line.find("http://").unwrap_or_else(|| panic!("no URL in {line:?}"));
        line[start..].split_whitespace().next().unwrap_or_default().to_string()
    }

    /// Every line not yet consumed up to and including the first containing `needle`, within
    /// 30 s: for checking what was logged up to an event without racing the log writer.
    pub fn lines_until(&self, needle: &str) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    out.push(line);
                    if found {
                        return out;
                    }
                }
                Err(e) => panic!("no line containing {needle:?} in {out:?}: {e}"),
            }
        }
    }

    /// Every line printed so far that `wait_for` has not consumed.
    pub fn lines_so_far(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Every line not yet consumed, through the end of the output (the process has exited or
    /// is exiting), within 30 s.
    pub fn rest_of_output(&self) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => out.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return out,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("the output did not end within 30 s"),
            }
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().expect("kill runs").success();
        assert!(ok, "signal {sig} delivered");
    }

    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Proc {
    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real `corral serve` with its shipped defaults (the store at `db`, `CORRAL_LOG` = `log`) in
/// front of one fast `corral sim` node `n0` taking 64 at once: the sim, the broker, and the
/// broker's proxy URL.
pub fn serve_before_a_sim(db: &std::path::Path, log: &str) -> (Proc, Proc, String) {
    let sim = Proc::spawn(&["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0", "--parallel", "64"]);
    let node = sim.url("simulated Ollama node on");
    let dir = db.with_extension("d");
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("corral.toml");
    let text = format!(
        "[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\npath = \"{}\"\n\n\
         [[nodes]]\nname = \"n0\"\nurl = \"{node}\"\nmax_concurrency = 64\n",
        db.display()
    );
    std::fs::write(&cfg, text).expect("config");
    let serve = Proc::spawn_with(&["serve", "--config", cfg.to_str().unwrap_or_default()], log);
    let base = serve.url("serving the Ollama API on");
    (sim, serve, base)
}
