//! Before a sale opens and after it ends, attempts are answered without
//! touching Redis: each process caches every voucher's sale window it has
//! seen, refreshed at least every second, with the measured offset between
//! this host's clock and Redis `TIME` (the gate's clock) and a margin for
//! that measurement's error. Near the edges the gate's own check decides.
//! Pre-sale refreshes are most of a hot sale's traffic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::gate::admission::Admission;
use crate::gate::buckets::Layout;
use crate::gate::state;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;

/// How long a window is trusted (so `voucher update` and preload reach
/// every process within about this).
pub const REFRESH: Duration = Duration::from_secs(1);
/// Added to the measured error of the clock offset.
const MARGIN_MS: i64 = 50;
/// How long past REFRESH the others answer from a window one request is
/// reading again; past it (that request slow, or dropped) each reads.
const STALE_GRACE: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
struct Window {
    begin_ms: i64,
    end_ms: i64,
    /// The voucher's buckets, read with the window (they never change
    /// once the voucher is loaded).
    layout: Arc<Layout>,
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

/// A window as cached, and since when one request refreshes it (the others
/// keep answering from it meanwhile, so an expiry under load costs one
/// read, not one per request in that round trip).
#[derive(Debug, Clone)]
struct Cached {
    window: Window,
    refreshing_since: Option<Instant>,
}

#[derive(Default)]
pub struct SaleWindows {
    known: Mutex<HashMap<u64, Cached>>,
    /// Layouts of vouchers in buckets, final once read (with a loaded
    /// bucket 0's window, or from MySQL's record): kept when bucket 0's
    /// gate is lost, so the other buckets' users are routed to their own
    /// gates while it is rebuilt.
    split: Mutex<HashMap<u64, Arc<Layout>>>,
    /// When MySQL was last asked for the split of a voucher whose bucket 0
    /// was not loaded and had none: asked again only after ASK_MYSQL_EVERY,
    /// so attempts at an unknown voucher cost MySQL nothing.
    unsplit: Mutex<HashMap<u64, Instant>>,
    /// Per voucher, one request asks MySQL at a time; the others wait for
    /// its answer, then find the split kept. Without it, the requests
    /// arriving while the first asked were routed to bucket 0 (lost whole:
    /// answered `unknown_voucher` though their own bucket sells).
    asking: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
}

/// How often MySQL is asked again for a voucher it recorded no split of.
const ASK_MYSQL_EVERY: Duration = Duration::from_secs(1);
/// How long a request waits for MySQL's answer (the others wait behind it).
const ASK_MYSQL_FOR: Duration = Duration::from_millis(500);
/// Vouchers remembered as not split, at most (ids come from clients).
const UNSPLIT_MAX: usize = 10_000;

/// What a request does with the cache.
enum Step {
    Use(Window),
    Refresh,
}

impl SaleWindows {
    /// An answer without Redis when the cached window settles it (before
    /// the sale or after it, outside the margin); None: ask the gate.
    pub async fn answer(
        &self,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
    ) -> Result<Option<Admission>> {
        let window = match self.step(keys.voucher()) {
            Step::Use(w) => w,
            Step::Refresh => match self.refresh(conn, keys).await {
                Ok(Some(w)) => w,
                Ok(None) => return Ok(None),
                Err(e) => {
                    self.refresh_failed(keys.voucher());
                    return Err(e);
                }
            },
        };
        Ok(decide(&window, window.redis_now_ms()))
    }

    /// Fresh: use it. Stale: the first request refreshes it, and the others
    /// use it meanwhile, for STALE_GRACE at most (a refresher stuck or
    /// dropped is taken over then).
    fn step(&self, voucher: u64) -> Step {
        let Ok(mut known) = self.known.lock() else {
            return Step::Refresh;
        };
        let Some(entry) = known.get_mut(&voucher) else {
            return Step::Refresh;
        };
        let age = entry.window.fetched.elapsed();
        if age < REFRESH {
            return Step::Use(entry.window.clone());
        }
        let someone_refreshes = entry
            .refreshing_since
            .is_some_and(|since| since.elapsed() < STALE_GRACE);
        if someone_refreshes && age < REFRESH + STALE_GRACE {
            return Step::Use(entry.window.clone());
        }
        entry.refreshing_since = Some(Instant::now());
        Step::Refresh
    }

    /// The voucher's buckets as last read with its window, or as kept once
    /// read (None until a request read it, or while it is not loaded and
    /// was never seen split).
    pub fn layout(&self, voucher: u64) -> Option<Arc<Layout>> {
        let cached = self
            .known
            .lock()
            .ok()?
            .get(&voucher)
            .map(|c| c.window.layout.clone());
        cached.or_else(|| self.split.lock().ok()?.get(&voucher).cloned())
    }

