//! Connecting to Redis, one node or a cluster. Everything else in the
//! library takes `impl RedisConn`; the key layout keeps each voucher's keys
//! in one slot, so the only thing code has to ask is whether several
//! vouchers may share one request ([`RedisConn::is_cluster`]).

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    Arg, AsyncConnectionConfig, ClientTlsConfig, Cmd, Pipeline, RedisFuture, TlsCertificates, Value,
};

use crate::error::{describe_redis, Error, Result};
use crate::store::config::Config;
use crate::store::scripts;
use crate::support::fault;
use crate::support::mask::{mask_url, url_list};
use crate::support::version;

/// Any async Redis connection the library can work with.
pub trait RedisConn: ConnectionLike + Send + Sync + Clone {
    /// A cluster refuses a request whose keys live in several slots: work
    /// over several vouchers must then be split per voucher.
    fn is_cluster(&self) -> bool;
}

impl RedisConn for MultiplexedConnection {
    fn is_cluster(&self) -> bool {
        false
    }
}

impl RedisConn for ClusterConnection {
    fn is_cluster(&self) -> bool {
        true
    }
}

/// A connection to one node or to a cluster (found out when connecting):
/// cheap to clone, pipelines concurrent requests either way.
#[derive(Clone)]
pub enum Redis {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Redis {
    fn send<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Redis::Node(c) => c.req_packed_command(cmd),
            Redis::Cluster(c) => c.req_packed_command(cmd),
        }
    }
}

impl ConnectionLike for Redis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if fault::armed() && resend_asked(cmd) {
            return Box::pin(async move {
                // Dropped, as a reply lost on the way is.
                let _ = self.send(cmd).await;
                self.send(cmd).await
            });
        }
        self.send(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Redis::Node(c) => c.req_packed_commands(cmd, offset, count),
            Redis::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Redis::Node(c) => c.get_db(),
            Redis::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisConn for Redis {
    fn is_cluster(&self) -> bool {
        matches!(self, Redis::Cluster(_))
    }
}

/// Whether a test fault asks this script call (a lone EVALSHA) to be sent
/// twice: its point is `resend_<script>` (support/fault.rs).
fn resend_asked(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter();
    let (Some(Arg::Simple(name)), Some(Arg::Simple(hash))) = (args.next(), args.next()) else {
        return false;
    };
    name.eq_ignore_ascii_case(b"EVALSHA")
        && std::str::from_utf8(hash)
            .ok()
            .and_then(scripts::stem_of)
            .is_some_and(|stem| fault::resend(&format!("resend_{stem}")))
}

/// Redis 6.2 brought XAUTOCLAIM, which the worker needs.
pub const MIN_REDIS: (u32, u32) = (6, 2);

/// Replies slower than this fail the command (blocking reads get their own
/// connection with a longer timeout).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection: to the node the URL names, or to the cluster it belongs
/// to (`cluster_enabled:1`; several seed URLs may be given, comma-separated).
pub async fn connect(cfg: &Config) -> Result<Redis> {
    connect_with_response_timeout(cfg, RESPONSE_TIMEOUT).await
}

/// A connection for blocking reads (XREADGROUP BLOCK): it is held for the
/// whole wait, so it must be its own, and its reply timeout must outlast the
/// block time (the driver's default would cut the wait short).
pub async fn connect_blocking(cfg: &Config, block: Duration) -> Result<Redis> {
    connect_with_response_timeout(cfg, block + RESPONSE_TIMEOUT).await
}

/// The URLs of `--redis-url`: one, or a cluster's seed nodes.
pub(crate) fn seed_urls(raw: &str) -> Vec<&str> {
    let raw = raw.trim().trim_end_matches(',');
    if raw.is_empty() {
        return Vec::new();
    }
    url_list(raw)
        .map(|urls| urls.into_iter().map(str::trim).collect())
        .unwrap_or_else(|| vec![raw])
}

async fn connect_with_response_timeout(cfg: &Config, response_timeout: Duration) -> Result<Redis> {
    let fail = |reason: String| Error::RedisConnect {
        url: mask_url(&cfg.redis_url),
        reason,
    };
    let seeds = seed_urls(&cfg.redis_url);
    if seeds.is_empty() {
        return Err(fail("no URL given".into()));
    }
    // The first seed that answers tells whether this is a cluster.
    let mut last_error = String::new();
    for seed in &seeds {
        let mut node = match connect_node(seed, cfg, response_timeout).await {
            Ok(node) => node,
            Err(reason) => {
                last_error = with_tls_hint(seed, reason);
                continue;
            }
        };
        let clustered = match cluster_enabled(&mut node).await {
            Ok(c) => c,
            Err(reason) => {
                last_error = reason;
                continue;
            }
        };
        if !clustered {
            if seeds.len() > 1 {
                return Err(fail(format!(
                    "several URLs are a cluster's seed nodes, but {} is not in cluster mode",
                    mask_url(seed)
                )));
            }
            return Ok(Redis::Node(node));
        }
        return connect_cluster(&seeds, cfg, response_timeout)
            .await
            .map(Redis::Cluster)
            .map_err(fail);
    }
    Err(fail(last_error))
}

/// The certificates of `--redis-ca-cert` and `--redis-client-cert/-key`,
/// for `rediss://` URLs (none given: the system's roots).
fn tls_certificates(cfg: &Config) -> std::result::Result<Option<TlsCertificates>, String> {
    let t = &cfg.redis_tls;
    if t.ca_cert.is_none() && t.client_cert.is_none() {
        return Ok(None);
    }
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
    };
    let root_cert = match &t.ca_cert {
        Some(p) => Some(read("--redis-ca-cert", p)?),
        None => None,
    };
    let client_tls = match (&t.client_cert, &t.client_key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read("--redis-client-cert", cert)?,
            client_key: read("--redis-client-key", key)?,
        }),
        _ => None,
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// TLS settings that only a `rediss://` URL can use.
fn check_tls_use(url: &str, certs: &Option<TlsCertificates>) -> std::result::Result<(), String> {
    if certs.is_some() && !url.trim_start().starts_with("rediss://") {
        return Err(format!(
            "--redis-ca-cert / --redis-client-cert need a rediss:// URL, not {}",
            mask_url(url)
        ));
    }
    Ok(())
}

