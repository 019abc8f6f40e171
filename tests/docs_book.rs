//! The documentation book under `docs/` (mdBook's layout): every page its
//! table of contents names exists, every page is in a chapter, and every
//! link between pages (and from the README) leads to a file that exists.
//! Building the HTML is `scripts/book.sh`'s job, not the suite's.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn book() -> PathBuf {
    root().join("docs").join("src")
}

/// The targets of a Markdown text's inline links `[text](target)`, outside
/// fenced code blocks and inline code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code may hold anything: drop it first.
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// A link that points at a file of this repository (not a web address,
/// not an anchor on the same page), without its anchor.
fn local_target(link: &str) -> Option<&str> {
    if link.contains("://") || link.starts_with("mailto:") || link.starts_with('#') {
        return None;
    }
    Some(link.split('#').next().unwrap_or(link))
}

fn pages(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("docs/src readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            pages(&path, found);
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_table_of_contents_names_every_page_and_only_pages_that_exist() {
    let summary = book().join("SUMMARY.md");
    let named: BTreeSet<PathBuf> = links(&read(&summary))
        .iter()
        .filter_map(|l| local_target(l))
        .map(|l| book().join(l))
        .collect();
    let missing: Vec<_> = named.iter().filter(|p| !p.is_file()).collect();
    assert!(
        missing.is_empty(),
        "SUMMARY.md names missing pages: {missing:?}"
    );
    let mut all = Vec::new();
    pages(&book(), &mut all);
    let orphans: Vec<_> = all
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "SUMMARY.md"))
        .filter(|p| !named.contains(*p))
        .collect();
    assert!(
        orphans.is_empty(),
        "pages in no chapter of SUMMARY.md: {orphans:?}"
    );
}

#[test]
fn every_link_between_pages_and_from_the_readme_leads_somewhere() {
    let mut sources = Vec::new();
    pages(&book(), &mut sources);
    sources.push(root().join("README.md"));
    let mut broken = Vec::new();
    for page in &sources {
        let dir = page.parent().expect("a page's folder");
        for link in links(&read(page)) {
            let Some(target) = local_target(&link) else {
                continue;
            };
            if !dir.join(target).exists() {
                broken.push(format!("{}: {link}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_stays_a_front_page() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move the detail into a page of docs/src"
    );
}

#[test]
fn links_are_found_outside_code_only() {
    let text = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](d.md#x) [e](https://e)";
    assert_eq!(links(text), ["a.md", "d.md#x", "https://e"]);
    assert_eq!(local_target("d.md#x"), Some("d.md"));
    assert_eq!(local_target("https://e"), None);
    assert_eq!(local_target("#here"), None);
}
