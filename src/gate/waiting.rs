//! The waiting room, read from the gates: a user's place in the voucher's
//! line (every bucket's waitlist, first come first served by queued time),
//! the line's length, and how fast it has moved.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::error::Result;
use crate::store::layout::{bucket_of, Layout};
use crate::store::redis_conn::RedisConn;

/// A waiting request: its place in line and the client reference it
/// queued with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InLine {
    /// 1-based: the requests of every bucket's line queued before this
    /// one, plus one.
    pub position: u64,
    pub client_reference: Option<String>,
}

/// Where the user waits; None when the user does not wait.
pub async fn in_line(
    conn: &mut impl RedisConn,
    layout: &Layout,
    user: u64,
) -> Result<Option<InLine>> {
    let own = layout.keys_of_user(user)?;
    // The reference's field is lua/seckill.lua's (KEYS[8], ref:<user>).
    let (score, rank, client_reference): (Option<f64>, Option<u64>, Option<String>) = redis::pipe()
        .zscore(own.waitlist(), user)
        .zrank(own.waitlist(), user)
        .hget(own.waitlist_quantity(), format!("ref:{user}"))
        .query_async(conn)
        .await?;
    let (Some(score), Some(rank)) = (score, rank) else {
        return Ok(None);
    };
    let mut position = rank + 1;
    // Queued times are microseconds, below 2^53: exact as the scores are.
    // Two buckets' requests queued in the same microsecond are served in
    // bucket order, as the mover serves them: a lower bucket's counts
    // before this one.
    let own_bucket = bucket_of(user, layout.buckets());
    let (up_to, before) = (format!("{score:.0}"), format!("({score:.0}"));
    for b in (0..layout.buckets()).filter(|b| *b != own_bucket) {
        let keys = layout.keys(b)?;
        let bound = if b < own_bucket { &up_to } else { &before };
        let ahead: u64 = conn.zcount(keys.waitlist(), "-inf", bound).await?;
        position += ahead;
    }
    Ok(Some(InLine {
        position,
        client_reference,
    }))
}

/// The voucher's line: requests waiting, and promotions ever (a waiting
/// request served a released unit), summed over its buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Line {
    pub waiting: u64,
    pub promotions: u64,
}

/// One round trip per bucket.
pub async fn line_of(conn: &mut impl RedisConn, layout: &Layout) -> Result<Line> {
    let mut line = Line::default();
    for b in 0..layout.buckets() {
        let keys = layout.keys(b)?;
        let (waiting, promotions): (u64, Option<u64>) = redis::pipe()
            .zcard(keys.waitlist())
            .hget(keys.meta(), "promotions")
            .query_async(conn)
            .await?;
        line.waiting += waiting;
        line.promotions += promotions.unwrap_or(0);
    }
    Ok(line)
}

/// How fast each voucher's line has moved, from the promotion counts this
/// process has seen over the last minutes: the basis of a waiting buyer's
/// estimate.
#[derive(Default)]
pub struct Pace {
    seen: Mutex<HashMap<u64, VecDeque<(Instant, u64)>>>,
}

/// Counts older than this say nothing of the line now.
const WINDOW: Duration = Duration::from_secs(300);
/// An estimate needs counts at least this far apart.
const MIN_SPAN: Duration = Duration::from_secs(5);
/// At most one count kept a second per voucher.
const SPACING: Duration = Duration::from_secs(1);
/// Vouchers followed at once; past it the oldest is forgotten.
const VOUCHERS: usize = 1024;

impl Pace {
    /// Records the voucher's promotion count as seen now.
    pub fn saw(&self, voucher: u64, promotions: u64) {
        self.saw_at(voucher, promotions, Instant::now());
    }

    fn saw_at(&self, voucher: u64, promotions: u64, now: Instant) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        if seen.len() >= VOUCHERS && !seen.contains_key(&voucher) {
            let stalest = seen
                .iter()
                .min_by_key(|(_, counts)| counts.back().map(|c| c.0))
                .map(|(v, _)| *v);
            if let Some(v) = stalest {
                seen.remove(&v);
            }
        }
        let counts = seen.entry(voucher).or_default();
        if counts.back().is_some_and(|last| now < last.0 + SPACING) {
            return;
        }
        counts.push_back((now, promotions));
        while counts
            .front()
            .is_some_and(|first| now.duration_since(first.0) > WINDOW)
        {
            counts.pop_front();
        }
    }

    /// How long until `position` requests are served at the pace shown over
    /// the last minutes, in ms; None without a basis (too few counts, or
    /// none served meanwhile).
    pub fn eta_ms(&self, voucher: u64, position: u64) -> Option<u64> {
        let seen = self.seen.lock().ok()?;
        let counts = seen.get(&voucher)?;
        let (first, last) = (counts.front()?, counts.back()?);
        let span = last.0.duration_since(first.0);
        let served = last.1.checked_sub(first.1)?;
        if span < MIN_SPAN || served == 0 {
            return None;
        }
        let per_ms = served as f64 / span.as_millis() as f64;
        Some((position as f64 / per_ms).round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_estimate_needs_a_span_and_a_moving_line() {
        let pace = Pace::default();
        let t0 = Instant::now();
        pace.saw_at(1, 10, t0);
        assert_eq!(pace.eta_ms(1, 5), None);
        pace.saw_at(1, 10, t0 + Duration::from_secs(10));
        assert_eq!(pace.eta_ms(1, 5), None, "nobody served: no basis");
        pace.saw_at(1, 30, t0 + Duration::from_secs(20));
        // 20 served in 20 s: one a second.
        assert_eq!(pace.eta_ms(1, 5), Some(5_000));
        assert_eq!(pace.eta_ms(2, 5), None);
        // Counts older than the window are dropped.
        pace.saw_at(1, 30, t0 + Duration::from_secs(400));
        assert_eq!(pace.eta_ms(1, 5), None);
    }
}
