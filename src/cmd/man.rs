//! `corral man [--out-dir DIR]`: the manual page, generated from the CLI's own definition
//! (`clap_mangen`), so it says what `corral help` says and cannot drift from it.
//!
//! Without `--out-dir`, `corral(1)` in roff on standard output (`corral man | man -l -`): every
//! command with its summary, the global flags, the version. With it, one page per command as
//! well (`corral-serve.1`, `corral-config-check.1`, ...), as a package installs them.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;

/// A command's page, titled in capitals as manual pages are (`.TH CORRAL 1`).
fn page(cmd: clap::Command) -> clap_mangen::Man {
    let title = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_ascii_uppercase();
    clap_mangen::Man::new(cmd).title(title).source(concat!("corral ", env!("CARGO_PKG_VERSION")))
}

/// `cmd`'s page and, below it, every visible subcommand's, into `dir`.
fn write_all(cmd: &clap::Command, dir: &Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_all(sub, dir)?;
    }
    page(cmd.clone()).generate_to(dir).map(drop)
}

pub fn run(out_dir: Option<&Path>) -> ExitCode {
    let mut cmd = super::args::Cli::command();
    let written = match out_dir {
        Some(dir) => {
            // Built once, so each subcommand knows its full name (`corral-config-check`); no
            // pages for `help`, which only prints the others.
            cmd = cmd.disable_help_subcommand(true);
            cmd.build();
            std::fs::create_dir_all(dir).and_then(|()| write_all(&cmd, dir))
        }
        None => {
            let mut out = Vec::new();
            page(cmd).render(&mut out).and_then(|()| std::io::stdout().write_all(&out))
        }
    };
    match written {
        Ok(()) => {
            if let Some(dir) = out_dir {
                eprintln!("wrote the manual pages to {}", dir.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let to = out_dir.map_or_else(|| "standard output".into(), |d| d.display().to_string());
            eprintln!("error: cannot write the manual page to {to}: {e}");
            ExitCode::from(1)
        }
    }
}
