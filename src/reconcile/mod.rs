//! `seckill reconcile`: compare each voucher's Redis gate with MySQL (the
//! truth), accounting for work in flight, classify every difference, and
//! repair it — only if the voucher did not move since it was read.
//!
//! Reads go Redis first, then MySQL. An order the worker persists between
//! the two reads is then both "in flight" and "in MySQL" and is counted once
//! (as stored); anything that changes the gate in between (an admission, a
//! release, a promotion) changes the witness, and the read is repeated.
//! Redis stock is never overwritten with MySQL's: the expected gate stock is
//! MySQL's stock less the units admitted but not yet persisted and the
//! cancelled units not yet given back.

mod buckets;
pub use buckets::StockJudged;
mod classify;
mod quick;
mod repair;
mod report;
mod snapshot;
mod target;
mod voucher_rows;

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::RedisConn;
pub use classify::{classify, Drift, DriftClass};
use quick::Quick;
pub use report::busy_report;
pub use report::{Outcome, VoucherReport};
pub use snapshot::{candidates, read_many, read_voucher, Read, Snapshot, VoucherUnits};
pub use target::{reconcile_bucket, reconcile_voucher, BucketCheck};
use target::{reopen_if_paused, Carrier};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub dry_run: bool,
    pub fix_mysql: bool,
    /// Reads repeated when the voucher moves, before reporting it busy.
    pub attempts: usize,
    /// Cancellations and new orders younger than this are still being
    /// handled by a worker (release, deadline), not drift.
    pub settle_ms: i64,
    /// Read every voucher in full (every order, buyer, release, deadline)
    /// and check MySQL's counters against the rows, instead of comparing
    /// counts and digests first.
    pub deep: bool,
    /// The operator's word that the buyers whose orders MySQL may have
    /// lost with their entries (`orders_lost_unrestorable`) are to be
    /// dropped: given only with their count, which must match.
    pub drop_lost_commits: Option<u64>,
}

/// Quick looks at a voucher that is moving or not yet agreed (work between
/// the stores takes milliseconds), before it is read in full.
const QUICK_ROUNDS: usize = 3;
const QUICK_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);
/// How long reconcile or the guard holds a voucher's mover still for one
/// read of a bucket (renewed before each; one that dies meanwhile holds
/// it no longer).
pub const MOVER_HOLD: std::time::Duration = std::time::Duration::from_secs(15);

/// Vouchers read per chunk: a few round trips per chunk, not per voucher.
pub const CHUNK: usize = 500;

/// One reconcile run over both stores: a look, and perhaps a repair pass.
pub struct Run<'a, C> {
    pub db: &'a Db,
    pub conn: &'a mut C,
    pub prefix: &'a str,
    /// The operator named the vouchers: one missing from MySQL is an error
    /// (otherwise it was only registered, and is skipped with a warning).
    pub explicit: bool,
    /// Mints the order ids of promotions a release may make: set only by
    /// `repair` (a dry run leases no node id, so it writes nothing).
    ids: Option<&'a OrderIds>,
}

impl<'a, C: RedisConn> Run<'a, C> {
    pub fn new(db: &'a Db, conn: &'a mut C, prefix: &'a str, explicit: bool) -> Self {
        Run {
            db,
            conn,
            prefix,
            explicit,
            ids: None,
        }
    }

    /// A run that may mint the order ids of promotions a repair makes (a
    /// worker's guard, which holds a node id already).
    pub fn with_order_ids(mut self, ids: &'a OrderIds) -> Self {
        self.ids = Some(ids);
        self
    }

    /// Checks (and, unless dry-run, repairs) every voucher given, reading
    /// them in chunks; `progress` hears how many each chunk finished.
    pub async fn pass(
        &mut self,
        vouchers: &[u64],
        opts: &Options,
        mut progress: impl FnMut(usize),
    ) -> Result<Vec<VoucherReport>> {
        let mut out = Vec::with_capacity(vouchers.len());
        for whole in vouchers.chunks(CHUNK) {
            // MySQL's word on the split: a bucket 0 that lost its meta
            // reads as a voucher of one gate, whose "repair" would take
            // every other bucket's buyers and stock into it.
            let split = crate::orders::voucher_buckets::split_in_buckets(self.db, whole).await?;
            let chunk: &Vec<u64> = &whole
                .iter()
                .filter(|v| !split.contains(v))
                .copied()
                .collect();
            let (mut agreed, full) = match opts.deep {
                true => (HashMap::new(), chunk.to_vec()),
                false => self.quick_rounds(chunk, opts).await?,
            };
            let reads = match full.is_empty() {
                true => Vec::new(),
                false => read_many(self.db, self.conn, self.prefix, &full, opts.settle_ms).await?,
            };
            for (&v, read) in full.iter().zip(reads) {
                if matches!(read, Read::Missing) && !self.explicit {
                    tracing::warn!(
                        "voucher {v} is registered at the gate but not in MySQL; skipped"
                    );
                    continue;
                }
                let report = reconcile_voucher(
                    self.db,
                    self.conn,
                    self.prefix,
                    v,
                    Some(read),
                    opts,
                    self.ids,
                )
                .await?;
                agreed.insert(v, report);
            }
            for &v in whole {
                match split.contains(&v) {
                    true => out.extend(self.buckets_pass(v, opts).await?),
                    false => out.extend(agreed.remove(&v)),
                }
            }
            progress(whole.len());
        }
        Ok(out)
    }