/// A TLS-only server drops a plaintext client during its first command:
/// the bare I/O error would not say why.
fn with_tls_hint(url: &str, reason: String) -> String {
    let plaintext = !url.trim_start().starts_with("rediss://");
    let lower = reason.to_lowercase();
    let dropped = [
        "reset by peer",
        "broken pipe",
        "unexpected end",
        "end of file",
        "eof",
    ]
    .iter()
    .any(|s| lower.contains(s));
    if plaintext && dropped {
        format!("{reason} (a server that speaks only TLS drops a plaintext redis:// client like this: use rediss://)")
    } else {
        reason
    }
}

async fn connect_node(
    url: &str,
    cfg: &Config,
    response_timeout: Duration,
) -> std::result::Result<MultiplexedConnection, String> {
    let certs = tls_certificates(cfg)?;
    check_tls_use(url, &certs)?;
    let client = match certs {
        Some(certs) => redis::Client::build_with_tls(url, certs),
        None => redis::Client::open(url),
    }
    .map_err(|e| describe_redis(&e))?;
    let conn_cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout))
        .set_response_timeout(Some(response_timeout));
    let attempt = client.get_multiplexed_async_connection_with_config(&conn_cfg);
    within(cfg.connect_timeout, attempt).await
}

async fn connect_cluster(
    seeds: &[&str],
    cfg: &Config,
    response_timeout: Duration,
) -> std::result::Result<ClusterConnection, String> {
    let mut builder = ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(cfg.connect_timeout)
        .response_timeout(response_timeout);
    if let Some(certs) = tls_certificates(cfg)? {
        builder = builder.certs(certs);
    }
    let client = builder.build().map_err(|e| describe_redis(&e))?;
    // The driver connects in two rounds, each node bounded by the connect
    // timeout: the seeds, then every node their slot map lists, replicas
    // too. A node that accepts but never answers (frozen, overloaded) costs
    // its round the whole timeout and is then left out; bounding the sum by
    // one timeout would let that one node fail the connect to the cluster.
    within(
        2 * cfg.connect_timeout + CLUSTER_CONNECT_MARGIN,
        client.get_async_connection(),
    )
    .await
}

/// Time for the slot-map query between the two rounds of a cluster connect.
const CLUSTER_CONNECT_MARGIN: Duration = Duration::from_secs(1);

async fn within<T>(
    limit: Duration,
    attempt: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(limit, attempt).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(describe_redis(&e)),
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(limit)
        )),
    }
}

