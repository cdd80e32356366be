//! `corral serve` as a person restarts it: the admin token stays the same across starts (the
//! keyring's, else an owner-only file beside the store), `--listen` / `--admin` work without a
//! config file, and a taken port names the way to change it that exists.
//!
//! The keyring is kept out of the plain tests by pointing D-Bus at nowhere
//! (`DBUS_SESSION_BUS_ADDRESS`), which is how a machine without a Secret Service looks; the
//! `#[ignore]`d test runs inside `scripts/test`'s keyring session, against the real one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::process::{Proc, BIN};

const NO_KEYRING: (&str, &str) = ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/corral-test-bus");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("corral-token-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A config with free ports and the store (so the state dir) in `dir`.
fn config_in(dir: &Path) -> PathBuf {
    let path = dir.join("corral.toml");
    let text = format!(
        "# my broker\n[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\npath = \"{}\"\n",
        dir.join("corral.db").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// Start `serve` with `env`, read the token it prints, and stop it; with the line that logged
/// where the token is kept.
fn token_of_one_start(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let serve = Proc::spawn_env(args, env);
    let [kept, line] = serve.wait_for_each(["admin token kept in", "Admin API on"]);
    let token = line.rsplit("token: ").next().unwrap_or_default().trim_end_matches(')').to_string();
    drop(serve);
    (token, kept)
}

#[test]
fn two_starts_without_a_keyring_give_the_same_token_kept_in_an_owner_only_file() {
    let dir = temp_dir("file");
    let cfg = config_in(&dir);
    let args = ["serve", "--config", cfg.to_str().unwrap_or_default()];
    let (first, logged) = token_of_one_start(&args, &[NO_KEYRING]);
    let (second, _) = token_of_one_start(&args, &[NO_KEYRING]);
    assert!(first.len() >= 32, "a token is printed: {first:?}");
    assert_eq!(first, second, "a restart keeps the token, so open browser tabs stay signed in");
    let file = dir.join("admin-token");
    assert_eq!(std::fs::read_to_string(&file).expect("the token file").trim(), first);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).expect("file").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "only the owner may read the token");
    }
    let said = logged.contains("keyring not used") && logged.contains(&file.display().to_string());
    assert!(said, "the log says the keyring was passed over and where the token is kept: {logged}");

    let env_token = "my-own-token-5be0c3f18a7d2946e1aa77";
    let serve = Proc::spawn_env(&args, &[NO_KEYRING, ("CORRAL_ADMIN_TOKEN", env_token)]);
    let admin = serve.url("Admin API on");
    let status = |token: &str| {
        let out = Command::new(BIN)
            .args(["status", "--url", &admin])
            .env("CORRAL_ADMIN_TOKEN", token)
            .output()
            .expect("corral runs");
        out.status.code()
    };
    assert_eq!(status(env_token), Some(0), "CORRAL_ADMIN_TOKEN still wins");
    assert_eq!(status(&first), Some(1), "the kept token does not open a broker started with its own");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn listen_and_admin_flags_work_without_a_config_file() {
    let dir = temp_dir("flags");
    let (data, conf) = (dir.join("data"), dir.join("conf"));
    let env = [
        NO_KEYRING,
        ("XDG_DATA_HOME", data.to_str().unwrap_or_default()),
        ("XDG_CONFIG_HOME", conf.to_str().unwrap_or_default()),
        ("HOME", dir.to_str().unwrap_or_default()),
    ];
    let serve = Proc::spawn_env(&["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"], &env);
    let proxy = serve.url("serving the Ollama API on");
    let admin = serve.url("Admin API on");
    let get = |url: String| async move { reqwest::get(url).await.map(|r| r.status().as_u16()).unwrap_or(0) };
    assert_eq!(get(format!("{admin}/healthz")).await, 200, "the admin API is on the --admin address");
    assert_eq!(get(format!("{proxy}/")).await, 200, "the proxy is on the --listen address");
    assert!(data.join("corral").join("admin-token").exists(), "the token is kept in the platform data dir");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_taken_port_names_the_flag_without_a_config_file_and_the_file_with_one() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = temp_dir("taken");
    let env: Vec<(String, String)> = vec![
        (NO_KEYRING.0.into(), NO_KEYRING.1.into()),
        ("XDG_DATA_HOME".into(), dir.join("data").display().to_string()),
        ("XDG_CONFIG_HOME".into(), dir.join("conf").display().to_string()),
        ("NO_COLOR".into(), "1".into()),
    ];
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).envs(env.iter().cloned()).output().expect("corral runs");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["serve", "--listen", &addr, "--admin", "127.0.0.1:0"]);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_default().to_string();
    assert_eq!(code, Some(1), "{err}");
    assert!(line.contains(&addr) && line.contains("--listen ADDR"), "the proxy flag is suggested: {line}");
    assert!(!line.contains("config"), "no config file is in use, so none is mentioned: {line}");
    let (_, err) = run(&["serve", "--listen", "127.0.0.1:0", "--admin", &addr]);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_default().to_string();
    assert!(line.contains("--admin ADDR") && !line.contains("config"), "the admin flag is suggested: {line}");

    let cfg = dir.join("corral.toml");
    std::fs::write(
        &cfg,
        format!("[[listeners]]\naddr = \"{addr}\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\nenabled = false\n"),
    )
    .expect("write config");
    let (_, err) = run(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_default().to_string();
    assert!(line.contains(&format!("change the address in {}", cfg.display())), "the file is named: {line}");
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a Secret Service: run by scripts/test inside dbus-run-session"]
fn two_starts_with_a_keyring_give_the_keyrings_token_and_write_no_file() {
    let dir = temp_dir("keyring");
    let cfg = config_in(&dir);
    let args = ["serve", "--config", cfg.to_str().unwrap_or_default()];
    let (first, logged) = token_of_one_start(&args, &[]);
    let (second, _) = token_of_one_start(&args, &[]);
    assert_eq!(first, second, "a restart keeps the token");
    assert_eq!(corral::secrets::admin_token().expect("the keyring answers"), first, "the desktop app's entry");
    assert!(!dir.join("admin-token").exists(), "no file where the keyring works");
    assert!(logged.contains("kept in the OS keyring"), "{logged}");
    let _ = std::fs::remove_dir_all(&dir);
}
