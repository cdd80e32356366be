//! Packaging: the systemd unit (`packaging/corral.service`) passes `systemd-analyze verify`,
//! `corral completions bash` is a script bash sources, and `corral man` is a manual page that
//! names every command.
//!
//! `systemd-analyze` and `man` come from the `systemd` and `man-db` packages (scripts/test
//! installs them and sets `CORRAL_PACKAGING_TOOLS=required`, so there a missing tool fails
//! instead of skipping).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_corral");
const UNIT: &str = include_str!("../packaging/corral.service");

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("corral-packaging-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Whether `tool` runs here; without it the test is skipped, unless scripts/test says the
/// tools are required.
fn have(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CORRAL_PACKAGING_TOOLS").as_deref() != Ok("required"),
            "{tool} is required here (scripts/test installs it)"
        );
        eprintln!("skipped: {tool} is not installed");
    }
    found
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The manual pages `corral man --out-dir` writes, under `dir/man1` (a MANPATH entry).
fn man_pages(dir: &Path) -> PathBuf {
    let man1 = dir.join("man1");
    let out = Command::new(BIN).args(["man", "--out-dir"]).arg(&man1).output().expect("corral man runs");
    assert!(out.status.success(), "corral man --out-dir: {}", text(&out));
    man1
}

/// `systemd-analyze verify` on `unit` (its ExecStart pointed at the built binary, as verify
/// needs the binary to exist), with the man pages its `Documentation=` names on MANPATH.
fn verify(unit: &str, dir: &Path) -> Output {
    let unit = unit.replace("ExecStart=/usr/bin/corral ", &format!("ExecStart={BIN} "));
    let path = dir.join("corral.service");
    std::fs::write(&path, unit).expect("write the unit");
    man_pages(dir);
    Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", dir)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("systemd-analyze runs")
}

#[test]
fn the_unit_runs_corral_serve_as_its_own_user_with_state_and_config_dirs() {
    let lines: Vec<&str> = UNIT.lines().map(str::trim).collect();
    for want in [
        "ExecStart=/usr/bin/corral serve --config /etc/corral/corral.toml",
        "DynamicUser=yes",
        "User=corral",
        "StateDirectory=corral",
        "ConfigurationDirectory=corral",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "NoNewPrivileges=yes",
        "KillSignal=SIGTERM",
        "WantedBy=multi-user.target",
    ] {
        assert!(lines.contains(&want), "the unit lacks {want:?}");
    }
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    if !have("systemd-analyze") || !have("man") {
        return;
    }
    let dir = temp_dir("unit");
    let out = verify(UNIT, &dir);
    assert!(out.status.success(), "systemd-analyze verify failed: {}", text(&out));
    assert_eq!(text(&out).trim(), "", "verify is clean: no warnings either");
    // The check can fail: an unknown value is reported.
    let broken = UNIT.replace("ProtectSystem=strict", "ProtectSystem=stricter");
    let out = verify(&broken, &temp_dir("broken-unit"));
    assert!(!text(&out).trim().is_empty(), "verify must complain about ProtectSystem=stricter");
}

