//! `corral config check | export | import`: validate a config file, share one (never secrets:
//! providers only name their keyring entries), and bring a shared one into yours, showing what
//! is added, changed and removed. Also where the other commands find their config.
//!
//! An import is validated whole before anything is written, and written next to the target then
//! renamed over it, so a failure never leaves half a file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use corral::config::{Config, ImportMode};

/// The config, where it came from (for the log), and the file to watch if there is one.
///
/// Without `--config`, the platform config file (`~/.config/corral/corral.toml` on Linux) if it
/// exists, else built-in defaults. A file that does not load is exit 2 with every problem.
pub fn load(path: Option<&Path>) -> Result<(Config, String, Option<PathBuf>), ExitCode> {
    let (path, explicit) = match path {
        Some(p) => (p.to_path_buf(), true),
        None => match corral::config::default_path() {
            Some(p) => (p, false),
            None => return Ok((Config::default(), "built-in defaults".into(), None)),
        },
    };
    if !explicit && !path.exists() {
        return Ok((Config::default(), format!("built-in defaults (no {})", path.display()), None));
    }
    match Config::load(&path) {
        Ok(c) => Ok((c, path.display().to_string(), Some(path))),
        Err(e) => {
            eprintln!("error: {}: {e}", path.display());
            eprintln!("fix the problems above, or check the file with: corral config check {}", path.display());
            Err(ExitCode::from(2))
        }
    }
}

pub fn check(file: &Path, verbose: bool) -> ExitCode {
    match Config::load(file) {
        Ok(c) => {
            for (name, state) in super::secret::states(&c) {
                println!("secret {name}: {state}");
            }
            for (path, message) in c.warnings() {
                println!("warning: {path}: {message}");
            }
            println!(
                "{}: ok ({} node(s), {} categor{})",
                file.display(),
                c.nodes.len(),
                c.categories.len(),
                if c.categories.len() == 1 { "y" } else { "ies" }
            );
            if verbose {
                println!("\n# applied at reload: every key but these, which take effect at the next restart:");
                for (key, why) in corral::state::RESTART_KEYS {
                    println!("#   {key}: {why}");
                }
                println!("\n# effective config, defaults filled in\n{}", c.to_toml());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            ExitCode::from(2)
        }
    }
}

pub fn export(config: Option<&Path>, out: Option<&Path>) -> ExitCode {
    let (config, _, _) = match load(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let text = corral::config::export_text(&config);
    match out {
        None => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Some(path) => match corral::config::write_private(path, &text) {
            Ok(()) => {
                eprintln!("wrote {}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot write {}: {e}", path.display());
                ExitCode::from(1)
            }
        },
    }
}

pub fn import(file: &Path, mode: ImportMode, dry_run: bool, target: Option<&Path>) -> ExitCode {
    let incoming = match Config::load(file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            eprintln!("nothing was changed");
            return ExitCode::from(2);
        }
    };
    let Some(target) = target.map(Path::to_path_buf).or_else(corral::config::default_path) else {
        eprintln!("error: no platform config dir; pass --config FILE");
        return ExitCode::from(2);
    };
    let base = if target.exists() {
        match Config::load(&target) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{}: {e}", target.display());
                eprintln!("fix your own config first; nothing was changed");
                return ExitCode::from(2);
            }
        }
    } else {
        Config::default()
    };
    let (next, changes) = corral::config::import(&base, &incoming, mode);
    let problems = next.validate();
    if !problems.is_empty() {
        eprintln!("the imported config would not be valid; nothing was changed:");
        for (path, msg) in problems {
            eprintln!("  {path}: {msg}");
        }
        return ExitCode::from(2);
    }
    if changes.is_empty() {
        println!("no changes: {} already has everything in {}", target.display(), file.display());
    }
    for c in &changes {
        println!("{c}");
    }
    let secrets = corral::config::secret_names(&next);
    if !secrets.is_empty() {
        println!("secrets this config needs (set each with `corral secret set NAME`): {}", secrets.join(", "));
    }
    if dry_run {
        println!("dry run: {} not changed", target.display());
        return ExitCode::SUCCESS;
    }
    match corral::config::write_private(&target, &corral::config::export_text(&next)) {
        Ok(()) => {
            println!("wrote {} ({} change(s))", target.display(), changes.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot write {}: {e}", target.display());
            ExitCode::from(1)
        }
    }
}
