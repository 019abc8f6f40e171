//! Which master serves a hash slot now: what choosing a bucket's hash tag
//! (gate/buckets.rs) needs to put a voucher's buckets on different masters.

use redis::Value;

use crate::error::Result;
use crate::store::redis_conn::{value_text, RedisConn};

/// The slots of Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The slot of a key or a hash tag's content: CRC16 (XMODEM) of the tag
/// when the key has one (`{...}`, not empty), of the whole key otherwise.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS
}

/// Slot ranges and the addresses of the master serving each and of its
/// replicas (what the doctor asks each server of, too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMap {
    ranges: Vec<SlotRange>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotRange {
    start: u16,
    end: u16,
    master: String,
    replicas: Vec<String>,
}

impl SlotMap {
    /// The map a cluster's nodes hold now; `None` on a single node, where
    /// one server serves every slot.
    pub async fn read(conn: &mut impl RedisConn) -> Result<Option<SlotMap>> {
        if !conn.is_cluster() {
            return Ok(None);
        }
        let reply: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
        Ok(Some(SlotMap::parse(&reply)))
    }

    /// `CLUSTER SLOTS`: `[start, end, [ip, port, id, ..], replicas...]` per
    /// range; a range that does not read so is left out.
    pub fn parse(reply: &Value) -> SlotMap {
        let Value::Array(ranges) = reply else {
            return SlotMap::default();
        };
        let node = |v: &Value| match v {
            Value::Array(f) if f.len() >= 2 => {
                Some(format!("{}:{}", value_text(&f[0]), value_text(&f[1])))
            }
            _ => None,
        };
        let bound = |v: &Value| match v {
            Value::Int(n) => u16::try_from(*n).ok(),
            _ => None,
        };
        let ranges = ranges
            .iter()
            .filter_map(|range| {
                let Value::Array(f) = range else { return None };
                Some(SlotRange {
                    start: bound(f.first()?)?,
                    end: bound(f.get(1)?)?,
                    master: node(f.get(2)?)?,
                    replicas: f.iter().skip(3).filter_map(node).collect(),
                })
            })
            .collect();
        SlotMap { ranges }
    }

    /// The master serving `slot`, if any serves it.
    pub fn master_of(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|r| (r.start..=r.end).contains(&slot))
            .map(|r| r.master.as_str())
    }

    /// The masters serving slots, each once, with the replicas of its
    /// first range.
    pub fn masters_with_replicas(&self) -> Vec<(&str, &[String])> {
        let mut masters: Vec<(&str, &[String])> = Vec::new();
        for r in &self.ranges {
            if !masters.iter().any(|(m, _)| *m == r.master) {
                masters.push((&r.master, &r.replicas));
            }
        }
        masters
    }

    /// The masters serving slots, each once.
    pub fn masters(&self) -> Vec<&str> {
        self.masters_with_replicas()
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // The examples of the Redis Cluster specification.
        assert_eq!(slot_of("123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("foo{}{bar}"), slot_of("foo{}{bar}"));
        assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"));
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    }

    #[test]
    fn reads_masters_from_the_slot_listing() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |a: i64, b: i64, port: i64| {
            Value::Array(vec![
                Value::Int(a),
                Value::Int(b),
                node(port),
                node(port + 3),
            ])
        };
        let map = SlotMap::parse(&Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16383, 7002),
        ]));
        assert_eq!(map.master_of(0), Some("127.0.0.1:7000"));
        assert_eq!(map.master_of(10922), Some("127.0.0.1:7001"));
        assert_eq!(map.master_of(16383), Some("127.0.0.1:7002"));
        assert_eq!(map.masters().len(), 3);
    }
}
