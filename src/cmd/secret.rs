//! `corral secret set | bind | delete | list`: keys in the OS keyring. A value comes in on
//! standard input (not echoed on a terminal) and never goes out: `list` prints names only.
//! `set` files a key under its purpose (a provider key bound to its providers' origins, or a
//! client key); `bind` is a person confirming a provider key for a new origin.
//! Also which of a config's secrets are set, for `serve` and `config check`.

use std::process::ExitCode;

use corral::config::Config;
use corral::secrets::SecretError;

use super::args::SecretCommand;

pub fn run(command: SecretCommand) -> ExitCode {
    let result = match command {
        SecretCommand::Set { name, origin, client, config } => {
            let value = match read_value(&name) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("error: cannot read the value: {e}");
                    return ExitCode::from(1);
                }
            };
            let (config, _, _) = match super::config::load(config.as_deref()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            // A trailing newline from `echo` or a terminal is not part of a key.
            store(&config, &name, value.trim_end_matches(['\r', '\n']), origin, client)
        }
        SecretCommand::Bind { name, origin } => {
            corral::secrets::bind(&name, &origin).map(|o| format!("bound {name} to {o}"))
        }
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
                SecretError::BadName(_) | SecretError::Empty | SecretError::Reserved(_) | SecretError::BadOrigin(_) => {
                    2
                }
                _ => 1,
            })
        }
    }
}

/// Store `value` in the namespace its name has in `config`: a provider key bound to the
/// origins of the providers that name it (and `--origin`), a client key, or, when nobody says,
/// an unclaimed entry that the config the broker starts with claims.
fn store(config: &Config, name: &str, value: &str, extra: Vec<String>, client: bool) -> Result<String, SecretError> {
    let mut origins: Vec<String> =
        config.providers.iter().filter(|p| p.secret == name).map(|p| p.base_url.clone()).collect();
    origins.extend(extra);
    if client || (origins.is_empty() && config.listeners.iter().any(|l| l.api_keys.iter().any(|k| k == name))) {
        return corral::secrets::set_client_key(name, value).map(|()| format!("stored {name} (client key)"));
    }
    if origins.is_empty() {
        return corral::secrets::set(name, value).map(|()| format!("stored {name}"));
    }
    corral::secrets::set_provider_key(name, value, &origins).map(|()| {
        let bound: Vec<String> = origins.iter().filter_map(|o| corral::secrets::origin_of(o).ok()).collect();
        format!("stored {name} (provider key for {})", bound.join(", "))
    })
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
