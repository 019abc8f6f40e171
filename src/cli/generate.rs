//! `seckill generate` (hidden): shell completions and man pages from the
//! command definitions, and the OpenAPI description of `seckill serve`,
//! committed under `completions/`, `man/` and `docs/`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;
use crate::exit_code;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Directory that receives completions/ and man/
    #[arg(long, default_value = ".")]
    pub out_dir: PathBuf,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<u8> {
    write_all(&args.out_dir)?;
    Ok(exit_code::OK)
}

/// Writes `completions/seckill.{bash,zsh,fish,elv,ps1}`, `man/*.1` and
/// `docs/openapi.json` under `dir`.
pub fn write_all(dir: &Path) -> anyhow::Result<()> {
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)
        .with_context(|| format!("cannot create {}", completions.display()))?;
    for shell in [
        Shell::Bash,
        Shell::Zsh,
        Shell::Fish,
        Shell::Elvish,
        Shell::PowerShell,
    ] {
        let mut cmd = Cli::command();
        clap_complete::generate_to(shell, &mut cmd, "seckill", &completions)
            .with_context(|| format!("cannot write {shell} completions"))?;
    }
    let man = dir.join("man");
    std::fs::create_dir_all(&man).with_context(|| format!("cannot create {}", man.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    write_man(&cmd, "seckill", &man)?;
    let docs = dir.join("docs");
    std::fs::create_dir_all(&docs).with_context(|| format!("cannot create {}", docs.display()))?;
    let openapi = docs.join("openapi.json");
    std::fs::write(&openapi, crate::http::openapi::document())
        .with_context(|| format!("cannot write {}", openapi.display()))
}

fn write_man(cmd: &clap::Command, name: &str, dir: &Path) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(name)
        .render(&mut buf)
        .with_context(|| format!("cannot render the man page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        write_man(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}
