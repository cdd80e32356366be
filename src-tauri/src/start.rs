//! Where the cluster comes from, and starting the embedded broker on it.
//!
//! `--config FILE` (as `corral serve` takes it), else `CORRAL_CONFIG`, else `corral.toml` in
//! the platform config dir. A file named by the flag or the variable must exist and be valid:
//! otherwise the app says so and stops (it never falls back to the demo in its place). With no
//! file named and none in the config dir: the Ollama on the default port, else the demo cluster.

use std::path::PathBuf;

use corral::config::Config;
use corral::sim::SimNode;
use corral::{Broker, StartOptions};

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Args {
    pub config: Option<PathBuf>,
    pub help: bool,
}

pub const USAGE: &str = "usage: corral-desktop [--config FILE]\n\n  --config FILE  the cluster's config (default: CORRAL_CONFIG, else corral.toml in the config dir)";

/// Parse the app's arguments (without the program name). Unknown ones are a usage error.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut out = Args::default();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" | "-c" => match it.next() {
                Some(f) if !f.is_empty() => out.config = Some(PathBuf::from(f)),
                _ => return Err("--config needs a file: corral-desktop --config FILE".into()),
            },
            "-h" | "--help" => out.help = true,
            s if s.starts_with("--config=") => out.config = Some(PathBuf::from(&s["--config=".len()..])),
            s => return Err(format!("unknown argument {s:?}\n\n{USAGE}")),
        }
    }
    Ok(out)
}

/// Which config to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Named by the flag or the variable: it must load.
    Named { path: PathBuf, by: &'static str },
    /// The platform default; used when it exists.
    Default(PathBuf),
    /// No file anywhere.
    None,
}

/// The flag wins over the variable, which wins over the platform default.
pub fn choose(flag: Option<PathBuf>, env: Option<PathBuf>, default: Option<PathBuf>) -> Source {
    match (flag, env.filter(|p| !p.as_os_str().is_empty())) {
        (Some(path), _) => Source::Named { path, by: "--config" },
        (None, Some(path)) => Source::Named { path, by: "CORRAL_CONFIG" },
        (None, None) => default.map_or(Source::None, Source::Default),
    }
}

/// A started broker and what it fronts.
pub struct Started {
    pub broker: Broker,
    pub sims: Vec<SimNode>,
    /// Said in the log: "/home/me/corral.toml", "the demo cluster ...".
    pub source: String,
    /// The config file in use, if any (where the tray's "config folder" points).
    pub file: Option<PathBuf>,
}

/// Load a named file, with an error that says which file, who named it and what is wrong.
pub fn load_named(path: &std::path::Path, by: &str) -> Result<Config, String> {
    if !path.exists() {
        return Err(format!(
            "{} (given by {by}) does not exist. Pass an existing file, or start without {by} to use the demo cluster.",
            path.display()
        ));
    }
    Config::load(path).map_err(|e| format!("{} (given by {by}) is not a valid config:\n{e}", path.display()))
}

pub async fn start_broker(source: Source) -> Result<Started, String> {
    let token = admin_token();
    let file = match &source {
        Source::Named { path, .. } => Some(path.clone()),
        Source::Default(p) if p.exists() => Some(p.clone()),
        _ => None,
    };
    let mut sims = Vec::new();
    let (config, said) = match &source {
        Source::Named { path, by } => (load_named(path, by)?, path.display().to_string()),
        Source::Default(p) if p.exists() => (load_named(p, "the config dir")?, p.display().to_string()),
        _ if ollama_on_default_port().await => (Config::default(), "the Ollama on 127.0.0.1:11434".into()),
        _ => {
            let (s, config) = demo().await?;
            sims = s;
            (config, "the demo cluster (no config, no Ollama on 127.0.0.1:11434)".into())
        }
    };
    let options = StartOptions {
        admin_token: token,
        config_path: file.clone(),
        demo: !sims.is_empty(),
        ..StartOptions::default()
    };
    let broker = Broker::start(config, options).await.map_err(|e| e.to_string())?;
    Ok(Started { broker, sims, source: said, file })
}

/// `CORRAL_ADMIN_TOKEN`, else the keyring's (kept between starts), else one for this run.
fn admin_token() -> Option<String> {
    std::env::var("CORRAL_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()).or_else(|| {
        match corral::secrets::admin_token() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "admin token not kept in the keyring; using one for this run");
                None
            }
        }
    })
}

async fn demo() -> Result<(Vec<SimNode>, Config), String> {
    let (mut sims, nodes) =
        corral::sim::demo_nodes(3).await.map_err(|e| format!("cannot start the demo nodes: {e}"))?;
    let mut c = Config { nodes, ..Config::default() };
    let (cloud, provider, categories) =
        corral::sim::demo_cloud().await.map_err(|e| format!("cannot start the simulated cloud: {e}"))?;
    sims.push(cloud);
    c.providers.push(provider);
    c.categories.extend(categories);
    c.store.path = Some(corral::store::default_path(&c.store).with_file_name("corral-demo.db").display().to_string());
    Ok((sims, c))
}

/// Whether something listens on Ollama's default port (a bare connect, within half a second).
async fn ollama_on_default_port() -> bool {
    let connect = tokio::net::TcpStream::connect("127.0.0.1:11434");
    matches!(tokio::time::timeout(std::time::Duration::from_millis(500), connect).await, Ok(Ok(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Args, String> {
        parse_args(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn the_config_flag_is_read_in_both_spellings() {
        assert_eq!(args(&["--config", "a.toml"]).unwrap().config, Some(PathBuf::from("a.toml")));
        assert_eq!(args(&["--config=b.toml"]).unwrap().config, Some(PathBuf::from("b.toml")));
        assert_eq!(args(&[]).unwrap(), Args::default());
        assert!(args(&["--config"]).unwrap_err().contains("needs a file"));
        assert!(args(&["--confg", "x"]).unwrap_err().contains("unknown argument \"--confg\""));
    }

    #[test]
    fn the_flag_wins_over_the_variable_which_wins_over_the_default() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(choose(p("f"), p("e"), p("d")), Source::Named { path: "f".into(), by: "--config" });
        assert_eq!(choose(None, p("e"), p("d")), Source::Named { path: "e".into(), by: "CORRAL_CONFIG" });
        assert_eq!(choose(None, p(""), p("d")), Source::Default("d".into()));
        assert_eq!(choose(None, None, None), Source::None);
    }

    #[test]
    fn a_named_file_that_is_missing_or_invalid_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("corral-desktop-start-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.toml");
        let e = load_named(&missing, "--config").unwrap_err();
        assert!(e.contains("missing.toml (given by --config) does not exist"), "{e}");
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "[[nodes]]\nname = \"a\"\nurl = \"not a url\"\n").unwrap();
        let e = load_named(&bad, "CORRAL_CONFIG").unwrap_err();
        assert!(e.contains("bad.toml (given by CORRAL_CONFIG) is not a valid config"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
