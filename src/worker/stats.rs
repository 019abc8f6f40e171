//! What a worker has done, counted lock-free and read as a snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;

#[derive(Debug, Default)]
pub struct WorkerStats {
    persisted: AtomicU64,
    units_persisted: AtomicU64,
    duplicates: AtomicU64,
    dead_lettered: AtomicU64,
    batches: AtomicU64,
    reclaimed: AtomicU64,
    lock_denied: AtomicU64,
    lock_lost: AtomicU64,
    cancelled: AtomicU64,
    released: AtomicU64,
    promoted: AtomicU64,
    max_lateness_ms: AtomicU64,
    deadline_errors: AtomicU64,
    gate_pauses: AtomicU64,
    mysql_loss_pauses: AtomicU64,
    gate_reopens: AtomicU64,
    gates_paused: AtomicU64,
    orders_restored: AtomicU64,
    payments_restored: AtomicU64,
    /// At the guard's last pass: orders committed that MySQL lost, and
    /// pending orders held for the operator.
    mysql_commits_lost: AtomicU64,
    orders_held: AtomicU64,
    /// Passes the gate guard has completed (succeeded or failed).
    guard_passes: AtomicU64,
    units_moved: AtomicU64,
    transfers_completed: AtomicU64,
    /// Mover passes started, and the number of the last one that left
    /// nothing to move (an --until-idle run waits for one that started
    /// after its own last work).
    mover_passes: AtomicU64,
    mover_settled_pass: AtomicU64,
    pub timings: Timings,
}

/// The worker's histograms, shared with the metrics page (a
/// prometheus-client histogram is a handle).
#[derive(Debug)]
pub struct Timings {
    /// Time to persist one batch.
    pub batch_seconds: Histogram,
    /// Per deadline pass that cancelled something, how late its latest
    /// cancellation was.
    pub lateness_seconds: Histogram,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            batch_seconds: Histogram::new(BATCH_BUCKETS),
            lateness_seconds: Histogram::new(LATENESS_BUCKETS),
        }
    }
}

/// Upper bounds (seconds) of the batch-duration histogram's buckets.
pub const BATCH_BUCKETS: [f64; 11] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Upper bounds (seconds) of the deadline-lateness histogram's buckets: a
/// pass is due every few hundred ms, and minutes late is an outage.
pub const LATENESS_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    /// Orders inserted into MySQL by this worker.
    pub persisted: u64,
    /// The units those orders hold.
    pub units_persisted: u64,
    /// Redelivered entries whose order was already stored.
    pub duplicates: u64,
    pub dead_lettered: u64,
    pub batches: u64,
    /// Entries taken over from silent consumers.
    pub reclaimed: u64,
    /// Entries left pending because another worker held the user's lock.
    pub lock_denied: u64,
    /// Lock leases that expired while their batch was being persisted.
    pub lock_lost: u64,
    /// Unpaid orders cancelled at their payment deadline.
    pub cancelled: u64,
    /// Units given back at the gate (to the stock or the waitlist).
    pub released: u64,
    /// Of those, units handed to waitlisted users.
    pub promoted: u64,
    /// Worst time from a deadline to its cancellation.
    pub max_lateness_ms: u64,
    /// Voucher passes of the payment deadlines that failed (retried).
    pub deadline_errors: u64,
    /// Gates this worker paused: Redis had lost writes MySQL holds.
    pub gate_pauses: u64,
    /// Gates this worker paused: MySQL had lost commits workers made.
    pub mysql_loss_pauses: u64,
    /// Orders MySQL lost that this worker's guard restored into it.
    pub orders_restored: u64,
    /// Payments MySQL lost that this worker's canceller made again (the
    /// gate had seen them paid).
    pub payments_restored: u64,
    /// At the guard's last pass: how many fewer orders MySQL held than the
    /// gates saw committed (every voucher's), and how many pending orders
    /// were held for the operator.
    pub mysql_commits_lost: u64,
    pub orders_held: u64,
    /// Paused gates this worker rebuilt from MySQL and reopened.
    pub gate_reopens: u64,
    /// Passes of the gate guard over every voucher.
    pub guard_passes: u64,
    /// Units the mover moved between a voucher's buckets (and its pool).
    pub units_moved: u64,
    /// Transfers a stopped mover left between its steps, completed.
    pub transfers_completed: u64,
}

