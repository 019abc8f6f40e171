//! Test hooks for crash tests: `SECKILL_TEST_PAUSE=<step>=<duration>[,...]`
//! makes a worker stop for that long at a named step of a batch and say so
//! on stderr, so a test can kill -9 it exactly there. Unset (always, in
//! production) it costs one lookup in an empty map.
//!
//! `<step>=<duration>*<n>` pauses there only the first n times.
//!
//! Steps: `after_lock` (locks held, nothing in MySQL), `before_commit` (the
//! transaction is open), `after_commit` (committed, not yet acknowledged),
//! `after_ack` (acknowledged and unlocked); for payment deadlines
//! `before_cancel_commit` and `after_cancel` (cancelled in MySQL, the unit not
//! yet given back in Redis); for preload and reconcile `between_snapshot_reads`
//! (a voucher's row read, its orders not yet) and `between_gate_and_mysql_reads`
//! (the gates read, MySQL's snapshot not taken yet); for the gate guard
//! `gate_paused` (a gate paused, not yet rebuilt); for the mover of a
//! voucher in buckets `between_take_and_give` (units taken from one gate,
//! in transit, not yet given to the other); for `seckill serve`'s Redis
//! connections' mender `mend_round` (before each round).
//!
//! `SECKILL_TEST_PANIC=<place>` panics at `startup` (before the command
//! line is read) or in `command` (inside the command, on the runtime), so a
//! test can see what an operator sees of a bug: one line, whatever
//! RUST_BACKTRACE says.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

pub const ENV: &str = "SECKILL_TEST_PAUSE";

/// How long to pause at a step, and how many more times (`*N`; unbounded
/// without it).
struct Pause {
    length: Duration,
    left: AtomicU64,
}

static PAUSES: LazyLock<HashMap<String, Pause>> = LazyLock::new(|| {
    std::env::var(ENV)
        .map(|spec| parse(&spec))
        .unwrap_or_default()
});

fn parse(spec: &str) -> HashMap<String, Pause> {
    spec.split(',')
        .filter_map(|item| {
            let (step, d) = item.split_once('=')?;
            let (d, times) = match d.split_once('*') {
                Some((d, n)) => (d, n.trim().parse().ok()?),
                None => (d, u64::MAX),
            };
            Some((
                step.trim().to_string(),
                Pause {
                    length: humantime::parse_duration(d.trim()).ok()?,
                    left: AtomicU64::new(times),
                },
            ))
        })
        .collect()
}

/// Pauses at `step` when the test hook asks for it.
pub async fn pause(step: &str) {
    let Some(p) = PAUSES.get(step) else { return };
    let taken = p
        .left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    if taken.is_ok() {
        tracing::warn!(
            "test pause at {step} for {}",
            humantime::format_duration(p.length)
        );
        tokio::time::sleep(p.length).await;
    }
}

pub const PANIC_ENV: &str = "SECKILL_TEST_PANIC";

/// Panics at `place` when the test hook asks for it.
pub fn panic_at(place: &str) {
    if std::env::var(PANIC_ENV).is_ok_and(|p| p == place) {
        panic!("test panic at {place}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_steps_and_ignores_garbage() {
        let p = super::parse("after_commit=1s, before_commit=250ms*2,junk,x=forever,y=1s*z");
        assert_eq!(p.len(), 2);
        assert_eq!(p["after_commit"].length.as_millis(), 1000);
        assert_eq!(p["before_commit"].length.as_millis(), 250);
        assert_eq!(p["before_commit"].left.load(super::Ordering::SeqCst), 2);
    }
}
