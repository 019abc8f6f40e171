//! A process on a clock of its own: libfaketime moves its wall clock.

/// The environment that runs a process on a clock `offset` ("+30m", "-30m")
/// off this machine's (libfaketime; its monotonic clock is left alone so
/// timers work), checked to move a process's clock by at least
/// `at_least_secs` (negative: behind).
pub fn skewed_clock(offset: &str, at_least_secs: i64) -> Vec<(&'static str, String)> {
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libfaketime is installed (scripts/services.sh up installs the faketime package)");
    let env = vec![
        ("LD_PRELOAD", lib.to_string()),
        ("FAKETIME", offset.to_string()),
        ("DONT_FAKE_MONOTONIC", "1".to_string()),
    ];
    let probe = std::process::Command::new("date")
        .arg("+%s")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let skewed: i64 = String::from_utf8_lossy(&probe.stdout)
        .trim()
        .parse()
        .unwrap();
    let moved = skewed - seckill::support::timespec::now_ms() / 1000;
    assert!(
        if at_least_secs < 0 {
            moved <= at_least_secs
        } else {
            moved >= at_least_secs
        },
        "libfaketime moved the clock by {moved} s, not {at_least_secs}"
    );
    env
}
