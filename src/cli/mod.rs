//! The command line: parsing and rendering only; the work is in the library.

/// `println!` for what a command prints for its reader, through the one place
/// (`render::write_out`) that ends output quietly when the reader has gone
/// away, where `println!` would panic.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::render::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics: a closed stderr (`2>&1 | head -1`) must
/// not turn an error line into a panic (and a panic inside the panic hook
/// into an abort).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::render::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through the same place as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::render::write_out(format_args!($($arg)*))
    };
}

mod bench;
mod buy;
mod common;
mod confirm;
mod doctor;
pub mod generate;
mod init;
mod order;
mod pay;
mod pending;
mod preload;
mod reconcile;
mod render;
mod serve;
mod status;
mod token;
mod voucher;
mod waitlist;
mod worker;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit_code;
use common::ConnectOpts;

#[derive(Parser, Debug)]
#[command(
    name = "seckill",
    version,
    about = "Flash-sale operations tool: admit buyers at Redis speed, never oversell",
    long_about = "Flash-sale operations tool: admit buyers at Redis speed, never oversell.\n\n\
        A voucher has N units. `seckill preload` opens it at the Redis gate, where \
        lua/seckill.lua admits each buyer atomically (sale window, one unit per user, \
        stock, or the waitlist) and hands the order to a stream. `seckill worker` \
        persists the orders to MySQL (the truth), cancels those unpaid at their \
        deadline and hands the units to the waitlist. `seckill reconcile` finds and \
        repairs any drift between Redis and MySQL, safely while a sale runs.",
    after_long_help = exit_code::HELP,
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten, next_help_heading = "Connection (every command)")]
    pub connect: ConnectOpts,

    /// More log output on stderr (-v debug, -vv trace); RUST_LOG overrides
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = "Logging")]
    pub verbose: u8,

    /// Only errors on stderr
    #[arg(
        short,
        long,
        global = true,
        conflicts_with = "verbose",
        help_heading = "Logging"
    )]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or upgrade the MySQL schema and check both servers' versions
    Init(init::InitArgs),
    /// One row per voucher: both stores side by side, in flight, dead letters, deadlines
    Status(status::StatusArgs),
    /// Add and list vouchers (MySQL, the source of truth)
    #[command(subcommand)]
    Voucher(voucher::VoucherCommand),
    /// Load vouchers from MySQL into the Redis gate and register them for workers
    Preload(preload::PreloadArgs),
    /// One admission attempt through lua/seckill.lua (exit code tells the outcome)
    Buy(buy::BuyArgs),
    /// Load-test the admission script and report attempts/s and latency
    Bench(bench::BenchArgs),
    /// Admission tokens for vouchers that require them
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Persist admitted orders to MySQL, cancel unpaid ones at their deadline (layers 2-5)
    Worker(worker::WorkerArgs),
    /// The HTTP front door: purchases, tokens, sale state, orders and payment over JSON
    Serve(serve::ServeArgs),
    /// Show stream backlog, pending entries and dead letters; requeue dead letters
    Pending(pending::PendingArgs),
    /// Mark a pending order paid (before its payment deadline)
    Pay(pay::PayArgs),
    /// Look up orders
    #[command(subcommand)]
    Order(order::OrderCommand),
    /// Show a voucher's waitlist and how many released units it received
    Waitlist(waitlist::WaitlistArgs),
    /// Compare Redis with MySQL per voucher, classify drift, repair it safely
    Reconcile(reconcile::ReconcileArgs),
    /// Check that the servers are set up so the guarantees hold (exit 5: warnings, 6: failures)
    Doctor(doctor::DoctorArgs),
    /// Write shell completions and man pages (for packagers)
    #[command(hide = true)]
    Generate(generate::GenerateArgs),
}

/// Parses the command line, runs the command and maps the result to an exit code.
pub fn main() -> ExitCode {
    // From the first instruction. Until the config is read the hook knows
    // no secret to scrub (a panic in parsing would print one unmasked, as
    // Rust's own hook did); it is installed again with them below.
    report_panics_in_one_line(Vec::new());
    crate::support::fault::panic_at("startup");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(render::clap_error(e)),
    };
    init_logging(cli.verbose, cli.quiet);
    let cfg = match cli.connect.config() {
        Ok(cfg) => cfg,
        Err(e) => {
            // Nothing secret was read yet, or the error does not hold it.
            render::error_line(&anyhow::Error::from(e), &[]);
            return ExitCode::from(exit_code::ERROR);
        }
    };
    let secrets = cfg.secrets();
    report_panics_in_one_line(secrets.clone());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            render::error_line(
                &anyhow::anyhow!("cannot start the async runtime: {e}"),
                &secrets,
            );
            return ExitCode::from(exit_code::ERROR);
        }
    };
    match runtime.block_on(run(cli, cfg)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            render::error_line(&e, &secrets);
            ExitCode::from(exit_code::ERROR)
        }
    }
}

/// Runs one parsed command; the `u8` is the exit code.
pub async fn run(cli: Cli, cfg: crate::store::config::Config) -> anyhow::Result<u8> {
    crate::store::config::validate_prefix(&cfg.prefix)?;
    crate::support::fault::panic_at("command");
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Init(args) => init::run(&cfg, args).await,
        Command::Status(args) => status::run(&cfg, args).await,
        Command::Voucher(cmd) => voucher::run(&cfg, cmd).await,
        Command::Preload(args) => preload::run(&cfg, args).await,
        Command::Buy(args) => buy::run(&cfg, args).await,
        Command::Bench(args) => bench::run(&cfg, args).await,
        Command::Token(cmd) => token::run(&cfg, cmd).await,
        Command::Worker(args) => worker::run(&cfg, args).await,
        Command::Serve(args) => serve::run(&cfg, args).await,
        Command::Pending(args) => pending::run(&cfg, args).await,
        Command::Pay(args) => pay::run(&cfg, args).await,
        Command::Order(cmd) => order::run(&cfg, cmd).await,
        Command::Waitlist(args) => waitlist::run(&cfg, args).await,
        Command::Reconcile(args) => reconcile::run(&cfg, args).await,
        Command::Doctor(args) => doctor::run(&cfg, args).await,
    }
}

/// A panic is a bug, but the operator still gets one line (secrets
/// scrubbed), not a backtrace, whatever RUST_BACKTRACE says.
fn report_panics_in_one_line(secrets: Vec<String>) {
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let line = format!("internal error{at}: {message}").replace('\n', " ");
        errln!(
            "error: {} (a bug in seckill: please report it)",
            crate::support::mask::redact(&line, &secrets)
        );
    }));
}

fn init_logging(verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("seckill={level},warn")));
    let ansi = render::colour_on_stderr();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .try_init()
        .ok();
}

/// Whether stdout is a terminal (tables may use the terminal's width).
pub(crate) fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}
