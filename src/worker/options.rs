//! What `seckill worker` is told to do: its options, checked once.

use std::time::Duration;

use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// This instance's consumer name in the group (stable per instance).
    pub consumer: String,
    /// Entries read per stream per round trip.
    pub batch: usize,
    /// While reads come back full (a backlog), each one reads twice as many
    /// as the last, up to this; once they come back less than half full,
    /// the size halves back toward `batch`. Under a sale the gate keeps
    /// Redis busy and every round trip waits its turn: fewer, larger
    /// batches are what lets the worker keep up.
    pub max_batch: usize,
    /// How long one blocking read waits for new entries.
    pub block: Duration,
    /// Entries pending this long with a silent consumer are reclaimed.
    pub claim_idle: Duration,
    /// A message that cannot be persisted is dead-lettered once it has been
    /// delivered more often than this.
    pub max_deliveries: u64,
    /// Lease of the L3 locks (renewed while a batch runs).
    pub lock_lease: Duration,
    /// Longest a fenced MySQL transaction (a batch's, a cancellation's) may
    /// take from its checkout to its COMMIT's answer; past it, it is
    /// abandoned (worker/fence.rs).
    pub mysql_timeout: Duration,
    /// Exit once no voucher has undelivered or pending entries.
    pub until_idle: bool,
    /// Acknowledged entries are trimmed from the streams after this long.
    pub keep: Duration,
    /// Batches in hand at once: while one waits for its MySQL commit, the
    /// next is read and locked (each lane has its own connections).
    pub lanes: usize,
    /// Snowflake node id of the orders this worker mints (promotions).
    pub node_id: Option<u16>,
    /// Layer 5: payment deadlines.
    pub deadlines: DeadlineOptions,
    /// Where to serve Prometheus metrics (none: no endpoint).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How often the gate guard looks for gates that lost writes (zero: off).
    pub gate_check: Duration,
}

impl WorkerOptions {
    /// The largest read while a backlog lasts (`--max-batch`, never below
    /// `--batch`).
    pub fn largest_batch(&self) -> usize {
        self.max_batch.max(self.batch)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidInput(m.to_string()));
        if !(1..=4096).contains(&self.batch) {
            return bad("--batch must be between 1 and 4096");
        }
        if !(1..=4096).contains(&self.max_batch) {
            return bad("--max-batch must be between 1 and 4096");
        }
        if self.block < Duration::from_millis(1) || self.block > Duration::from_secs(60) {
            return bad("--block must be between 1ms and 60s");
        }
        if self.claim_idle < Duration::from_millis(10) {
            return bad("--claim-idle must be at least 10ms");
        }
        if self.max_deliveries == 0 {
            return bad("--max-deliveries must be at least 1");
        }
        if self.lock_lease < Duration::from_millis(30) {
            return bad("--lock-lease must be at least 30ms");
        }
        let wait = crate::worker::fence::lock_wait(self.lock_lease);
        if self.mysql_timeout <= wait {
            return Err(Error::InvalidInput(format!(
                "--mysql-timeout ({}) must be longer than a lock wait, half --lock-lease in whole seconds ({}): a transaction waiting for a stopped holder's row would be abandoned before it could end that holder",
                humantime::format_duration(self.mysql_timeout),
                humantime::format_duration(wait)
            )));
        }
        if self.deadlines.lease < Duration::from_millis(100) {
            return bad("--deadline-lease must be at least 100ms");
        }
        if self.deadlines.sweep_every < Duration::from_millis(100) {
            return bad("--sweep-every must be at least 100ms");
        }
        if !(1..=16).contains(&self.lanes) {
            return bad("--lanes must be between 1 and 16");
        }
        if self.consumer.is_empty() || self.consumer.len() > 200 {
            return bad("--consumer must be 1-200 characters");
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct DeadlineOptions {
    /// A claimed deadline comes back after this long if its claimer died.
    pub lease: Duration,
    /// How often MySQL is swept for overdue pending orders.
    pub sweep_every: Duration,
    /// How far past its deadline an order must be before the sweep takes it.
    pub sweep_grace: Duration,
    /// Deadlines claimed (and orders swept) per voucher per round trip.
    pub batch: usize,
}

/// The default consumer name: host and process id, stable for the life of
/// the process and distinct between instances.
pub fn default_consumer() -> String {
    format!("{}-{}", crate::support::host::name(), std::process::id())
}
