//! The mover (design/buckets.md §3): inside `seckill worker`, it moves the
//! stock of vouchers split in buckets to where buyers wait, so no unit is
//! left unsold in one bucket while a buyer who fits waits in another.
//!
//! One worker at a time moves a voucher (lua/mover_lease.lua, with an epoch
//! that fences a mover that lost its lease). Each round, for each voucher:
//! complete transfers a stopped mover left between its steps; read every
//! bucket's line (worker/bucket_look.rs); give the free units to the
//! earliest waiting requests of any bucket (worker/allotment.rs) and
//! publish in the buckets the queued time up to which each serves its own
//! line (lua/serve_up_to.lua), so a unit freed at one bucket is not served
//! to a later request there; move units to the buckets whose allotted
//! requests lack them, from the pool first, then from buckets holding more
//! than theirs need; serve each bucket's allotted requests; then even out
//! buckets running low. Nothing moves before the sale begins or while a
//! bucket is not loaded. Every move is take, give, settle
//! (gate/transfer.rs).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::allotment::{Allotment, Filling, Took};
use super::bucket_look::{
    allotment, look_all, movable, pool_usable, unpromised, BucketView, LINE_DEPTH,
};
use super::WorkerStats;
use crate::error::{Error, Result};
use crate::gate::buckets::{Layout, Layouts};
use crate::gate::mover_lease;
use crate::gate::transfer::{self, Bounded, Given, Landing, Settled, Side, Taken};
use crate::store::config::Config;
use crate::store::keys::VoucherKeys;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::{self, Redis};
use crate::store::registry;
use crate::support::backoff::Backoff;
use crate::support::timespec::now_ms;

/// How often the mover looks at every voucher in buckets: a buyer waiting
/// at an empty bucket while units remain elsewhere is served within about
/// this plus a few round trips.
pub const MOVE_EVERY: Duration = Duration::from_millis(100);
/// A transfer open longer than this was left by a mover that stopped (a
/// mover takes, gives and settles in one round, milliseconds apart).
const STALE_TRANSFER_MS: u64 = 5_000;
/// The most waiting requests one serve promotes (lua/lib/waitlist.lua looks
/// at no more): the fresh order ids it needs at most, as many as a round
/// reads of a line.
const PROMOTIONS_PER_SERVE: usize = LINE_DEPTH as usize;
/// How long a published bound holds at least without the next round
/// renewing it (three passes, if a pass takes longer): a mover that stops
/// keeps no bucket's units from its own line for longer.
const BOUND_HOLDS_MS: u64 = 1_000;
/// A bucket holding less than this share of the average is topped up.
const LOW_WATER_DIVISOR: i64 = 2;

pub struct Mover {
    pub(super) cfg: Arc<Config>,
    pub(super) conn: Redis,
    pub(super) db: crate::store::db::Db,
    pub(super) ids: Arc<OrderIds>,
    pub(super) stats: Arc<WorkerStats>,
    /// Unique among all workers: the lease's owner.
    pub(super) owner: String,
    pub(super) lease: Duration,
    pub(super) layouts: Layouts,
    /// Vouchers whose round failed, said once until one succeeds.
    pub(super) failing: HashMap<u64, String>,
    /// Per voucher, the epoch the next lease must be above (a gate fenced
    /// this mover with a later one).
    pub(super) epoch_floors: HashMap<u64, u64>,
    /// The worker runs --until-idle: it must know, of a voucher another
    /// worker moves, whether work is left.
    pub(super) until_idle: bool,
    /// A move of this pass was refused or fell short (a fence, a pause, a
    /// sale emptying the giver, units left in transit), or a serve
    /// promoted someone: the next pass may move what this one could not,
    /// so the pass is not settled.
    pub(super) moves_left: bool,
    /// Vouchers whose buckets this mover last left a live bound in, with
    /// the epoch it held: lifted once nobody waits, and when it stops.
    pub(super) bounded: HashMap<u64, u64>,
    /// How long the last pass took: a bound holds for three of them (at
    /// least BOUND_HOLDS_MS), so a slow pass does not let it lapse.
    pub(super) last_pass: Duration,
    /// Per voucher, the free units last published in its buckets, and
    /// when.
    pub(super) published: HashMap<u64, (i64, std::time::Instant)>,
    /// This worker runs a gate guard (--gate-check above 0).
    pub(super) guarded: bool,
    /// Vouchers whose unchecked bucket a guardless worker has told of.
    pub(super) told_unchecked: std::collections::HashSet<u64>,
    /// Per voucher, the buckets whose last publish answered that their
    /// server is not checked yet (lua/lib/server_checked.lua), or that
    /// refused a give as paused since: planned as paused, since nothing
    /// may draw on them, until a publish there is taken again.
    pub(super) unchecked: HashMap<u64, BTreeSet<usize>>,
}

