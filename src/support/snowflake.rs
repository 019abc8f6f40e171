//! 64-bit snowflake order ids: 41 bits of milliseconds since 2020-01-01 UTC,
//! 10 bits of node id, 12 bits of sequence.
//!
//! The generator keeps one monotonic state word `(ms << 12) | seq` and always
//! moves it forward: `next = max(now << 12, last + 1)`. When the wall clock
//! steps back, ids keep coming from the last millisecond seen (borrowing
//! sequence numbers, then future milliseconds), so a process never repeats an
//! id. Distinct processes never share a node id: each leases one from Redis
//! (`store::node_lease`), which also hands out a floor for the time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// 2020-01-01T00:00:00Z in Unix milliseconds.
pub const EPOCH_MS: u64 = 1_577_836_800_000;
pub const MAX_NODE_ID: u16 = (1 << NODE_BITS) - 1;
const NODE_BITS: u32 = 10;
const SEQ_BITS: u32 = 12;

pub struct Snowflake {
    node: u64,
    state: AtomicU64,
    clock: fn() -> u64,
}

fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Snowflake {
    pub fn new(node: u16) -> Result<Self> {
        Self::with_clock(node, wall_clock_ms)
    }

    /// A generator reading time from `clock` (Unix ms); tests step it back.
    pub fn with_clock(node: u16, clock: fn() -> u64) -> Result<Self> {
        if node > MAX_NODE_ID {
            return Err(Error::InvalidInput(format!(
                "node id {node} is out of range (0..={MAX_NODE_ID})"
            )));
        }
        Ok(Snowflake {
            node: u64::from(node),
            state: AtomicU64::new(0),
            clock,
        })
    }

    /// A generator whose ids all have a time after `floor_ms` (Unix ms),
    /// whatever this host's clock says: the floor a node-id lease hands out.
    pub fn starting_after(node: u16, floor_ms: u64) -> Result<Self> {
        let gen = Self::new(node)?;
        let floor = floor_ms.saturating_sub(EPOCH_MS) << SEQ_BITS;
        gen.state
            .store(floor | ((1 << SEQ_BITS) - 1), Ordering::Relaxed);
        Ok(gen)
    }

    /// A generator whose ids all come after both `floor_ms` (Unix ms) and
    /// `after` (where a former generator of this process stood): a process
    /// that claims a node id again must not fall back to a floor that Redis
    /// lost (a failover to an empty replica hands out 0) and repeat its own
    /// ids, nor move its ids back in time under another node id.
    pub fn resuming(node: u16, floor_ms: u64, after: Position) -> Result<Self> {
        let gen = Self::starting_after(node, floor_ms)?;
        gen.state.fetch_max(after.0, Ordering::Relaxed);
        Ok(gen)
    }

    /// Where it stands: the time and sequence of the last id it made.
    pub fn position(&self) -> Position {
        Position(self.state.load(Ordering::Acquire))
    }

    /// The time (Unix ms) of the next id: the clock, or later if the ids
    /// already made are ahead of it.
    pub fn time_ms(&self) -> u64 {
        let clock = (self.clock)();
        let state = (self.state.load(Ordering::Relaxed) >> SEQ_BITS) + EPOCH_MS;
        clock.max(state)
    }

    pub fn next_id(&self) -> u64 {
        let now = (self.clock)().saturating_sub(EPOCH_MS) << SEQ_BITS;
        let mut last = self.state.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self
                .state
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    let ms = next >> SEQ_BITS;
                    let seq = next & ((1 << SEQ_BITS) - 1);
                    return (ms << (NODE_BITS + SEQ_BITS)) | (self.node << SEQ_BITS) | seq;
                }
                Err(actual) => last = actual,
            }
        }
    }
}

/// The state of a generator (the last id's time and sequence, whatever its
/// node id); the default is that of one that made no id yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position(u64);

impl Position {
    /// The time (Unix ms) of the last id made; the epoch if none was.
    pub fn time_ms(self) -> u64 {
        (self.0 >> SEQ_BITS) + EPOCH_MS
    }
}

