//! Shared rendering: error lines, tables, JSON, colour decisions.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use comfy_table::{presets, ContentArrangement, Table};
use serde::Serialize;

use crate::exit_code;
use crate::support::mask::redact;

/// Colour only on a terminal and only when NO_COLOR is unset.
pub fn colour_on_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `error: <what went wrong>` on one line of stderr, secrets scrubbed.
pub fn error_line(e: &anyhow::Error, secrets: &[String]) {
    let text = format!("{e:#}").replace('\n', " ");
    let text = redact(&text, secrets);
    if colour_on_stderr() {
        errln!("\x1b[1;31merror:\x1b[0m {text}");
    } else {
        errln!("error: {text}");
    }
}

/// clap's own error, folded to one line (help and version print as usual).
pub fn clap_error(e: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                exit_code::USAGE
            } else {
                exit_code::OK
            }
        }
        _ => {
            let rendered = e.render().to_string();
            // The first paragraph names the problem; usage and tips follow it.
            let first: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let line = first.join(" ");
            let line = line.strip_prefix("error: ").unwrap_or(&line);
            errln!("error: {line} (see --help)");
            exit_code::USAGE
        }
    }
}

/// A table in the house style, fitted to the terminal when there is one.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_header(header.iter().copied());
    // Fit to the terminal only when its width is known and usable: a pty
    // that reports no size would squeeze every column to one character.
    let fits = super::stdout_is_terminal() && t.width().is_some_and(|w| w >= 60);
    t.set_content_arrangement(if fits {
        ContentArrangement::Dynamic
    } else {
        ContentArrangement::Disabled
    });
    t
}

/// Set once stdout's reader has gone away: nothing more is written, and
/// loops that print (`status --watch`) end.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Writes to stdout and flushes. A reader gone away (`seckill status | head
/// -1`) is not an error: the rest of the output is dropped quietly, as
/// ripgrep and git do, and the command keeps its exit code (`buy` still
/// tells its outcome). `println!` would panic there instead.
pub fn write_out(text: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    if reader_gone() {
        return Ok(());
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            READER_GONE.store(true, Ordering::Relaxed);
            Ok(())
        }
        other => Ok(other?),
    }
}

/// Writes to stderr; a closed stderr is ignored (there is nobody to tell).
pub fn write_err(text: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(text);
}

/// Whether stdout's reader has gone away.
pub fn reader_gone() -> bool {
    READER_GONE.load(Ordering::Relaxed)
}

pub fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}