    /// A voucher in buckets, bucket by bucket (each read in full, every
    /// bucket still across the read), its mover held still while they are
    /// counted and repaired. A dry run writes nothing, the hold neither:
    /// it looks up to a few times for a look that finds no difference.
    async fn buckets_pass(&mut self, v: u64, opts: &Options) -> Result<Vec<VoucherReport>> {
        let Some(layout) = crate::gate::buckets::recorded(self.db, self.prefix, v).await? else {
            tracing::warn!(
                "voucher {v} is split in buckets and was never preloaded; nothing to check"
            );
            return Ok(Vec::new());
        };
        let gates = layout.all_keys()?;
        let owner = format!("reconcile:{}", crate::support::host::random_tag());
        if !opts.dry_run
            && crate::gate::mover_lease::seize(self.conn, &gates, &owner, MOVER_HOLD)
                .await?
                .is_none()
        {
            // A worker's guard rebuilds one of its buckets: look again later.
            return Ok(vec![busy_report(v)]);
        }
        let done = self.buckets_under_hold(&layout, &gates, &owner, opts).await;
        if !opts.dry_run {
            self.unhold(&gates[0], &owner).await;
        }
        done
    }

    async fn buckets_under_hold(
        &mut self,
        layout: &Layout,
        gates: &[VoucherKeys],
        owner: &str,
        opts: &Options,
    ) -> Result<Vec<VoucherReport>> {
        let (carrier, units) = match self.stock_carrier(layout, opts).await? {
            // No still look at every bucket: the voucher's units cannot
            // be counted now; nothing is judged, nothing written.
            Carrier::Busy => return Ok(vec![busy_report(layout.voucher())]),
            Carrier::None(units) => (None, units),
            Carrier::Bucket(b, units) => (Some(b), units),
        };
        let mut out = Vec::with_capacity(gates.len());
        // The carrier first: what it cannot take, the others take after.
        let mut order: Vec<u32> = carrier.into_iter().collect();
        order.extend((0..layout.buckets()).filter(|b| carrier != Some(*b)));
        for b in order {
            let judged = match carrier == Some(b) {
                true => StockJudged::Here,
                false => StockJudged::Elsewhere,
            };
            if opts.dry_run {
                let mut report = None;
                for round in 0..QUICK_ROUNDS {
                    if round > 0 {
                        tokio::time::sleep(QUICK_PAUSE).await;
                    }
                    let check = BucketCheck {
                        layout,
                        bucket: b,
                        judged,
                        hold: None,
                        others_may_move: false,
                    };
                    let r = reconcile_bucket(self.db, self.conn, check, opts, None).await?;
                    let agreed = r.outcome == Outcome::Consistent;
                    report = Some(r);
                    if agreed {
                        break;
                    }
                }
                out.extend(report);
                continue;
            }
            // The hold is renewed before each read (reconcile_gate).
            let check = BucketCheck {
                layout,
                bucket: b,
                judged,
                hold: Some(owner),
                others_may_move: false,
            };
            out.push(reconcile_bucket(self.db, self.conn, check, opts, self.ids).await?);
        }
        out.sort_by_key(|r| r.bucket);
        // The units as found, before any bucket's repair moved them.
        if let Some(first) = out.first_mut() {
            first.voucher_units = units;
        }
        Ok(out)
    }

    /// The bucket that answers for a difference in the voucher's units,
    /// from one look at them all: too many, the one holding the most
    /// stock, which can give it up; too few, bucket 0, whose units the
    /// mover spreads.
    async fn stock_carrier(&mut self, layout: &Layout, opts: &Options) -> Result<Carrier> {
        let look = Options {
            dry_run: true,
            ..*opts
        };
        let check = BucketCheck {
            layout,
            bucket: 0,
            judged: StockJudged::Here,
            hold: None,
            others_may_move: false,
        };
        let mut tries = 0;
        let read = loop {
            tries += 1;
            match buckets::read_bucket(self.db, self.conn, &check, look.settle_ms, false).await? {
                Read::Snapshot(s) => break s,
                Read::Missing => return Err(Error::VoucherNotFound(layout.voucher())),
                Read::Moved if tries >= look.attempts => return Ok(Carrier::Busy),
                Read::Moved => tokio::time::sleep(QUICK_PAUSE).await,
            }
        };
        let Some(view) = &read.bucket else {
            return Ok(Carrier::None(None));
        };
        let units = Some(view.units);
        Ok(match view.units.off {
            0 => Carrier::None(units),
            o if o < 0 => Carrier::Bucket(view.richest, units),
            _ => Carrier::Bucket(0, units),
        })
    }

