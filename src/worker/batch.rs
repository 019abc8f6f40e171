//! The batch pipeline of a lane: parse → lock (one round trip) → MySQL
//! transaction → finish script (deadlines, dead letters, XACK, unlock). A
//! crash anywhere leaves the batch's entries pending; whoever reclaims them
//! runs the same steps, which are idempotent against what was committed.

use std::time::Instant;

use super::fence;
use super::group::{self, DeadLetter, Delivery};
use super::keepalive;
use super::lane::Lane;
use super::lost_group;
use super::persist::{self, persist, Fate, PersistError};
use crate::error::{mysql_code, mysql_codes, Error, Result, StoreFault};
use crate::gate::witness;
use crate::store::keys::VoucherKeys;
use crate::stream::entry::OrderMessage;
use crate::support::backoff::Backoff;

/// A batch's entries as read: the orders, and the malformed ones to
/// dead-letter (and acknowledge) now.
#[derive(Default)]
struct Parsed {
    valid: Vec<(OrderMessage, u64)>,
    dead: Vec<DeadLetter>,
    acks: Vec<String>,
}
impl Lane {
    /// Runs a batch to completion, retrying it as a whole with backoff while
    /// a store is down. Its entries stay claimed by us meanwhile (keep-alive),
    /// so no other worker redelivers them and their delivery count does not
    /// grow. Returns only when done, or when stopping (entries left pending).
    pub(super) async fn process_batch(
        &mut self,
        keys: &VoucherKeys,
        deliveries: Vec<Delivery>,
    ) -> Result<()> {
        let alive = self.keep_alive(keys, &deliveries);
        self.process_kept(keys, deliveries, alive).await
    }

    /// Starts keeping a batch alive: from the moment it is read, not
    /// only once its turn comes, since a batch waiting behind another
    /// gate's (one read serves every stream) is in this worker's hand too,
    /// and Redis may lose it meanwhile.
    pub(super) fn keep_alive(
        &self,
        keys: &VoucherKeys,
        deliveries: &[Delivery],
    ) -> keepalive::KeepAlive {
        let ids: Vec<String> = deliveries.iter().map(|d| d.raw.entry_id.clone()).collect();
        keepalive::start(
            keepalive::Ticker {
                cfg: self.cfg.clone(),
                conn: self.conn.clone(),
                keys: keys.clone(),
                consumer: self.opts.consumer.clone(),
                entry_ids: ids,
                owner: self.owner.clone(),
                stats: self.stats.clone(),
            },
            // Often enough that neither a lease nor the reclaim threshold passes.
            self.opts.lock_lease.min(self.opts.claim_idle) / 3,
        )
    }

