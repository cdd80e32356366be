//! Embeds the built UI (`ui/dist`, from `npm --prefix ui run build`) into the binary, so
//! `corral serve` and the desktop app serve the same files with nothing beside the binary.
//! Without a built UI the list is empty and the admin listener says how to build it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dist = root.join("ui").join("dist");
    println!("cargo:rerun-if-changed=ui/dist");
    // sqlx::migrate! embeds migrations/ when the crate compiles: a new migration must rebuild it.
    println!("cargo:rerun-if-changed=migrations");
    let mut found = Vec::new();
    files(&dist, &mut found);
    found.sort();
    let mut code =
        String::from("/// Built UI files: (path under ui/dist, bytes).\npub static ASSETS: &[(&str, &[u8])] = &[\n");
    for f in &found {
        let rel = f.strip_prefix(&dist).unwrap_or(f).to_string_lossy().replace('\\', "/");
        let _ = writeln!(code, "    ({rel:?}, include_bytes!({:?})),", f.display().to_string());
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("ui_assets.rs");
    if let Err(e) = std::fs::write(&out, code) {
        panic!("cannot write {}: {e}", out.display());
    }
}
