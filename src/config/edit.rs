//! Writing a changed config back into the user's own file, keeping the file theirs.
//!
//! An edit made in the UI, the admin API or an import must survive the next hot reload of the
//! file, so it is written into the file; but the file is the user's: comments, order, spacing
//! and the keys they chose to leave at their defaults stay as they were. So the file is edited
//! as a document (`toml_edit`), not re-serialized: only the values that differ between the
//! config the file holds and the one to write are set, items are matched by `name` (listeners
//! by position), new items carry only their non-default keys, removed items go.
//!
//! Invariant: parsing the written file gives back exactly the config that was asked for
//! (checked after every write, before the file is replaced).

use std::path::Path;

use toml_edit::{DocumentMut, Item, Table};

use super::Config;

/// Why the file could not be updated.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("cannot read {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("{path} is not TOML Corral can edit: {detail}")]
    Parse { path: String, detail: String },
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
    /// The edited document would not read back as the requested config: nothing was written.
    #[error("editing {path} in place would not give back the requested config ({detail}); nothing was written")]
    Drift { path: String, detail: String },
}

impl EditError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Read { .. } => "config_file_unreadable",
            Self::Parse { .. } => "config_file_unparsable",
            Self::Write { .. } => "config_file_unwritable",
            Self::Drift { .. } => "config_file_drift",
        }
    }
}

/// Write `next` into the file at `path`, changing only what differs from what the file holds.
pub fn write_into(path: &Path, next: &Config) -> Result<(), EditError> {
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(EditError::Read { path: shown, detail: e.to_string() }),
    };
    let edited = edit_text(&text, next).map_err(|detail| EditError::Parse { path: shown.clone(), detail })?;
    match Config::parse(&edited) {
        Ok(back) if &back == next => {}
        Ok(_) => return Err(EditError::Drift { path: shown, detail: "a value reads back differently".into() }),
        Err(e) => return Err(EditError::Drift { path: shown, detail: e.to_string() }),
    }
    if edited == text {
        return Ok(());
    }
    if !text.is_empty() {
        backup(path, &text).map_err(|e| EditError::Write { path: shown.clone(), detail: format!("backup: {e}") })?;
    }
    super::write_private(path, &edited).map_err(|e| EditError::Write { path: shown, detail: e.to_string() })
}

/// Backups of a config file kept beside it, newest last; older ones are removed.
pub const BACKUPS_KEPT: usize = 20;

/// Keep `text` (what `path` held before an edit) as `<dir>/.corral-backups/<name>.<UTC time>`,
/// so an edit made through the UI can always be undone by hand.
fn backup(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new(".")).join(".corral-backups");
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let stamp = time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!("[year][month][day]T[hour][minute][second].[subsecond digits:6]Z"))
        .unwrap_or_default();
    super::write_private(&dir.join(format!("{name}.{stamp}")), text)?;
    let mut kept: Vec<_> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with(&format!("{name}.")) && !f.ends_with(".tmp"))
        .collect();
    kept.sort();
    for old in kept.iter().take(kept.len().saturating_sub(BACKUPS_KEPT)) {
        let _ = std::fs::remove_file(dir.join(old));
    }
    Ok(())
}

/// `text` with `next` applied as a minimal edit.
pub fn edit_text(text: &str, next: &Config) -> Result<String, String> {
    let mut doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| e.to_string())?;
    let old = if text.trim().is_empty() { Config::default() } else { Config::parse(text).unwrap_or_default() };
    let old = table_of(&old)?;
    let new = table_of(next)?;
    for (key, value) in &new {
        if old.get(key) == Some(value) {
            continue;
        }
        match value {
            toml::Value::Array(items) if items.iter().all(|v| v.is_table()) && !items.is_empty() => {
                edit_array(&mut doc, key, old.get(key), items)
            }
            toml::Value::Table(t) => edit_section(&mut doc, key, old.get(key).and_then(|v| v.as_table()), t),
            other => doc[key.as_str()] = value_item(other),
        }
    }
    // Arrays that became empty (every node removed, say); one that was empty already stays as
    // the file has it (with the comments around it).
    for (key, value) in &old {
        let was_full = value.as_array().is_some_and(|a| !a.is_empty());
        if was_full && new.get(key).and_then(|v| v.as_array()).is_some_and(Vec::is_empty) {
            doc.remove(key);
        }
    }
    Ok(doc.to_string())
}

