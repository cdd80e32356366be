//! `corral secret set | delete | list`: API keys in the OS keyring. A value comes in on
//! standard input (not echoed on a terminal) and never goes out: `list` prints names only.
//! Also which of a config's secrets are set, for `serve` and `config check`.

use std::process::ExitCode;

use corral::config::Config;
use corral::secrets::SecretError;

use super::args::SecretCommand;

pub fn run(command: SecretCommand) -> ExitCode {
    let result = match command {
        SecretCommand::Set { name } => match read_value(&name) {
            Err(e) => {
                eprintln!("error: cannot read the value: {e}");
                return ExitCode::from(1);
            }
            Ok(v) => {
                // A trailing newline from `echo` or a terminal is not part of a key.
                let v = v.trim_end_matches(['\r', '\n']);
                corral::secrets::set(&name, v).map(|()| format!("stored {name}"))
            }
        },
        SecretCommand::Delete { name } => corral::secrets::delete(&name).map(|()| format!("deleted {name}")),
        SecretCommand::List => corral::secrets::list().map(|names| names.join("\n")),
    };
    match result {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(match e {
                SecretError::BadName(_) | SecretError::Empty => 2,
                _ => 1,
            })
        }
    }
}

/// The value for `name`: prompted for (not shown) on a terminal, else all of standard input.
fn read_value(name: &str) -> Result<String, String> {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        eprint!("value for {name} (not shown): ");
        rpassword::read_password().map_err(|e| e.to_string())
    } else {
        let mut v = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut v).map(|_| v).map_err(|e| e.to_string())
    }
}

/// Each secret the config names, and whether the keyring has it ("set", "missing", or why not).
pub fn states(config: &Config) -> Vec<(String, String)> {
    corral::config::secret_names(config)
        .into_iter()
        .map(|name| {
            let state = match corral::secrets::is_set(&name) {
                Ok(true) => "set".to_string(),
                Ok(false) => "missing".to_string(),
                Err(e) => format!("unknown ({})", e.code()),
            };
            (name, state)
        })
        .collect()
}
