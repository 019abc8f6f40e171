//! The Redis key layout (DESIGN.md §3), a public contract. Every key of one
//! voucher carries the hash tag `{V}` so scripts touch a single cluster slot.

use crate::error::Result;
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
        validate_prefix(prefix)?;
        Ok(VoucherKeys {
            prefix: prefix.to_string(),
            voucher,
            base: format!("{prefix}:{{{voucher}}}"),
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
    /// User → units wanted, for waitlisted requests of more than one unit.
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
    /// (lua/fence.lua).
    pub fn fence(&self) -> String {
        self.key("fence")
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
    fn rejects_prefixes_that_break_the_layout() {
        for bad in ["", "a{b", "a b", ":x", "x:"] {
            assert!(VoucherKeys::new(bad, 1).is_err(), "{bad:?}");
        }
    }
}
