//! `seckill token issue`

use clap::{Args, Subcommand};

use super::common::{parse_duration, parse_id, Format, FormatOpt};
use super::render::print_json;
use crate::exit_code;
use crate::gate::buckets;
use crate::gate::token;
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn;

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Issue a user's admission token for a voucher that requires one
    Issue(IssueArgs),
}

#[derive(Args, Debug)]
pub struct IssueArgs {
    /// Voucher id
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub voucher: u64,
    /// User id
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub user: u64,
    /// How long the token stays valid (at most 24h); issuing again replaces it
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub ttl: std::time::Duration,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, cmd: TokenCommand) -> anyhow::Result<u8> {
    let TokenCommand::Issue(args) = cmd;
    // Checked before connecting: bad input is reported even with no server.
    token::validate_ttl(args.ttl)?;
    VoucherKeys::new(&cfg.prefix, args.voucher)?;
    let mut redis = redis_conn::connect(cfg).await?;
    // A token lives in the user's bucket, where the user is admitted.
    let keys = buckets::for_routing(&mut redis, &cfg.prefix, args.voucher, async || {
        Db::connect(cfg).await
    })
    .await?
    .keys_of_user(args.user)?;
    let issued = token::issue(&mut redis, &keys, args.user, args.ttl).await?;
    match args.format.format {
        Format::Json => print_json(&issued)?,
        Format::Table => outln!("{}", issued.token)?,
    }
    Ok(exit_code::OK)
}