async fn cluster_enabled(node: &mut MultiplexedConnection) -> std::result::Result<bool, String> {
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(node)
        .await
        .map_err(|e| describe_redis(&e))?;
    Ok(info.lines().any(|l| l.trim() == "cluster_enabled:1"))
}

/// Runs the same shape of pipeline for many items whose keys each live in
/// one slot (one voucher's keys), and returns each item's replies in order.
/// One node gets one pipeline per chunk of items, as before clusters; a
/// cluster gets one pipeline per item, sent concurrently so that each node
/// works on its own share. `atomic` wraps each item (a whole chunk on one
/// node) in MULTI/EXEC; `ignore_errors` leaves a command's error as its
/// reply instead of failing the call.
pub async fn pipeline_per_item<T>(
    conn: &mut impl RedisConn,
    items: &[T],
    atomic: bool,
    ignore_errors: bool,
    build: impl Fn(&mut Pipeline, &T) -> Result<()>,
) -> Result<Vec<Vec<Value>>> {
    const NODE_CHUNK: usize = 500;
    const CLUSTER_IN_FLIGHT: usize = 64;
    let mut pipes = Vec::with_capacity(items.len());
    for item in items {
        let mut p = redis::pipe();
        build(&mut p, item)?;
        pipes.push(p);
    }
    let flags = |p: &mut Pipeline| {
        if atomic {
            p.atomic();
        }
        if ignore_errors {
            p.ignore_errors();
        }
    };
    let mut out = Vec::with_capacity(items.len());
    if conn.is_cluster() {
        for group in pipes.chunks_mut(CLUSTER_IN_FLIGHT) {
            let calls = group.iter_mut().map(|p| {
                flags(p);
                let mut c = conn.clone();
                let p = p.clone();
                async move { p.query_async::<Vec<Value>>(&mut c).await }
            });
            for replies in futures_util::future::join_all(calls).await {
                out.push(replies?);
            }
        }
        return Ok(out);
    }
    for group in pipes.chunks(NODE_CHUNK) {
        let mut merged = redis::pipe();
        flags(&mut merged);
        let mut counts = Vec::with_capacity(group.len());
        for p in group {
            counts.push(p.cmd_iter().count());
            for c in p.cmd_iter() {
                merged.add_command(c.clone());
            }
        }
        let replies: Vec<Value> = merged.query_async(conn).await?;
        let mut replies = replies.into_iter();
        for n in counts {
            out.push(replies.by_ref().take(n).collect());
        }
    }
    Ok(out)
}

/// The server's version, e.g. `7.0.15`.
pub async fn server_version(conn: &mut impl RedisConn) -> Result<String> {
    // A cluster answers INFO from every master (address -> text): the
    // oldest version is the one that counts.
    let texts = match redis::cmd("INFO").arg("server").query_async(conn).await? {
        Value::Map(per_node) => per_node.iter().map(|(_, text)| value_text(text)).collect(),
        single => vec![value_text(&single)],
    };
    texts
        .iter()
        .map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .map(|v| v.trim().to_string())
        })
        .collect::<Option<Vec<String>>>()
        .and_then(|versions| versions.into_iter().min_by_key(|v| version::major_minor(v)))
        .ok_or_else(|| Error::redis("INFO server has no redis_version"))
}

/// Fails unless the server is at least [`MIN_REDIS`].
pub async fn check_version(conn: &mut impl RedisConn) -> Result<String> {
    let version = server_version(conn).await?;
    if version::major_minor(&version) < MIN_REDIS {
        return Err(Error::ServerTooOld {
            server: "Redis",
            found: version,
            needed: "6.2",
        });
    }
    Ok(version)
}

/// A reply value as text (bulk and simple strings, integers), for replies
/// whose shape is known but whose element types vary.
pub fn value_text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::VerbatimString { text, .. } => text.clone(),
        redis::Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_lists_split_between_urls_only() {
        assert_eq!(seed_urls("redis://a:1/"), ["redis://a:1/"]);
        assert_eq!(
            seed_urls("redis://a:1/, redis://b:2/,"),
            ["redis://a:1/", "redis://b:2/"]
        );
        assert_eq!(seed_urls("redis://:pa,ss@h:1/"), ["redis://:pa,ss@h:1/"]);
        assert!(seed_urls(" ").is_empty());
    }
}
