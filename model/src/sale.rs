//! The model of one gate's sale: admission, the stream hand-off and a
//! worker's batch, payment deadlines with the waitlist, payments, the gate
//! guard's pause, rebuild and reopen, and the faults (a worker killed at
//! any step, Redis back to an earlier snapshot). One action per step
//! between two durable writes, in the order the code takes them
//! (docs/src/concepts/checked-model.md maps each to its script, statement and fault point).
//!
//! Time is not modelled: a payment deadline passing is an action
//! (`Due`), and so is a lease running out (`Lapse`). Order ids are handed
//! out in order, so two runs that did the same things reach one state.

use stateright::{Model, Property};

/// The fixes the reviews found holes without, each one condition in the
/// code (docs/src/concepts/checked-model.md names it); the "it bites" test turns each off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fixes {
    /// A batch in hand that Redis lost holds the gate: paused, and no
    /// repair gives units back or reopens while the hold lives
    /// (src/worker/keepalive.rs, lua/pause.lua, lua/reconcile.lua: E01,
    /// E16, E21).
    pub hold_batch_in_hand: bool,
    /// A release on a paused gate is deferred (lua/release.lua: E10).
    pub release_defers_while_paused: bool,
    /// The rebuild's stock leaves out the units of cancellations MySQL
    /// committed and the gate has not released yet (the release to come
    /// gives them: src/reconcile/snapshot.rs `gate_owes`).
    pub rebuild_subtracts_unreleased: bool,
    /// A reopen is refused when the gate was paused again since the view
    /// it was decided on was read (lua/pause.lua's token: E09, E22).
    pub reopen_checks_token: bool,
    /// A rebuild whose gate owes more than MySQL has (the units of
    /// cancellations it has not released went to orders since, through
    /// promotions Redis lost) marks enough of those cancellations released
    /// without giving their units (src/reconcile/snapshot.rs
    /// `spoken_for`: E14).
    pub spoken_for: bool,
    /// A reopen waits while the repaired view's gate still owed units
    /// beyond MySQL's stock that no cancellation covered: requests
    /// admitted past MySQL's stock, still in flight
    /// (src/reconcile/target.rs `reopen_on_read`, the model's finding M1,
    /// docs/src/concepts/checked-model.md). Without it, a cancellation
    /// committed after the view frees a unit in MySQL that such a request
    /// then takes, and its release gives the gate the same unit again.
    pub reopen_waits_while_owed: bool,
    /// The guard pauses on a Redis restart it sees by the server's run id,
    /// not only when the gate counts fewer buyers than MySQL has orders
    /// (src/worker/guard.rs: E19).
    pub run_id_sign: bool,
    /// The commit's keep-alive looks at the batch again before it counts
    /// as committed (src/worker/keepalive.rs `committed`, the model's
    /// finding M2): without it, Redis losing the batch after the last tick
    /// goes unseen, the commit pauses nothing, and a guard's view read
    /// before the commit reopens the gate once the grace ends, without the
    /// committed orders' units.
    pub commit_looks_again: bool,
    /// The guard pauses a gate whose witness counts more commits (or
    /// released cancellations) than MySQL holds, and the rebuild restores
    /// the lost orders from their acknowledged stream entries and cancels
    /// again the orders whose units the gate gave back
    /// (src/worker/guard.rs, src/orders/restore.rs: issue 27).
    pub restore_lost_commits: bool,
    /// finish.lua counts into the witness every order the batch's
    /// transaction found in MySQL, inserted or stored already (a retry
    /// after the worker that inserted it died): otherwise such an order,
    /// lost by MySQL while its entry is in flight, is never counted, and
    /// the guard never sees it lost (the model's finding M3). The code
    /// counts one found stored only if its entry inserted it (the order's
    /// time is the entry's), not a copy's; the model has one entry per
    /// order, so every order it finds stored is its entry's own.
    pub count_stored_acks: bool,
    /// A request MySQL has no unit for, while MySQL has fewer
    /// cancellations than the gate released, is left in the stream for a
    /// retry, not dead-lettered: the unit comes back once the guard
    /// cancels again what MySQL lost (the model's finding M4;
    /// src/worker/group.rs `keep_no_stock_while_mysql_lacks_cancellations`).
    /// Without it, such a request is dead-lettered and its buyer's
    /// "success" has no order.
    pub retry_no_stock_while_behind: bool,
    /// The canceller gives back the unit of an order the gate saw paid
    /// that MySQL has cancelled (its payment lost, the order cancelled
    /// before the gate recorded it), where it dropped its deadline (the
    /// model's finding M5; src/worker/canceller.rs `take_out_paid`).
    pub release_paid_cancelled: bool,
    /// The canceller's sweep gives a deadline due now to a cancelled order
    /// the gate has not released, whose user is a buyer there, and that no
    /// deadline names (finding M5:
    /// src/worker/canceller.rs `reschedule_unreleased`).
    pub sweep_unreleased: bool,
    /// A repair gives no unit back (neither its stock's rise nor the
    /// release of cancellations, both of which serve the waitlist) while
    /// the pause's grace runs, as while a hold lives: the grace is there
    /// for the keep-alive of a batch in hand whose entries Redis lost to
    /// tick and hold the gate, and a unit given before it ticks may be
    /// the batch's (the model's finding M6; lua/reconcile.lua,
    /// lua/release.lua, lua/lib/holds.lua `grace_runs`).
    pub repair_gives_after_grace: bool,
}

impl Fixes {
    /// The fixes as the code has them today.
    pub const CODE: Fixes = Fixes {
        hold_batch_in_hand: true,
        release_defers_while_paused: true,
        rebuild_subtracts_unreleased: true,
        reopen_checks_token: true,
        spoken_for: true,
        reopen_waits_while_owed: true,
        run_id_sign: true,
        commit_looks_again: true,
        restore_lost_commits: true,
        count_stored_acks: true,
        retry_no_stock_while_behind: true,
        release_paid_cancelled: true,
        sweep_unreleased: true,
        repair_gives_after_grace: true,
    };
}

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Sale {
    pub units: u8,
    pub users: u8,
    /// Times each user presses buy (a resend, or buying again after a
    /// loss).
    pub presses: u8,
    /// Worker processes reading the stream (`seckill worker` on several
    /// machines); the first runs the canceller and the gate guard too.
    pub workers: u8,
    pub crashes: u8,
    pub rollbacks: u8,
    /// Times MySQL goes back to an earlier snapshot (a failover to an
    /// asynchronous replica that lacked the last commits).
    pub mysql_losses: u8,
    pub fixes: Fixes,
}

/// A stream entry as the gate keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub order: u8,
    pub user: u8,
    pub delivery: Delivery,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Delivery {
    New,
    /// Pending with this incarnation of the worker.
    Pending(u8),
    Acked,
}

