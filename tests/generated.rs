//! The committed completions, man pages and OpenAPI description are what
//! the current binary generates; regenerate with `cargo run -- generate`
//! when this fails.

use std::collections::BTreeMap;
use std::path::Path;

fn files_under(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for sub in ["completions", "man", "docs"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for e in entries.flatten() {
            // docs/ also holds the book (its book.toml and src/), which
            // `generate` does not write.
            let book = sub == "docs" && (e.path().is_dir() || e.file_name() == "book.toml");
            if book {
                continue;
            }
            let name = format!("{sub}/{}", e.file_name().to_string_lossy());
            out.insert(name, std::fs::read(e.path()).unwrap());
        }
    }
    out
}

#[test]
fn completions_and_man_pages_are_up_to_date() {
    let tmp = std::env::temp_dir().join(format!("seckill-generated-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut cmd = assert_cmd::Command::cargo_bin("seckill").unwrap();
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SECKILL_")) {
        cmd.env_remove(k);
    }
    cmd.args(["generate", "--out-dir"])
        .arg(&tmp)
        .assert()
        .success();
    let fresh = files_under(&tmp);
    let committed = files_under(Path::new(env!("CARGO_MANIFEST_DIR")));
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(fresh.len() >= 10, "generate wrote {} files", fresh.len());
    let names = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&committed),
        names(&fresh),
        "run `cargo run -- generate`"
    );
    for (name, bytes) in &fresh {
        assert!(
            committed[name] == *bytes,
            "{name} is stale: run `cargo run -- generate`"
        );
    }
}
