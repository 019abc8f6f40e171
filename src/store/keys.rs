//! The Redis key layout (docs/src/reference/key-layout.md), a public contract. Every key of one
//! voucher carries the hash tag `{V}` so scripts touch a single cluster slot;
//! a voucher split into buckets (gate/buckets.rs) has one tag per bucket,
//! `{V}` for bucket 0 and `{V.b.s}` for bucket b > 0 (s: a salt chosen to
//! put the bucket on a master of its own).

use crate::error::{Error, Result};
use crate::store::config::validate_prefix;

/// The keys of one voucher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoucherKeys {
    prefix: String,
    voucher: u64,
    base: String,
}

impl VoucherKeys {
    /// The keys of each of `vouchers`.
    pub fn of_all(prefix: &str, vouchers: &[u64]) -> Result<Vec<Self>> {
        vouchers.iter().map(|v| Self::new(prefix, *v)).collect()
    }

    pub fn new(prefix: &str, voucher: u64) -> Result<Self> {
        Self::of_bucket(prefix, voucher, &voucher.to_string())
    }

    /// The keys of one bucket's gate, under the bucket's recorded `tag`.
    pub fn of_bucket(prefix: &str, voucher: u64, tag: &str) -> Result<Self> {
        validate_prefix(prefix)?;
        if !is_bucket_tag(tag, voucher) {
            return Err(Error::InvalidInput(format!(
                "'{tag}' is not a bucket tag of voucher {voucher}"
            )));
        }
        Ok(VoucherKeys {
            prefix: prefix.to_string(),
            voucher,
            base: format!("{prefix}:{{{tag}}}"),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn voucher(&self) -> u64 {
        self.voucher
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.base)
    }

    /// A request's admission record (`KEYS[9]` of lua/seckill.lua), named
    /// by the nonce its idempotency key's reservation holds.
    pub fn idempotency_record(&self, nonce: &str) -> String {
        self.key(&format!("idem:{nonce}"))
    }

    pub fn meta(&self) -> String {
        self.key("meta")
    }
    pub fn stock(&self) -> String {
        self.key("stock")
    }
    pub fn buyers(&self) -> String {
        self.key("buyers")
    }
    pub fn waitlist(&self) -> String {
        self.key("waitlist")
    }
    pub fn orders(&self) -> String {
        self.key("orders")
    }
    pub fn dead(&self) -> String {
        self.key("dead")
    }
    pub fn timeouts(&self) -> String {
        self.key("timeouts")
    }
    pub fn released(&self) -> String {
        self.key("released")
    }
    /// The orders paid through this tool (`lua/timeouts.lua paid`): what
    /// Redis saw paid, for a MySQL that lost the payment.
    pub fn paid(&self) -> String {
        self.key("paid")
    }
    pub fn events(&self) -> String {
        self.key("events")
    }
    /// The user's admission token (when the voucher requires tokens).
    pub fn token(&self, user: u64) -> String {
        self.key(&format!("token:{user}"))
    }
    /// Every user's attempts in the last second (when the voucher has a rate).
    pub fn rate(&self) -> String {
        self.key("rate")
    }
    /// User → units wanted, for waitlisted requests of more than one unit;
    /// `ref:<user>` → a waitlisted request's client reference.
    pub fn waitlist_quantity(&self) -> String {
        self.key("waitlist_quantity")
    }
    /// Failed passes of the workers over this voucher's deadlines (a count
    /// of its own, not in meta: it must not make a lost gate look loaded).
    pub fn deadline_errors(&self) -> String {
        self.key("deadline_errors")
    }
    /// Dead letters requeued lately (lua/requeue.lua): id -> what was done,
    /// so a resent requeue reports it instead of "no such dead letter".
    pub fn requeued(&self) -> String {
        self.key("requeued")
    }
    /// The voucher's layer-3 lease locks, one field per user
    /// (lua/lib/lease.lua).
    pub fn locks(&self) -> String {
        self.key("locks")
    }
    /// Workers holding the gate paused: each has a batch in hand whose
    /// entries Redis lost (lua/pause.lua).
    pub fn holds(&self) -> String {
        self.key("holds")
    }
    /// MySQL sessions holding the voucher's row lock, under leases
    /// (lua/fence.lua). One per voucher, on bucket 0's tag whatever bucket
    /// these keys are: the row is the voucher's, and a worker waiting for
    /// it must see every session that may hold it.
    pub fn fence(&self) -> String {
        format!("{}:{{{}}}:fence", self.prefix, self.voucher)
    }
    /// Units of a bucketed voucher given to no bucket yet (a string, on
    /// bucket 0's tag: the pool is rebuilt and watched with bucket 0).
    pub fn pool(&self) -> String {
        self.key("pool")
    }
    /// Transfers this gate gave and has not settled: id -> `<to> <units>
    /// <time_ms>` (lua/transfer_take.lua).
    pub fn transfers(&self) -> String {
        self.key("transfers")
    }
    /// The pool's open transfers, like `transfers` (on bucket 0's tag).
    pub fn pool_transfers(&self) -> String {
        self.key("pool_transfers")
    }
    /// Transfers that reached this gate: id -> `given`, or `void` for one
    /// called off before it arrived (lua/transfer_give.lua, transfer_void.lua).
    pub fn received(&self) -> String {
        self.key("received")
    }
    /// Transfers that reached the pool, like `received` (on bucket 0's tag).
    pub fn pool_received(&self) -> String {
        self.key("pool_received")
    }
    /// Who holds a bucketed voucher's mover still while they count its
    /// units (the gate guard's rebuild, reconcile): owner -> expiry ms, a
    /// sorted set on bucket 0's tag (lua/mover_lease.lua).
    pub fn mover_holds(&self) -> String {
        self.key("mover_holds")
    }
    /// Scratch key for rebuilding the buyers set before swapping it in;
    /// `run` keeps two concurrent rebuilds (preload and reconcile) apart.
    pub fn buyers_staging(&self, run: &str) -> String {
        self.key(&format!("buyers:staging:{run}"))
    }
    /// Scratch key for rebuilding the released set before swapping it in.
    pub fn released_staging(&self, run: &str) -> String {
        self.key(&format!("released:staging:{run}"))
    }
}

/// The hash tag content of bucket `bucket` of `voucher` under `salt`.
pub fn bucket_tag(voucher: u64, bucket: u32, salt: u32) -> String {
    if bucket == 0 {
        voucher.to_string()
    } else {
        format!("{voucher}.{bucket}.{salt}")
    }
}

/// Whether `tag` is one of `voucher`'s bucket tags (what the scripts accept
/// between the braces of a voucher's keys).
pub fn is_bucket_tag(tag: &str, voucher: u64) -> bool {
    let v = voucher.to_string();
    if tag == v {
        return true;
    }
    let Some(rest) = tag
        .strip_prefix(v.as_str())
        .and_then(|r| r.strip_prefix('.'))
    else {
        return false;
    };
    let number = |p: &str| !p.is_empty() && p.len() <= 10 && p.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 2 && parts.iter().all(|p| number(p))
}

/// An idempotency key's reservation (lua/idem_reserve.lua), in a slot of
/// its own: `scope` names the caller, `digest` is the key's SHA-256 (hex).
pub fn idempotency_reservation(prefix: &str, scope: &str, digest: &str) -> String {
    format!("{prefix}:idem:{{{scope}:{digest}}}")
}

/// The lease of snowflake node id `node` (lua/node_lease.lua).
pub fn node_lease(prefix: &str, node: u16) -> String {
    format!("{prefix}:{{nodes}}:lease:{node}")
}

/// Per node id, the highest id time any holder may have used.
pub fn node_clock(prefix: &str) -> String {
    format!("{prefix}:{{nodes}}:clock")
}

/// The consumer group of `seckill worker` on every order stream.
pub const WORKER_GROUP: &str = "seckill-worker";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_contract() {
        let k = VoucherKeys::new("seckill", 42).unwrap();
        assert_eq!(k.meta(), "seckill:{42}:meta");
        assert_eq!(k.stock(), "seckill:{42}:stock");
        assert_eq!(k.orders(), "seckill:{42}:orders");
        assert_eq!(k.locks(), "seckill:{42}:locks");
    }

    #[test]
    fn a_bucket_has_its_own_tag() {
        let k = VoucherKeys::of_bucket("seckill", 42, &bucket_tag(42, 2, 5)).unwrap();
        assert_eq!(k.stock(), "seckill:{42.2.5}:stock");
        assert_eq!(k.voucher(), 42);
        assert_eq!(
            k.fence(),
            "seckill:{42}:fence",
            "the voucher row's, one per voucher"
        );
        assert_eq!(bucket_tag(42, 0, 5), "42");
        assert!(VoucherKeys::of_bucket("seckill", 42, "43.1.0").is_err());
    }

    #[test]
    fn bucket_tags_are_recognised_as_the_vouchers_only() {
        assert!(is_bucket_tag("12", 12));
        assert!(is_bucket_tag("12.1.0", 12));
        assert!(is_bucket_tag("12.63.9999", 12));
        for not in [
            "1", "123", "12.", "12.1", "12.1.", "12.a.1", "12.1.1.1", "121.1.0", "",
        ] {
            assert!(!is_bucket_tag(not, 12), "{not:?}");
        }
    }

    #[test]
    fn rejects_prefixes_that_break_the_layout() {
        for bad in ["", "a{b", "a b", ":x", "x:"] {
            assert!(VoucherKeys::new(bad, 1).is_err(), "{bad:?}");
        }
    }
}