    async fn unhold(&mut self, bucket0: &VoucherKeys, owner: &str) {
        if let Err(e) = crate::gate::mover_lease::unseize(self.conn, bucket0, owner).await {
            tracing::debug!(
                "voucher {}: the hold on its mover was not given back ({e}); it runs out",
                bucket0.voucher()
            );
        }
    }

    /// Quick looks at `chunk`: the reports of the vouchers both stores
    /// agree on, and the vouchers left to read in full.
    async fn quick_rounds(
        &mut self,
        chunk: &[u64],
        opts: &Options,
    ) -> Result<(HashMap<u64, VoucherReport>, Vec<u64>)> {
        let mut reports = HashMap::new();
        let mut left = chunk.to_vec();
        // A full read says what is missing, or skips it.
        let mut full = Vec::new();
        for round in 0..QUICK_ROUNDS {
            if left.is_empty() {
                break;
            }
            if round > 0 {
                tokio::time::sleep(QUICK_PAUSE).await;
            }
            let looks = quick::look_many(self.db, self.conn, self.prefix, &left).await?;
            let mut again = Vec::new();
            for (v, look) in left.iter().zip(looks) {
                match look {
                    Quick::Agreed(a) => {
                        let mut report = report::agreed_report(&a);
                        if !opts.dry_run && a.gate_paused {
                            let keys = VoucherKeys::new(self.prefix, *v)?;
                            let orders = a.row.counters.orders_total;
                            reopen_if_paused(self.conn, &keys, orders, &a.pause_token, &mut report)
                                .await?;
                        }
                        reports.insert(*v, report);
                    }
                    Quick::Missing => full.push(*v),
                    Quick::Unsure | Quick::Moved => again.push(*v),
                }
            }
            left = again;
        }
        full.extend(left);
        Ok((reports, full))
    }

    /// The repair pass over what a look found not consistent (`plan`). A
    /// node id is leased, and kept alive for the pass, only when a repair
    /// may mint order ids (a release can promote a waitlisted user): a
    /// repair that needs none writes nothing beyond the repair itself.
    pub async fn repair(
        &mut self,
        cfg: &Config,
        node_id: Option<u16>,
        plan: &[VoucherReport],
        opts: &Options,
        progress: impl FnMut(usize),
    ) -> Result<Vec<VoucherReport>> {
        let ids = match needs_order_ids(plan) {
            true => Some(OrderIds::lease(cfg, node_id).await?),
            false => None,
        };
        let stop_renewing = CancellationToken::new();
        let renewing = ids
            .as_ref()
            .map(|ids| ids.keep_alive(stop_renewing.clone()));
        let mut run = Run {
            db: self.db,
            conn: &mut *self.conn,
            prefix: self.prefix,
            explicit: self.explicit,
            ids: ids.as_deref(),
        };
        let done = run.pass(&to_repair(plan), opts, progress).await;
        stop_renewing.cancel();
        if let Some(renewing) = renewing {
            renewing.await.ok();
        }
        done
    }
}

/// The vouchers a repair pass must look at again: every one not found
/// consistent (busy ones included: the repair pass reads them again), and
/// every paused one (the repair pass reopens a gate it finds consistent:
/// one whose guard died between pausing and reopening stays paused
/// otherwise).
pub fn to_repair(reports: &[VoucherReport]) -> Vec<u64> {
    reports
        .iter()
        .filter(|r| r.outcome != Outcome::Consistent || r.gate_paused || r.gate_digests_behind)
        .map(|r| r.voucher)
        // A voucher in buckets reports each (side by side): looked at once.
        .fold(Vec::new(), |mut seen, v| {
            if seen.last() != Some(&v) {
                seen.push(v);
            }
            seen
        })
}

/// Whether repairing what `reports` found may mint order ids (a unit given
/// back, by a release or a repair of stuck units, can promote a waitlisted
/// user; an order MySQL lost may come back cancelled, its unit to give
/// back). A repair pass without them reports such drift as not repaired.
pub fn needs_order_ids(reports: &[VoucherReport]) -> bool {
    reports.iter().flat_map(|r| &r.drifts).any(|d| {
        matches!(
            d.class,
            DriftClass::CancelledNotReleased
                | DriftClass::RedisStockLow
                | DriftClass::OrdersLostByMysql
        )
    })
}
