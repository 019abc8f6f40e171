//! Redis: reachable and new enough, every server set up to keep what it
//! acknowledged, the cluster's shape, the scripts, the node ids, and the
//! rights of the role.

use std::future::Future;

use super::redis_nodes::{self, Node, Shape};
use super::{Check, Role, Status};
use crate::store::config::Config;
use crate::store::keys;
use crate::store::redis_conn::{self, Redis};
use crate::store::scripts;
use crate::support::mask::{mask_url, redact};
use crate::support::snowflake::MAX_NODE_ID;

/// The rows, and the connection with the servers behind it once they were
/// reached (the clock check asks them again).
pub async fn checks(cfg: &Config, role: Option<Role>) -> (Vec<Check>, Option<(Redis, Shape)>) {
    let mut conn = match redis_conn::connect(cfg).await {
        Ok(conn) => conn,
        Err(e) => {
            let row = Check::fail("redis reachable", redact(&e.to_string(), &cfg.secrets()))
                .why("every command and the worker need Redis")
                .fix(format!(
                    "check --redis-url ({}) and that the server runs",
                    mask_url(&cfg.redis_url)
                ));
            return (vec![row], None);
        }
    };
    let mut out = vec![reachable(&mut conn).await];
    if out[0].status == Status::Fail {
        return (out, None);
    }
    let seed = redis_conn::seed_urls(&cfg.redis_url)
        .first()
        .and_then(|u| url::Url::parse(u).ok())
        .map(|u| {
            format!(
                "{}:{}",
                u.host_str().unwrap_or("127.0.0.1"),
                u.port().unwrap_or(6379)
            )
        })
        .unwrap_or_default();
    let shape = match redis_nodes::shape(&mut conn, &seed).await {
        Ok(shape) => shape,
        Err(e) => {
            out.push(Check::fail("redis cluster nodes", e.to_string()));
            return (out, None);
        }
    };
    out.push(eviction(&mut conn, &shape.nodes).await);
    out.push(append_only(&mut conn, &shape.nodes).await);
    out.push(append_fsync(&mut conn, &shape.nodes).await);
    out.push(lazy_free(&mut conn, &shape.nodes).await);
    if matches!(conn, Redis::Cluster(_)) {
        out.push(replicas(&shape));
        out.push(full_coverage(&mut conn, &shape.nodes).await);
    }
    if Role::uses_keys(role) {
        out.push(scripts_load(&mut conn).await);
        out.push(node_ids(&mut conn, &cfg.prefix).await);
    }
    if let Some(role) = role {
        out.push(rights(&mut conn, &cfg.prefix, role).await);
    }
    (out, Some((conn, shape)))
}

async fn reachable(conn: &mut Redis) -> Check {
    let kind = match conn {
        Redis::Cluster(_) => "cluster",
        Redis::Node(_) => "one server",
    };
    match redis_conn::check_version(conn).await {
        Ok(v) => Check::ok("redis reachable", format!("Redis {v}, {kind}")),
        Err(e) => Check::fail("redis reachable", e.to_string())
            .why("the worker's stream reads need Redis 6.2 (XAUTOCLAIM)")
            .fix("upgrade Redis to 7"),
    }
}

/// What one server said of a setting, judged.
struct Reading {
    status: Status,
    value: String,
}

/// Asks every server, and sums up: the worst reading decides, and the
/// values are listed per server where they differ.
async fn per_node<'a, F, Fut>(conn: &'a mut Redis, nodes: &'a [Node], mut read: F) -> Reading
where
    F: FnMut(Redis, Node) -> Fut,
    Fut: Future<Output = Reading>,
{
    let mut readings = Vec::with_capacity(nodes.len());
    for node in nodes {
        readings.push((node.label(), read(conn.clone(), node.clone()).await));
    }
    let status = readings
        .iter()
        .map(|(_, r)| r.status)
        .max()
        .unwrap_or(Status::Ok);
    let first = readings.first().map(|(_, r)| r.value.clone());
    let value = if readings
        .iter()
        .all(|(_, r)| Some(&r.value) == first.as_ref())
    {
        let one = first.unwrap_or_default();
        if readings.len() > 1 {
            format!("{one} (all {} servers)", readings.len())
        } else {
            one
        }
    } else {
        readings
            .iter()
            .map(|(at, r)| format!("{at}: {}", r.value))
            .collect::<Vec<_>>()
            .join("; ")
    };
    Reading { status, value }
}