/// The creation time (Unix ms) and node id encoded in an id.
pub fn decode(id: u64) -> (u64, u16) {
    let ms = (id >> (NODE_BITS + SEQ_BITS)) + EPOCH_MS;
    let node = ((id >> SEQ_BITS) & u64::from(MAX_NODE_ID)) as u16;
    (ms, node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicU64 as Clock;

    static STEPPING: Clock = Clock::new(0);
    fn stepping_clock() -> u64 {
        // Goes forward 5 ms, then back 3 ms, over and over.
        let t = STEPPING.fetch_add(1, Ordering::Relaxed);
        EPOCH_MS + 1_000_000 + (t / 2) * 2 + if t.is_multiple_of(2) { 5 } else { 0 }
    }

    fn frozen_clock() -> u64 {
        EPOCH_MS + 42
    }

    #[test]
    fn a_floor_ahead_of_the_clock_is_respected() {
        let gen = Snowflake::starting_after(5, EPOCH_MS + 10_000_000).unwrap();
        let (ms, node) = decode(gen.next_id());
        assert_eq!(node, 5);
        assert!(ms > EPOCH_MS + 10_000_000 || wall_clock_ms() > EPOCH_MS + 10_000_000);
        let behind = Snowflake::with_clock(5, frozen_clock).unwrap();
        behind.state.store(
            ((EPOCH_MS + 10_000_000 - EPOCH_MS) << SEQ_BITS) | ((1 << SEQ_BITS) - 1),
            Ordering::Relaxed,
        );
        let (ms, _) = decode(behind.next_id());
        assert_eq!(
            ms,
            EPOCH_MS + 10_000_001,
            "a frozen clock far behind the floor"
        );
    }

    #[test]
    fn a_resumed_generator_keeps_the_later_of_its_position_and_the_floor() {
        // Its ids an hour ahead of this clock (a former holder's floor).
        let hour_ahead = wall_clock_ms() + 3_600_000;
        let gen = Snowflake::starting_after(4, hour_ahead).unwrap();
        let last = (0..5_000).map(|_| gen.next_id()).last().unwrap();
        assert_eq!(gen.position().time_ms(), decode(last).0);
        // The floor lost (0): it goes on after its own last id.
        let again = Snowflake::resuming(4, 0, gen.position()).unwrap();
        assert_eq!(again.next_id(), last + 1);
        // A floor ahead of it wins.
        let later = Snowflake::resuming(4, hour_ahead + 60_000, gen.position()).unwrap();
        assert!(decode(later.next_id()).0 > hour_ahead + 60_000);
        // Under another node id, its time does not go back.
        let other = Snowflake::resuming(8, 0, gen.position()).unwrap();
        let (ms, node) = decode(other.next_id());
        assert_eq!((ms, node), (decode(last).0, 8));
        assert_eq!(Position::default().time_ms(), EPOCH_MS);
    }

    #[test]
    fn ids_stay_unique_and_increasing_when_the_clock_steps_back() {
        let gen = Snowflake::with_clock(7, stepping_clock).unwrap();
        let mut last = 0;
        for _ in 0..100_000 {
            let id = gen.next_id();
            assert!(id > last, "{id} after {last}");
            last = id;
        }
    }

    #[test]
    fn a_frozen_clock_borrows_future_milliseconds_instead_of_repeating() {
        let gen = Snowflake::with_clock(3, frozen_clock).unwrap();
        let ids: Vec<u64> = (0..10_000).map(|_| gen.next_id()).collect();
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
        assert!(ids.iter().all(|id| decode(*id).1 == 3));
    }

    #[test]
    fn ids_are_unique_across_threads() {
        let gen = std::sync::Arc::new(Snowflake::new(1).unwrap());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let gen = gen.clone();
                std::thread::spawn(move || (0..20_000).map(|_| gen.next_id()).collect::<Vec<_>>())
            })
            .collect();
        let mut all = HashSet::new();
        for h in handles {
            for id in h.join().unwrap() {
                assert!(all.insert(id));
            }
        }
        assert_eq!(all.len(), 80_000);
    }

    #[test]
    fn ids_fit_a_signed_bigint_and_decode() {
        let gen = Snowflake::new(MAX_NODE_ID).unwrap();
        let id = gen.next_id();
        assert!(id <= i64::MAX as u64);
        let (ms, node) = decode(id);
        assert_eq!(node, MAX_NODE_ID);
        assert!(ms.abs_diff(wall_clock_ms()) < 5_000);
        assert!(Snowflake::new(MAX_NODE_ID + 1).is_err());
    }
}