    /// The layout to route by when the window had none (bucket 0's gate
    /// not loaded): the one kept, else MySQL's record, asked at most once a
    /// second per voucher (None: not split, or not known to be).
    pub async fn routing(&self, db: &Db, prefix: &str, voucher: u64) -> Option<Arc<Layout>> {
        if let Some(layout) = self.layout(voucher) {
            return Some(layout);
        }
        let asking = {
            let mut asking = self.asking.lock().ok()?;
            if asking.len() >= UNSPLIT_MAX {
                asking.clear();
            }
            asking.entry(voucher).or_default().clone()
        };
        let _turn = asking.lock().await;
        if let Some(layout) = self.layout(voucher) {
            return Some(layout);
        }
        let recently = self.unsplit.lock().ok()?.get(&voucher).copied();
        if recently.is_some_and(|t| t.elapsed() < ASK_MYSQL_EVERY) {
            return None;
        }
        let asked = crate::gate::buckets::recorded(db, prefix, voucher);
        let answer = match tokio::time::timeout(ASK_MYSQL_FOR, asked).await {
            Ok(Ok(Some(layout))) => {
                let layout = Arc::new(layout);
                self.keep_split(voucher, &layout);
                return Some(layout);
            }
            Ok(Ok(None)) => None,
            Ok(Err(e)) => {
                tracing::debug!("voucher {voucher}: its split could not be read from MySQL: {e}");
                None
            }
            Err(_) => {
                tracing::debug!("voucher {voucher}: MySQL did not say its split in time");
                None
            }
        };
        // Asked and answered (no split, or no answer): not again for a
        // second, so attempts at an unknown voucher cost MySQL little.
        if let Ok(mut unsplit) = self.unsplit.lock() {
            if unsplit.len() >= UNSPLIT_MAX {
                unsplit.clear();
            }
            unsplit.insert(voucher, Instant::now());
        }
        answer
    }

    /// Each buyer's gate: by the layout read with the window, else the
    /// one kept or recorded (bucket 0's gate not loaded: lost while the
    /// other buckets sell on?), else the voucher's one gate.
    pub async fn gates(&self, db: &Db, prefix: &str, voucher: u64) -> Arc<Layout> {
        match self.routing(db, prefix, voucher).await {
            Some(layout) => layout,
            None => Arc::new(Layout::single(prefix, voucher)),
        }
    }

    fn keep_split(&self, voucher: u64, layout: &Arc<Layout>) {
        if layout.buckets() > 1 {
            if let Ok(mut split) = self.split.lock() {
                split.insert(voucher, layout.clone());
            }
        }
    }

    fn refresh_failed(&self, voucher: u64) {
        if let Ok(mut known) = self.known.lock() {
            if let Some(entry) = known.get_mut(&voucher) {
                entry.refreshing_since = None;
            }
        }
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
        let layout = Arc::new(Layout::from_tags(
            keys.prefix(),
            keys.voucher(),
            sale.bucket_tags.as_deref(),
        )?);
        self.keep_split(keys.voucher(), &layout);
        let window = Window {
            begin_ms: sale.begin_ms,
            end_ms: sale.end_ms,
            layout,
            // Redis read its clock somewhere within the round trip.
            redis_ms: sale.now_ms + rtt_ms / 2,
            error_ms: rtt_ms / 2 + 1,
            fetched: Instant::now(),
        };
        if let Ok(mut m) = self.known.lock() {
            let cached = Cached {
                window: window.clone(),
                refreshing_since: None,
            };
            m.insert(keys.voucher(), cached);
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

    fn cached_aged(windows: &SaleWindows, age: Duration) {
        let fetched = Instant::now().checked_sub(age).unwrap();
        let window = Window {
            begin_ms: 10_000,
            end_ms: 20_000,
            layout: Arc::new(Layout::single("t", 1)),
            redis_ms: 0,
            error_ms: 1,
            fetched,
        };
        let entry = Cached {
            window,
            refreshing_since: None,
        };
        windows.known.lock().unwrap().insert(1, entry);
    }

    #[test]
    fn a_stale_window_is_read_again_by_one_request_while_the_others_use_it() {
        let windows = SaleWindows::default();
        assert!(matches!(windows.step(1), Step::Refresh), "unknown: read it");
        cached_aged(&windows, Duration::from_millis(100));
        assert!(matches!(windows.step(1), Step::Use(_)), "fresh");
        cached_aged(&windows, Duration::from_millis(1_050));
        assert!(
            matches!(windows.step(1), Step::Refresh),
            "stale: the first reads"
        );
        assert!(matches!(windows.step(1), Step::Use(_)), "the others use it");
        assert!(matches!(windows.step(1), Step::Use(_)));
        windows.refresh_failed(1);
        assert!(
            matches!(windows.step(1), Step::Refresh),
            "a failed read: the next tries"
        );
        // Past the grace: every request reads, whoever refreshes.
        cached_aged(&windows, Duration::from_millis(1_250));
        assert!(matches!(windows.step(1), Step::Refresh));
        assert!(matches!(windows.step(1), Step::Refresh));
    }

    #[test]
    fn only_what_the_margin_settles_is_answered_here() {
        let w = Window {
            begin_ms: 10_000,
            end_ms: 20_000,
            layout: Arc::new(Layout::single("t", 1)),
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
