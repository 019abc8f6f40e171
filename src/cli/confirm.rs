//! `--yes` and the confirmation prompt for commands that change data.

use std::io::IsTerminal;

use clap::Args;

#[derive(Args, Debug, Clone, Copy)]
pub struct Confirmation {
    /// Do not ask for confirmation (for cron and scripts)
    #[arg(short = 'y', long)]
    pub yes: bool,
}

/// True when the change may go ahead: `--yes`, or a person said yes on a
/// terminal. Without a terminal and without `--yes` it refuses, since nobody
/// can be asked.
pub fn confirm(c: &Confirmation, question: &str) -> anyhow::Result<bool> {
    if c.yes {
        return Ok(true);
    }
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        anyhow::bail!("not a terminal, so nobody can confirm: pass --yes to go ahead");
    }
    Ok(dialoguer::Confirm::new()
        .with_prompt(question)
        .default(false)
        .interact()?)
}
