//! The configuration file (`corral.toml`): loading, with the schema, validation and sharing
//! in submodules.
//!
//! Config is data: one struct per section, `deny_unknown_fields`, defaults that work with no file
//! at all (one proxy listener on 127.0.0.1:11400 in front of one Ollama on 127.0.0.1:11434).
//! Parsing never stops at the first problem: each section is deserialized on its own, then the
//! whole is validated, and every problem is reported with its path (`nodes[1].url`) and the line
//! it sits on, found through `toml_edit`'s spans. A `Config` that `parse` returns has no
//! problems. Loading reads one file and changes nothing on disk. Names here are the public
//! contract (CONTRACT.md); add fields freely, never rename one.
//!
//! - `schema`: the sections, their serde shape and defaults.
//! - `validate`: `Config::validate`, `Problem`, `ConfigError`, and finding a path's line.
//! - `share`: `export_text`, `import` and its change list, `secret_names`.
//!
//! Everything is re-exported here, so callers say `crate::config::X`.

mod edit;
mod schema;
mod share;
mod validate;

pub use edit::{edit_text, write_into, EditError};
pub use schema::{
    model_key, normalize_model, AdminConfig, AlertsConfig, BreakerConfig, CategoryConfig, CloudPermission, Config,
    DegradeOrder, HealthConfig, ListenerConfig, NodeConfig, NodeKind, Origin, OverLimit, Policy, ProviderConfig,
    ProxyConfig, QueueConfig, QuotaConfig, RequestLimits, RetryConfig, StoreConfig, ANY_FLEET_KEY, DEFAULT_ADMIN_ADDR,
    DEFAULT_NODE_URL, DEFAULT_PROXY_ADDR,
};
pub use share::{
    export_text, import, plan, redacted_url, secret_names, share_text, Accept, Change, FieldChange, ImportMode, Plan,
    TrustChange,
};
pub use validate::{ConfigError, Problem};

use validate::{line_of, Locator};

/// `corral.toml` in the platform config dir (`~/.config/corral/` on Linux).
pub fn default_path() -> Option<std::path::PathBuf> {
    directories::ProjectDirs::from("dev", "corral", "corral").map(|d| d.config_dir().join("corral.toml"))
}

/// Create `dir` and any missing parents readable by the owner only (0700 on Unix): config and
/// data directories hold prompts' metadata and the shape of the cluster. A directory that
/// already exists is left as it is (it may be the user's own, such as the working directory).
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Make an existing file or directory the owner's only: 0600 for files, 0700 for directories
/// (Unix; elsewhere nothing to do). Whatever the umask was when it was created.
pub fn make_private(path: &std::path::Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if path.is_dir() { 0o700 } else { 0o600 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Write a config file Corral makes (export, import) whole: the text goes to a sibling created
/// 0600, then is renamed over `target`, so a crash never leaves half a file and no other user
/// can read it at any point. Missing directories are created 0700.
pub fn write_private(target: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = target.parent() {
        create_private_dir(dir)?;
        // Corral's own config directory is made private even when it already exists.
        if default_path().as_deref().and_then(std::path::Path::parent) == Some(dir) {
            make_private(dir)?;
        }
    }
    // A name of its own per write: two writers at once (two processes, or an export and an
    // edit) never share, truncate or rename each other's half-written file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = std::ffi::OsString::from(".");
    name.push(target.file_name().unwrap_or_default());
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = target.with_file_name(name);
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    let mut file = open.open(&tmp)?;
    let written = file.write_all(text.as_bytes()).and_then(|()| file.sync_all());
    let renamed = written.and_then(|()| std::fs::rename(&tmp, target));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// The largest config text Corral parses (a file, a shared file, an admin import): a config
/// with a hundred nodes is tens of KiB, and a shared file of millions of items would take
/// seconds and hundreds of MiB to read (issue found from outside: 10 MB, 33 s, 556 MB).
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

impl Config {
    /// Parse and validate a config text, reporting every problem with its line.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError {
                problems: vec![Problem {
                    path: String::new(),
                    line: None,
                    message: format!(
                        "the file is {} bytes; a config is at most {MAX_CONFIG_BYTES} (1 MiB): is this the right file?",
                        text.len()
                    ),
                }],
            });
        }
        let doc = match toml_edit::ImDocument::parse(text) {
            Ok(doc) => doc,
            Err(e) => {
                let line = e.span().map(|s| line_of(text, s.start));
                return Err(ConfigError {
                    problems: vec![Problem {
                        path: String::new(),
                        line,
                        message: format!("not valid TOML: {}", e.message()),
                    }],
                });
            }
        };
        let root: toml::Table = toml::from_str(text).map_err(|e| ConfigError {
            problems: vec![Problem {
                path: String::new(),
                line: e.span().map(|s| line_of(text, s.start)),
                message: e.message().to_string(),
            }],
        })?;
        let locator = Locator { text, doc: &doc };
        let mut problems = Vec::new();
        let mut config = Config::default();

        for (key, value) in &root {
            let path = key.as_str();
            match path {
                "listeners" => section_array(&locator, path, value, &mut problems, &mut config.listeners),
                "nodes" => section_array(&locator, path, value, &mut problems, &mut config.nodes),
                "categories" => section_array(&locator, path, value, &mut problems, &mut config.categories),
                "providers" => section_array(&locator, path, value, &mut problems, &mut config.providers),
                "admin" => section(&locator, path, value, &mut problems, &mut config.admin),
                "proxy" => section(&locator, path, value, &mut problems, &mut config.proxy),
                "health" => section(&locator, path, value, &mut problems, &mut config.health),
                "breaker" => section(&locator, path, value, &mut problems, &mut config.breaker),
                "retry" => section(&locator, path, value, &mut problems, &mut config.retry),
                "queue" => section(&locator, path, value, &mut problems, &mut config.queue),
                "store" => section(&locator, path, value, &mut problems, &mut config.store),
                "alerts" => section(&locator, path, value, &mut problems, &mut config.alerts),
                "telemetry" => section(&locator, path, value, &mut problems, &mut config.telemetry),
                "quotas" => section_array(&locator, path, value, &mut problems, &mut config.quotas),
                other => problems.push(Problem {
                    path: other.to_string(),
                    line: locator.line(other, None),
                    message:
                        "unknown section; known: listeners, admin, nodes, categories, providers, proxy, health, breaker, retry, queue, store, alerts, telemetry, quotas"
                            .into(),
                }),
            }
        }
        // A file that lists no categories still gets the default one, so requests can be classified.
        if !root.contains_key("categories") {
            config.categories = vec![CategoryConfig::default()];
        }
        for (path, message) in config.validate() {
            let line = locator.line(&path, None);
            problems.push(Problem { path, line, message });
        }
        if problems.is_empty() {
            Ok(config)
        } else {
            problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
            Err(ConfigError { problems })
        }
    }

    /// Read and parse a file; problems carry the file's lines.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            problems: vec![Problem {
                path: String::new(),
                line: None,
                message: format!("cannot read {}: {e}", path.display()),
            }],
        })?;
        Config::parse(&text)
    }
}