impl WorkerStats {
    pub fn add_batch(&self, persisted: u64, units: u64, duplicates: u64, dead: u64) {
        self.persisted.fetch_add(persisted, Ordering::Relaxed);
        self.units_persisted.fetch_add(units, Ordering::Relaxed);
        self.duplicates.fetch_add(duplicates, Ordering::Relaxed);
        self.dead_lettered.fetch_add(dead, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add_reclaimed(&self, n: u64) {
        self.reclaimed.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_lock_denied(&self, n: u64) {
        self.lock_denied.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_lock_lost(&self, n: u64) {
        self.lock_lost.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_released(&self, cancelled: u64, released: u64, promoted: u64) {
        self.cancelled.fetch_add(cancelled, Ordering::Relaxed);
        self.released.fetch_add(released, Ordering::Relaxed);
        self.promoted.fetch_add(promoted, Ordering::Relaxed);
    }
    pub fn add_deadline_error(&self) {
        self.deadline_errors.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add_gate_pause(&self) {
        self.gate_pauses.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add_mysql_loss_pause(&self) {
        self.mysql_loss_pauses.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add_orders_restored(&self, n: u64) {
        self.orders_restored.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_payments_restored(&self, n: u64) {
        self.payments_restored.fetch_add(n, Ordering::Relaxed);
    }
    pub fn set_mysql_commits_lost(&self, n: u64) {
        self.mysql_commits_lost.store(n, Ordering::Relaxed);
    }
    pub fn set_orders_held(&self, n: u64) {
        self.orders_held.store(n, Ordering::Relaxed);
    }
    pub fn add_gate_reopen(&self) {
        self.gate_reopens.fetch_add(1, Ordering::Relaxed);
    }
    /// How many gates the guard saw paused on its last pass.
    pub fn set_gates_paused(&self, n: u64) {
        self.gates_paused.store(n, Ordering::Relaxed);
    }
    pub fn gates_paused(&self) -> u64 {
        self.gates_paused.load(Ordering::Relaxed)
    }
    pub fn add_guard_pass(&self) {
        self.guard_passes.fetch_add(1, Ordering::Relaxed);
    }
    pub fn guard_passes(&self) -> u64 {
        self.guard_passes.load(Ordering::Relaxed)
    }
    pub fn add_units_moved(&self, n: u64) {
        self.units_moved.fetch_add(n, Ordering::Relaxed);
    }
    /// A mover pass begins: its number.
    pub fn start_mover_pass(&self) -> u64 {
        self.mover_passes.fetch_add(1, Ordering::Relaxed) + 1
    }
    /// Mover pass `pass` ended with nothing moved, nothing left in transit
    /// and no voucher failing.
    pub fn note_mover_settled(&self, pass: u64) {
        self.mover_settled_pass.fetch_max(pass, Ordering::Relaxed);
    }
    /// The number of the last mover pass begun.
    pub fn mover_passes(&self) -> u64 {
        self.mover_passes.load(Ordering::Relaxed)
    }
    /// Whether a mover pass begun after pass `after` found nothing to move.
    pub fn mover_settled_after(&self, after: u64) -> bool {
        self.mover_settled_pass.load(Ordering::Relaxed) > after
    }
    pub fn add_transfer_completed(&self) {
        self.transfers_completed.fetch_add(1, Ordering::Relaxed);
    }
    pub fn note_lateness(&self, ms: u64) {
        self.max_lateness_ms.fetch_max(ms, Ordering::Relaxed);
        self.timings.lateness_seconds.observe(ms as f64 / 1000.0);
    }

    /// Records how long one batch took, for the latency histogram.
    pub fn observe_batch(&self, d: std::time::Duration) {
        self.timings.batch_seconds.observe(d.as_secs_f64());
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            persisted: get(&self.persisted),
            units_persisted: get(&self.units_persisted),
            duplicates: get(&self.duplicates),
            dead_lettered: get(&self.dead_lettered),
            batches: get(&self.batches),
            reclaimed: get(&self.reclaimed),
            lock_denied: get(&self.lock_denied),
            lock_lost: get(&self.lock_lost),
            cancelled: get(&self.cancelled),
            released: get(&self.released),
            promoted: get(&self.promoted),
            max_lateness_ms: get(&self.max_lateness_ms),
            deadline_errors: get(&self.deadline_errors),
            gate_pauses: get(&self.gate_pauses),
            mysql_loss_pauses: get(&self.mysql_loss_pauses),
            orders_restored: get(&self.orders_restored),
            payments_restored: get(&self.payments_restored),
            mysql_commits_lost: get(&self.mysql_commits_lost),
            orders_held: get(&self.orders_held),
            gate_reopens: get(&self.gate_reopens),
            guard_passes: get(&self.guard_passes),
            units_moved: get(&self.units_moved),
            transfers_completed: get(&self.transfers_completed),
        }
    }
}