fn table_of(c: &Config) -> Result<toml::Table, String> {
    match toml::Value::try_from(c).map_err(|e| e.to_string())? {
        toml::Value::Table(t) => Ok(t),
        _ => Err("the config is not a table".into()),
    }
}

fn value_item(v: &toml::Value) -> Item {
    let text = format!("v = {v}");
    text.parse::<DocumentMut>().ok().and_then(|d| d.get("v").cloned()).unwrap_or(Item::None)
}

/// Put `v` in `slot`, keeping the spacing and the comment around the value it replaces
/// (`policy = "p2c"  # fast` stays commented).
fn set_value(slot: &mut Item, v: &toml::Value) {
    let mut next = value_item(v);
    if let (Some(old), Some(new)) = (slot.as_value(), next.as_value_mut()) {
        let (prefix, suffix) = (old.decor().prefix().cloned(), old.decor().suffix().cloned());
        if let Some(p) = prefix {
            new.decor_mut().set_prefix(p);
        }
        if let Some(s) = suffix {
            new.decor_mut().set_suffix(s);
        }
    }
    *slot = next;
}

/// `[section]`: set each key whose value changed.
fn edit_section(doc: &mut DocumentMut, key: &str, old: Option<&toml::Table>, new: &toml::Table) {
    let changed: Vec<(&String, &toml::Value)> =
        new.iter().filter(|(k, v)| old.and_then(|o| o.get(*k)) != Some(*v)).collect();
    if changed.is_empty() {
        return;
    }
    if !doc.contains_table(key) {
        doc[key] = Item::Table(Table::new());
    }
    for (k, v) in changed {
        set_value(&mut doc[key][k.as_str()], v);
    }
}

/// The identity of an item of `[[key]]`: its `name`, else its position.
fn identity(v: &toml::Value, i: usize) -> String {
    v.get("name").and_then(|n| n.as_str()).map_or_else(|| format!("#{i}"), str::to_string)
}

/// The identities of the items the file itself holds under `[[key]]`.
fn doc_identities(array: &toml_edit::ArrayOfTables) -> Vec<String> {
    array
        .iter()
        .enumerate()
        .map(|(i, t)| t.get("name").and_then(|n| n.as_str()).map_or_else(|| format!("#{i}"), str::to_string))
        .collect()
}

/// `[[key]]`: update the file's items in place by identity, append new ones (non-default keys
/// only), drop removed ones.
fn edit_array(doc: &mut DocumentMut, key: &str, old: Option<&toml::Value>, new: &[toml::Value]) {
    let old_items: Vec<toml::Value> = old.and_then(|v| v.as_array()).cloned().unwrap_or_default();
    let default_item = item_defaults(key);
    if !matches!(doc.get(key), Some(Item::ArrayOfTables(_))) {
        doc[key] = Item::ArrayOfTables(toml_edit::ArrayOfTables::new());
    }
    let Some(array) = doc[key].as_array_of_tables_mut() else { return };
    let wanted: Vec<String> = new.iter().enumerate().map(|(i, v)| identity(v, i)).collect();
    for (i, id) in doc_identities(array).iter().enumerate().rev() {
        if !wanted.contains(id) {
            array.remove(i);
        }
    }
    for (i, item) in new.iter().enumerate() {
        let id = identity(item, i);
        let Some(table) = item.as_table() else { continue };
        let before = old_items.iter().enumerate().find(|(j, v)| identity(v, *j) == id).and_then(|(_, v)| v.as_table());
        match doc_identities(array).iter().position(|k| *k == id) {
            Some(at) => {
                if let Some(t) = array.get_mut(at) {
                    for (k, v) in table {
                        if before.and_then(|b| b.get(k)) != Some(v) {
                            set_value(&mut t[k.as_str()], v);
                        }
                    }
                }
            }
            None => {
                let mut t = Table::new();
                for (k, v) in table {
                    let is_default = default_item.as_ref().and_then(|d| d.get(k)) == Some(v);
                    if !is_default || k == "name" {
                        t[k.as_str()] = value_item(v);
                    }
                }
                array.push(t);
            }
        }
    }
}