fn section<T: serde::de::DeserializeOwned>(
    loc: &Locator<'_>,
    path: &str,
    value: &toml::Value,
    problems: &mut Vec<Problem>,
    out: &mut T,
) {
    match T::deserialize(value.clone()) {
        Ok(v) => *out = v,
        Err(e) => problems.push(loc.serde_problem(path, e)),
    }
}

fn section_array<T: serde::de::DeserializeOwned>(
    loc: &Locator<'_>,
    path: &str,
    value: &toml::Value,
    problems: &mut Vec<Problem>,
    out: &mut Vec<T>,
) {
    let Some(items) = value.as_array() else {
        problems.push(Problem {
            path: path.into(),
            line: loc.line(path, None),
            message: format!("must be a list of tables, written [[{path}]]"),
        });
        return;
    };
    out.clear();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        match T::deserialize(item.clone()) {
            Ok(v) => out.push(v),
            Err(e) => problems.push(loc.serde_problem(&item_path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_working_defaults() {
        let c = Config::parse("").expect("empty config is valid");
        assert_eq!(c.listeners[0].addr, DEFAULT_PROXY_ADDR);
        assert_eq!(c.nodes[0].url, DEFAULT_NODE_URL);
        assert_eq!(c.categories[0].name, "default");
    }

    #[test]
    fn contract_example_parses() {
        let text = r#"
[[listeners]]
addr = "127.0.0.1:11400"
origin = "local"
category = "default"

[admin]
addr = "127.0.0.1:11402"

[[nodes]]
name = "gpu0"
url = "http://127.0.0.1:11434"
kind = "ollama"
weight = 1
max_concurrency = 4
enabled = true

[[categories]]
name = "default"
policy = "least-connections"
priority = 1
queue_timeout_ms = 30000
cloud = "never"
providers = []
redact = false
models = []

[[providers]]
name = "openai"
base_url = "https://api.openai.com/v1"
secret = "openai"
model_map = { "llama3.1:8b" = "gpt-4o-mini" }
"#;
        let c = Config::parse(text).unwrap_or_else(|e| panic!("contract example must parse: {e}"));
        assert_eq!(c.nodes[0].name, "gpu0");
        assert_eq!(c.providers[0].model_map["llama3.1:8b"], "gpt-4o-mini");
    }

    #[test]
    fn unknown_fields_and_sections_are_named() {
        let err = Config::parse("[[nodes]]\nname = \"a\"\nurl = \"http://x:1\"\nwieght = 2\n[bogus]\nx = 1\n")
            .expect_err("typos");
        let text = err.to_string();
        assert!(text.contains("line 4") && text.contains("wieght"), "{text}");
        assert!(text.contains("line 5") && text.contains("bogus"), "{text}");
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let err = Config::parse("[[nodes]]\nname = \"a\nurl = 3\n").expect_err("unterminated string");
        assert_eq!(err.problems.len(), 1);
        assert_eq!(err.problems[0].line, Some(2), "{err}");
    }

    #[test]
    fn round_trips_through_toml() {
        let c = Config::default();
        let back = Config::parse(&c.to_toml()).expect("rendered config parses");
        assert_eq!(c, back);
    }
}