fn reading(status: Status, value: impl Into<String>) -> Reading {
    Reading {
        status,
        value: value.into(),
    }
}

fn unreadable(e: &str) -> Reading {
    let value = if e.contains("NoPerm") || e.contains("NOPERM") {
        // The documented users may not run CONFIG (it is @dangerous).
        "not readable by this user (CONFIG GET refused): run doctor as an admin user".to_string()
    } else {
        format!("not readable: {e}")
    };
    reading(Status::Warn, value)
}

async fn eviction(conn: &mut Redis, nodes: &[Node]) -> Check {
    let r = per_node(conn, nodes, |mut c, n| async move {
        let memory = redis_nodes::info(&mut c, &n, "memory").await;
        let field = |f| memory.as_ref().map(|text| redis_nodes::info_field(text, f));
        match (field("maxmemory_policy"), field("maxmemory")) {
            (Ok(Some(p)), _) if p == "noeviction" => reading(Status::Ok, p),
            (Ok(Some(p)), Ok(Some(l))) if l == "0" => reading(
                Status::Warn,
                format!("{p}, no maxmemory (nothing evicted until a limit is set)"),
            ),
            (Ok(Some(p)), _) => reading(Status::Fail, p),
            (Ok(None), _) => unreadable("INFO memory has no maxmemory_policy"),
            (Err(e), _) => unreadable(e),
        }
    })
    .await;
    Check::new("redis maxmemory-policy", r.status, r.value)
        .why("an evicted buyers set admits its buyers again, an evicted stock key sells units twice, an evicted stream loses admitted orders")
        .fix("CONFIG SET maxmemory-policy noeviction (and in redis.conf); give Redis the memory the sale needs (scripts/bench-memory.sh)")
}

async fn append_only(conn: &mut Redis, nodes: &[Node]) -> Check {
    let r = per_node(conn, nodes, |mut c, n| async move {
        let persistence = redis_nodes::info(&mut c, &n, "persistence").await;
        match persistence.map(|text| redis_nodes::info_field(&text, "aof_enabled")) {
            Ok(Some(v)) if v == "1" => reading(Status::Ok, "yes"),
            Ok(Some(_)) => reading(Status::Fail, "no"),
            Ok(None) => unreadable("INFO persistence has no aof_enabled"),
            Err(e) => unreadable(&e),
        }
    })
    .await;
    Check::new("redis appendonly", r.status, r.value)
        .why("without the append-only file a restart loses the gate's writes since the last snapshot: admitted orders not yet in MySQL are gone, and the gate pauses to be rebuilt")
        .fix("CONFIG SET appendonly yes (and in redis.conf)")
}

async fn append_fsync(conn: &mut Redis, nodes: &[Node]) -> Check {
    let r = per_node(conn, nodes, |mut c, n| async move {
        match redis_nodes::config_get(&mut c, &n, "appendfsync").await {
            Ok(Some(v)) => Reading {
                status: match v.as_str() {
                    "always" => Status::Ok,
                    "everysec" => Status::Warn,
                    _ => Status::Fail,
                },
                value: v,
            },
            Ok(None) => unreadable("no such setting"),
            Err(e) => unreadable(&e),
        }
    })
    .await;
    Check::new("redis appendfsync", r.status, r.value)
        .why("a crash of the host loses the admissions not yet on disk: up to a second of them with everysec, up to about 30 s with no (the book: \"When Redis loses its last writes\", docs/src/concepts/redis-loss.md)")
        .fix("CONFIG SET appendfsync always, or keep everysec and run the worker and serve with --wait-replicas 1 on a replicated Redis")
}

