//! The Redis servers behind a connection, each asked on its own: settings
//! are per server, and on a cluster a replica's settings count as much as
//! its master's (it is the master after a failover).

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Value};

use crate::error::{describe_redis, Result};
use crate::store::redis_conn::Redis;
use crate::store::slot_map::SlotMap;

/// One server: its address, and whether it is a replica (and of whom).
#[derive(Debug, Clone)]
pub struct Node {
    pub addr: String,
    pub replica_of: Option<String>,
}

impl Node {
    pub fn label(&self) -> String {
        match &self.replica_of {
            Some(_) => format!("{} (replica)", self.addr),
            None => self.addr.clone(),
        }
    }
}

/// A cluster's shape: its masters serving slots, each with its replicas.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    pub nodes: Vec<Node>,
    /// Masters serving slots, with how many live replicas each has.
    pub masters: Vec<(String, usize)>,
}

/// The servers to ask: the one node, or every node of the cluster that is
/// not flagged failed.
pub async fn shape(conn: &mut Redis, node_addr: &str) -> Result<Shape> {
    let Redis::Cluster(_) = conn else {
        return Ok(Shape {
            nodes: vec![Node {
                addr: node_addr.to_string(),
                replica_of: None,
            }],
            masters: Vec::new(),
        });
    };
    let listing: std::result::Result<Value, _> = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn.clone())
        .await;
    let text = match listing {
        Ok(text) => text,
        // The documented users may run CLUSTER SLOTS only (the driver
        // needs it): the slot map names the masters and their replicas,
        // without the failed flags.
        Err(_) => {
            let slots: Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn.clone())
                .await?;
            return Ok(parse_cluster_slots(&slots));
        }
    };
    // Asked of every master; any one's view will do.
    let text = match text {
        Value::Map(per_node) => per_node
            .into_iter()
            .next()
            .map(|(_, v)| crate::store::redis_conn::value_text(&v))
            .unwrap_or_default(),
        single => crate::store::redis_conn::value_text(&single),
    };
    Ok(parse_cluster_nodes(&text))
}

/// `CLUSTER NODES`: `<id> <ip:port@cport[,host]> <flags> <master id> ...
/// <slots>...`, one line per node.
fn parse_cluster_nodes(text: &str) -> Shape {
    struct Line<'a> {
        id: &'a str,
        addr: String,
        replica: bool,
        master: &'a str,
        slots: bool,
    }
    let lines: Vec<Line> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let down = |flag: &str| matches!(flag, "fail" | "fail?" | "noaddr" | "handshake");
            if f.len() < 8 || f[2].split(',').any(down) {
                return None;
            }
            let addr = f[1].split(['@', ',']).next()?.to_string();
            Some(Line {
                id: f[0],
                addr,
                replica: f[2].contains("slave"),
                master: f[3],
                slots: f.len() > 8,
            })
        })
        .collect();
    let addr_of = |id: &str| lines.iter().find(|l| l.id == id).map(|l| l.addr.clone());
    let nodes = lines
        .iter()
        .map(|l| Node {
            addr: l.addr.clone(),
            replica_of: l.replica.then(|| addr_of(l.master).unwrap_or_default()),
        })
        .collect();
    let masters = lines
        .iter()
        .filter(|l| !l.replica && l.slots)
        .map(|m| {
            let replicas = lines
                .iter()
                .filter(|l| l.replica && l.master == m.id)
                .count();
            (m.addr.clone(), replicas)
        })
        .collect();
    Shape { nodes, masters }
}

/// `CLUSTER SLOTS` (store/slot_map.rs reads it): each master once, with
/// its replicas.
fn parse_cluster_slots(reply: &Value) -> Shape {
    let mut shape = Shape::default();
    for (master, replicas) in SlotMap::parse(reply).masters_with_replicas() {
        shape.nodes.push(Node {
            addr: master.to_string(),
            replica_of: None,
        });
        for r in replicas {
            shape.nodes.push(Node {
                addr: r.clone(),
                replica_of: Some(master.to_string()),
            });
        }
        shape.masters.push((master.to_string(), replicas.len()));
    }
    shape
}

