//! The real binary on a pseudo-terminal (util-linux `script`): stdin, stdout
//! and stderr are all the terminal, as for an operator at a shell.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::TestEnv;

/// Quotes one argument for the `sh -c` line `script` runs.
fn sh_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

impl TestEnv {
    /// Runs `seckill <args>` on a terminal, with NO_COLOR set or unset; types
    /// `answer` once the program had time to prompt. Returns (exit code,
    /// everything the terminal showed).
    pub fn on_a_terminal(
        &self,
        args: &[&str],
        no_color: bool,
        answer: Option<&str>,
    ) -> (i32, String) {
        let bin = assert_cmd::cargo::cargo_bin("seckill");
        let line = std::iter::once(bin.display().to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .map(|a| sh_quote(&a))
            .collect::<Vec<_>>()
            .join(" ");
        let screen = tempfile_path(&self.prefix);
        let screen_file = std::fs::File::create(&screen).expect("screen file");
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"])
            .env("SECKILL_REDIS_URL", &self.cfg.redis_url)
            .env("SECKILL_MYSQL_URL", &self.cfg.mysql_url)
            .env("SECKILL_PREFIX", &self.prefix)
            .env_remove("RUST_LOG")
            .env_remove("SECKILL_NODE_ID")
            .stdin(if answer.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(screen_file)
            .stderr(Stdio::inherit());
        if no_color {
            cmd.env("NO_COLOR", "1");
        } else {
            cmd.env_remove("NO_COLOR");
        }
        let mut child = cmd.spawn().expect("script(1) from util-linux");
        if let Some(answer) = answer {
            std::thread::sleep(Duration::from_millis(1_500));
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(answer.as_bytes()).ok();
        }
        let start = Instant::now();
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Some(status);
            }
            if start.elapsed() > Duration::from_secs(60) {
                child.kill().ok();
                child.wait().ok();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let shown =
            String::from_utf8_lossy(&std::fs::read(&screen).unwrap_or_default()).into_owned();
        std::fs::remove_file(&screen).ok();
        let Some(status) = status else {
            panic!("seckill {args:?} on a terminal did not exit within 60 s:\n{shown}");
        };
        (status.code().unwrap_or(-1), shown)
    }
}

fn tempfile_path(prefix: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "seckill-tty-{prefix}-{}.screen",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ))
}
