//! The one retry policy for store outages: wait 100 ms, then twice as long
//! after each failure in a row, never more than 5 s; the first success resets it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Retries after a store failure in this process, for the metrics page
/// (`seckill_worker_retries_total`): rising means Redis or MySQL fails.
static RETRIES: AtomicU64 = AtomicU64::new(0);

pub fn retries() -> u64 {
    RETRIES.load(Ordering::Relaxed)
}

const FIRST: Duration = Duration::from_millis(100);
const MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST }
    }
}

impl Backoff {
    /// How long to wait before the next try; the wait after it doubles.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(MAX);
        delay
    }

    /// After a failed try: logs `<what>; retrying in <delay>` and returns
    /// the delay. The four retry loops (a batch, a lane's round, the
    /// deadline pass, the gate guard) end and reconnect each in their own
    /// way; the policy and what operators read are the same for all.
    pub fn retry_after(&mut self, what: impl std::fmt::Display) -> Duration {
        let delay = self.next_delay();
        RETRIES.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("{what}; retrying in {}", humantime::format_duration(delay));
        delay
    }

    /// A try succeeded: the next failure waits the shortest time again.
    pub fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<u128> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), FIRST);
    }
}
