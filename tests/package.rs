//! The Debian package: built by scripts/package.sh (from the binary the
//! tests run), clean under lintian, its units accepted by systemd-analyze,
//! installed on this machine with dpkg, used from the installed paths, and
//! purged without a trace. Needs root (dpkg), as CI runs.

use std::path::Path;
use std::process::Command;

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "80")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "seckill"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("installed"))
}

#[test]
fn the_package_installs_works_from_its_paths_and_purges_cleanly() {
    let uid = run("id", &["-u"]);
    assert_eq!(uid.trim(), "0", "dpkg -i needs root (CI runs as root)");
    if installed() {
        run("dpkg", &["--purge", "seckill"]);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/package.sh");
    let deb = run("bash", &[script, "--profile", "dev", "--no-build"]);
    let deb = deb.trim();
    let arch = run("dpkg", &["--print-architecture"]);
    assert!(
        deb.ends_with(&format!("_{}.deb", arch.trim())) && Path::new(deb).exists(),
        "{deb}"
    );
    // The control file: one synopsis line (under 80 columns), and the
    // version the changelog gives.
    let control = run("dpkg-deb", &["--field", deb, "Description", "Version"]);
    let synopsis = control
        .lines()
        .find_map(|l| l.strip_prefix("Description: "))
        .unwrap_or_default();
    assert!(
        !synopsis.is_empty() && synopsis.len() < 80 && !synopsis.ends_with(','),
        "{control}"
    );
    let version = control
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .unwrap_or_default()
        .to_string();
    let changelog = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/debian/changelog"
    ))
    .unwrap();
    assert!(
        changelog.starts_with(&format!("seckill ({version})")),
        "changelog and package disagree on {version}"
    );

    // Debian's own checker: no error, no warning (one override, the
    // environment file's 0640).
    run("lintian", &["--fail-on", "error,warning", deb]);
    let contents = run("dpkg-deb", &["--contents", deb]);
    for path in [
        "./usr/bin/seckill",
        "./usr/share/man/man1/seckill.1.gz",
        "./usr/share/man/man1/seckill-doctor.1.gz",
        "./usr/share/bash-completion/completions/seckill",
        "./usr/share/zsh/vendor-completions/_seckill",
        "./usr/share/fish/vendor_completions.d/seckill.fish",
        "./lib/systemd/system/seckill-worker.service",
        "./lib/systemd/system/seckill-serve.service",
        "./etc/seckill/seckill.env",
    ] {
        assert!(contents.contains(path), "{path} missing:\n{contents}");
    }
    let conffiles = run("dpkg-deb", &["--info", deb, "conffiles"]);
    assert_eq!(conffiles.trim(), "/etc/seckill/seckill.env");

    run("dpkg", &["-i", deb]);
    let version = run("/usr/bin/seckill", &["--version"]);
    assert_eq!(
        version.trim(),
        format!("seckill {}", env!("CARGO_PKG_VERSION"))
    );
    // Stripped: the build's line tables stay out of the package.
    let file = run("file", &["-L", "/usr/bin/seckill"]);
    assert!(
        file.contains("stripped") && !file.contains("not stripped"),
        "{file}"
    );
    let page = run("man", &["seckill"]);
    assert!(page.contains("Flash-sale operations tool"), "{page}");
    assert_eq!(
        run("man", &["-w", "seckill-doctor"]).trim(),
        "/usr/share/man/man1/seckill-doctor.1.gz"
    );
    run(
        "bash",
        &[
            "-c",
            ". /usr/share/bash-completion/completions/seckill && complete -p seckill",
        ],
    );
    run(
        "systemd-analyze",
        &[
            "verify",
            "/lib/systemd/system/seckill-worker.service",
            "/lib/systemd/system/seckill-serve.service",
        ],
    );
    // The installed front page's links lead to installed pages, and so do
    // theirs (the book's pages are installed in the repository's layout).
    let doc = Path::new("/usr/share/doc/seckill");
    let mut pages = vec![doc.join("README.md")];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(page) = pages.pop() {
        if !seen.insert(page.clone()) {
            continue;
        }
        let text = std::fs::read_to_string(&page)
            .unwrap_or_else(|e| panic!("{} not installed: {e}", page.display()));
        for target in relative_links(&text) {
            let linked = page.parent().unwrap().join(&target);
            assert!(
                linked.exists(),
                "{} links to {target}, not installed",
                page.display()
            );
            if target.ends_with(".md") {
                pages.push(linked.canonicalize().unwrap());
            }
        }
    }
    assert!(seen.len() > 40, "only {} pages reached", seen.len());

    // The user the units run as, the environment file readable by it,
    // and nothing started.
    run("id", &["seckill"]);
    assert_eq!(
        run("stat", &["-c", "%U:%G %a", "/etc/seckill/seckill.env"]).trim(),
        "root:seckill 640"
    );
    // Nothing enabled (a unit enabled on install would start at the next
    // boot, before anyone filled in the URLs).
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants");
    for unit in ["seckill-worker.service", "seckill-serve.service"] {
        assert!(!wants.join(unit).exists(), "{unit} enabled on install");
    }

    // An admin's edit of the environment file, and the mode they chose,
    // survive installing again (an upgrade's path through postinst).
    let env_file = "/etc/seckill/seckill.env";
    let mut edited = std::fs::read_to_string(env_file).unwrap();
    edited.push_str("SECKILL_PREFIX=edited-by-the-admin\n");
    std::fs::write(env_file, &edited).unwrap();
    run("chmod", &["0600", env_file]);
    run("dpkg", &["-i", deb]);
    assert_eq!(std::fs::read_to_string(env_file).unwrap(), edited);
    assert_eq!(run("stat", &["-c", "%a", env_file]).trim(), "600");

    // Enabled by the admin, then purged: the enablement goes too.
    run("systemctl", &["enable", "seckill-worker.service"]);
    assert!(wants.join("seckill-worker.service").exists());

    run("dpkg", &["--purge", "seckill"]);
    assert!(!installed());
    for gone in [
        "/etc/systemd/system/multi-user.target.wants/seckill-worker.service",
        "/usr/bin/seckill",
        "/etc/seckill",
        "/lib/systemd/system/seckill-worker.service",
        "/usr/share/man/man1/seckill.1.gz",
        "/var/log/seckill",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} left after purge");
    }
}

/// The targets of a Markdown page's relative links (`](path)` or
/// `](path#anchor)`), without the anchor.
fn relative_links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split('#').next().unwrap_or("").to_string())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}