#[test]
fn bash_sources_the_completions_and_completes_corral_with_a_function() {
    let script = r#"source <("$CORRAL_BIN" completions bash) && complete -p corral"#;
    let out = Command::new("bash").args(["-c", script]).env("CORRAL_BIN", BIN).output().expect("bash runs");
    assert!(out.status.success(), "bash could not source the completions: {}", text(&out));
    assert!(out.stderr.is_empty(), "sourcing printed errors: {}", text(&out));
    let spec = String::from_utf8_lossy(&out.stdout);
    let function = spec.split_whitespace().skip_while(|w| *w != "-F").nth(1);
    assert!(function.is_some_and(|f| !f.is_empty()), "complete -p corral names a function: {spec}");
    let f = function.unwrap_or_default();
    let check = format!(r#"source <("$CORRAL_BIN" completions bash) && declare -F {f}"#);
    let out = Command::new("bash").args(["-c", &check]).env("CORRAL_BIN", BIN).output().expect("bash runs");
    assert!(out.status.success(), "{f} is defined by the script: {}", text(&out));
}

/// The commands `corral --help` lists.
fn commands() -> Vec<String> {
    let out = Command::new(BIN).arg("--help").output().expect("corral --help runs");
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    let listed = help.split("Commands:").nth(1).and_then(|s| s.split("Options:").next()).unwrap_or_default();
    let names: Vec<String> = listed
        .lines()
        .filter_map(|l| l.strip_prefix("  ").and_then(|l| l.split_whitespace().next()))
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    assert!(names.len() >= 10 && names.iter().any(|n| n == "serve"), "commands from --help: {names:?}\n{help}");
    names
}

#[test]
fn the_man_page_names_every_command_and_man_renders_it() {
    let out = Command::new(BIN).arg("man").output().expect("corral man runs");
    assert!(out.status.success(), "corral man: {}", text(&out));
    let roff = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(roff.lines().any(|l| l.starts_with(".TH CORRAL 1")), "a corral(1) page: {roff}");
    let commands = commands();
    for c in commands.iter().filter(|c| *c != "help") {
        assert!(roff.contains(&format!("corral\\-{c}(1)")), "the page lists {c}");
    }
    let dir = temp_dir("man");
    let man1 = man_pages(&dir);
    for c in commands.iter().filter(|c| *c != "help") {
        assert!(man1.join(format!("corral-{c}.1")).is_file(), "corral-{c}.1 is written");
    }
    if !have("man") {
        return;
    }
    let out = Command::new("man").arg("-l").arg(man1.join("corral.1")).env("MANPAGER", "cat").output().expect("man");
    assert!(out.status.success(), "man -l: {}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("SUBCOMMANDS") && shown.contains("corral-serve(1)"), "man renders it: {shown}");
}

/// The paths a .deb holds (`dpkg-deb -c`), and its control fields (`dpkg-deb -f`).
fn deb_contents(deb: &str) -> (Vec<String>, String) {
    let list = Command::new("dpkg-deb").args(["-c", deb]).output().expect("dpkg-deb -c runs");
    assert!(list.status.success(), "{}", text(&list));
    let paths = text(&list)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| format!("/{}", p.trim_start_matches("./").trim_start_matches('/')))
        .collect();
    let control = Command::new("dpkg-deb").args(["-f", deb]).output().expect("dpkg-deb -f runs");
    (paths, text(&control))
}

/// The .deb CI builds from the Tauri bundle (scripts/test sets `CORRAL_DEB`): run with
/// `--ignored` there, after the desktop build.
#[test]
#[ignore = "needs the .deb scripts/test builds (CORRAL_DEB)"]
fn the_deb_holds_the_desktop_entry_icons_both_binaries_the_unit_and_the_man_pages() {
    let deb = std::env::var("CORRAL_DEB").expect("CORRAL_DEB names the .deb");
    let (paths, control) = deb_contents(&deb);
    for want in [
        "/usr/bin/corral-desktop",
        "/usr/bin/corral",
        "/usr/lib/systemd/system/corral.service",
        "/usr/share/applications/Corral.desktop",
        "/usr/share/icons/hicolor/128x128/apps/corral-desktop.png",
        "/usr/share/icons/hicolor/32x32/apps/corral-desktop.png",
        "/usr/share/man/man1/corral.1.gz",
        "/usr/share/man/man1/corral-serve.1.gz",
    ] {
        assert!(paths.iter().any(|p| p == want), "the .deb lacks {want}: {paths:?}");
    }
    assert!(control.contains("Package: corral"), "{control}");
    assert!(control.contains("Depends:") && control.contains("libwebkit2gtk-4.1-0"), "{control}");
    // What it installs is what was built: the unit byte for byte, the desktop entry launching the app.
    let dir = temp_dir("deb");
    let out = Command::new("dpkg-deb").args(["-x", &deb]).arg(&dir).output().expect("dpkg-deb -x runs");
    assert!(out.status.success(), "{}", text(&out));
    let unit = std::fs::read_to_string(dir.join("usr/lib/systemd/system/corral.service")).expect("unit");
    assert_eq!(unit, UNIT);
    let entry = std::fs::read_to_string(dir.join("usr/share/applications/Corral.desktop")).expect("desktop entry");
    assert!(entry.lines().any(|l| l == "Exec=corral-desktop"), "{entry}");
    assert!(entry.lines().any(|l| l == "Icon=corral-desktop"), "{entry}");
    let version = Command::new(dir.join("usr/bin/corral")).arg("--version").output().expect("the packaged CLI runs");
    assert!(text(&version).contains(env!("CARGO_PKG_VERSION")), "{}", text(&version));
    let _ = std::fs::remove_dir_all(&dir);
}
