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
    assert!(
        deb.ends_with("_amd64.deb") && Path::new(deb).exists(),
        "{deb}"
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
    // The user the units run as, the environment file readable by it,
    // and nothing started.
    run("id", &["seckill"]);
    assert_eq!(
        run("stat", &["-c", "%U:%G %a", "/etc/seckill/seckill.env"]).trim(),
        "root:seckill 640"
    );
    let running = Command::new("pgrep")
        .args(["-f", "^/usr/bin/seckill"])
        .output()
        .unwrap();
    assert!(running.stdout.is_empty(), "started on install: {running:?}");

    run("dpkg", &["--purge", "seckill"]);
    assert!(!installed());
    for gone in [
        "/usr/bin/seckill",
        "/etc/seckill",
        "/lib/systemd/system/seckill-worker.service",
        "/usr/share/man/man1/seckill.1.gz",
        "/var/log/seckill",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} left after purge");
    }
}