/// A voucher's free units as a round reads them and its moves change them.
struct Holdings {
    looks: Vec<BucketView>,
    pool: i64,
}

impl Mover {
    pub async fn run(mut self, stop: CancellationToken) {
        let mut backoff = Backoff::default();
        loop {
            let delay = match self.pass().await {
                Ok(()) => {
                    backoff.reset();
                    MOVE_EVERY
                }
                Err(e) => {
                    let delay = backoff.retry_after(format_args!("mover: {e}"));
                    if let Ok(c) = redis_conn::connect(&self.cfg).await {
                        self.conn = c;
                    }
                    delay
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        // Bounded in time: a Redis that is down must not hold up shutdown.
        let lifting = Duration::from_millis(2 * BOUND_HOLDS_MS);
        if tokio::time::timeout(lifting, self.lift_every_bound())
            .await
            .is_err()
        {
            tracing::debug!("mover: bounds not all lifted in time; they lapse");
        }
        self.release_leases().await;
    }

    /// One round over every registered voucher in buckets; one voucher's
    /// failure is logged and the others go on.
    pub async fn pass(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        let passed = self.pass_once().await;
        self.last_pass = started.elapsed();
        passed
    }

    async fn pass_once(&mut self) -> Result<()> {
        let pass = self.stats.start_mover_pass();
        self.moves_left = false;
        let vouchers = registry::members(&mut self.conn, &self.cfg.prefix).await?;
        let before = self.stats.snapshot().units_moved;
        let mut left_open = 0;
        let mut failed = false;
        for v in vouchers {
            let layout = match self
                .layouts
                .of(&mut self.conn, &self.db, &self.cfg.prefix, v)
                .await
            {
                Ok(layout) if layout.buckets() > 1 => layout,
                Ok(_) => continue,
                Err(e) => {
                    self.note_failure(v, &e);
                    failed = true;
                    continue;
                }
            };
            match self.round(&layout).await {
                Ok(open) => {
                    left_open += open;
                    if self.failing.remove(&v).is_some() {
                        tracing::info!("mover: voucher {v} moves again");
                    }
                }
                Err(e) => {
                    self.note_failure(v, &e);
                    failed = true;
                }
            }
        }
        let moved = self.stats.snapshot().units_moved - before;
        if moved == 0 && left_open == 0 && !failed && !self.moves_left {
            self.stats.note_mover_settled(pass);
        }
        Ok(())
    }

    /// A bucket on a server its state was not checked on waits for a gate
    /// guard's check; a worker without one (--gate-check 0s) says so once
    /// per voucher, or its operator would see a bucket that never moves
    /// again and no reason.
    fn unchecked_unguarded(&mut self, v: u64) {
        if !self.guarded && self.told_unchecked.insert(v) {
            tracing::warn!(
                "mover: voucher {v}: a bucket's master restarted or failed over, and nothing draws on it until a gate guard has checked it; this worker runs none (--gate-check 0s): run one (the default) on some worker"
            );
        }
    }

    fn note_failure(&mut self, v: u64, e: &Error) {
        let text = e.to_string();
        if self.failing.get(&v) != Some(&text) {
            tracing::warn!("mover: voucher {v}: {text}");
            self.failing.insert(v, text);
        }
    }

    /// One voucher's round; returns the transfers left open (too young to
    /// be a stopped mover's: completed in a later round).
    async fn round(&mut self, layout: &Layout) -> Result<usize> {
        let gates = layout.all_keys()?;
        let Some(epoch) = self.lease(&gates[0]).await? else {
            return self.left_to_the_holder(layout, &gates).await;
        };
        let left_open = self.complete_stale(&gates).await?;
        let (mut looks, pool) = look_all(&mut self.conn, &gates).await?;
        if !movable(&looks) {
            // A bucket is not loaded (lost, being rebuilt): nothing moves,
            // so no bound may keep units for a move; the buckets serve
            // their own lines meanwhile.
            if self.bounded.remove(&gates[0].voucher()).is_some() {
                self.lift_bound(&gates, epoch).await?;
            }
            return Ok(left_open);
        }
        // A bucket on a server nobody has checked yet takes no move and
        // gives none: planned as paused (its requests wait for its check,
        // as a paused bucket's for its rebuild). One the publish finds so
        // only now has the round planned again without it, so that no
        // unit is counted, lent or taken for a request there; one checked
        // again, with it.
        let voucher = gates[0].voucher();
        let read_paused: Vec<bool> = looks.iter().map(|l| l.line.paused).collect();
        let mut replanned = false;
        let (allotted, filling) = loop {
            let unchecked = self.unchecked.get(&voucher).cloned().unwrap_or_default();
            for (b, look) in looks.iter_mut().enumerate() {
                look.line.paused = read_paused[b] || unchecked.contains(&b);
            }
            let allotted = allotment(&looks, pool);
            if allotted.any() {
                // Not settled while a request is allotted units: the serve
                // may find a waiting user who bought meanwhile and promote
                // nobody, and the next pass then sees who is next.
                self.moves_left = true;
            }
            let free = unpromised(&looks, pool, &allotted);
            let filling = Filling::new(&looks, &allotted);
            let lends = filling.lends(&looks, pool, pool_usable(&looks), &allotted);
            if !self
                .publish_bounds(&gates, epoch, &allotted, free, &lends)
                .await?
            {
                return Ok(left_open);
            }
            // The publish says which buckets are unchecked now: planned
            // again (once) if that is not what this plan took, found
            // unchecked or checked again.
            let now = self.unchecked.get(&voucher).cloned().unwrap_or_default();
            if now == unchecked || replanned {
                // One found unchecked by the second publish (it closed
                // between the two): no move goes to or from it.
                for b in now {
                    looks[b].line.paused = true;
                }
                break (allotted, filling);
            }
            replanned = true;
            crate::support::fault::point("before_publishing_again").await?;
        };
        crate::support::fault::point("after_bounds_published").await?;
        let mut free = Holdings { looks, pool };
        let filled = self
            .fill_the_short(&gates, epoch, &mut free, &allotted, filling)
            .await?;
        for b in 0..free.looks.len() {
            // A bucket the fill left short (a giver found empty or
            // closed) is not served this round: in line order, each whole
            // or passed over, its units would go to a later, smaller
            // request while an earlier one waits for the rest.
            if allotted.requests[b] > 0 && free.looks[b].line.stock >= allotted.need[b] {
                self.promote_waiting(&gates, b, epoch, allotted.requests[b])
                    .await?;
            }
        }
        if !filled.cut_short() {
            self.even_out(&gates, epoch, &mut free).await?;
        }
        Ok(left_open)
    }

    /// Another worker moves this voucher. Only an --until-idle run asks
    /// what is left for it (so as not to exit while the holder may be a
    /// worker that died, whose lease runs out soon), by the holder's own
    /// rules; a long-running one has nothing to decide.
    async fn left_to_the_holder(
        &mut self,
        layout: &Layout,
        gates: &[VoucherKeys],
    ) -> Result<usize> {
        if !self.until_idle {
            return Ok(0);
        }
        let (looks, pool) = look_all(&mut self.conn, gates).await?;
        let waiting = movable(&looks) && allotment(&looks, pool).any();
        let open = transfer::any_open(&mut self.conn, layout).await?;
        Ok(usize::from(waiting || open))
    }

    /// The moves of `filling` (worker/allotment.rs), on the holdings as
    /// each move left them; returns it, done.
    async fn fill_the_short(
        &mut self,
        gates: &[VoucherKeys],
        epoch: u64,
        free: &mut Holdings,
        allotted: &Allotment,
        mut filling: Filling,
    ) -> Result<Filling> {
        while let Some(step) =
            filling.next(&free.looks, free.pool, pool_usable(&free.looks), allotted)
        {
            let took = self
                .move_units(gates, epoch, free, step.from, step.to, step.units)
                .await?;
            filling.moved(&step, took);
        }
        Ok(filling)
    }

    /// Even out: a bucket far below the average gets units, from the pool
    /// first, so it does not run dry while others hold plenty. Only after a
    /// fill no refused move cut short: then what the pool and the buckets
    /// nobody waits at hold is free units no request read was allotted.
    async fn even_out(
        &mut self,
        gates: &[VoucherKeys],
        epoch: u64,
        free: &mut Holdings,
    ) -> Result<()> {
        let total: i64 = free.looks.iter().map(|l| l.line.stock).sum::<i64>() + free.pool;
        let average = total / free.looks.len() as i64;
        for to in 0..free.looks.len() {
            let l = &free.looks[to];
            if l.line.stock * LOW_WATER_DIVISOR >= average
                || l.line.paused
                || !l.line.waiting.is_empty()
            {
                continue;
            }
            let mut wants = average - l.line.stock;
            if pool_usable(&free.looks) {
                wants -= self
                    .move_units(gates, epoch, free, None, to, wants)
                    .await?
                    .units();
                if free.looks[to].line.paused {
                    continue;
                }
            }
            let richest = (0..free.looks.len())
                .filter(|d| {
                    *d != to
                        && !free.looks[*d].line.paused
                        && free.looks[*d].line.waiting.is_empty()
                })
                .max_by_key(|d| free.looks[*d].line.stock);
            if let Some(from) = richest {
                let spare = free.looks[from].line.stock - average;
                if wants > 0 && spare > 0 {
                    self.move_units(gates, epoch, free, Some(from), to, wants.min(spare))
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Moves up to `units` from bucket `from` (None: the pool) to `to`, no
    /// more than the giver holds, and keeps `free` as the move left it:
    /// the units that arrived, or, from a giver found short, what it said
    /// it holds.
    async fn move_units(
        &mut self,
        gates: &[VoucherKeys],
        epoch: u64,
        free: &mut Holdings,
        from: Option<usize>,
        to: usize,
        units: i64,
    ) -> Result<Took> {
        let held = match from {
            None => free.pool,
            Some(b) => free.looks[b].line.stock,
        };
        let (took, left) = self
            .transfer(gates, from, to, units.min(held), epoch)
            .await?;
        let left = match (took, left) {
            (Took::Units(k), _) => {
                free.looks[to].line.stock += k;
                held - k
            }
            (Took::Short, Some(said)) => said,
            // Paused or lost meanwhile: it gives nothing more this round.
            (Took::Short, None) => {
                if let Some(b) = from {
                    free.looks[b].line.paused = true;
                }
                0
            }
            (Took::Refused, _) => held,
            // Its holdings show the units taken still there (they come
            // back once the transfer is completed); the receiver takes
            // nothing more this round.
            (Took::Undelivered, _) => {
                free.looks[to].line.paused = true;
                held
            }
        };
        match from {
            None => free.pool = left,
            Some(b) => free.looks[b].line.stock = left,
        }
        Ok(took)
    }

    /// Publishes in each bucket the queued time up to which it serves its
    /// own line (None: lifts it; nothing is written while no bucket was or
    /// is bounded) and the units of its stock the round's moves take to
    /// requests elsewhere (`lends`: neither served nor sold there until
    /// taken), and the voucher's `free` units no waiting request is
    /// given, when they changed or their last word is a third of its life
    /// old (lua/seckill.lua lets a request its bucket cannot fill wait for
    /// them). False: a gate has seen a later mover, and this one stops its
    /// round.
    async fn publish_bounds(
        &mut self,
        gates: &[VoucherKeys],
        epoch: u64,
        allotted: &Allotment,
        free: i64,
        lends: &[i64],
    ) -> Result<bool> {
        let voucher = gates[0].voucher();
        let bounds: Vec<Option<u64>> = (0..gates.len())
            .map(|b| allotted.bound_of(b).map(|t| t.max(1.0) as u64))
            .collect();
        // A bucket lends only to an allotted request, which bounds its own.
        let any = bounds.iter().any(Option::is_some);
        // Three passes if a pass is slow, but never past the lease: a
        // worker that dies leaves no bound longer than its lease.
        let ttl = (self.last_pass.as_millis() as u64).saturating_mul(3).clamp(
            BOUND_HOLDS_MS,
            BOUND_HOLDS_MS.max(self.lease.as_millis() as u64),
        );
        // An unchecked bucket is asked at every round, to learn when it is
        // checked.
        let fresh =
            self.published.get(&voucher).is_some_and(|(said, at)| {
                *said == free && (at.elapsed().as_millis() as u64) < ttl / 3
            }) && !self.unchecked.contains_key(&voucher);
        if !any && !self.bounded.contains_key(&voucher) && fresh {
            return Ok(true);
        }
        let said = std::time::Instant::now();
        if let Some(seen) = self
            .set_bounds(gates, epoch, &words(&bounds, lends, ttl, Some(free)))
            .await?
        {
            self.seen_a_later_epoch(voucher, seen);
            return Ok(false);
        }
        self.published.insert(voucher, (free, said));
        if any {
            self.bounded.insert(voucher, epoch);
        } else {
            self.bounded.remove(&voucher);
        }
        Ok(true)
    }

    /// Publishes each gate's word (its bound, None: lifted, and lent
    /// units) at once: the epoch of a later mover if a gate has seen one.
    async fn set_bounds(
        &mut self,
        gates: &[VoucherKeys],
        epoch: u64,
        words: &[transfer::BoundWord],
    ) -> Result<Option<u64>> {
        let calls = gates.iter().zip(words).map(|(keys, word)| {
            let mut conn = self.conn.clone();
            async move { transfer::set_bound(&mut conn, keys, epoch, word).await }
        });
        let voucher = gates[0].voucher();
        let mut fenced = None;
        let mut unchecked = BTreeSet::new();
        for (b, answer) in futures_util::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            match answer? {
                Bounded::Set => {}
                Bounded::Fenced(seen) => fenced = Some(seen),
                // Lost meanwhile: the guard rebuilds it; the next round
                // finds it not loaded and moves nothing.
                Bounded::NotLoaded => self.moves_left = true,
                // Until a guard checks it. A worker that runs none waits
                // for nothing that will come (it said so once): its
                // --until-idle run may end.
                Bounded::Unchecked => {
                    self.moves_left |= self.guarded;
                    unchecked.insert(b);
                    self.unchecked_unguarded(voucher);
                }
            }
        }
        if unchecked.is_empty() {
            self.unchecked.remove(&voucher);
        } else {
            self.unchecked.insert(voucher, unchecked);
        }
        Ok(fenced)
    }

    /// The mover stops: every bound it left is lifted, and every bucket
    /// where requests wait next to stock serves its own line (a newcomer
    /// queued under the bound in its last moments would otherwise wait
    /// there until the next mover). Best effort: a bound not lifted lapses.
    async fn lift_every_bound(&mut self) {
        let bounded: Vec<(u64, u64)> = self.bounded.drain().collect();
        for (voucher, epoch) in bounded {
            let lifted = match self
                .layouts
                .of(&mut self.conn, &self.db, &self.cfg.prefix, voucher)
                .await
                .and_then(|layout| layout.all_keys())
            {
                Ok(gates) => self.lift_bound(&gates, epoch).await,
                Err(e) => Err(e),
            };
            if let Err(e) = lifted {
                tracing::debug!("mover: voucher {voucher}: bound not lifted ({e}); it lapses");
            }
        }
    }

    /// Lifts the bounds of a voucher's gates and has each bucket where
    /// requests wait next to stock serve its own line.
    async fn lift_bound(&mut self, gates: &[VoucherKeys], epoch: u64) -> Result<()> {
        let n = gates.len();
        let lifted = words(&vec![None; n], &vec![0; n], BOUND_HOLDS_MS, None);
        if self.set_bounds(gates, epoch, &lifted).await?.is_some() {
            // Another mover has it: its rounds serve.
            return Ok(());
        }
        let (looks, _) = look_all(&mut self.conn, gates).await?;
        for (b, look) in looks.iter().enumerate() {
            let line = &look.line;
            if line.stock > 0 && !line.waiting.is_empty() && !line.paused {
                let requests = (line.stock as usize).min(line.waiting.len());
                self.promote_waiting(gates, b, epoch, requests).await?;
            }
        }
        Ok(())
    }

    /// Serves up to `requests` of bucket `b`'s waiting requests, in order,
    /// from the stock it holds now (lua/transfer_give.lua with no units),
    /// under the bound it holds.
    async fn promote_waiting(
        &mut self,
        gates: &[VoucherKeys],
        b: usize,
        epoch: u64,
        requests: usize,
    ) -> Result<()> {
        let id = self.ids.next_id()?;
        let fresh = (0..requests.min(PROMOTIONS_PER_SERVE))
            .map(|_| self.ids.next_id())
            .collect::<Result<Vec<u64>>>()?;
        let bucket = Side::Bucket(b as u32, &gates[b]);
        match transfer::promote_waiting(&mut self.conn, bucket, id, epoch, &fresh).await? {
            Given::Landed { promoted } => {
                if promoted > 0 {
                    // The line moved on: the next pass may find more to
                    // serve, so this one is not settled.
                    self.moves_left = true;
                }
            }
            Given::Fenced(seen) => self.seen_a_later_epoch(gates[0].voucher(), seen),
            Given::AlreadyGiven | Given::Void | Given::Paused | Given::NotLoaded => {}
        }
        Ok(())
    }

    /// Takes or renews the voucher's mover lease: its epoch while held.
    async fn lease(&mut self, bucket0: &VoucherKeys) -> Result<Option<u64>> {
        let floor = self
            .epoch_floors
            .get(&bucket0.voucher())
            .copied()
            .unwrap_or(0);
        let epoch =
            mover_lease::take(&mut self.conn, bucket0, &self.owner, self.lease, floor).await?;
        if epoch.is_some() {
            self.epoch_floors.remove(&bucket0.voucher());
        }
        Ok(epoch)
    }

    /// A gate has seen a later epoch than the lease's (bucket 0's meta lost
    /// takeovers that the other buckets saw): the next round takes the
    /// lease above it, or no gate that saw it would ever move again.
    fn seen_a_later_epoch(&mut self, voucher: u64, seen: u64) {
        let floor = self.epoch_floors.entry(voucher).or_insert(0);
        *floor = (*floor).max(seen.saturating_add(1));
    }

    async fn release_leases(&mut self) {
        let vouchers = match registry::members(&mut self.conn, &self.cfg.prefix).await {
            Ok(v) => v,
            Err(_) => return,
        };
        for v in vouchers {
            let Ok(keys) = VoucherKeys::new(&self.cfg.prefix, v) else {
                continue;
            };
            let released = mover_lease::give_back(&mut self.conn, &keys, &self.owner).await;
            if let Err(e) = released {
                tracing::debug!("mover: voucher {v}: lease not released ({e}); it runs out");
            }
        }
    }

    /// Moves up to `units` from bucket `from` (None: the pool) to bucket
    /// `to`: what it took, and, found short, the units the giver holds
    /// (None: it is paused or lost).
    async fn transfer(
        &mut self,
        gates: &[VoucherKeys],
        from: Option<usize>,
        to: usize,
        units: i64,
        epoch: u64,
    ) -> Result<(Took, Option<i64>)> {
        if units <= 0 {
            return Ok((Took::Units(0), None));
        }
        let giver = match from {
            None => Side::Pool(&gates[0]),
            Some(b) => Side::Bucket(b as u32, &gates[b]),
        };
        let receiver = Side::Bucket(to as u32, &gates[to]);
        let voucher = gates[0].voucher();
        let id = self.ids.next_id()?;
        let units = units as u64;
        // Whatever does not move in full is left for the next pass.
        let left_before = self.moves_left;
        self.moves_left = true;
        let taken = transfer::take(&mut self.conn, giver, receiver, id, units, 1, epoch).await?;
        let k = match taken {
            Taken::Units(k) => k,
            Taken::Fenced(seen) => {
                self.seen_a_later_epoch(voucher, seen);
                return Ok((Took::Refused, None));
            }
            Taken::StaleId => {
                tracing::warn!(
                    "mover: voucher {voucher}: transfer id {id} is not above the last one taken (this host's clock is behind the last mover's?): nothing moved"
                );
                return Ok((Took::Refused, None));
            }
            Taken::Short(held) => return Ok((Took::Short, Some(held as i64))),
            Taken::Paused | Taken::NotLoaded => return Ok((Took::Short, None)),
        };
        crate::support::fault::point("between_take_and_give").await?;
        // The units land in the stock: the round serves the receiver's
        // allotted requests once every move to it is done, in order (a
        // give serving on arrival could serve a later, smaller request
        // before the units for an earlier one had all arrived).
        let given = transfer::give(&mut self.conn, receiver, id, k, epoch, &[]).await?;
        let Some(landing) = given.landing() else {
            // Left in transit: completed (given back) once it is stale.
            match given {
                Given::Fenced(seen) => self.seen_a_later_epoch(voucher, seen),
                // Paused, or on a server nobody has checked: planned as
                // paused until the next round's publish there says which
                // (a paused gate takes a publish; the look sees it paused).
                Given::Paused => {
                    self.unchecked.entry(voucher).or_default().insert(to);
                }
                _ => {}
            }
            return Ok((Took::Undelivered, None));
        };
        transfer::settle(&mut self.conn, giver, id, landing).await?;
        if landing == Landing::Void {
            return Ok((Took::Undelivered, None));
        }
        self.stats.add_units_moved(k);
        // Moved in full: nothing of this move is left for the next pass.
        self.moves_left = left_before || k < units;
        Ok((Took::Units(k as i64), None))
    }

    /// Completes every transfer left open longer than a mover takes:
    /// receiver first, so none lands twice. Returns how many it left open:
    /// younger than that, or called off while their giver is paused
    /// (settled once it reopens).
    async fn complete_stale(&mut self, gates: &[VoucherKeys]) -> Result<usize> {
        let mut left_open = 0;
        let sides = Side::all(gates);
        let before = (now_ms() as u64).saturating_sub(STALE_TRANSFER_MS);
        for giver in sides.clone() {
            for t in transfer::open(&mut self.conn, giver).await? {
                if t.taken_ms > before {
                    left_open += 1;
                    continue;
                }
                let Some(receiver) = sides.iter().copied().find(|s| s.label() == t.to) else {
                    tracing::warn!(
                        "mover: transfer {} names a receiver {:?} the voucher does not have; left as it is",
                        t.id,
                        t.to
                    );
                    continue;
                };
                let how = match transfer::complete(&mut self.conn, giver, receiver, t.id).await? {
                    (Landing::Given, Settled::Done { .. }) => "it had arrived",
                    (Landing::Void, Settled::Done { .. }) => "called off, the units went back",
                    // Another completed it meanwhile: nothing done here.
                    (_, Settled::NoRecord) => continue,
                    // Called off; the giver is being rebuilt, so its units
                    // go back once it reopens (a later round settles).
                    (_, Settled::Paused) => {
                        left_open += 1;
                        continue;
                    }
                };
                self.stats.add_transfer_completed();
                tracing::info!(
                    "mover: completed transfer {} of {} unit(s) left open by a stopped mover ({how})",
                    t.id,
                    t.units,
                );
            }
        }
        Ok(left_open)
    }
}

/// Each bucket's word of a round: its bound and lent units, the voucher's
/// `free` units (None: left as they are), all for `ttl` ms.
fn words(
    bounds: &[Option<u64>],
    lends: &[i64],
    ttl: u64,
    free: Option<i64>,
) -> Vec<transfer::BoundWord> {
    bounds
        .iter()
        .zip(lends)
        .map(|(up_to_us, lent)| transfer::BoundWord {
            up_to_us: *up_to_us,
            ttl_ms: ttl,
            free,
            lent: Some(*lent),
        })
        .collect()
}
