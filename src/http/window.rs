//! Before a sale opens and after it ends, attempts are answered without
//! touching Redis: each process caches every voucher's sale window it has
//! seen, refreshed at least every second, with the measured offset between
//! this host's clock and Redis `TIME` (the gate's clock) and a margin for
//! that measurement's error. Near the edges the gate's own check decides.
//! Pre-sale refreshes are most of a hot sale's traffic.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::gate::admission::Admission;
use crate::gate::state;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;

/// How long a window is trusted (so `voucher update` and preload reach
/// every process within about this).
pub const REFRESH: Duration = Duration::from_secs(1);
/// Added to the measured error of the clock offset.
const MARGIN_MS: i64 = 50;

#[derive(Debug, Clone, Copy)]
struct Window {
    begin_ms: i64,
    end_ms: i64,
    /// Redis's clock when the reply arrived (`fetched`), estimated from
    /// its TIME and half the round trip, and how far off that may be. Now
    /// is that plus the time elapsed since, by the monotonic clock: a host
    /// clock stepped meanwhile cannot move it.
    redis_ms: i64,
    error_ms: i64,
    fetched: Instant,
}

impl Window {
    fn redis_now_ms(&self) -> i64 {
        self.redis_ms + self.fetched.elapsed().as_millis() as i64
    }
}

#[derive(Default)]
pub struct SaleWindows {
    known: Mutex<HashMap<u64, Window>>,
}

impl SaleWindows {
    /// An answer without Redis when the cached window settles it (before
    /// the sale or after it, outside the margin); None: ask the gate.
    pub async fn answer(
        &self,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
    ) -> Result<Option<Admission>> {
        let voucher = keys.voucher();
        let cached = self
            .known
            .lock()
            .ok()
            .and_then(|m| m.get(&voucher).copied());
        let window = match cached {
            Some(w) if w.fetched.elapsed() < REFRESH => w,
            _ => match self.refresh(conn, keys).await? {
                Some(w) => w,
                None => return Ok(None),
            },
        };
        Ok(decide(&window, window.redis_now_ms()))
    }

    /// Reads the window and Redis's clock in one round trip (the same
    /// read as `GET /v1/vouchers/{voucher}`).
    async fn refresh(
        &self,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
    ) -> Result<Option<Window>> {
        let sent = Instant::now();
        let sale = state::read_sale(conn, keys).await?;
        let rtt_ms = sent.elapsed().as_millis() as i64;
        let Some(sale) = sale else {
            // Not loaded: the gate answers (and may be loaded any moment).
            if let Ok(mut m) = self.known.lock() {
                m.remove(&keys.voucher());
            }
            return Ok(None);
        };
        let window = Window {
            begin_ms: sale.begin_ms,
            end_ms: sale.end_ms,
            // Redis read its clock somewhere within the round trip.
            redis_ms: sale.now_ms + rtt_ms / 2,
            error_ms: rtt_ms / 2 + 1,
            fetched: Instant::now(),
        };
        if let Ok(mut m) = self.known.lock() {
            m.insert(keys.voucher(), window);
        }
        Ok(Some(window))
    }
}

/// The answer a window settles when Redis's clock reads about `redis_ms`,
/// if it does.
fn decide(w: &Window, redis_ms: i64) -> Option<Admission> {
    let margin = w.error_ms + MARGIN_MS;
    if redis_ms + margin < w.begin_ms {
        Some(Admission::NotStarted {
            begin_ms: w.begin_ms,
        })
    } else if redis_ms - margin >= w.end_ms {
        Some(Admission::Ended { end_ms: w.end_ms })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_margin_settles_is_answered_here() {
        let w = Window {
            begin_ms: 10_000,
            end_ms: 20_000,
            redis_ms: 0,
            error_ms: 1,
            fetched: Instant::now(),
        };
        assert_eq!(
            decide(&w, 5_000),
            Some(Admission::NotStarted { begin_ms: 10_000 })
        );
        assert_eq!(
            decide(&w, 9_990),
            None,
            "near the opening: the gate decides"
        );
        assert_eq!(decide(&w, 15_000), None, "open: the gate decides");
        assert_eq!(decide(&w, 20_010), None, "near the end: the gate decides");
        assert_eq!(
            decide(&w, 21_000),
            Some(Admission::Ended { end_ms: 20_000 })
        );
        // A wider error widens the margin.
        let rough = Window { error_ms: 500, ..w };
        assert_eq!(decide(&rough, 9_500), None);
        assert_eq!(
            decide(&rough, 9_400),
            Some(Admission::NotStarted { begin_ms: 10_000 })
        );
    }
}