    /// [`Lane::process_batch`] with its keep-alive already running.
    pub(super) async fn process_kept(
        &mut self,
        keys: &VoucherKeys,
        deliveries: Vec<Delivery>,
        alive: keepalive::KeepAlive,
    ) -> Result<()> {
        let voucher = keys.voucher();
        let keys = keys.clone();
        let mut backoff = Backoff::default();
        let mut failures = 0u32;
        // A failed attempt may have committed all the same (abandoned past
        // its deadline, a COMMIT whose answer was lost, an error after the
        // COMMIT): a retry then finds its orders stored, and counts them as
        // possibly its own.
        let mut abandoned = false;
        loop {
            match self
                .try_batch(voucher, &keys, &deliveries, &alive, abandoned)
                .await
            {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(
                            "voucher {voucher}: batch of {} persisted after {failures} failed attempt(s)",
                            deliveries.len()
                        );
                    }
                    alive.finish().await;
                    return Ok(());
                }
                Err(e) if lost_group(&e) => {
                    tracing::warn!(
                        "voucher {voucher}: its order stream lost the worker group (Redis lost the keys?); \
                         the {} entries in hand went with it: `seckill reconcile` repairs what was lost",
                        deliveries.len()
                    );
                    alive.finish().await;
                    return Ok(());
                }
                // Renewal proves progress, not life: a batch whose
                // transaction made none is let go of whole (its entries,
                // locks and leases lapse), so another worker can take it
                // over after --claim-idle; retrying it here could hang again
                // and hold it for good. Not a batch Redis lost, though: its
                // entries are in no stream, nobody could take it over, and
                // this process holds its only copy; it is retried as during
                // an outage, holding the gate (looked at afresh first).
                Err(e @ Error::TransactionPastDeadline(_))
                    if !alive.lost_now().await && !self.stop.is_cancelled() =>
                {
                    tracing::warn!(
                        "voucher {voucher}: batch of {} let go of ({e}); its entries stay pending for whoever reclaims them",
                        deliveries.len()
                    );
                    return Ok(());
                }
                Err(e) => {
                    if self.stop.is_cancelled() {
                        tracing::warn!(
                            "stopping with a batch of {} unfinished ({e}); its entries stay pending for another worker",
                            deliveries.len()
                        );
                        return Ok(());
                    }
                    // Not only past its deadline (see `abandoned`).
                    abandoned = true;
                    let delay = backoff.retry_after(format_args!(
                        "voucher {voucher}: batch of {} not persisted: {e}",
                        deliveries.len()
                    ));
                    failures += 1;
                    self.pause(delay).await;
                    self.reconnect().await;
                }
            }
        }
    }

    async fn try_batch(
        &mut self,
        voucher: u64,
        keys: &VoucherKeys,
        deliveries: &[Delivery],
        alive: &keepalive::KeepAlive,
        after_abandoned: bool,
    ) -> Result<()> {
        let started = Instant::now();
        let Parsed { valid, dead, acks } = self.parse(voucher, deliveries);
        let t_lock = Instant::now();
        let (mine, held) = self.lock_users(keys, valid).await?;
        let lock_ms = t_lock.elapsed().as_secs_f64() * 1e3;
        alive.set_held(held.clone()).await;
        crate::support::fault::point("after_lock").await?;
        // A batch Redis lost must hold the gate before it commits, even if
        // this process was frozen past its keep-alive's ticks.
        alive.confirm_within(self.opts.lock_lease / 2).await;
        let t_sql = Instant::now();
        let msgs: Vec<OrderMessage> = mine.iter().map(|(m, _)| m.clone()).collect();
        let persisted = self.persist_fenced(keys, &msgs, alive).await;
        let sql_ms = t_sql.elapsed().as_secs_f64() * 1e3;
        let completion = match persisted {
            Ok(mut p) => {
                self.keep_while_mysql_lacks_cancellations(keys, &mine, &mut p)
                    .await;
                group::plan(&mine, p, dead, acks)
            }
            Err(PersistError::UnknownVoucher(v)) => {
                self.refuse_unknown_voucher(v, &mine, dead, acks)
            }
            Err(e) => {
                alive.set_held(Vec::new()).await;
                self.give_back_locks(keys, &held).await;
                return Err(match e {
                    PersistError::Mysql(e) => Error::from(e),
                    PersistError::Store(e) => e,
                    PersistError::UnknownVoucher(_) => unreachable!("handled above"),
                });
            }
        };
        crate::support::fault::point("after_commit").await?;
        let (inserted, duplicates) = completion.counts;
        let units = completion.units;
        // Stop renewing before the finish script releases the locks, so a
        // released lock is never taken for a lost one (and the commit's
        // look below renews none: one round trip, not two).
        alive.set_held(Vec::new()).await;
        // After a failed attempt, orders found stored may be that
        // attempt's, committed unseen while the gate was open.
        alive
            .committed(match after_abandoned {
                true => inserted + duplicates,
                false => inserted,
            })
            .await;
        let t_finish = Instant::now();
        let done = group::Completion {
            locks: &held,
            owner: &self.owner.token,
            ..completion.redis
        };
        group::finish(&mut self.conn, keys, &done).await?;
        crate::support::fault::point("after_ack").await?;
        tracing::debug!(
            "voucher {voucher}: batch of {}: lock {lock_ms:.1} ms, MySQL {sql_ms:.1} ms, finish {:.1} ms",
            deliveries.len(),
            t_finish.elapsed().as_secs_f64() * 1e3
        );
        for d in &done.dead {
            tracing::warn!(
                "voucher {voucher}: entry {} dead-lettered: {}",
                d.entry_id,
                d.reason
            );
        }
        for id in done.inserted.iter().chain(&done.acks) {
            self.last_error.remove(id);
        }
        self.stats
            .add_batch(inserted, units, duplicates, done.dead.len() as u64);
        self.stats.observe_batch(started.elapsed());
        Ok(())
    }

    /// The batch's entries read: the orders to persist, with their
    /// delivery counts; malformed ones past the last delivery dead-lettered
    /// (and acknowledged), the others left pending for another try.
    fn parse(&mut self, voucher: u64, deliveries: &[Delivery]) -> Parsed {
        let mut parsed = Parsed::default();
        for d in deliveries {
            match d.raw.parse(voucher) {
                Ok(m) => parsed.valid.push((m, d.deliveries)),
                Err(reason) if d.deliveries > self.opts.max_deliveries => {
                    parsed
                        .dead
                        .push(self.dead_letter(&d.raw.entry_id, reason, d.deliveries));
                    parsed.acks.push(d.raw.entry_id.clone());
                }
                Err(reason) => {
                    tracing::warn!(
                        "voucher {voucher}: entry {} is malformed ({reason}); delivery {} of {} before it is dead-lettered",
                        d.raw.entry_id,
                        d.deliveries,
                        self.opts.max_deliveries + 1
                    );
                    self.last_error.insert(d.raw.entry_id.clone(), reason);
                }
            }
        }
        parsed
    }

    /// Takes the users' locks: the orders whose lock this lane got, and
    /// their users.
    async fn lock_users(
        &mut self,
        keys: &VoucherKeys,
        valid: Vec<(OrderMessage, u64)>,
    ) -> Result<(Vec<(OrderMessage, u64)>, Vec<u64>)> {
        let users: Vec<u64> = valid.iter().map(|(m, _)| m.user).collect();
        let granted = self.owner.acquire(&mut self.conn, keys, &users).await?;
        let mut mine: Vec<(OrderMessage, u64)> = Vec::new();
        let mut held: Vec<u64> = Vec::new();
        for ((m, n), ok) in valid.into_iter().zip(granted) {
            if ok {
                held.push(m.user);
                mine.push((m, n));
            } else {
                // Someone else works on this user's order: leave it pending
                // (never ack what was not persisted); it comes back later.
                self.stats.add_lock_denied(1);
            }
        }
        Ok((mine, held))
    }

    /// The orders MySQL had no unit for, kept pending for a retry while it
    /// has fewer cancellations than the voucher's gates released
    /// ([`group::keep_no_stock_while_mysql_lacks_cancellations`]). The
    /// released sets are read after the transaction that counted MySQL's
    /// cancellations: a cancellation commits in MySQL before its unit is
    /// released, so one between the two reads errs towards a retry, which
    /// then finds its unit. The gates are those this lane consumes (MySQL's
    /// word on the voucher's split). Gates that cannot be read keep them
    /// too: the batch is committed, and each delivery decides afresh.
    async fn keep_while_mysql_lacks_cancellations(
        &mut self,
        keys: &VoucherKeys,
        mine: &[(OrderMessage, u64)],
        p: &mut persist::Persisted,
    ) {
        if !p.fates.contains(&Fate::NoStock) {
            return;
        }
        let voucher = keys.voucher();
        let gates: Vec<VoucherKeys> = self
            .streams
            .range((voucher, 0)..=(voucher, u32::MAX))
            .map(|(_, k)| k.clone())
            .collect();
        let released = match witness::read_many(&mut self.conn, &gates).await {
            Ok(w) => w.iter().map(|w| w.released).sum(),
            // Counted as behind: kept.
            Err(e) => {
                tracing::warn!(
                    "voucher {voucher}: its gates' released units could not be read ({e}); orders MySQL had no unit for are kept pending for a retry"
                );
                u64::MAX
            }
        };
        let kept = group::keep_no_stock_while_mysql_lacks_cancellations(
            &mut p.fates,
            mine.iter().map(|(_, n)| *n),
            released,
            p.cancelled,
            self.opts.max_deliveries,
        );
        if kept > 0 && released != u64::MAX {
            tracing::warn!(
                "voucher {voucher}: {kept} order(s) found no stock in MySQL, which has {} cancelled order(s) where its gates released {released}: \
                 kept pending for a retry, which finds the unit once the gate guard has cancelled the lost ones again",
                p.cancelled
            );
        }
    }

    /// After a failed transaction: the locks given back, or left to expire
    /// with their lease when Redis does not answer.
    async fn give_back_locks(&mut self, keys: &VoucherKeys, held: &[u64]) {
        if let Err(r) = self.owner.release(&mut self.conn, keys, held).await {
            tracing::warn!(
                "voucher {}: could not release {} lock(s), they expire with their lease: {r}",
                keys.voucher(),
                held.len()
            );
            // The lane's connection may be half-open (it answered
            // nothing for a reply timeout): a multiplexed one is never
            // replaced by itself, and a stopping lane still uses it.
            self.reconnect().await;
        }
    }

    /// The batch's transaction, fenced (worker/fence.rs): its session's
    /// lease renewed by the keep-alive until the transaction's deadline
    /// (`--mysql-timeout`), and the transaction abandoned past it.
    async fn persist_fenced(
        &mut self,
        keys: &VoucherKeys,
        msgs: &[OrderMessage],
        alive: &keepalive::KeepAlive,
    ) -> Result<persist::Persisted, PersistError> {
        if msgs.is_empty() {
            return persist(&mut self.db.conn().await?, keys.voucher(), msgs).await;
        }
        let persisted = fence::run(
            &mut self.conn,
            &self.db,
            (keys, &self.owner.token, self.opts.lock_lease),
            self.opts.mysql_timeout,
            (
                async |id, deadline| alive.set_transaction(Some((id, deadline))).await,
                // Before the fence is left: a renewal after it would enter
                // the entry again, and a worker whose lock wait times out
                // would later end this pooled session for a stopped holder.
                async || alive.set_transaction(None).await,
            ),
            async |mysql: &mut mysql_async::Conn| persist(mysql, keys.voucher(), msgs).await,
            |e| match e {
                PersistError::Mysql(e) => mysql_code(e) == Some(mysql_codes::LOCK_WAIT_TIMEOUT),
                PersistError::Store(e) => e.store_fault() == Some(StoreFault::LockWaitTimeout),
                PersistError::UnknownVoucher(_) => false,
            },
        )
        .await;
        // Also when `work` did not end (its deadline, or no session).
        alive.set_transaction(None).await;
        persisted
    }

    /// The voucher is not in MySQL: its messages wait (it may be added)
    /// until they have been delivered too often.
    fn refuse_unknown_voucher(
        &mut self,
        voucher: u64,
        mine: &[(OrderMessage, u64)],
        dead: Vec<DeadLetter>,
        acks: Vec<String>,
    ) -> group::Planned {
        let mut plan = group::Planned::new(dead, acks);
        let reason = format!("voucher {voucher} is not in MySQL");
        for (m, n) in mine {
            if *n > self.opts.max_deliveries {
                plan.redis
                    .dead
                    .push(self.dead_letter(&m.entry_id, reason.clone(), *n));
                plan.redis.acks.push(m.entry_id.clone());
            } else {
                self.last_error.insert(m.entry_id.clone(), reason.clone());
            }
        }
        if !mine.is_empty() {
            tracing::warn!(
                "voucher {voucher}: {reason}; its orders stay pending until they are dead-lettered"
            );
        }
        plan
    }

    fn dead_letter(&self, entry_id: &str, reason: String, deliveries: u64) -> DeadLetter {
        DeadLetter {
            entry_id: entry_id.to_string(),
            reason,
            deliveries,
        }
    }
}