/// The serialized defaults of one item of `[[key]]`, to leave out of new items.
fn item_defaults(key: &str) -> Option<toml::Table> {
    let v = match key {
        "nodes" => toml::Value::try_from(super::NodeConfig::default()).ok()?,
        "categories" => toml::Value::try_from(super::CategoryConfig::default()).ok()?,
        "providers" => toml::Value::try_from(super::ProviderConfig::default()).ok()?,
        "listeners" => toml::Value::try_from(super::ListenerConfig::default()).ok()?,
        _ => return None,
    };
    v.as_table().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# my cluster\n[[nodes]]\nname = \"gpu0\" # the big one\nurl = \"http://127.0.0.1:11434\"\n\n[[nodes]]\nname = \"gpu1\"\nurl = \"http://127.0.0.1:11435\"\n\n[[categories]]\nname = \"default\"\npolicy = \"p2c\" # fast\n";

    #[test]
    fn each_write_keeps_the_previous_file_and_only_the_newest_backups_stay() {
        let dir = std::env::temp_dir().join(format!("corral-edit-backup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("corral.toml");
        std::fs::write(&path, "# mine\n[retry]\nmax_attempts = 2\n").expect("write");
        for n in 0..(BACKUPS_KEPT as u32 + 3) {
            let mut next = Config::load(&path).expect("valid");
            next.retry.max_attempts = 3 + n;
            write_into(&path, &next).expect("written");
        }
        let mut kept: Vec<_> =
            std::fs::read_dir(dir.join(".corral-backups")).expect("dir").flatten().map(|e| e.path()).collect();
        kept.sort();
        assert_eq!(kept.len(), BACKUPS_KEPT);
        let newest = std::fs::read_to_string(kept.last().expect("one")).expect("read");
        assert!(newest.contains(&format!("max_attempts = {}", 2 + BACKUPS_KEPT as u32 + 2)), "{newest}");
        // Writing what the file already says changes nothing and keeps no backup.
        write_into(&path, &Config::load(&path).expect("valid")).expect("no-op");
        assert_eq!(std::fs::read_dir(dir.join(".corral-backups")).expect("dir").count(), BACKUPS_KEPT);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_edit_changes_only_what_changed_and_keeps_comments() {
        let mut next = Config::parse(FILE).expect("valid");
        next.nodes[1].weight = 5;
        next.categories[0].policy = crate::config::Policy::LeastConnections;
        let out = edit_text(FILE, &next).expect("edits");
        assert!(out.contains("# my cluster") && out.contains("# the big one"), "comments stay:\n{out}");
        assert!(out.contains("weight = 5"), "{out}");
        assert!(out.contains("policy = \"least-connections\" # fast"), "the edited line keeps its comment:\n{out}");
        assert_eq!(Config::parse(&out).expect("valid"), next, "reads back as asked");
        assert!(out.lines().count() < 16, "no defaults written out:\n{out}");
    }

    #[test]
    fn nodes_are_added_and_removed_by_name() {
        let mut next = Config::parse(FILE).expect("valid");
        next.nodes.remove(0);
        next.nodes.push(crate::config::NodeConfig {
            name: "gpu2".into(),
            url: "http://127.0.0.1:11436".into(),
            ..Default::default()
        });
        let out = edit_text(FILE, &next).expect("edits");
        assert!(!out.contains("gpu0") && out.contains("gpu2"), "{out}");
        assert!(!out.contains("max_concurrency"), "a new node carries only what is not a default:\n{out}");
        assert_eq!(Config::parse(&out).expect("valid"), next);
    }

    #[test]
    fn an_array_that_was_already_empty_keeps_its_place_and_the_comment_above_it() {
        let text = "# my cluster\nproviders = []\n\n[[listeners]]\naddr = \"127.0.0.1:1\"\n";
        let mut next = Config::parse(text).expect("valid");
        next.listeners[0].addr = "0.0.0.0:0".into();
        let out = edit_text(text, &next).expect("edits");
        assert!(out.starts_with("# my cluster\nproviders = []\n"), "{out}");
        assert_eq!(Config::parse(&out).expect("valid"), next);
    }

    #[test]
    fn an_empty_file_gets_only_what_differs_from_the_defaults() {
        let mut next = Config::default();
        next.retry.max_attempts = 2;
        let out = edit_text("", &next).expect("edits");
        assert_eq!(Config::parse(&out).expect("valid"), next);
        assert!(out.contains("max_attempts = 2") && out.lines().count() < 6, "{out}");
    }
}