async fn lazy_free(conn: &mut Redis, nodes: &[Node]) -> Check {
    let r = per_node(conn, nodes, |mut c, n| async move {
        let mut off = Vec::new();
        for name in ["lazyfree-lazy-expire", "lazyfree-lazy-server-del"] {
            match redis_nodes::config_get(&mut c, &n, name).await {
                Ok(Some(v)) if v == "yes" => {}
                Ok(Some(_)) => off.push(name),
                Ok(None) => {}
                Err(e) => return unreadable(&e),
            }
        }
        if off.is_empty() {
            reading(Status::Ok, "yes")
        } else {
            reading(Status::Warn, format!("{} no", off.join(", ")))
        }
    })
    .await;
    Check::new("redis lazyfree", r.status, r.value)
        .why("freeing a big set in place holds Redis: a million-member waitlist took 131 ms (scripts/bench-memory.sh), every admission waiting behind it")
        .fix("CONFIG SET lazyfree-lazy-expire yes and lazyfree-lazy-server-del yes (and in redis.conf)")
}

fn replicas(shape: &Shape) -> Check {
    let bare: Vec<&str> = shape
        .masters
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(m, _)| m.as_str())
        .collect();
    let counts = shape
        .masters
        .iter()
        .map(|(m, n)| format!("{m}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let check = if bare.is_empty() {
        Check::ok("redis cluster replicas", counts)
    } else {
        Check::warn(
            "redis cluster replicas",
            format!("no live replica for {}", bare.join(", ")),
        )
    };
    check
        .why("a master lost without a replica takes its vouchers' gates with it until it is back")
        .fix("give every master a replica (redis-cli --cluster add-node --cluster-slave)")
}

async fn full_coverage(conn: &mut Redis, nodes: &[Node]) -> Check {
    let r = per_node(conn, nodes, |mut c, n| async move {
        match redis_nodes::config_get(&mut c, &n, "cluster-require-full-coverage").await {
            Ok(Some(v)) if v == "no" => reading(Status::Ok, v),
            Ok(Some(v)) => reading(Status::Warn, v),
            Ok(None) => unreadable("no such setting"),
            Err(e) => unreadable(&e),
        }
    })
    .await;
    Check::new("redis cluster-require-full-coverage", r.status, r.value)
        .why("with yes, one master lost without a replica stops every voucher on the cluster, not only those in its slots (each voucher's keys share a slot, so no check needs the whole cluster)")
        .fix("CONFIG SET cluster-require-full-coverage no on every node (and in redis.conf)")
}

/// Every script of `lua/` loads on every server (a syntax a version does
/// not take, a user who may not load scripts).
async fn scripts_load(conn: &mut Redis) -> Check {
    let mut failed = Vec::new();
    let all = scripts::all();
    for (name, script) in &all {
        match script.load_async(conn).await {
            Ok(sha) if sha == script.get_hash() => {}
            Ok(sha) => failed.push((*name, format!("loaded as {sha}"))),
            Err(e) => failed.push((*name, crate::error::describe_redis(&e))),
        }
    }
    let check = if failed.is_empty() {
        Check::ok("redis scripts", format!("all {} load", all.len()))
    } else {
        Check::fail("redis scripts", same_errors_once(&failed, all.len()))
    };
    check
        .why("every layer runs as Lua scripts on the server")
        .fix(
        "a user that may run SCRIPT LOAD, EVAL and EVALSHA (contrib/redis-acl.conf), on Redis 7",
    )
}

