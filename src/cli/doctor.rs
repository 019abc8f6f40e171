//! `seckill doctor`

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::common::{Format, FormatOpt};
use super::render::{print_json, table};
use crate::doctor::{self, Check, Role, Status};
use crate::exit_code;
use crate::store::config::Config;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Also try the rights this role's users need (contrib/redis-acl.conf,
    /// contrib/mysql-grants.sql), as the users of the URLs, writing nothing
    #[arg(long, value_enum)]
    pub role: Option<RoleArg>,
    #[command(flatten)]
    pub format: FormatOpt,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Worker,
    Serve,
    Operator,
    Schema,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::Worker => Role::Worker,
            RoleArg::Serve => Role::Serve,
            RoleArg::Operator => Role::Operator,
            RoleArg::Schema => Role::Schema,
        }
    }
}

#[derive(Serialize)]
struct Report<'a> {
    checks: &'a [Check],
}

pub async fn run(cfg: &Config, args: DoctorArgs) -> anyhow::Result<u8> {
    let checks = doctor::run(cfg, args.role.map(Role::from)).await;
    match args.format.format {
        Format::Json => print_json(&Report { checks: &checks })?,
        Format::Table => print_table(&checks)?,
    }
    Ok(match doctor::worst(&checks) {
        Status::Ok => exit_code::OK,
        Status::Warn => exit_code::DOCTOR_WARNINGS,
        Status::Fail => exit_code::DOCTOR_FAILURES,
    })
}

fn print_table(checks: &[Check]) -> anyhow::Result<()> {
    let mut t = table(&["check", "status", "found"]);
    // Off a terminal too, long findings wrap instead of widening every row.
    if !super::stdout_is_terminal() {
        t.set_width(120)
            .set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
    }
    for c in checks {
        t.add_row([c.check.as_str(), c.status.word(), c.found.as_str()]);
    }
    outln!("{t}")?;
    // Why and how to fix, for what needs doing: a table of ok rows with
    // paragraphs beside each would bury the few that matter.
    for c in checks.iter().filter(|c| c.status != Status::Ok) {
        outln!("\n{} {}: {}", c.status.word(), c.check, c.found)?;
        if !c.why.is_empty() {
            outln!("  why: {}", c.why)?;
        }
        if !c.fix.is_empty() {
            outln!("  fix: {}", c.fix)?;
        }
    }
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    outln!(
        "\n{} ok, {} warn, {} fail",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail)
    )?;
    Ok(())
}