/// What Redis holds of the gate (`seckill:{V}:*`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Redis {
    pub stock: u8,
    pub buyers: Vec<u8>,
    pub waitlist: Vec<u8>,
    pub entries: Vec<Entry>,
    /// Deadlines: (order, claimed by the canceller).
    pub timeouts: Vec<(u8, bool)>,
    pub released: Vec<u8>,
    /// Orders a payment recorded at the gate (lua/timeouts.lua `paid`):
    /// the canceller drops their deadlines without cancelling them.
    pub paid: Vec<u8>,
    pub paused: bool,
    pub token: u8,
    /// A pause's grace (meta reopen_after_ms, one lock lease): no reopen
    /// before it ends.
    pub grace: bool,
    /// Worker incarnations holding the gate.
    pub holds: Vec<u8>,
    /// The server's run id (a restart from a snapshot changes it) and the
    /// one the guard recorded in meta.
    pub run: u8,
    pub recorded_run: u8,
    /// The witness of MySQL's commits (meta `committed`): lua/finish.lua
    /// adds one per order its batch inserted and acknowledged now.
    pub committed: u8,
    /// Users with a dead-lettered entry (the dead-letter stream): a
    /// restore passes them over (stream/backlog.rs).
    pub dead: Vec<u8>,
    /// The per-user lease locks (lua/lock_acquire.lua): (incarnation,
    /// user), kept only with two workers or more (one worker is denied only
    /// by a dead incarnation's lock, which lapses before its entries can
    /// be reclaimed: `--claim-idle` outlasts `--lock-lease`).
    pub locks: Vec<(u8, u8)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Pending,
    Paid,
    Cancelled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Order {
    pub id: u8,
    pub user: u8,
    pub status: Status,
    /// Restored pending with nothing known of its fate (paid, or
    /// cancelled before MySQL's loss): no deadline, for the operator.
    pub held: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mysql {
    pub stock: u8,
    pub orders: Vec<Order>,
}

/// Where the worker's batch is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Batch {
    Idle,
    /// Read (XREADGROUP / XAUTOCLAIM): (order, user) in hand.
    Read(Vec<(u8, u8)>),
    /// Locks taken: `after_lock`.
    Locked(Vec<(u8, u8)>),
    /// The transaction's writes, not committed: `before_commit`.
    InTx {
        batch: Vec<(u8, u8)>,
        inserted: Vec<(u8, u8)>,
        /// Refused for no stock while MySQL was behind the gate's
        /// witness: left in the stream for a retry.
        kept: Vec<u8>,
    },
    /// Committed: `after_commit`; finish.lua next, scheduling the
    /// deadlines of `deadlines`: the orders the transaction inserted or
    /// found stored pending (the code decides by its fates, at the commit:
    /// a payment between the commit and finish.lua leaves a deadline that
    /// finds the order paid).
    Committed {
        batch: Vec<(u8, u8)>,
        deadlines: Vec<u8>,
        /// The orders finish.lua counts into the witness: those the
        /// transaction inserted, or found in MySQL (`count_stored_acks`).
        counted: Vec<u8>,
        /// Orders left in the stream for a retry (not acknowledged).
        kept: Vec<u8>,
        /// Users whose entries are dead-lettered (refused for good).
        dead: Vec<u8>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Canceller {
    Idle,
    /// Deadlines claimed (lua/claim_due.lua).
    Claimed(Vec<u8>),
    /// Cancelled in MySQL (`after_cancel`): these orders' units to give
    /// back, the settled ones' deadlines to drop.
    Cancelled {
        cancelled: Vec<u8>,
        settled: Vec<u8>,
    },
}

/// The guard's view of a paused gate, as read in two steps.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GateView {
    pub token: u8,
    /// The gate's witness: what a repair checks has not moved.
    pub stock: u8,
    pub buyers: Vec<u8>,
    pub released: Vec<u8>,
    pub entries_len: u8,
    /// In flight: entries not acknowledged, (order, user).
    pub in_flight: Vec<(u8, u8)>,
    /// Acknowledged entries, (order, user): what a restore has.
    pub acked: Vec<(u8, u8)>,
    pub timeouts: Vec<u8>,
    pub committed: u8,
    pub dead: Vec<u8>,
}

impl GateView {
    /// The gate as the rebuild reads it now.
    fn of(r: &Redis) -> GateView {
        let entries = |acked: bool| {
            r.entries
                .iter()
                .filter(|e| (e.delivery == Delivery::Acked) == acked)
                .map(|e| (e.order, e.user))
                .collect()
        };
        GateView {
            token: r.token,
            stock: r.stock,
            buyers: r.buyers.clone(),
            released: r.released.clone(),
            entries_len: r.entries.len() as u8,
            in_flight: entries(false),
            acked: entries(true),
            timeouts: r.timeouts.iter().map(|(o, _)| *o).collect(),
            committed: r.committed,
            dead: r.dead.clone(),
        }
    }

    /// The gate's witness moved since this view (src/gate/witness.rs: the
    /// stream's last entry, the stock, the buyers' and the released
    /// counts).
    fn moved(&self, r: &Redis) -> bool {
        r.stock != self.stock
            || r.buyers.len() != self.buyers.len()
            || r.released.len() != self.released.len()
            || r.entries.len() != self.entries_len as usize
    }
}

impl Guard {
    /// The next step of a rebuild under way (None: none is).
    pub fn rebuild_step(&self) -> Option<Action> {
        match self {
            Guard::Idle => None,
            Guard::ReadGate(_) => Some(Action::GuardReadMysql),
            Guard::Viewed(..) => Some(Action::GuardRepair),
            Guard::Repaired(..) => Some(Action::GuardReopen),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Guard {
    Idle,
    /// The gate read (`between_gate_and_mysql_reads` follows).
    ReadGate(GateView),
    /// MySQL read too: the repair next (`before_repair`).
    Viewed(GateView, Mysql),
    /// Repaired: the reopen next, with the view's token and whether the
    /// gate still owed units beyond MySQL's stock (admitted, in flight,
    /// more than MySQL has).
    Repaired(u8, bool),
}

/// One worker process: its batch, and what its keep-alive knows of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    pub batch: Batch,
    /// This process's incarnation: a crash starts a new one (never one
    /// another worker had, so a hold or a pending entry names one process).
    pub incarnation: u8,
    /// A pause's grace waits for the batch in hand's next keep-alive tick:
    /// the grace (a lease) is longer than a tick's period (a third of
    /// it), the one timing the model takes from the code.
    pub grace_waits_tick: bool,
    /// A keep-alive tick found the batch in hand lost before its commit
    /// (src/worker/keepalive.rs `Standing::lost`): only then does the
    /// commit pause the gate.
    pub lost_seen: bool,
    /// Entries of the batch whose user's lock another process held: in
    /// hand (the keep-alive claims them and looks for them) but not in the
    /// transaction, never acknowledged by this batch (src/worker/batch.rs
    /// `lock_users`).
    pub denied: Vec<(u8, u8)>,
    /// An attempt at the batch in hand failed and it runs again
    /// (`Sale::attempt_failed`: fenced, MySQL's failover, or past its
    /// deadline and lost): the retry's commit tells the keep-alive of the
    /// orders it finds stored too, as possibly the failed attempt's
    /// (src/worker/batch.rs `abandoned`).
    pub abandoned: bool,
}

impl Worker {
    fn new(incarnation: u8) -> Worker {
        Worker {
            batch: Batch::Idle,
            incarnation,
            grace_waits_tick: false,
            lost_seen: false,
            denied: vec![],
            abandoned: false,
        }
    }

    /// Every entry in hand: the batch's and those denied a lock.
    pub fn claimed(&self) -> Vec<(u8, u8)> {
        let mut all: Vec<(u8, u8)> = self.batch.in_hand().to_vec();
        all.extend(&self.denied);
        all.sort_unstable();
        all
    }
}

/// What a buyer was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Told {
    Nothing,
    Waiting,
    /// Success with this order; `exposed` when a fault the docs name as a
    /// limit undid it (Redis lost the admission before a worker read it,
    /// or the worker holding it died after Redis lost it).
    Success {
        order: u8,
        exposed: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    pub redis: Redis,
    pub snapshot: Option<Redis>,
    pub mysql: Mysql,
    /// The worker processes (the first also runs the canceller and the
    /// gate guard).
    pub workers: Vec<Worker>,
    pub canceller: Canceller,
    pub guard: Guard,
    /// The guard's last seen server run id.
    pub guard_run: u8,
    pub told: Vec<Told>,
    pub presses: Vec<u8>,
    /// Orders whose payment deadline passed.
    pub due: Vec<u8>,
    /// Orders paid in MySQL whose payer has yet to drop the deadline and
    /// record the payment at the gate (`after_pay`); a payer that dies
    /// there never does.
    pub forgetting: Vec<u8>,
    /// Orders the sweep gave a deadline: once each, which bounds its loop
    /// (stateright checks `eventually` on paths that end, and a sweep
    /// whose deadline nothing settles would go round for ever).
    pub swept: Vec<u8>,
    pub next_order: u8,
    pub crashes: u8,
    pub rollbacks: u8,
    /// From a Redis rollback to the guard's next pass: what the gate
    /// answers then may be undone (docs/src/concepts/redis-loss.md names
    /// the window as a limit).
    pub loss_window: bool,
    /// What the guard's last refused reopen saw (token, grace, holds): it
    /// reads the gate again only once one of them changed, so a gate that
    /// can never reopen is a state with nothing left to do, which the
    /// checker's `eventually` sees.
    pub guard_refused: Option<(u8, bool, Vec<u8>)>,
    /// MySQL's state now is what a failover would come back to.
    pub mysql_snapshot: Option<Mysql>,
    pub mysql_losses: u8,
    /// From MySQL's loss to a guard's pass that sees all of it (nothing
    /// in flight then: commits acknowledged after the loss count into the
    /// witness later).
    pub mysql_loss_window: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// lua/seckill.lua for this user.
    Admit(u8),
    /// XREADGROUP by this worker, or its XAUTOCLAIM of entries pending
    /// with another incarnation: a dead one's, or a live one's stopped
    /// past `--claim-idle` (its keep-alive not ticking).
    Read(u8),
    Reclaim(u8),
    /// lua/lock_acquire.lua (`after_lock`).
    Lock(u8),
    /// The keep-alive's tick beside the batch: entries of it gone from
    /// the stream hold the gate (src/worker/keepalive.rs).
    KeepAlive(u8),
    /// The batch's transaction up to its COMMIT (`before_commit`); the
    /// keep-alive's look at the batch just before it.
    Transact(u8),
    Commit(u8),
    /// Worker `w` stopped inside its transaction is fenced by another's
    /// lock wait (lua/fence.lua, src/worker/fence.rs): its session ended,
    /// the transaction rolled back, its COMMIT fails and it runs the batch
    /// again, its locks given back and taken afresh (the connection's
    /// error came before its deadline, or Redis lost the batch).
    Fence(u8),
    /// Worker `w`'s transaction past its deadline (`--mysql-timeout`; a
    /// fenced worker's is, once it resumes): rolled back, and the batch,
    /// unless Redis lost it, let go of, its entries left pending
    /// (src/worker/batch.rs `TransactionPastDeadline`). Two workers only.
    LetGo(u8),
    /// Worker `w` stopped past a lease: its per-user locks lapse.
    LapseLocks(u8),
    /// lua/finish.lua: deadlines, XACK, locks released, hold given back
    /// (`after_ack`).
    Finish(u8),
    /// The worker killed (kill -9) wherever it is.
    Crash(u8),
    /// A dead incarnation's hold lapses, and its locks (one lease each;
    /// a Redis rollback can bring back a lock its kill had let lapse).
    LapseHold,
    /// A pause's grace ends.
    GraceEnds,
    /// A payment deadline passes.
    Due(u8),
    /// Payment (one UPDATE in MySQL, before the deadline: `after_pay`).
    Pay(u8),
    /// The payer drops the paid order's deadline and records the payment
    /// at the gate (lua/timeouts.lua `paid`).
    Forget(u8),
    /// lua/claim_due.lua.
    Claim,
    /// The cancellation's transaction (`before_cancel_commit`, then
    /// `after_cancel`).
    Cancel,
    /// lua/release.lua.
    Release,
    /// The canceller's claims lapse (it died, or its release was deferred).
    LapseClaims,
    /// The canceller's sweep: a cancelled order in MySQL that the gate has
    /// not released, whose user is a buyer there and that no deadline
    /// names gets one, due now (`deadline::schedule_unreleased`; the
    /// code's condition, the released sets disagreeing with MySQL's
    /// cancelled orders the same way two sweeps running, is not
    /// modelled: the model may sweep at any moment).
    SweepUnreleased,
    /// The guard's pass: pause on a sign of lost writes (`gate_paused`).
    GuardCheck,
    GuardReadGate,
    GuardReadMysql,
    /// lua/reconcile.lua with the witness, then lua/release.lua of the
    /// settled cancellations the gate has not released.
    GuardRepair,
    /// lua/pause.lua reopen.
    GuardReopen,
    /// Redis's state now is what a restart would come back to.
    Snapshot,
    /// Redis killed and started from the snapshot (a failover to a
    /// replica that lacked the last writes).
    Rollback,
    /// MySQL's state now is what a failover would come back to.
    MysqlSnapshot,
    /// MySQL failed over to the snapshot (an asynchronous replica).
    MysqlRollback,
}

fn has(v: &[u8], x: u8) -> bool {
    v.contains(&x)
}

fn add(v: &mut Vec<u8>, x: u8) {
    if !v.contains(&x) {
        v.push(x);
        v.sort_unstable();
    }
}

fn remove(v: &mut Vec<u8>, x: u8) {
    v.retain(|y| *y != x);
}

impl Batch {
    /// The orders in hand.
    fn in_hand(&self) -> &[(u8, u8)] {
        match self {
            Batch::Idle => &[],
            Batch::Read(b) | Batch::Locked(b) => b,
            Batch::InTx { batch, .. } | Batch::Committed { batch, .. } => batch,
        }
    }
}

impl State {
    /// An entry of worker `w`'s batch is gone from the stream (Redis lost
    /// it).
    fn batch_lost(&self, w: usize) -> bool {
        self.workers[w]
            .claimed()
            .iter()
            .any(|(o, _)| !self.redis.entries.iter().any(|e| e.order == *o))
    }

    /// A batch's transaction is open: it holds the voucher row's lock.
    pub fn in_tx(&self) -> bool {
        self.workers
            .iter()
            .any(|w| matches!(w.batch, Batch::InTx { .. }))
    }

    /// No worker has a batch in hand.
    pub fn workers_idle(&self) -> bool {
        self.workers.iter().all(|w| w.batch == Batch::Idle)
    }

    /// A hold, or an entry pending, names a process that still runs.
    fn alive(&self, incarnation: u8) -> bool {
        self.workers.iter().any(|w| w.incarnation == incarnation)
    }

    fn hold_is_live(&self) -> bool {
        !self.redis.holds.is_empty()
    }

    /// MySQL holds fewer orders than the witness counts commits, or fewer
    /// cancelled ones than the gate released (src/gate/witness.rs
    /// `MysqlBehind`).
    fn mysql_behind(&self) -> bool {
        usize::from(self.redis.committed) > self.mysql.orders.len()
            || self.mysql_lacks_cancellations()
    }

    /// Cancelled orders in MySQL the gate has not released, whose user is
    /// a buyer there (a gate set back before the admission has the unit
    /// free already), and no deadline names: nothing will give their units
    /// back but the sweep.
    fn unreleased_without_deadline(&self) -> Vec<u8> {
        self.mysql
            .orders
            .iter()
            .filter(|o| {
                o.status == Status::Cancelled
                    && !has(&self.swept, o.id)
                    && !has(&self.redis.released, o.id)
                    && has(&self.redis.buyers, o.user)
                    && !self.redis.timeouts.iter().any(|(t, _)| *t == o.id)
            })
            .map(|o| o.id)
            .collect()
    }

    /// More units released at the gate than MySQL has cancellations.
    fn mysql_lacks_cancellations(&self) -> bool {
        let cancelled = self
            .mysql
            .orders
            .iter()
            .filter(|o| o.status == Status::Cancelled)
            .count();
        self.redis.released.len() > cancelled
    }

    /// lua/raise_commits.lua: the witness up to `held` (MySQL's orders, as
    /// read) less every entry not acknowledged yet, never down.
    fn raise_witness_to(&mut self, held: usize) {
        let in_flight = self
            .redis
            .entries
            .iter()
            .filter(|e| e.delivery != Delivery::Acked)
            .count();
        let floor = held.saturating_sub(in_flight) as u8;
        self.redis.committed = self.redis.committed.max(floor);
    }

    fn raise_witness(&mut self) {
        self.raise_witness_to(self.mysql.orders.len());
    }

    /// No process has work left, nothing waits in the stream, the gate is
    /// open: what the sale comes to once faults stop and processes run.
    pub fn quiescent(&self) -> bool {
        self.workers_idle()
            && self.canceller == Canceller::Idle
            && self.guard == Guard::Idle
            && !self.redis.paused
            && !self.redis.grace
            && self.redis.holds.is_empty()
            // The guard's pass after a Redis restart is one of the
            // processes running.
            && !self.loss_window
            && !self.mysql_loss_window
            && self
                .redis
                .entries
                .iter()
                .all(|e| e.delivery == Delivery::Acked)
    }

    pub fn sold(&self) -> u8 {
        self.mysql
            .orders
            .iter()
            .filter(|o| o.status != Status::Cancelled)
            .count() as u8
    }

    fn order_of(&self, user: u8) -> Option<&Order> {
        self.mysql.orders.iter().find(|o| o.user == user)
    }

    /// Success answers the stores no longer back after a fault the docs
    /// name: marked so the property does not count them. A batch in hand
    /// backs its orders until its commit (a committed one's are MySQL's:
    /// lost with it, its entries lost with Redis's, nothing has them).
    fn expose_lost(&mut self) {
        let uncommitted = self.workers.iter().flat_map(|w| match &w.batch {
            Batch::Committed { .. } => &[][..],
            b => b.in_hand(),
        });
        let kept: Vec<u8> = self
            .redis
            .entries
            .iter()
            .map(|e| e.order)
            .chain(self.mysql.orders.iter().map(|o| o.id))
            .chain(uncommitted.map(|(o, _)| *o))
            .collect();
        for told in self.told.iter_mut() {
            if let Told::Success { order, exposed } = told {
                if !kept.contains(order) {
                    *exposed = true;
                }
            }
        }
    }
}

impl Sale {
    /// `units` units and `users` buyers who press once each, one worker
    /// kill and one Redis rollback, no MySQL loss: the bounds most checks
    /// start from.
    pub fn redis_loss(units: u8, users: u8, fixes: Fixes) -> Sale {
        Sale {
            units,
            users,
            presses: 1,
            workers: 1,
            crashes: 1,
            rollbacks: 1,
            mysql_losses: 0,
            fixes,
        }
    }

    pub fn initial(&self) -> State {
        State {
            redis: Redis {
                stock: self.units,
                buyers: vec![],
                waitlist: vec![],
                entries: vec![],
                timeouts: vec![],
                released: vec![],
                paid: vec![],
                paused: false,
                token: 0,
                grace: false,
                holds: vec![],
                run: 0,
                recorded_run: 0,
                committed: 0,
                dead: vec![],
                locks: vec![],
            },
            snapshot: None,
            mysql: Mysql {
                stock: self.units,
                orders: vec![],
            },
            workers: (0..self.workers).map(Worker::new).collect(),
            canceller: Canceller::Idle,
            guard: Guard::Idle,
            guard_run: 0,
            told: vec![Told::Nothing; self.users as usize],
            presses: vec![self.presses; self.users as usize],
            due: vec![],
            forgetting: vec![],
            swept: vec![],
            next_order: 1,
            crashes: self.crashes,
            rollbacks: self.rollbacks,
            loss_window: false,
            guard_refused: None,
            mysql_snapshot: None,
            mysql_losses: self.mysql_losses,
            mysql_loss_window: false,
        }
    }

    fn admit(&self, s: &mut State, user: u8) {
        s.presses[user as usize] -= 1;
        let r = &mut s.redis;
        if r.paused || has(&r.buyers, user) {
            // paused: try again later; already bought: told so (the
            // order, when MySQL has it).
            return;
        }
        if r.stock == 0 {
            if !has(&r.waitlist, user) {
                r.waitlist.push(user);
            }
            if s.told[user as usize] == Told::Nothing {
                s.told[user as usize] = Told::Waiting;
            }
            return;
        }
        let order = s.next_order;
        s.next_order += 1;
        r.stock -= 1;
        add(&mut r.buyers, user);
        remove(&mut r.waitlist, user);
        r.entries.push(Entry {
            order,
            user,
            delivery: Delivery::New,
        });
        s.told[user as usize] = Told::Success {
            order,
            exposed: s.loss_window,
        };
    }

    /// The careful path of the batch's transaction: each order stored
    /// once, one per user, a unit of MySQL's stock each or dead-lettered.
    fn transact(&self, s: &State, batch: &[(u8, u8)]) -> Vec<(u8, u8)> {
        let mut stock = s.mysql.stock;
        let mut inserted = vec![];
        for &(order, user) in batch {
            let stored = s.mysql.orders.iter().any(|o| o.id == order);
            let holds = s.mysql.orders.iter().any(|o| o.user == user)
                || inserted.iter().any(|(_, u)| *u == user);
            if stored || holds || stock == 0 {
                continue;
            }
            stock -= 1;
            inserted.push((order, user));
        }
        inserted
    }

    /// Worker `w`'s keep-alive looks: entries of its batch gone from the
    /// stream hold the gate (paused, a hold).
    fn hold_if_lost(&self, s: &mut State, w: usize) {
        s.workers[w].grace_waits_tick = false;
        // The tick's XCLAIM takes the batch's entries back from whoever
        // they are pending with (after a rollback: an earlier
        // incarnation; or another worker that reclaimed them).
        let me = s.workers[w].incarnation;
        let batch: Vec<u8> = s.workers[w].claimed().iter().map(|(o, _)| *o).collect();
        for e in s.redis.entries.iter_mut() {
            if batch.contains(&e.order) && matches!(e.delivery, Delivery::Pending(_)) {
                e.delivery = Delivery::Pending(me);
            }
        }
        if !self.fixes.hold_batch_in_hand {
            return;
        }
        // Seen lost only before the commit; once seen, held each tick.
        let committed = matches!(s.workers[w].batch, Batch::Committed { .. });
        if s.batch_lost(w) && !committed {
            s.workers[w].lost_seen = true;
        }
        if s.workers[w].lost_seen {
            add(&mut s.redis.holds, me);
            if !s.redis.paused && !committed {
                self.pause(s);
            }
        }
    }

    /// Worker `w`'s transaction ended without its commit (fenced, past its
    /// deadline, or its MySQL gone): rolled back, its locks given back
    /// (`try_batch`'s `give_back_locks`). Past its deadline
    /// (`past_deadline`) a look (`KeepAlive::lost_now`, a tick: its
    /// XCLAIM takes the entries back from whoever reclaimed them, found by
    /// the conformance walks) decides: not lost, the batch is let go of,
    /// its entries pending with this worker (`process_kept`). Otherwise
    /// it is locked and run again, and that commit tells the keep-alive
    /// of the orders it finds stored too, as possibly the failed
    /// attempt's (`process_kept`'s `abandoned`).
    fn attempt_failed(&self, s: &mut State, w: usize, past_deadline: bool) {
        let claimed = s.workers[w].claimed();
        self.give_back_locks(s, w);
        if past_deadline {
            self.hold_if_lost(s, w);
        }
        s.workers[w].denied.clear();
        if past_deadline && !s.workers[w].lost_seen {
            s.workers[w].batch = Batch::Idle;
            s.workers[w].abandoned = false;
            // No batch in hand: no tick for a pause's grace to wait for.
            s.workers[w].grace_waits_tick = false;
            return;
        }
        s.workers[w].batch = Batch::Read(claimed);
        s.workers[w].abandoned = true;
    }

    /// Worker `w` gives back the locks of its batch's users (lua/finish.lua's
    /// and `give_back_locks`' `lease_release`: those users only; another
    /// lock of its, which a Redis rollback brought back, lapses).
    fn give_back_locks(&self, s: &mut State, w: usize) {
        let me = s.workers[w].incarnation;
        let users: Vec<u8> = s.workers[w]
            .batch
            .in_hand()
            .iter()
            .map(|(_, u)| *u)
            .collect();
        s.redis
            .locks
            .retain(|(x, u)| *x != me || !users.contains(u));
    }

    /// lua/pause.lua pause: a fresh token and a grace of one lease, which
    /// every batch in hand's keep-alive ticks within.
    fn pause(&self, s: &mut State) {
        s.redis.paused = true;
        s.redis.token += 1;
        s.redis.grace = true;
        for w in s.workers.iter_mut() {
            w.grace_waits_tick = w.batch != Batch::Idle;
        }
    }

    /// lua/release.lua: units of cancelled orders back, each once, the
    /// waitlist served first; settled orders' deadlines dropped.
    fn release(&self, s: &mut State, cancelled: &[u8], settled: &[u8]) {
        let mut pool = 0;
        for &o in cancelled {
            s.redis.timeouts.retain(|(t, _)| *t != o);
            if !has(&s.redis.released, o) {
                add(&mut s.redis.released, o);
                pool += 1;
            }
        }
        for &o in settled {
            s.redis.timeouts.retain(|(t, _)| *t != o);
        }
        if pool == 0 {
            return;
        }
        pool += s.redis.stock;
        s.redis.stock = self.promote(s, pool);
    }

    /// Serves the waitlist from `pool` units in order of arrival (a user
    /// who is a buyer already just leaves it); the units left.
    fn promote(&self, s: &mut State, mut pool: u8) -> u8 {
        while pool > 0 && !s.redis.waitlist.is_empty() {
            let head = s.redis.waitlist.remove(0);
            if has(&s.redis.buyers, head) {
                continue;
            }
            let order = s.next_order;
            s.next_order += 1;
            add(&mut s.redis.buyers, head);
            s.redis.entries.push(Entry {
                order,
                user: head,
                delivery: Delivery::New,
            });
            s.told[head as usize] = Told::Success {
                order,
                exposed: s.loss_window,
            };
            pool -= 1;
        }
        pool
    }
}

impl Model for Sale {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for user in 0..self.users {
            if s.presses[user as usize] > 0 {
                actions.push(Action::Admit(user));
            }
        }
        for (w, worker) in s.workers.iter().enumerate() {
            let w = w as u8;
            match &worker.batch {
                Batch::Idle => {
                    if s.redis.entries.iter().any(|e| e.delivery == Delivery::New) {
                        actions.push(Action::Read(w));
                    }
                    // Idle: every pending entry is another's, or this
                    // one's that Redis gave back (XAUTOCLAIM takes either
                    // once idle).
                    if s.redis
                        .entries
                        .iter()
                        .any(|e| matches!(e.delivery, Delivery::Pending(_)))
                    {
                        actions.push(Action::Reclaim(w));
                    }
                }
                Batch::Read(_) => actions.push(Action::Lock(w)),
                // The voucher row's lock: one batch's transaction at a
                // time (another waits at its conditional update).
                Batch::Locked(_) if !s.in_tx() => actions.push(Action::Transact(w)),
                Batch::Locked(_) => {}
                Batch::InTx { .. } => {
                    actions.push(Action::Commit(w));
                    // Another batch waits for the row lock: its lock wait
                    // ends this transaction once its fence lease ran out.
                    if s.workers
                        .iter()
                        .any(|x| matches!(x.batch, Batch::Locked(_)))
                    {
                        actions.push(Action::Fence(w));
                    }
                    // Past its deadline (--mysql-timeout): let go of, or
                    // run again if Redis lost it.
                    if self.workers > 1 {
                        actions.push(Action::LetGo(w));
                    }
                }
                Batch::Committed { .. } => actions.push(Action::Finish(w)),
            }
            if worker.batch != Batch::Idle {
                actions.push(Action::KeepAlive(w));
            }
            if s.crashes > 0 && worker.batch != Batch::Idle {
                actions.push(Action::Crash(w));
            }
            // Stopped past a lease: its locks lapse.
            if s.redis.locks.iter().any(|(x, _)| *x == worker.incarnation) {
                actions.push(Action::LapseLocks(w));
            }
        }
        if s.redis.grace && !s.workers.iter().any(|w| w.grace_waits_tick) {
            actions.push(Action::GraceEnds);
        }
        if s.redis.holds.iter().any(|h| !s.alive(*h))
            || s.redis.locks.iter().any(|(x, _)| !s.alive(*x))
        {
            actions.push(Action::LapseHold);
        }
        for o in &s.mysql.orders {
            if has(&s.due, o.id) {
                continue;
            }
            // Time passes for every deadline, also one whose order was
            // paid after its batch's commit decided to schedule it.
            if o.status == Status::Pending || s.redis.timeouts.iter().any(|(t, _)| *t == o.id) {
                actions.push(Action::Due(o.id));
            }
            if o.status == Status::Pending {
                actions.push(Action::Pay(o.id));
            }
        }
        for &o in &s.forgetting {
            actions.push(Action::Forget(o));
        }
        match &s.canceller {
            Canceller::Idle => {
                if s.redis
                    .timeouts
                    .iter()
                    .any(|(o, claimed)| !claimed && has(&s.due, *o))
                {
                    actions.push(Action::Claim);
                }
                // A dead canceller's claims (the worker was killed).
                if s.redis.timeouts.iter().any(|(_, claimed)| *claimed) {
                    actions.push(Action::LapseClaims);
                }
            }
            Canceller::Claimed(_) => actions.push(Action::Cancel),
            // Deferred while the gate is paused: its claims lapse and the
            // next claim finds the orders cancelled, so waiting is the same.
            Canceller::Cancelled { .. } => {
                if !(s.redis.paused && self.fixes.release_defers_while_paused) {
                    actions.push(Action::Release);
                }
            }
        }
        if self.fixes.sweep_unreleased && !s.unreleased_without_deadline().is_empty() {
            actions.push(Action::SweepUnreleased);
        }
        match &s.guard {
            Guard::Idle => {
                actions.push(Action::GuardCheck);
                let seen = (s.redis.token, s.redis.grace, s.redis.holds.clone());
                if s.redis.paused && s.guard_refused.as_ref() != Some(&seen) {
                    actions.push(Action::GuardReadGate);
                }
            }
            rebuilding => actions.extend(rebuilding.rebuild_step()),
        }
        if s.rollbacks > 0 {
            match &s.snapshot {
                None => actions.push(Action::Snapshot),
                Some(_) => actions.push(Action::Rollback),
            }
        }
        if s.mysql_losses > 0 {
            match &s.mysql_snapshot {
                None => actions.push(Action::MysqlSnapshot),
                Some(_) => actions.push(Action::MysqlRollback),
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Admit(user) => self.admit(&mut s, user),
            Action::Read(w) | Action::Reclaim(w) => {
                let w = w as usize;
                let me = s.workers[w].incarnation;
                let mut batch = vec![];
                for e in s.redis.entries.iter_mut() {
                    let taken = match action {
                        Action::Read(_) => e.delivery == Delivery::New,
                        _ => matches!(e.delivery, Delivery::Pending(_)),
                    };
                    if taken {
                        e.delivery = Delivery::Pending(me);
                        batch.push((e.order, e.user));
                    }
                }
                s.workers[w].batch = Batch::Read(batch);
            }
            Action::Lock(w) => {
                let w = w as usize;
                let Batch::Read(batch) = s.workers[w].batch.clone() else {
                    return None;
                };
                let me = s.workers[w].incarnation;
                let (mut mine, mut denied) = (vec![], vec![]);
                // One worker keeps no locks: none is ever taken by another.
                for (o, u) in batch {
                    if s.redis.locks.iter().any(|&(x, v)| v == u && x != me) {
                        denied.push((o, u));
                        continue;
                    }
                    if self.workers > 1 && !s.redis.locks.contains(&(me, u)) {
                        s.redis.locks.push((me, u));
                        s.redis.locks.sort_unstable();
                    }
                    mine.push((o, u));
                }
                s.workers[w].batch = Batch::Locked(mine);
                s.workers[w].denied = denied;
                // The keep-alive confirms the batch before its commit.
                self.hold_if_lost(&mut s, w);
            }
            Action::Transact(w) => {
                let w = w as usize;
                let Batch::Locked(batch) = &s.workers[w].batch else {
                    return None;
                };
                let batch = batch.clone();
                let inserted = self.transact(&s, &batch);
                // No unit in MySQL for it: dead-lettered, or kept for a
                // retry while MySQL is behind what the gate saw (the
                // transaction's counts against the gate's witness).
                let no_stock: Vec<u8> = batch
                    .iter()
                    .filter(|(o, u)| {
                        !inserted.iter().any(|(i, _)| i == o)
                            && !s.mysql.orders.iter().any(|x| x.id == *o || x.user == *u)
                    })
                    .map(|(o, _)| *o)
                    .collect();
                let behind = s.mysql_lacks_cancellations();
                let kept = match self.fixes.retry_no_stock_while_behind && behind {
                    true => no_stock,
                    false => vec![],
                };
                s.workers[w].batch = Batch::InTx {
                    batch,
                    inserted,
                    kept,
                };
            }
            Action::Commit(w) => {
                let w = w as usize;
                let Batch::InTx {
                    batch,
                    inserted,
                    kept,
                } = s.workers[w].batch.clone()
                else {
                    return None;
                };
                // Checked again at the commit: another commit may have
                // come between (the row lock makes it so).
                let inserted = self.transact(&s, &inserted);
                for &(id, user) in &inserted {
                    s.mysql.stock -= 1;
                    s.mysql.orders.push(Order {
                        id,
                        user,
                        status: Status::Pending,
                        held: false,
                    });
                }
                s.mysql.orders.sort();
                // KeepAlive::committed hears of the orders inserted; after
                // a failed attempt, of those found stored too.
                let told_committed = match s.workers[w].abandoned {
                    false => !inserted.is_empty(),
                    true => batch
                        .iter()
                        .any(|(o, _)| s.mysql.orders.iter().any(|x| x.id == *o)),
                };
                // KeepAlive::committed: a look first (a tick, the batch not
                // yet committed), then lost as the ticks saw it.
                if self.fixes.commit_looks_again && told_committed && !s.workers[w].lost_seen {
                    self.hold_if_lost(&mut s, w);
                }
                let lost = told_committed && s.workers[w].lost_seen;
                let deadlines = batch
                    .iter()
                    .map(|(o, _)| *o)
                    .filter(|o| {
                        s.mysql
                            .orders
                            .iter()
                            .any(|x| x.id == *o && x.status == Status::Pending)
                    })
                    .collect();
                let counted = batch
                    .iter()
                    .map(|(o, _)| *o)
                    .filter(|o| match self.fixes.count_stored_acks {
                        true => s.mysql.orders.iter().any(|x| x.id == *o),
                        false => inserted.iter().any(|(i, _)| i == o),
                    })
                    .collect();
                let dead = batch
                    .iter()
                    .filter(|(o, _)| {
                        !kept.contains(o) && !s.mysql.orders.iter().any(|x| x.id == *o)
                    })
                    .map(|(_, u)| *u)
                    .collect();
                s.workers[w].batch = Batch::Committed {
                    batch,
                    deadlines,
                    counted,
                    kept,
                    dead,
                };
                // Committed while lost: paused with a grace, so no view
                // read before the commit reopens (KeepAlive::committed).
                if lost && self.fixes.hold_batch_in_hand {
                    self.pause(&mut s);
                }
            }
            Action::Fence(w) | Action::LetGo(w) => {
                let w = w as usize;
                if !matches!(s.workers[w].batch, Batch::InTx { .. }) {
                    return None;
                }
                let past_deadline = matches!(action, Action::LetGo(_));
                self.attempt_failed(&mut s, w, past_deadline);
            }
            Action::LapseLocks(w) => {
                let me = s.workers[w as usize].incarnation;
                s.redis.locks.retain(|(x, _)| *x != me);
            }
            Action::KeepAlive(w) => {
                self.hold_if_lost(&mut s, w as usize);
                if &s == last {
                    return None;
                }
            }
            Action::GraceEnds => s.redis.grace = false,
            Action::Finish(w) => {
                let w = w as usize;
                let Batch::Committed {
                    batch,
                    deadlines,
                    counted,
                    kept,
                    dead,
                } = s.workers[w].batch.clone()
                else {
                    return None;
                };
                let me = s.workers[w].incarnation;
                // A dead letter only for an entry still pending (another
                // worker's batch may have acknowledged it since).
                for &(o, u) in &batch {
                    let pending = s
                        .redis
                        .entries
                        .iter()
                        .any(|e| e.order == o && matches!(e.delivery, Delivery::Pending(_)));
                    if pending && dead.contains(&u) {
                        add(&mut s.redis.dead, u);
                    }
                }
                for &order in &deadlines {
                    // finish.lua's ZADD moves a deadline there already to
                    // the order's own (a claim's lease ends with it).
                    s.redis.timeouts.retain(|(o, _)| *o != order);
                    s.redis.timeouts.push((order, false));
                }
                s.redis.timeouts.sort();
                // XACK takes an entry out of the pending list whoever it
                // is pending with: after a rollback, the batch's entry may
                // be pending again with the incarnation that read it first.
                for e in s.redis.entries.iter_mut() {
                    if matches!(e.delivery, Delivery::Pending(_))
                        && batch.iter().any(|(o, _)| *o == e.order)
                        && !kept.contains(&e.order)
                    {
                        e.delivery = Delivery::Acked;
                        // Counted when its XACK acknowledges it now.
                        if counted.contains(&e.order) {
                            s.redis.committed += 1;
                        }
                    }
                }
                self.give_back_locks(&mut s, w);
                s.workers[w].denied.clear();
                if has(&s.redis.holds, me) {
                    remove(&mut s.redis.holds, me);
                    // lua/pause.lua's unhold renews a paused gate's token:
                    // a view read while the batch held it is too old.
                    if s.redis.paused {
                        s.redis.token += 1;
                    }
                }
                s.workers[w].batch = Batch::Idle;
                s.workers[w].grace_waits_tick = false;
                s.workers[w].lost_seen = false;
                s.workers[w].abandoned = false;
            }
            Action::Crash(w) => {
                let w = w as usize;
                s.crashes -= 1;
                let next = s.workers.iter().map(|x| x.incarnation).max().unwrap_or(0) + 1;
                // Its locks lapse before its entries can be reclaimed
                // (`--claim-idle` outlasts `--lock-lease`).
                let dead = s.workers[w].incarnation;
                s.redis.locks.retain(|(x, _)| *x != dead);
                s.workers[w] = Worker::new(next);
                // The canceller and the guard run in the first worker's
                // process.
                if w == 0 {
                    s.canceller = Canceller::Idle;
                    s.guard = Guard::Idle;
                    s.guard_refused = None;
                }
                // A batch Redis lost, in a worker that dies before
                // committing it: a named limit.
                s.expose_lost();
            }
            Action::LapseHold => {
                let live: Vec<u8> = s.workers.iter().map(|w| w.incarnation).collect();
                let holds = s.redis.holds.len();
                s.redis.holds.retain(|h| live.contains(h));
                s.redis.locks.retain(|(x, _)| live.contains(x));
                if s.redis.paused && s.redis.holds.len() < holds {
                    // lua/pause.lua renews the token when a hold lapses.
                    s.redis.token += 1;
                }
            }
            Action::Due(order) => add(&mut s.due, order),
            Action::Pay(order) => {
                let o = s.mysql.orders.iter_mut().find(|o| o.id == order)?;
                if o.status == Status::Pending {
                    o.status = Status::Paid;
                    add(&mut s.forgetting, order);
                }
            }
            Action::Forget(order) => {
                remove(&mut s.forgetting, order);
                s.redis.timeouts.retain(|(t, _)| *t != order);
                add(&mut s.redis.paid, order);
            }
            Action::Claim => {
                let mut claimed = vec![];
                for (o, c) in s.redis.timeouts.iter_mut() {
                    if !*c && s.due.contains(o) {
                        *c = true;
                        claimed.push(*o);
                    }
                }
                s.canceller = Canceller::Claimed(claimed);
            }
            Action::Cancel => {
                let Canceller::Claimed(claimed) = s.canceller.clone() else {
                    return None;
                };
                let (mut cancelled, mut settled) = (vec![], vec![]);
                for o in claimed {
                    // The gate saw it paid: its deadline dropped at once,
                    // never cancelled (take_out_paid).
                    // A released order gave its unit away: cancelled
                    // whatever the paid set says.
                    if has(&s.redis.paid, o) && !has(&s.redis.released, o) {
                        // Paid again if MySQL has it pending (lost its
                        // payment); its unit back if MySQL cancelled it.
                        match s.mysql.orders.iter_mut().find(|x| x.id == o) {
                            Some(x) if x.status == Status::Pending => x.status = Status::Paid,
                            Some(x)
                                if x.status == Status::Cancelled
                                    && self.fixes.release_paid_cancelled =>
                            {
                                cancelled.push(o);
                                continue;
                            }
                            _ => {}
                        }
                        s.redis.timeouts.retain(|(t, _)| *t != o);
                        continue;
                    }
                    match s.mysql.orders.iter_mut().find(|x| x.id == o) {
                        Some(x) if x.status == Status::Pending => {
                            x.status = Status::Cancelled;
                            s.mysql.stock += 1;
                            cancelled.push(o);
                        }
                        Some(x) if x.status == Status::Cancelled => cancelled.push(o),
                        _ => settled.push(o),
                    }
                }
                // Nothing left to give back (every order was paid at the
                // gate): the canceller goes on at once (cancel_claimed's None).
                s.canceller = if cancelled.is_empty() && settled.is_empty() {
                    Canceller::Idle
                } else {
                    Canceller::Cancelled { cancelled, settled }
                };
            }
            Action::Release => {
                let Canceller::Cancelled { cancelled, settled } = s.canceller.clone() else {
                    return None;
                };
                s.canceller = Canceller::Idle;
                self.release(&mut s, &cancelled, &settled);
            }
            Action::LapseClaims => {
                for (_, c) in s.redis.timeouts.iter_mut() {
                    *c = false;
                }
            }
            Action::SweepUnreleased => {
                for o in s.unreleased_without_deadline() {
                    s.redis.timeouts.push((o, false));
                    add(&mut s.due, o);
                    add(&mut s.swept, o);
                }
                s.redis.timeouts.sort();
            }
            Action::GuardCheck => {
                let orders = s.mysql.orders.len();
                let restarted = s.redis.run != s.guard_run || s.redis.run != s.redis.recorded_run;
                let behind = s.mysql_behind();
                // A restart pauses again a gate already paused (a fresh
                // token: a view read before it is stale); MySQL behind and
                // the count's sign only an open gate. MySQL's loss pauses
                // with no grace: Redis lost nothing, so no worker holds a
                // batch it lost.
                if self.fixes.run_id_sign && restarted {
                    self.pause(&mut s);
                } else if behind && !s.redis.paused && self.fixes.restore_lost_commits {
                    s.redis.paused = true;
                    s.redis.token += 1;
                } else if !s.redis.paused && s.redis.buyers.len() < orders {
                    self.pause(&mut s);
                }
                s.guard_run = s.redis.run;
                s.redis.recorded_run = s.redis.run;
                s.loss_window = false;
                // Seen whole once nothing decided before the loss is
                // still on its way to the witness: every entry counted,
                // every cancellation released (one not released yet
                // masks a lost one in the counts).
                let released_all = s
                    .mysql
                    .orders
                    .iter()
                    .filter(|o| o.status == Status::Cancelled)
                    .all(|o| has(&s.redis.released, o.id));
                if s.workers_idle()
                    && s.canceller == Canceller::Idle
                    && s.redis
                        .entries
                        .iter()
                        .all(|e| e.delivery == Delivery::Acked)
                    && released_all
                {
                    s.mysql_loss_window = false;
                }
                // The pass ends with the witness raised to MySQL's count
                // (lua/raise_commits.lua), unless MySQL is behind it.
                if !behind {
                    s.raise_witness();
                }
                if last == &s {
                    return None;
                }
            }
            Action::GuardReadGate => s.guard = Guard::ReadGate(GateView::of(&s.redis)),
            Action::GuardReadMysql => {
                let Guard::ReadGate(view) = s.guard.clone() else {
                    return None;
                };
                let my = s.mysql.clone();
                // The gate's witness read again after MySQL's
                // (snapshot.rs `read_gates`): moved, the gate read again
                // at once, nothing mended on this view; as after a forget
                // refused.
                s.guard = match view.moved(&s.redis)
                    || self.fixes.restore_lost_commits && !self.mend_witness(&mut s, &view, &my)
                {
                    true => Guard::ReadGate(GateView::of(&s.redis)),
                    false => Guard::Viewed(view, my),
                };
            }
            Action::GuardRepair => {
                let Guard::Viewed(view, my) = s.guard.clone() else {
                    return None;
                };
                self.repair(&mut s, &view, &my);
            }
            Action::GuardReopen => {
                let Guard::Repaired(token, owes) = s.guard else {
                    return None;
                };
                if owes && self.fixes.reopen_waits_while_owed {
                    // Read again once the batches in flight settle.
                    s.guard = Guard::Idle;
                    return Some(s);
                }
                s.guard = Guard::Idle;
                let orders = s.mysql.orders.len();
                let token_ok = !self.fixes.reopen_checks_token || token == s.redis.token;
                let hold_ok = !self.fixes.hold_batch_in_hand || !s.hold_is_live();
                let grace_over = !s.redis.grace;
                if s.redis.paused
                    && token_ok
                    && hold_ok
                    && grace_over
                    && s.redis.buyers.len() >= orders
                {
                    s.redis.paused = false;
                    s.guard_refused = None;
                } else if token == s.redis.token {
                    // Refused on a view still current: read again once
                    // something changed. A stale view is read again now.
                    s.guard_refused = Some((s.redis.token, s.redis.grace, s.redis.holds.clone()));
                }
            }
            Action::Snapshot => s.snapshot = Some(s.redis.clone()),
            Action::MysqlSnapshot => s.mysql_snapshot = Some(s.mysql.clone()),
            Action::MysqlRollback => {
                s.mysql_losses -= 1;
                s.mysql = s.mysql_snapshot.take()?;
                s.mysql_loss_window = true;
                // An open transaction dies with the old primary's
                // connections: its COMMIT fails, a failed attempt, and the
                // batch runs again (src/worker/batch.rs; found by a review
                // of the walks: it kept its locks here, without
                // `abandoned`).
                for w in 0..s.workers.len() {
                    if matches!(s.workers[w].batch, Batch::InTx { .. }) {
                        self.attempt_failed(&mut s, w, false);
                    }
                }
                // A commit MySQL lost whose entry Redis lost before: no
                // store keeps it (mysql-loss.md's unrestorable commits).
                s.expose_lost();
            }
            Action::Rollback => {
                s.rollbacks -= 1;
                let mut back = s.snapshot.take()?;
                back.run = s.redis.run + 1;
                s.redis = back;
                s.expose_lost();
                s.loss_window = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always("no unit sold twice (MySQL)", |m, s| {
                s.sold() + s.mysql.stock == m.units
            }),
            Property::<Self>::always("one order per user", |_, s| {
                let mut users: Vec<u8> = s.mysql.orders.iter().map(|o| o.user).collect();
                users.sort_unstable();
                users.windows(2).all(|w| w[0] != w[1])
            }),
            Property::<Self>::always("every success is an order (at rest)", |_, s| {
                !s.quiescent()
                    || s.told.iter().enumerate().all(|(user, told)| match told {
                        Told::Success { exposed: true, .. } => true,
                        Told::Success { .. } => s.order_of(user as u8).is_some(),
                        _ => true,
                    })
            }),
            // Fewer is a dead letter's unit, which reconcile gives back;
            // more is a unit the gate may sell that MySQL does not have.
            Property::<Self>::always("the gate holds no unit MySQL lacks (at rest)", |_, s| {
                !s.quiescent() || s.redis.stock <= s.mysql.stock
            }),
            Property::<Self>::always(
                "at rest, reconcile leaves no unit free while a request waits",
                |m, s| {
                    if !s.quiescent() {
                        return true;
                    }
                    let r = m.reconciled(s);
                    r.redis.stock == 0 || r.redis.waitlist.iter().all(|u| has(&r.redis.buyers, *u))
                },
            ),
            Property::<Self>::eventually("the sale comes to rest, its gate open", |_, s| {
                s.quiescent() && s.presses.iter().all(|p| *p == 0)
            }),
        ]
    }
}

impl Sale {
    /// `seckill reconcile --yes` at rest: a fresh view of both stores,
    /// repaired.
    pub fn reconciled(&self, s: &State) -> State {
        let mut r = s.clone();
        // Read again after MySQL was mended, as reconcile_gate does.
        for _ in 0..5 {
            // At rest every entry is acknowledged: none in flight.
            let view = GateView::of(&r.redis);
            let my = r.mysql.clone();
            r.guard = Guard::Idle;
            if self.fixes.restore_lost_commits {
                // Its view is of now: the witness cannot have moved.
                self.mend_witness(&mut r, &view, &my);
            }
            self.repair(&mut r, &view, &my);
            if matches!(r.guard, Guard::Repaired(..)) {
                break;
            }
        }
        r.guard = Guard::Idle;
        r
    }

    /// The rebuild (src/reconcile: reconcile.lua with the witness, then
    /// release.lua of the cancellations the gate has not released).
    fn repair(&self, s: &mut State, view: &GateView, my: &Mysql) {
        // MySQL mended (or sold again since: nothing restored), or the
        // gate moved since the view (reconcile.lua's witness): the gate
        // read again at once (target.rs `reconcile_gate`'s loop; the
        // code gives up after 5 reads, the model does not).
        if self.fixes.restore_lost_commits && !self.mend_mysql(s, view, my) || view.moved(&s.redis)
        {
            s.guard = Guard::ReadGate(GateView::of(&s.redis));
            return;
        }
        let unpersisted: Vec<(u8, u8)> = view
            .in_flight
            .iter()
            .filter(|(o, _)| !my.orders.iter().any(|x| x.id == *o))
            .copied()
            .collect();
        let mut unreleased: Vec<u8> = my
            .orders
            .iter()
            .filter(|o| o.status == Status::Cancelled && !has(&view.released, o.id))
            .map(|o| o.id)
            .collect();
        let mut expected = my.stock as i16 - unpersisted.len() as i16;
        if self.fixes.rebuild_subtracts_unreleased {
            expected -= unreleased.len() as i16;
        }
        let mut spoken = vec![];
        if expected < 0 && self.fixes.spoken_for {
            let owed = (-expected) as usize;
            spoken = unreleased.drain(..owed.min(unreleased.len())).collect();
        }
        let owes = expected + (spoken.len() as i16) < 0;
        let expected = expected.max(0) as u8;
        let mut holders: Vec<u8> = my.orders.iter().map(|o| o.user).collect();
        holders.extend(unpersisted.iter().map(|(_, u)| *u));
        holders.sort_unstable();
        holders.dedup();
        // A live hold, or a pause's grace the keep-alive of a batch in
        // hand may yet hold the gate in (M6): no unit given back.
        let waits = s.hold_is_live() || (self.fixes.repair_gives_after_grace && s.redis.grace);
        let withheld = expected > view.stock && self.fixes.hold_batch_in_hand && waits;
        s.redis.buyers = holders.clone();
        for u in &holders {
            remove(&mut s.redis.waitlist, *u);
        }
        if withheld {
            s.redis.stock = s.redis.stock.min(expected);
        } else if expected > s.redis.stock {
            // Units given back serve the waitlist first (reconcile.lua).
            let given = expected - s.redis.stock;
            s.redis.stock += self.promote(s, given);
        } else {
            s.redis.stock = expected;
        }
        // Marked released, no unit given: their units went to orders since.
        for o in spoken {
            add(&mut s.redis.released, o);
        }
        for o in my
            .orders
            .iter()
            .filter(|o| o.status == Status::Pending && !o.held)
        {
            if !view.timeouts.contains(&o.id) {
                // reconcile.lua's ZADD: a deadline set since the view, a
                // claim's included, goes back to the order's own.
                s.redis.timeouts.retain(|(t, _)| *t != o.id);
                s.redis.timeouts.push((o.id, false));
                s.redis.timeouts.sort();
            }
        }
        // release.lua under the repair's token: each once (released); at a
        // paused gate a worker holds or whose grace runs, or one paused
        // again since the view, deferred (a later pass gives them).
        // (Called only with cancellations to release: the code's repair
        // runs release.lua only then, so only then can it defer.)
        let deferred =
            !unreleased.is_empty() && s.redis.paused && (waits || s.redis.token != view.token);
        if withheld || deferred {
            // The code's `Held` (reconcile.lua's reply 2, or release.lua
            // deferred): no reopen, which would leave the units not given
            // back if the grace ended in between; read again once the
            // token, the grace or the holds changed (a view made stale by
            // a pause is read again at once).
            s.guard = Guard::Idle;
            if s.redis.token == view.token {
                s.guard_refused = Some((s.redis.token, s.redis.grace, s.redis.holds.clone()));
            }
            return;
        }
        self.release(s, &unreleased, &[]);
        s.guard = Guard::Repaired(view.token, owes);
    }

    /// What MySQL lost, as reconcile reads and mends it before any repair
    /// of the gate (src/reconcile/target.rs, snapshot.rs
    /// `find_lost_commits`, src/orders/restore.rs; the witness was mended
    /// at the read, [`Sale::mend_witness`]): lost orders are put back from
    /// their acknowledged entries and lost cancellations made again, in
    /// one transaction.
    /// True: nothing to mend, go on with this view's repair.
    fn mend_mysql(&self, s: &mut State, view: &GateView, my: &Mysql) -> bool {
        let lost = self.lost_commits(s, view, my);
        let cancel: Vec<u8> = my
            .orders
            .iter()
            .filter(|o| o.status == Status::Pending && has(&view.released, o.id))
            .map(|o| o.id)
            .collect();
        if lost.is_empty() && cancel.is_empty() {
            return true;
        }
        // restore.rs `restore`: all or nothing, on MySQL as it is now.
        let mut m = s.mysql.clone();
        for o in m.orders.iter_mut() {
            if cancel.contains(&o.id) && o.status == Status::Pending {
                o.status = Status::Cancelled;
                m.stock += 1;
            }
        }
        let fresh: Vec<Order> = lost
            .into_iter()
            .filter(|l| !m.orders.iter().any(|o| o.id == l.id || o.user == l.user))
            .collect();
        let units = fresh.iter().filter(|o| o.status == Status::Pending).count() as u8;
        if units > m.stock {
            // Sold again in MySQL since: nothing restored (an error; the
            // gate stays paused for the operator).
            return false;
        }
        m.stock -= units;
        m.orders.extend(fresh);
        m.orders.sort();
        s.mysql = m;
        false
    }

    /// The rebuild's witness, right after its reads (target.rs
    /// `forget_lost_commits`, `raise_lost_witness`, before the repair's
    /// fault point): a gap nothing kept names taken off, or the witness
    /// raised to MySQL's count. False: the witness moved since the view,
    /// nothing taken off (read again).
    fn mend_witness(&self, s: &mut State, view: &GateView, my: &Mysql) -> bool {
        let gap = usize::from(view.committed).saturating_sub(my.orders.len());
        if gap > 0 && self.lost_commits(s, view, my).is_empty() {
            // lua/forget_commits.lua: only off the witness this view read.
            if s.redis.committed != view.committed {
                return false;
            }
            s.redis.committed -= gap as u8;
        } else if gap == 0 {
            s.raise_witness_to(my.orders.len());
        }
        true
    }

    /// The orders MySQL lost that the stream kept (snapshot.rs
    /// `find_lost_commits`, stream/backlog.rs `acknowledged_orders`): the
    /// newest acknowledged entry of each buyer without an order, then, if
    /// the witness counts more, of users the gate does not know, each as
    /// the gate knows it now (restore.rs `LostState`).
    fn lost_commits(&self, s: &State, view: &GateView, my: &Mysql) -> Vec<Order> {
        let in_mysql = |o: u8| my.orders.iter().any(|x| x.id == o);
        let mut holders: Vec<u8> = my.orders.iter().map(|o| o.user).collect();
        holders.extend(
            view.in_flight
                .iter()
                .filter(|(o, _)| !in_mysql(*o))
                .map(|(_, u)| *u),
        );
        let orphans: Vec<u8> = view
            .buyers
            .iter()
            .copied()
            .filter(|u| !holders.contains(u))
            .collect();
        let newest = |wanted: &dyn Fn(u8) -> bool, limit: usize| -> Vec<(u8, u8)> {
            let mut decided = view.dead.clone();
            let mut out = vec![];
            for &(o, u) in view.acked.iter().rev() {
                if out.len() == limit || decided.contains(&u) {
                    continue;
                }
                decided.push(u);
                if wanted(u) {
                    out.push((o, u));
                }
            }
            out
        };
        let mut found: Vec<(u8, u8)> = newest(&|u| orphans.contains(&u), usize::MAX)
            .into_iter()
            .filter(|(o, _)| !in_mysql(*o))
            .collect();
        let gap = usize::from(view.committed).saturating_sub(my.orders.len());
        let unexplained = gap.saturating_sub(found.len());
        if unexplained > 0 {
            let mut known: Vec<u8> = my.orders.iter().map(|o| o.user).collect();
            known.extend(&orphans);
            known.extend(view.in_flight.iter().map(|(_, u)| *u));
            found.extend(
                newest(&|u| !known.contains(&u), unexplained)
                    .into_iter()
                    .filter(|(o, _)| !in_mysql(*o)),
            );
        }
        found
            .into_iter()
            .map(|(id, user)| {
                let (status, held) = if has(&view.released, id) {
                    (Status::Cancelled, false)
                } else if view.timeouts.contains(&id) && has(&s.due, id) {
                    // Past its deadline: cancelled, its unit still taken
                    // at the gate for the release to come.
                    (Status::Cancelled, false)
                } else if view.timeouts.contains(&id) {
                    (Status::Pending, false)
                } else {
                    (Status::Pending, true)
                };
                Order {
                    id,
                    user,
                    status,
                    held,
                }
            })
            .collect()
    }
}