/// One command on one server.
pub async fn ask(conn: &mut Redis, node: &Node, cmd: &Cmd) -> std::result::Result<Value, String> {
    let reply = match conn {
        Redis::Node(c) => cmd.query_async(c).await,
        Redis::Cluster(c) => {
            let Some((host, port)) = node
                .addr
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
            else {
                return Err(format!("cannot address {}", node.addr));
            };
            c.route_command(
                cmd.clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port }),
            )
            .await
        }
    };
    // A routed command hands a server's refusal back as a value.
    match reply {
        Ok(Value::ServerError(e)) => Err(describe_redis(&e.into())),
        Ok(v) => Ok(v),
        Err(e) => Err(describe_redis(&e)),
    }
}

/// `CONFIG GET name` on one server: `Ok(None)` when the setting does not
/// exist in this version.
pub async fn config_get(
    conn: &mut Redis,
    node: &Node,
    name: &str,
) -> std::result::Result<Option<String>, String> {
    let reply = ask(conn, node, redis::cmd("CONFIG").arg("GET").arg(name)).await?;
    let pairs: Vec<String> = match reply {
        Value::Map(m) => m
            .iter()
            .flat_map(|(k, v)| [k, v])
            .map(crate::store::redis_conn::value_text)
            .collect(),
        Value::Array(a) => a.iter().map(crate::store::redis_conn::value_text).collect(),
        _ => Vec::new(),
    };
    Ok(pairs
        .chunks(2)
        .find(|kv| kv.len() == 2 && kv[0].eq_ignore_ascii_case(name))
        .map(|kv| kv[1].clone()))
}

/// `INFO <section>` of one server, as text.
pub async fn info(
    conn: &mut Redis,
    node: &Node,
    section: &str,
) -> std::result::Result<String, String> {
    let reply = ask(conn, node, redis::cmd("INFO").arg(section)).await?;
    Ok(crate::store::redis_conn::value_text(&reply))
}

/// One field of an INFO text.
pub fn info_field(text: &str, field: &str) -> Option<String> {
    let wanted = format!("{field}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .map(|v| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_listing_gives_masters_with_their_live_replicas() {
        let text = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922
a3 127.0.0.1:7003@17003,host3 master - 0 0 3 connected 10923-16383
b1 127.0.0.1:7004@17004 slave,nofailover a1 0 0 1 connected
b2 127.0.0.1:7005@17005 slave,fail a2 0 0 2 connected
b3 127.0.0.1:7006@17006 slave a3 0 0 3 connected
";
        let shape = parse_cluster_nodes(text);
        assert_eq!(
            shape.masters,
            [
                ("127.0.0.1:7001".to_string(), 1),
                ("127.0.0.1:7002".to_string(), 0),
                ("127.0.0.1:7003".to_string(), 1)
            ]
        );
        assert_eq!(shape.nodes.len(), 5, "the failed replica is left out");
        assert_eq!(shape.nodes[3].label(), "127.0.0.1:7004 (replica)");
        assert_eq!(shape.nodes[3].replica_of.as_deref(), Some("127.0.0.1:7001"));
    }

    #[test]
    fn a_slot_map_gives_each_master_once_with_its_replicas() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |a: i64, b: i64, nodes: Vec<Value>| {
            let mut f = vec![Value::Int(a), Value::Int(b)];
            f.extend(nodes);
            Value::Array(f)
        };
        let reply = Value::Array(vec![
            range(0, 100, vec![node(7001), node(7004)]),
            range(101, 200, vec![node(7002)]),
            range(201, 300, vec![node(7001), node(7004)]),
        ]);
        let shape = parse_cluster_slots(&reply);
        assert_eq!(
            shape.masters,
            [
                ("127.0.0.1:7001".to_string(), 1),
                ("127.0.0.1:7002".to_string(), 0)
            ]
        );
        assert_eq!(shape.nodes.len(), 3);
    }
}
