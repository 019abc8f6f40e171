//! A stream entry id (`<ms>-<seq>`), the one place ids are parsed and ordered.

use std::fmt;
use std::str::FromStr;

/// An entry id of a Redis stream. Ordered as Redis orders them: by the
/// millisecond part, then by the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    /// `0-0`: below every entry Redis can hold.
    pub const ZERO: StreamId = StreamId { ms: 0, seq: 0 };

    /// The smallest id at the given millisecond.
    pub fn at_ms(ms: u64) -> StreamId {
        StreamId { ms, seq: 0 }
    }

    /// The smallest id greater than this one (for inclusive range starts).
    pub fn next(self) -> StreamId {
        match self.seq.checked_add(1) {
            Some(seq) => StreamId { ms: self.ms, seq },
            None => StreamId {
                ms: self.ms.saturating_add(1),
                seq: 0,
            },
        }
    }

    /// The millisecond part as the signed time the rest of the code uses.
    pub fn time_ms(self) -> Option<i64> {
        i64::try_from(self.ms).ok()
    }

    /// Parses what Redis reports (`last-delivered-id`, a pending entry, ...),
    /// where a malformed id would be Redis's fault: it orders as `0-0`, the
    /// cautious end for every caller (nothing is trimmed below it).
    pub fn lenient(id: &str) -> StreamId {
        id.parse().unwrap_or(StreamId::ZERO)
    }
}

impl FromStr for StreamId {
    type Err = String;

    /// `<ms>-<seq>`, or a bare `<ms>` (sequence 0), as Redis accepts them.
    fn from_str(id: &str) -> Result<StreamId, String> {
        let bad = || format!("'{id}' is not a stream id");
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        Ok(StreamId {
            ms: ms.parse().map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_orders_and_prints_like_redis() {
        let a: StreamId = "1764400000123-4".parse().unwrap();
        assert_eq!(
            a,
            StreamId {
                ms: 1_764_400_000_123,
                seq: 4
            }
        );
        assert_eq!(a.to_string(), "1764400000123-4");
        assert_eq!("17".parse::<StreamId>().unwrap(), StreamId::at_ms(17));
        assert!(StreamId { ms: 5, seq: 9 } < StreamId { ms: 6, seq: 0 });
        assert!(StreamId { ms: 5, seq: 1 } < StreamId { ms: 5, seq: 2 });
        assert_eq!(a.next().to_string(), "1764400000123-5");
        assert_eq!(
            StreamId {
                ms: 3,
                seq: u64::MAX
            }
            .next(),
            StreamId::at_ms(4)
        );
    }

    #[test]
    fn rejects_what_is_not_an_id() {
        for bad in ["", "x-1", "1-x", "1-2-3", "-1"] {
            assert!(bad.parse::<StreamId>().is_err(), "{bad:?}");
        }
        assert_eq!(StreamId::lenient("garbage"), StreamId::ZERO);
    }
}
