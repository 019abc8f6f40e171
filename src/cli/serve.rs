//! `seckill serve`

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::common::{parse_duration, NodeIdOpt, ReplicaWaitOpt};
use crate::exit_code;
use crate::http::{self, ApiKeys, ServeOptions};
use crate::store::config::Config;
use crate::support::shutdown;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (a non-loopback one needs --api-key-file)
    #[arg(
        long,
        env = "SECKILL_LISTEN",
        hide_env_values = true,
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,
    /// File of API keys, one per line (blank lines and # comments skipped);
    /// every /v1 request must carry one as `Authorization: Bearer <key>`
    #[arg(long, env = "SECKILL_API_KEY_FILE", hide_env_values = true)]
    pub api_key_file: Option<PathBuf>,
    /// Requests handled at once; more are answered 503 at once
    #[arg(long, default_value_t = 4096)]
    pub max_in_flight: usize,
    /// A request not answered within this is answered 503 (outcome unknown)
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub request_timeout: std::time::Duration,
    /// A connection is closed when a request's head has not arrived within
    /// this of its opening, or of its first byte after an answer
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: std::time::Duration,
    /// A keep-alive connection with no request for this long is closed
    /// (keep it above a load balancer's idle timeout: 60 s on most)
    #[arg(long, default_value = "75s", value_parser = parse_duration)]
    pub idle_timeout: std::time::Duration,
    /// Connections open at once (fewer if the descriptor limit leaves less
    /// room); at the cap the longest idle or slow ones are closed for newcomers
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// On SIGTERM/SIGINT, requests in flight get this long to finish
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub drain: std::time::Duration,
    /// Multiplexed Redis connections shared by all requests
    #[arg(long, default_value_t = 4)]
    pub redis_connections: usize,
    /// Serve HTTPS with this certificate chain (PEM; needs --tls-key)
    #[arg(long, env = "SECKILL_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM)
    #[arg(long, env = "SECKILL_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9465) and not on --listen, which then answers 404 there
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// How long an Idempotency-Key's answer is kept for resends (1s ..= 30days)
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub idempotency_ttl: std::time::Duration,
    #[command(flatten)]
    pub replicas: ReplicaWaitOpt,
    #[command(flatten)]
    pub node: NodeIdOpt,
}

pub async fn run(cfg: &Config, args: ServeArgs) -> anyhow::Result<u8> {
    let api_keys = args
        .api_key_file
        .as_deref()
        .map(ApiKeys::from_file)
        .transpose()?;
    let opts = ServeOptions {
        listen: args.listen,
        api_keys,
        max_in_flight: args.max_in_flight,
        request_timeout: args.request_timeout,
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        max_connections: args.max_connections,
        drain: args.drain,
        redis_connections: args.redis_connections,
        metrics_addr: args.metrics_addr,
        node_id: args.node.node_id,
        tls: args.tls_cert.zip(args.tls_key),
        wait: args.replicas.wait(),
        idempotency_ttl: args.idempotency_ttl,
    };
    opts.validate()?;
    let stop = shutdown::on_signals()?;
    http::serve(cfg, &opts, stop).await?;
    Ok(exit_code::OK)
}
