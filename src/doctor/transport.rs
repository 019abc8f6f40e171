//! How the connections are secured, read from the configuration alone: a
//! plaintext connection, or TLS that checks no certificate, is fine on
//! loopback and a risk anywhere else (anyone on the path can read and
//! change orders and payments, or pose as the server).

use super::Check;
use crate::store::config::{Config, SslMode};
use crate::store::redis_conn::seed_urls;

pub fn checks(cfg: &Config) -> Vec<Check> {
    vec![redis_transport(cfg), mysql_transport(cfg)]
}

const CHECK_REDIS: &str = "redis transport";
const CHECK_MYSQL: &str = "mysql transport";

/// The host a URL names (with an IPv6 literal's brackets).
fn host_of(raw: &str) -> Option<String> {
    url::Url::parse(raw.trim())
        .ok()?
        .host_str()
        .map(str::to_string)
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn redis_transport(cfg: &Config) -> Check {
    let seeds = seed_urls(&cfg.redis_url);
    let remote_plain: Vec<String> = seeds
        .iter()
        .filter(|u| u.starts_with("redis://"))
        .filter_map(|u| host_of(u))
        .filter(|h| !is_loopback(h))
        .collect();
    let check = if remote_plain.is_empty() {
        let tls = seeds.iter().any(|u| u.starts_with("rediss://"));
        Check::ok(
            CHECK_REDIS,
            if tls {
                "TLS (rediss://), certificate checked"
            } else {
                "plaintext on loopback"
            },
        )
    } else {
        Check::warn(
            CHECK_REDIS,
            format!("plaintext (redis://) to {}", remote_plain.join(", ")),
        )
    };
    check
    .why("off loopback, anyone on the network path can read and change admissions and tokens, or pose as Redis")
    .fix("use rediss:// URLs (Redis with tls-port), with --redis-ca-cert for a private CA")
}

fn mysql_transport(cfg: &Config) -> Check {
    let host = host_of(&cfg.mysql_url).unwrap_or_default();
    let socket = cfg.mysql_url.contains("socket=");
    let mode = crate::store::mysql_tls::mode_name(cfg.mysql_ssl_mode);
    let checked = matches!(
        cfg.mysql_ssl_mode,
        SslMode::VerifyCa | SslMode::VerifyIdentity
    );
    let to = if socket {
        "a unix socket".to_string()
    } else {
        host.clone()
    };
    let found = format!("--mysql-ssl-mode {mode} to {to}");
    let check = if checked || socket || is_loopback(&host) {
        Check::ok(CHECK_MYSQL, found)
    } else {
        Check::warn(CHECK_MYSQL, found)
    };
    let why = match cfg.mysql_ssl_mode {
        SslMode::Disabled => "off loopback, orders, payments and the password would cross the network in plaintext",
        _ => "off loopback, a mode that checks no certificate lets an attacker on the path pose as MySQL (preferred also falls back to plaintext when the offer of TLS is stripped)",
    };
    check
        .why(why)
        .fix("--mysql-ssl-mode verify-identity (or verify-ca) with --mysql-ca-cert")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_apart_from_others() {
        for host in ["127.0.0.1", "localhost", "[::1]", "127.8.9.10"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["10.0.0.1", "db.example.com", "[2001:db8::1]", ""] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}
