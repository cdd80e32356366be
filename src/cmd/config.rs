//! `corral config check | export | import`: validate a config file, share one (never secrets:
//! providers only name their keyring entries), and bring a shared one into yours, showing what
//! is added, changed and removed, field by field, with every trust change named in words and
//! held back unless accepted (`--accept-trust-changes`). Also where the other commands find
//! their config.
//!
//! An import is validated whole before anything is written, and written next to the target then
//! renamed over it, so a failure never leaves half a file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use corral::config::{Accept, Config, ImportMode, Plan};

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
    let text = corral::config::share_text(&config);
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

pub fn import(file: &Path, mode: ImportMode, dry_run: bool, target: Option<&Path>, accept: &Accept) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", file.display());
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
    let plan = match corral::config::plan(&base, &text, mode, accept) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            eprintln!("nothing was changed");
            return ExitCode::from(2);
        }
    };
    let problems = plan.next.validate();
    if !problems.is_empty() {
        eprintln!("the imported config would not be valid; nothing was changed:");
        for (path, msg) in problems {
            eprintln!("  {path}: {msg}");
        }
        return ExitCode::from(2);
    }
    print_plan(&plan, &target, file);
    if dry_run {
        println!("dry run: {} not changed", target.display());
        return ExitCode::SUCCESS;
    }
    if plan.next == base {
        // Everything was held back (or there was nothing to take): the file stays as it is.
        println!("nothing written: {} is unchanged", target.display());
        return ExitCode::SUCCESS;
    }
    if let Err(code) = claim_before_write(&base, &plan.next) {
        return code;
    }
    // Edited in place: the file keeps its comments, order and the defaults it left out.
    match corral::config::write_into(&target, &plan.next) {
        Ok(()) => {
            let held =
                if plan.held_back.is_empty() { String::new() } else { format!("; {} held back", plan.held_back.len()) };
            println!("wrote {} ({} change(s){held})", target.display(), plan.changes.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// The preview: each change with its fields old -> new, the trust changes in words (and which
/// are held back), keys that will not follow a provider, the secrets needed.
fn print_plan(plan: &Plan, target: &Path, file: &Path) {
    if plan.changes.is_empty() {
        println!("no changes: {} already has everything in {}", target.display(), file.display());
    }
    for c in &plan.changes {
        println!("{c}");
        for f in &c.fields {
            println!("    {}: {} -> {}", f.field, f.old, f.new);
        }
    }
    if !plan.trust.is_empty() {
        println!("trust changes (each applies only when you accept it):");
        for t in &plan.trust {
            let state = if t.accepted { "accepted" } else { "held back" };
            println!("  ! [{}] {} ({state})", t.id, t.message);
        }
    }
    for note in &plan.notes {
        println!("note: {note}");
    }
    let secrets = corral::config::secret_names(&plan.next);
    if !secrets.is_empty() {
        println!("secrets this config needs (set each with `corral secret set NAME`): {}", secrets.join(", "));
    }
    if !plan.held_back.is_empty() {
        println!(
            "held back {} trust change(s): {}; to apply them re-run with --accept-trust-changes={}",
            plan.held_back.len(),
            plan.held_back.join(", "),
            plan.held_back.join(",")
        );
    }
}

/// Keys stored before keyring namespaces belong to the file being changed: claim them for its
/// providers' origins before the new file is written, so the next start never binds a key to
/// an origin the import brought. If the keyring cannot be reached and the import moves a
/// provider that names a key, nothing is written.
fn claim_before_write(base: &Config, next: &Config) -> Result<(), ExitCode> {
    let providers: Vec<(String, String)> = base
        .providers
        .iter()
        .filter(|p| !p.secret.is_empty())
        .map(|p| (p.secret.clone(), p.base_url.clone()))
        .collect();
    if providers.is_empty() {
        return Ok(());
    }
    let clients: Vec<String> = base.listeners.iter().flat_map(|l| l.api_keys.iter().cloned()).collect();
    let Err(e) = corral::secrets::claim(&providers, &clients) else { return Ok(()) };
    let origin = |u: &str| corral::secrets::origin_of(u).ok();
    let moved = next.providers.iter().filter(|p| !p.secret.is_empty()).any(|p| {
        base.providers.iter().find(|o| o.name == p.name).is_some_and(|o| origin(&o.base_url) != origin(&p.base_url))
    });
    if moved {
        eprintln!("error: {e}");
        eprintln!(
            "the import moves a provider that names a key, and its key cannot be secured first; nothing was changed"
        );
        return Err(ExitCode::from(1));
    }
    eprintln!("warning: keys stored before keyring namespaces were not claimed ({}): {e}", e.code());
    Ok(())
}