/// Failures by error, each error once with the scripts it stopped.
fn same_errors_once(failed: &[(&str, String)], of: usize) -> String {
    let mut errors: Vec<&str> = failed.iter().map(|(_, e)| e.as_str()).collect();
    errors.dedup();
    if errors.len() == 1 && failed.len() == of {
        return format!("none of {of} loads: {}", errors[0]);
    }
    failed
        .iter()
        .map(|(name, e)| format!("{name}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// How many of the 1024 snowflake node ids are free: each `buy`, `bench`,
/// worker and `serve` leases one while it runs.
async fn node_ids(conn: &mut Redis, prefix: &str) -> Check {
    let span = u32::from(MAX_NODE_ID) + 1;
    let leases: Vec<String> = (0..=MAX_NODE_ID)
        .map(|n| keys::node_lease(prefix, n))
        .collect();
    let leased: Result<u32, _> = redis::cmd("EXISTS")
        .arg(&leases)
        .query_async(&mut conn.clone())
        .await;
    let check = match leased {
        Ok(leased) => {
            let free = span.saturating_sub(leased);
            let found = format!("{free} of {span} free ({leased} leased)");
            if free == 0 {
                Check::fail("redis node ids", found)
            } else if free < span / 16 {
                Check::warn("redis node ids", found)
            } else {
                Check::ok("redis node ids", found)
            }
        }
        Err(e) => Check::fail("redis node ids", crate::error::describe_redis(&e)),
    };
    check
        .why("a process that finds no free node id cannot mint order ids and refuses to start")
        .fix("fewer processes per prefix, or a separate --prefix per sale; a lease of a process killed -9 frees itself within 30 s")
}

/// A command the role runs, with arguments of the right arity; `K` and
/// `K2` stand for keys under the prefix.
type Probe = &'static [&'static str];

const DATA_COMMANDS: &[Probe] = &[
    &["get", "K"],
    &["set", "K", "v"],
    &["del", "K"],
    &["unlink", "K"],
    &["exists", "K"],
    &["incr", "K"],
    &["rename", "K", "K2"],
    &["persist", "K"],
    &["pexpire", "K", "1"],
    &["pexpireat", "K", "1"],
    &["pttl", "K"],
    &["incrby", "K", "1"],
    &["decrby", "K", "1"],
    &["hget", "K", "f"],
    &["hset", "K", "f", "v"],
    &["hsetnx", "K", "f", "v"],
    &["hmget", "K", "f"],
    &["hgetall", "K"],
    &["hdel", "K", "f"],
    &["hincrby", "K", "f", "1"],
    &["hexists", "K", "f"],
    &["hvals", "K"],
    &["sadd", "K", "m"],
    &["srem", "K", "m"],
    &["sismember", "K", "m"],
    &["smismember", "K", "m"],
    &["smembers", "K"],
    &["scard", "K"],
    &["zadd", "K", "1", "m"],
    &["zrem", "K", "m"],
    &["zremrangebyscore", "K", "-inf", "0"],
    &["zrange", "K", "0", "1"],
    &["zrangebyscore", "K", "0", "1"],
    &["zscore", "K", "m"],
    &["zmscore", "K", "m"],
    &["zcard", "K"],
    &["zrank", "K", "m"],
    &["xadd", "K", "*", "f", "v"],
    &["xack", "K", "g", "0-1"],
    &["xautoclaim", "K", "g", "c", "0", "0-0"],
    &["xclaim", "K", "g", "c", "0", "0-1"],
    &["xdel", "K", "0-1"],
    &["xgroup", "create", "K", "g", "$"],
    &["xgroup", "delconsumer", "K", "g", "c"],
    &["xlen", "K"],
    &["xinfo", "groups", "K"],
    &["xinfo", "consumers", "K", "g"],
    &["xpending", "K", "g"],
    &["xrange", "K", "-", "+"],
    &["xrevrange", "K", "+", "-"],
    &["xreadgroup", "group", "g", "c", "streams", "K", ">"],
    &["xtrim", "K", "maxlen", "1"],
    &["eval", "return 1", "1", "K"],
    &[
        "evalsha",
        "0000000000000000000000000000000000000000",
        "1",
        "K",
    ],
    &["script", "load", "return 1"],
    &[
        "script",
        "exists",
        "0000000000000000000000000000000000000000",
    ],
    &["multi"],
    &["exec"],
    &["time"],
    &["info", "server"],
];

const CONNECTION_COMMANDS: &[Probe] = &[&["ping"], &["client", "setname", "seckill"]];

fn probes(role: Role) -> Vec<Probe> {
    let mut all: Vec<Probe> = CONNECTION_COMMANDS.to_vec();
    match role {
        Role::Schema => all.push(&["info", "server"]),
        Role::Operator => all.extend_from_slice(DATA_COMMANDS),
        Role::Worker | Role::Serve => {
            all.extend_from_slice(DATA_COMMANDS);
            // --wait-replicas.
            all.push(&["wait", "0", "0"]);
        }
    }
    all
}

/// The role's commands, asked of the server with `redis.acl_check_cmd`
/// inside one script: nothing is run, nothing written.
async fn rights(conn: &mut Redis, prefix: &str, role: Role) -> Check {
    let check = format!("redis rights ({})", role.name());
    let probe_key = format!("{prefix}:{{doctor}}:probe");
    let second_key = format!("{prefix}:{{doctor}}:probe2");
    let probes = probes(role);
    let mut call = scripts::ACL_CHECK.prepare_invoke();
    call.key(&probe_key);
    for p in &probes {
        call.arg(p.len());
        for a in p.iter() {
            call.arg(match *a {
                "K" => probe_key.as_str(),
                "K2" => second_key.as_str(),
                other => other,
            });
        }
    }
    let role_file = "contrib/redis-acl.conf";
    if role == Role::Schema {
        // Its user may not run scripts: its two commands are read-only, so
        // they are simply run.
        return schema_rights(conn, check, role_file).await;
    }
    let denied: Result<Vec<i64>, _> = call.invoke_async(&mut conn.clone()).await;
    match denied {
        Ok(denied) if denied.is_empty() => Check::ok(
            check,
            format!("all {} commands of the role allowed", probes.len()),
        ),
        Ok(denied) => {
            let names: Vec<String> = denied
                .iter()
                .filter_map(|i| usize::try_from(*i).ok())
                .filter_map(|i| probes.get(i.wrapping_sub(1)))
                .map(|p| command_name(p))
                .collect();
            Check::fail(check, format!("denied: {}", names.join(", ")))
                .why(format!(
                    "the {} runs these (within its scripts too)",
                    role.name()
                ))
                .fix(format!(
                    "give the user the rules of its role in {role_file}"
                ))
        }
        Err(e) if is_unknown_function(&e) => Check::warn(
            check,
            "not checked: Redis before 7 cannot test a right without using it",
        )
        .why("a right missing is found only when the command is refused")
        .fix("upgrade Redis to 7"),
        Err(e) => Check::fail(check, crate::error::describe_redis(&e))
            .why(format!(
                "the {} runs scripts (EVAL, EVALSHA) on keys under the prefix",
                role.name()
            ))
            .fix(format!(
                "give the user the rules of its role in {role_file}"
            )),
    }
}

async fn schema_rights(conn: &mut Redis, check: String, role_file: &str) -> Check {
    let mut denied = Vec::new();
    for p in [&["ping"][..], &["info", "server"]] {
        let mut cmd = redis::cmd(p[0]);
        cmd.arg(&p[1..]);
        let reply: Result<redis::Value, _> = cmd.query_async(&mut conn.clone()).await;
        if let Err(e) = reply {
            denied.push(format!(
                "{} ({})",
                command_name(p),
                crate::error::describe_redis(&e)
            ));
        }
    }
    if denied.is_empty() {
        Check::ok(check, "PING and INFO allowed")
    } else {
        Check::fail(check, format!("denied: {}", denied.join(", ")))
            .why("`seckill init` reads the server's version")
            .fix(format!(
                "give the user the rules of its role in {role_file}"
            ))
    }
}

fn command_name(p: Probe) -> String {
    let sub = matches!(p[0], "xgroup" | "xinfo" | "script" | "client");
    let name = if sub {
        format!("{} {}", p[0], p[1])
    } else {
        p[0].to_string()
    };
    name.to_ascii_uppercase()
}

fn is_unknown_function(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    text.contains("acl_check_cmd") && (text.contains("nil") || text.contains("unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_commands_are_named_with_their_sub_command() {
        assert_eq!(
            command_name(&["xgroup", "create", "K", "g", "$"]),
            "XGROUP CREATE"
        );
        assert_eq!(command_name(&["hset", "K", "f", "v"]), "HSET");
    }

    #[test]
    fn every_command_a_script_runs_is_tried() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let mut sources = String::new();
        for dir in [dir.to_string(), format!("{dir}/lib")] {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.path().extension().is_some_and(|e| e == "lua") {
                    sources.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
                }
            }
        }
        let tried: Vec<&str> = DATA_COMMANDS.iter().map(|p| p[0]).collect();
        let mut missing = Vec::new();
        for call in sources
            .split("redis.call('")
            .skip(1)
            .chain(sources.split("redis.pcall('").skip(1))
        {
            let name = call
                .split('\'')
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            if !tried.contains(&name.as_str()) && !missing.contains(&name) {
                missing.push(name);
            }
        }
        assert_eq!(missing, Vec::<String>::new());
    }

    #[test]
    fn only_the_worker_and_serve_may_wait() {
        let waits = |r| probes(r).iter().any(|p| p[0] == "wait");
        assert!(waits(Role::Worker) && waits(Role::Serve));
        assert!(!waits(Role::Operator) && !waits(Role::Schema));
    }
}
