//! The model of the mover between a voucher's buckets (design/buckets.md
//! §3, src/worker/mover.rs): its lease and epoch (lua/mover_lease.lua),
//! a move's three steps, take, give and settle (lua/transfer_take.lua,
//! transfer_give.lua, transfer_settle.lua, as src/gate/transfer.rs calls
//! them), the completion of a transfer a stopped mover left open (the
//! receiver asked first, lua/transfer_void.lua, then the giver settled),
//! and sales at the buckets drawing on their stock. The faults: a mover
//! killed at any step, a mover that stalls past its lease and goes on
//! with its old epoch, and a script call delivered twice (a client's
//! retry after a lost answer, or a copy held up on the wire and run
//! later).
//!
//! Checked on its own: the buckets' sale path, the worker and payments
//! draw on the stock as sales do here (one unit leaves a bucket's stock
//! by one script) and give units back by the release the sale's model
//! holds to the code; the mover's bound on serving lines
//! (lua/serve_up_to.lua) orders who is served, not how many units exist:
//! model/src/serving.rs models it.
//!
//! The gate guard's rebuild of a bucket that lost writes (src/worker/
//! guard.rs `rebuild_bucket`, src/reconcile/buckets.rs `read_bucket`):
//! the bucket paused, the mover held still and every bucket fenced
//! (lua/mover_lease.lua seize and fence), its stock counted as MySQL's
//! free units less every unit elsewhere, each place read at its own
//! moment while the other buckets sell on, the reads rechecked, the
//! stock written and the gate reopened, the hold given back. The bucket
//! here lost nothing, so a count that comes out high makes units (the
//! property breaks) and one that comes out low holds them back
//! (`held_back`, given back by a later recount, not modelled). The
//! guard may be killed (its hold runs out later) or stall past its hold.

use stateright::{Model, Property};

/// The fixes the reviews found holes without (design/buckets.md §8, hole
/// 1); the "it bites" test turns each off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fixes {
    /// A transfer a stopped mover left open is called off at the receiver
    /// (lua/transfer_void.lua writes `void` where no `given` is) before
    /// the giver takes its units back; off, the completion reads the
    /// receiver and settles as void when it finds nothing, and a late give
    /// lands the units a second time.
    pub void_marker: bool,
    /// A take refuses an id at or below the giver's highest (`last`) that
    /// has no open record (lua/transfer_take.lua, code 4); off, a take
    /// delivered again after its transfer settled takes the units again,
    /// into a record the receiver already says is given.
    pub take_refuses_stale_ids: bool,
    /// The receiver keeps every transfer id it answered for, for the
    /// voucher's life (design/buckets.md: no floor, no trims); off, a
    /// settled transfer's id is trimmed from `received`, and a give
    /// delivered again lands the units a second time.
    pub received_kept: bool,
    /// Takes and gives of a mover older than the gate has seen are refused
    /// (lua/lib/mover_epoch.lua). Not one of hole 1's: only the gate
    /// guard's count of a bucket needs it, which `model/tests/mover.rs`
    /// checks.
    pub epoch_fence: bool,
    /// The guard's seize raises bucket 0's epoch far and fences every
    /// bucket with it (lua/mover_lease.lua seize, fence); off, the hold
    /// alone keeps the next lease from being taken, and a mover whose
    /// round began before it moves on under its old epoch.
    pub seize_fences: bool,
    /// After its reads the count checks its hold is still live
    /// (`mover_lease::holds`); off, a hold that ran out during the reads
    /// lets a mover take the lease at an epoch above the fence and move
    /// units between buckets read at different moments.
    pub hold_rechecked: bool,
    /// MySQL is read after the buckets (`read_gates`: every gate's Redis
    /// first); off, before them, and a sale between the two reads is
    /// counted nowhere.
    pub mysql_read_last: bool,
    /// The pool and the units in transit are read again after the buckets
    /// and must not have moved; off, they are read once.
    pub transit_reread: bool,
}

impl Fixes {
    pub const CODE: Fixes = Fixes {
        void_marker: true,
        take_refuses_stale_ids: true,
        received_kept: true,
        epoch_fence: true,
        seize_fences: true,
        hold_rechecked: true,
        mysql_read_last: true,
        transit_reread: true,
    };
}

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Moving {
    /// The voucher's units, split as preload splits them: each bucket
    /// `units / buckets`, the rest in the pool.
    pub units: u8,
    pub buckets: u8,
    pub movers: u8,
    /// Transfers taken in all (transfer ids handed out).
    pub transfers: u8,
    /// The most units one move asks for.
    pub want: u8,
    pub crashes: u8,
    /// Leases that run out under a live mover (it stalls and goes on).
    pub lapses: u8,
    /// Script calls delivered twice: a copy run later (`Duplicate`,
    /// `Deliver`), or a resend whose answer the mover acts on (`Again`).
    pub duplicates: u8,
    /// Buckets the gate guard pauses and rebuilds, one after another (0:
    /// no guard).
    pub rebuilds: u8,
    pub fixes: Fixes,
}

/// A mover epoch (a seize raises it by `SEIZE_RAISE` each time, and a
/// count seizes again at each attempt).
pub type Epoch = u16;

/// A side of a transfer: 0 is the pool, 1 + b is bucket b.
pub type Side = u8;
pub const POOL: Side = 0;

/// What a receiver recorded of a transfer (`received`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Landing {
    Given,
    Void,
}

/// A giver's open transfer record: id, receiver, units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    pub id: u8,
    pub to: Side,
    pub units: u8,
}

/// What one side holds in Redis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holding {
    /// Free units: a bucket's stock, or the pool.
    pub units: u8,
    /// Open transfers (`transfers`, the pool's `pool_transfers`), by id.
    pub open: Vec<Record>,
    /// The highest id ever taken (`last`; 0: none).
    pub last: u8,
    /// Transfers received (`received`), by id.
    pub received: Vec<(u8, Landing)>,
}

/// A script call as a mover sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Take {
        from: Side,
        to: Side,
        id: u8,
        want: u8,
        epoch: Epoch,
    },
    Give {
        from: Side,
        to: Side,
        id: u8,
        units: u8,
        epoch: Epoch,
    },
    Settle {
        from: Side,
        id: u8,
        landing: Landing,
    },
    Void {
        from: Side,
        to: Side,
        id: u8,
    },
}

/// A script's answer, as the mover reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// A take: the units taken (a replay of an open record: its units),
    /// or refused.
    Taken(Result<u8, Refusal>),
    /// A give or a void: what the receiver says of the transfer, or a
    /// refused give (fenced: the units stay in transit).
    Landed(Result<Landing, Refusal>),
    /// A settle.
    Settled(Settlement),
}

/// What a settle did (lua/transfer_settle.lua).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Settlement {
    /// The record went: these units back in the giver (0 for a given
    /// transfer).
    Back(u8),
    /// No record was open.
    NoRecord,
    /// A void transfer's giver is paused: the record stays, in transit.
    Paused,
}

/// Why a take or a give is refused (lua/transfer_take.lua's order of
/// checks: the id, the epoch, the pause, the stock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    StaleId,
    Fenced,
    /// The gate is paused (being rebuilt); the pool's is bucket 0's.
    Paused,
    Short,
}

/// Where a mover is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Between moves: its round may start one.
    Idle,
    /// Taken (`between_take_and_give`): the give next.
    Taken {
        from: Side,
        to: Side,
        id: u8,
        units: u8,
    },
    /// A stale open record read (`complete_stale`'s HGETALL): its void
    /// at the receiver next; the record may be settled meanwhile.
    Completing { from: Side, to: Side, id: u8 },
    /// The receiver answered (a give, or a completion's void): the
    /// giver's settle next.
    Answered {
        from: Side,
        id: u8,
        landing: Landing,
    },
}

impl Step {
    /// The mover's next step after `call` answered `answer`
    /// (src/worker/mover.rs: a take's units are given, a give's or void's
    /// landing settled, anything refused left for a later round).
    pub fn after(call: Call, answer: Answer) -> Step {
        match (call, answer) {
            (Call::Take { from, to, id, .. }, Answer::Taken(Ok(units))) => Step::Taken {
                from,
                to,
                id,
                units,
            },
            (
                Call::Give { from, id, .. } | Call::Void { from, id, .. },
                Answer::Landed(Ok(landing)),
            ) => Step::Answered { from, id, landing },
            _ => Step::Idle,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mover {
    /// Its process: a kill starts the next (a lease of the last one is
    /// not this one's).
    pub incarnation: u8,
    /// The epoch of the lease this round runs under; 0: no round (the
    /// next one takes or renews the lease first).
    pub epoch: Epoch,
    pub step: Step,
    /// Its last script call, which the wire may deliver again.
    pub last_call: Option<Call>,
    /// Its last action was that call: a resend's answer may still be the
    /// one it acts on (`Again`).
    pub answer_pending: bool,
}

/// The gate guard's lease holder name in the model (`holder`'s mover).
pub const GUARD: u8 = u8::MAX;

/// How far a seize raises bucket 0's epoch (2^20 in lua/mover_lease.lua):
/// above any a mover holds within the bounds.
pub const SEIZE_RAISE: Epoch = 16;

/// A read of the guard's count of a paused bucket, in the order
/// src/reconcile/buckets.rs `read_bucket` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Read {
    /// The units in transit and the pool (`transit_and_pool`).
    TransitAndPool,
    /// Another bucket's stock (its witness).
    Bucket(Side),
    /// MySQL's units sold (`read_mysql`).
    Mysql,
    /// The pool and transit again: moved, the reads start over.
    Again,
    /// The hold still live (`mover_lease::holds`): else the count is
    /// given up and seized again.
    Hold,
}

/// What the count has read so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tally {
    pub transit: u8,
    pub pool: u8,
    /// The other buckets' stock read.
    pub others: u8,
    pub sold: u8,
}

/// Where the gate guard is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Count {
    /// No rebuild in hand.
    Watching,
    /// A bucket paused: the seize next.
    Seizing,
    /// Seized at `epoch`: bucket `next`'s fence next.
    Fencing { next: u8, epoch: Epoch },
    /// Read `next` of the count's reads next.
    Reading { next: u8, tally: Tally },
    /// Every read taken: the stock written and the gate reopened next.
    Counted { tally: Tally },
    /// The hold given back next.
    Unseizing,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Guard {
    /// Its process: a kill starts the next, whose owner token differs.
    pub incarnation: u8,
    pub step: Count,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The pool, then each bucket.
    pub sides: Vec<Holding>,
    /// Each bucket's meta `mover_epoch` (the pool's is bucket 0's).
    pub epochs: Vec<Epoch>,
    /// The lease's holder (bucket 0's meta `mover`): a mover and its
    /// incarnation; None before the first.
    pub holder: Option<(u8, u8)>,
    /// The lease has not run out. One that ran out is taken over by
    /// another owner (a new epoch) or renewed by its holder (the same).
    pub lease_live: bool,
    pub movers: Vec<Mover>,
    /// A call delivered again later.
    pub wire: Option<Call>,
    pub sold: u8,
    pub next_id: u8,
    pub guard: Guard,
    /// The bucket the guard paused (a side), if any.
    pub paused: Option<Side>,
    /// The guard's hold on the mover (`mover_holds`): the incarnation that
    /// seized, and whether it is live.
    pub hold: Option<(u8, bool)>,
    /// Units a count came out low by: off the stock, owed to a recount.
    pub held_back: u8,
    pub rebuilds: u8,
    pub crashes: u8,
    pub lapses: u8,
    pub duplicates: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// lua/mover_lease.lua take (or renew) at a round's start; refused
    /// while another owner's lease is live.
    Lease(u8),
    /// The round ends: the next one takes or renews the lease.
    EndRound(u8),
    /// A move: lua/transfer_take.lua of up to `want` units, from a giver
    /// the round read (its stock may be gone since: short).
    Move {
        mover: u8,
        from: Side,
        to: Side,
        want: u8,
    },
    /// lua/transfer_give.lua of the units taken.
    Give(u8),
    /// lua/transfer_settle.lua as the receiver answered.
    Settle(u8),
    /// A stale open transfer read (src/worker/mover.rs `complete_stale`),
    /// to complete: its void next.
    Complete { mover: u8, from: Side, id: u8 },
    /// lua/transfer_void.lua at the receiver (`transfer::complete`'s
    /// first step), its settle next.
    Void(u8),
    /// A sale at bucket `b` (1 + b as a side) draws one unit.
    Sell(Side),
    /// The mover killed (kill -9); its lease runs out later.
    Crash(u8),
    /// The lease runs out: a dead mover's, or a live one's that stalled.
    Lapse,
    /// The mover's last call is delivered again, later; its answer goes
    /// nowhere.
    Duplicate(u8),
    /// The copy on the wire runs now.
    Deliver,
    /// The mover's last call, just answered, is resent and the mover acts
    /// on the second answer (a client's retry after a lost answer:
    /// src/store/redis_conn.rs's `script_resent` fault).
    Again(u8),
    /// The gate guard pauses bucket side `b`: it lost writes (lua/pause.lua).
    Pause(Side),
    /// lua/mover_lease.lua seize: the hold, and bucket 0's epoch raised.
    Seize,
    /// lua/mover_lease.lua fence of the next bucket.
    Fence,
    /// The count's next read.
    Read,
    /// The stock set from the count and the gate reopened.
    Repair,
    /// lua/mover_lease.lua unseize.
    Unseize,
    /// The guard killed; its hold runs out later.
    GuardCrash,
    /// The hold runs out: a killed guard's, or a live one's that stalled.
    HoldLapse,
}

impl Holding {
    fn open_record(&self, id: u8) -> Option<Record> {
        self.open.iter().copied().find(|r| r.id == id)
    }

    fn landing(&self, id: u8) -> Option<Landing> {
        self.received
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, landing)| *landing)
    }

    fn receive(&mut self, id: u8, landing: Landing) {
        self.received.push((id, landing));
        self.received.sort_unstable();
    }
}

impl State {
    /// Units taken by a giver and not landed at the receiver: records
    /// whose receiver has no `given` (between give and settle a
    /// transfer's units are the receiver's; src/gate/transfer.rs
    /// `in_transit`).
    pub fn in_transit(&self) -> u8 {
        self.sides
            .iter()
            .flat_map(|h| h.open.iter())
            .filter(|r| self.sides[r.to as usize].landing(r.id) != Some(Landing::Given))
            .map(|r| r.units)
            .sum()
    }

    pub fn free(&self) -> u8 {
        self.sides.iter().map(|h| h.units).sum()
    }

    /// The epoch a side's meta has seen.
    pub fn epoch_of(&self, side: Side) -> Epoch {
        self.epochs[meta_of(side)]
    }

    fn see_epoch(&mut self, side: Side, epoch: Epoch) {
        let seen = &mut self.epochs[meta_of(side)];
        *seen = (*seen).max(epoch);
    }

    fn fenced(&self, fixes: Fixes, side: Side, epoch: Epoch) -> bool {
        fixes.epoch_fence && epoch < self.epoch_of(side)
    }

    /// A side's gate is paused (the pool's meta is bucket 0's).
    pub fn paused_at(&self, side: Side) -> bool {
        self.paused.is_some_and(|b| meta_of(b) == meta_of(side))
    }

    /// The guard's hold is live.
    pub fn hold_live(&self) -> bool {
        self.hold.is_some_and(|(_, live)| live)
    }

    /// The lease's holder is a mover whose process died.
    fn holder_dead(&self) -> bool {
        self.holder
            .is_some_and(|(m, inc)| m != GUARD && self.movers[m as usize].incarnation != inc)
    }

    /// No mover mid-move, nothing on the wire, no bucket paused.
    pub fn quiet(&self) -> bool {
        self.wire.is_none()
            && self.movers.iter().all(|m| m.step == Step::Idle)
            && self.guard.step == Count::Watching
            && self.paused.is_none()
    }

    /// Whether mover `m` (its incarnation now) holds the lease.
    fn holds(&self, m: u8) -> bool {
        self.holder == Some((m, self.movers[m as usize].incarnation))
    }

    /// lua/transfer_take.lua.
    fn take(
        &mut self,
        fixes: Fixes,
        from: Side,
        to: Side,
        id: u8,
        want: u8,
        epoch: Epoch,
    ) -> Answer {
        let giver = &self.sides[from as usize];
        if let Some(r) = giver.open_record(id) {
            return Answer::Taken(Ok(r.units));
        }
        if fixes.take_refuses_stale_ids && giver.last != 0 && id <= giver.last {
            return Answer::Taken(Err(Refusal::StaleId));
        }
        if self.fenced(fixes, from, epoch) {
            return Answer::Taken(Err(Refusal::Fenced));
        }
        if self.paused_at(from) {
            return Answer::Taken(Err(Refusal::Paused));
        }
        if giver.units == 0 {
            return Answer::Taken(Err(Refusal::Short));
        }
        let units = giver.units.min(want);
        let giver = &mut self.sides[from as usize];
        giver.units -= units;
        giver.open.push(Record { id, to, units });
        giver.open.sort_unstable();
        giver.last = id;
        self.see_epoch(from, epoch);
        Answer::Taken(Ok(units))
    }

    /// lua/transfer_give.lua.
    fn give(&mut self, fixes: Fixes, to: Side, id: u8, units: u8, epoch: Epoch) -> Answer {
        if let Some(prior) = self.sides[to as usize].landing(id) {
            return Answer::Landed(Ok(prior));
        }
        if self.fenced(fixes, to, epoch) {
            return Answer::Landed(Err(Refusal::Fenced));
        }
        if self.paused_at(to) {
            return Answer::Landed(Err(Refusal::Paused));
        }
        let receiver = &mut self.sides[to as usize];
        receiver.receive(id, Landing::Given);
        receiver.units += units;
        self.see_epoch(to, epoch);
        Answer::Landed(Ok(Landing::Given))
    }

    /// lua/transfer_settle.lua.
    fn settle(&mut self, fixes: Fixes, from: Side, id: u8, landing: Landing) -> Answer {
        let Some(record) = self.sides[from as usize].open_record(id) else {
            return Answer::Settled(Settlement::NoRecord);
        };
        if landing == Landing::Void && self.paused_at(from) {
            return Answer::Settled(Settlement::Paused);
        }
        let giver = &mut self.sides[from as usize];
        giver.open.retain(|r| r.id != id);
        let back = match landing {
            Landing::Void => record.units,
            Landing::Given => 0,
        };
        giver.units += back;
        if !fixes.received_kept && landing == Landing::Given {
            // The old design's trim: once settled, the receiver forgets.
            self.sides[record.to as usize]
                .received
                .retain(|(i, _)| *i != id);
        }
        Answer::Settled(Settlement::Back(back))
    }

    /// lua/transfer_void.lua: what the receiver says of the transfer,
    /// called off there when it had not landed.
    fn void(&mut self, fixes: Fixes, to: Side, id: u8) -> Answer {
        let receiver = &mut self.sides[to as usize];
        let landing = match receiver.landing(id) {
            Some(landing) => landing,
            None => {
                if fixes.void_marker {
                    receiver.receive(id, Landing::Void);
                }
                Landing::Void
            }
        };
        Answer::Landed(Ok(landing))
    }

    /// Runs `call` (the script it names) and answers as it does.
    pub fn call(&mut self, fixes: Fixes, call: Call) -> Answer {
        match call {
            Call::Take {
                from,
                to,
                id,
                want,
                epoch,
            } => self.take(fixes, from, to, id, want, epoch),
            Call::Give {
                to,
                id,
                units,
                epoch,
                ..
            } => self.give(fixes, to, id, units, epoch),
            Call::Settle { from, id, landing } => self.settle(fixes, from, id, landing),
            Call::Void { to, id, .. } => self.void(fixes, to, id),
        }
    }

    /// Mover `m` sends `call` and steps on its answer.
    fn send(&mut self, fixes: Fixes, m: u8, call: Call) {
        let answer = self.call(fixes, call);
        let mover = &mut self.movers[m as usize];
        mover.last_call = Some(call);
        mover.answer_pending = true;
        mover.step = Step::after(call, answer);
    }
}

/// The meta a side's scripts check: the pool lives on bucket 0's.
fn meta_of(side: Side) -> usize {
    side.saturating_sub(1) as usize
}

impl Moving {
    pub fn initial(&self) -> State {
        let share = self.units / self.buckets;
        let mut sides = vec![Holding {
            units: self.units - share * self.buckets,
            open: vec![],
            last: 0,
            received: vec![],
        }];
        for _ in 0..self.buckets {
            sides.push(Holding {
                units: share,
                ..sides[0].clone()
            });
        }
        State {
            sides,
            epochs: vec![0; self.buckets as usize],
            holder: None,
            lease_live: false,
            movers: vec![
                Mover {
                    incarnation: 0,
                    epoch: 0,
                    step: Step::Idle,
                    last_call: None,
                    answer_pending: false,
                };
                self.movers as usize
            ],
            wire: None,
            sold: 0,
            next_id: 1,
            guard: Guard {
                incarnation: 0,
                step: Count::Watching,
            },
            paused: None,
            hold: None,
            held_back: 0,
            rebuilds: self.rebuilds,
            crashes: self.crashes,
            lapses: self.lapses,
            duplicates: self.duplicates,
        }
    }

    /// The sides, the pool first.
    fn sides(&self) -> std::ops::Range<Side> {
        0..self.buckets + 1
    }

    /// The reads of the count of paused bucket side `b`, in order.
    pub fn reads(&self, b: Side) -> Vec<Read> {
        let fixes = self.fixes;
        let mut reads = vec![Read::TransitAndPool];
        if !fixes.mysql_read_last {
            reads.push(Read::Mysql);
        }
        reads.extend((1..self.buckets + 1).filter(|k| *k != b).map(Read::Bucket));
        if fixes.mysql_read_last {
            reads.push(Read::Mysql);
        }
        if fixes.transit_reread {
            reads.push(Read::Again);
        }
        if fixes.hold_rechecked {
            reads.push(Read::Hold);
        }
        reads
    }

    /// The guard's next step: the count's next read taken.
    fn read(&self, s: &mut State, next: u8, mut tally: Tally) {
        let Some(b) = s.paused else { return };
        let reads = self.reads(b);
        match reads[next as usize] {
            Read::TransitAndPool => {
                tally.transit = s.in_transit();
                tally.pool = s.sides[POOL as usize].units;
            }
            Read::Bucket(k) => tally.others += s.sides[k as usize].units,
            Read::Mysql => tally.sold = s.sold,
            Read::Again => {
                if (s.in_transit(), s.sides[POOL as usize].units) != (tally.transit, tally.pool) {
                    // Moved: the next attempt seizes again (`Target::read`).
                    s.guard.step = Count::Seizing;
                    return;
                }
            }
            Read::Hold => {
                if s.hold != Some((s.guard.incarnation, true)) {
                    s.guard.step = Count::Seizing;
                    return;
                }
            }
        }
        s.guard.step = match next as usize + 1 == reads.len() {
            true => Count::Counted { tally },
            false => Count::Reading {
                next: next + 1,
                tally,
            },
        };
    }

    /// The guard's steps and faults.
    fn guard_actions(&self, s: &State, actions: &mut Vec<Action>) {
        match s.guard.step {
            // The last bucket: bucket 0's rebuild also folds the pool into
            // its stock first (lua/pool_fold.lua), not modelled.
            Count::Watching if s.rebuilds > 0 => actions.push(Action::Pause(self.buckets)),
            Count::Watching => {}
            Count::Seizing => actions.push(Action::Seize),
            Count::Fencing { .. } => actions.push(Action::Fence),
            Count::Reading { .. } => actions.push(Action::Read),
            Count::Counted { .. } => actions.push(Action::Repair),
            Count::Unseizing => actions.push(Action::Unseize),
        }
        if s.crashes > 0 && s.guard.step != Count::Watching {
            actions.push(Action::GuardCrash);
        }
        if let Some((inc, true)) = s.hold {
            if inc != s.guard.incarnation || s.lapses > 0 {
                actions.push(Action::HoldLapse);
            }
        }
    }

    /// The guard's step `action`; false: not one of the guard's.
    fn guard_step(&self, s: &mut State, action: Action) -> bool {
        let inc = s.guard.incarnation;
        let after_hold = |s: &State| match s.paused {
            Some(_) => Count::Seizing,
            None => Count::Watching,
        };
        match action {
            Action::Pause(b) => {
                s.rebuilds -= 1;
                s.paused = Some(b);
                s.guard.step = Count::Seizing;
            }
            Action::Seize => {
                if s.hold.is_some_and(|(other, live)| live && other != inc) {
                    // Another's hold: a later pass tries again.
                    return true;
                }
                if self.fixes.seize_fences {
                    s.epochs[0] += SEIZE_RAISE;
                }
                let epoch = s.epochs[0];
                s.holder = Some((GUARD, inc));
                s.lease_live = true;
                s.hold = Some((inc, true));
                s.guard.step = match self.fixes.seize_fences && self.buckets > 1 {
                    true => Count::Fencing { next: 1, epoch },
                    false => Count::Reading {
                        next: 0,
                        tally: Tally::default(),
                    },
                };
            }
            Action::Fence => {
                let Count::Fencing { next, epoch } = s.guard.step else {
                    return true;
                };
                let seen = &mut s.epochs[next as usize];
                *seen = (*seen).max(epoch);
                s.guard.step = match next + 1 == self.buckets {
                    true => Count::Reading {
                        next: 0,
                        tally: Tally::default(),
                    },
                    false => Count::Fencing {
                        next: next + 1,
                        epoch,
                    },
                };
            }
            Action::Read => {
                if let Count::Reading { next, tally } = s.guard.step {
                    self.read(s, next, tally);
                }
            }
            Action::Repair => {
                let (Count::Counted { tally }, Some(b)) = (s.guard.step, s.paused) else {
                    return true;
                };
                // MySQL's free units less every unit elsewhere.
                let share = self
                    .units
                    .saturating_sub(tally.sold)
                    .saturating_sub(tally.transit)
                    .saturating_sub(tally.pool)
                    .saturating_sub(tally.others);
                let stock = &mut s.sides[b as usize].units;
                // Low: held back. High: what an earlier count held back
                // comes back (a recount); beyond that, units made (the
                // property breaks).
                match share <= *stock {
                    true => s.held_back += *stock - share,
                    false => s.held_back -= (share - *stock).min(s.held_back),
                }
                *stock = share;
                s.paused = None;
                s.guard.step = Count::Unseizing;
            }
            Action::Unseize => {
                if s.hold.is_some_and(|(owner, _)| owner == inc) {
                    s.hold = None;
                }
                if s.holder == Some((GUARD, inc)) {
                    s.holder = None;
                    s.lease_live = false;
                }
                s.guard.step = after_hold(s);
            }
            Action::GuardCrash => {
                s.crashes -= 1;
                s.guard.incarnation += 1;
                s.guard.step = after_hold(s);
            }
            Action::HoldLapse => {
                let Some((owner, _)) = s.hold else {
                    return true;
                };
                if owner == inc {
                    s.lapses -= 1;
                }
                s.hold = Some((owner, false));
                // The seize's lease runs out with it.
                if s.holder == Some((GUARD, owner)) {
                    s.lease_live = false;
                }
            }
            _ => return false,
        }
        true
    }

    /// Every transfer still open, completed as a mover's round completes
    /// stale ones (src/gate/transfer.rs `complete`): the state a round at
    /// rest leaves.
    pub fn completed(&self, s: &State) -> State {
        let mut r = s.clone();
        for from in self.sides() {
            for record in s.sides[from as usize].open.clone() {
                if let Answer::Landed(Ok(landing)) = r.void(self.fixes, record.to, record.id) {
                    r.settle(self.fixes, from, record.id, landing);
                }
            }
        }
        r
    }
}

impl Model for Moving {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (m, mover) in s.movers.iter().enumerate() {
            let m = m as u8;
            match mover.step {
                // The round's first step, granted or refused.
                Step::Idle if mover.epoch == 0 => actions.push(Action::Lease(m)),
                Step::Idle => {
                    actions.push(Action::EndRound(m));
                    for from in self.sides() {
                        for r in &s.sides[from as usize].open {
                            actions.push(Action::Complete {
                                mover: m,
                                from,
                                id: r.id,
                            });
                        }
                    }
                    if s.next_id <= self.transfers {
                        for from in self.sides() {
                            for to in 1..self.buckets + 1 {
                                if to == from {
                                    continue;
                                }
                                for want in 1..=self.want {
                                    actions.push(Action::Move {
                                        mover: m,
                                        from,
                                        to,
                                        want,
                                    });
                                }
                            }
                        }
                    }
                }
                Step::Taken { .. } => actions.push(Action::Give(m)),
                Step::Completing { .. } => actions.push(Action::Void(m)),
                Step::Answered { .. } => actions.push(Action::Settle(m)),
            }
            if s.crashes > 0 && (mover.step != Step::Idle || mover.epoch != 0) {
                actions.push(Action::Crash(m));
            }
            if s.duplicates > 0 && mover.last_call.is_some() {
                if s.wire.is_none() {
                    actions.push(Action::Duplicate(m));
                }
                if mover.answer_pending {
                    actions.push(Action::Again(m));
                }
            }
        }
        // The seize's lease runs out with its hold (HoldLapse).
        let mover_holds = s.holder.is_some_and(|(m, _)| m != GUARD);
        if s.lease_live && mover_holds && (s.holder_dead() || s.lapses > 0) {
            actions.push(Action::Lapse);
        }
        for b in 1..self.buckets + 1 {
            if s.sides[b as usize].units > 0 && !s.paused_at(b) {
                actions.push(Action::Sell(b));
            }
        }
        self.guard_actions(s, actions);
        if s.wire.is_some() {
            actions.push(Action::Deliver);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let fixes = self.fixes;
        // Any step of a mover but a resend acts on the answer it has.
        let acting = match action {
            Action::Lease(m)
            | Action::EndRound(m)
            | Action::Give(m)
            | Action::Settle(m)
            | Action::Void(m)
            | Action::Crash(m) => Some(m),
            Action::Move { mover, .. } | Action::Complete { mover, .. } => Some(mover),
            _ => None,
        };
        if let Some(m) = acting {
            s.movers[m as usize].answer_pending = false;
        }
        if self.guard_step(&mut s, action) {
            return Some(s);
        }
        match action {
            Action::Lease(m) => {
                if s.hold_live() || s.lease_live && !s.holds(m) {
                    // A hold keeps any mover from taking or renewing it.
                    // Or another owner's live lease: refused.
                    return Some(s);
                }
                if !s.holds(m) {
                    // A takeover raises bucket 0's epoch.
                    s.epochs[0] += 1;
                    s.holder = Some((m, s.movers[m as usize].incarnation));
                }
                s.lease_live = true;
                s.movers[m as usize].epoch = s.epochs[0];
            }
            Action::EndRound(m) => s.movers[m as usize].epoch = 0,
            Action::Move {
                mover,
                from,
                to,
                want,
            } => {
                let call = Call::Take {
                    from,
                    to,
                    id: s.next_id,
                    want,
                    epoch: s.movers[mover as usize].epoch,
                };
                s.next_id += 1;
                s.send(fixes, mover, call);
            }
            Action::Give(m) => {
                let Step::Taken {
                    from,
                    to,
                    id,
                    units,
                } = s.movers[m as usize].step
                else {
                    return None;
                };
                let epoch = s.movers[m as usize].epoch;
                let call = Call::Give {
                    from,
                    to,
                    id,
                    units,
                    epoch,
                };
                s.send(fixes, m, call);
            }
            Action::Settle(m) => {
                let Step::Answered { from, id, landing } = s.movers[m as usize].step else {
                    return None;
                };
                s.send(fixes, m, Call::Settle { from, id, landing });
            }
            Action::Complete { mover, from, id } => {
                let to = s.sides[from as usize].open_record(id)?.to;
                s.movers[mover as usize].step = Step::Completing { from, to, id };
            }
            Action::Void(m) => {
                let Step::Completing { from, to, id } = s.movers[m as usize].step else {
                    return None;
                };
                s.send(fixes, m, Call::Void { from, to, id });
            }
            Action::Sell(b) => {
                s.sides[b as usize].units -= 1;
                s.sold += 1;
            }
            Action::Crash(m) => {
                s.crashes -= 1;
                let mover = &mut s.movers[m as usize];
                *mover = Mover {
                    incarnation: mover.incarnation + 1,
                    epoch: 0,
                    step: Step::Idle,
                    last_call: None,
                    answer_pending: false,
                };
            }
            Action::Lapse => {
                if !s.holder_dead() {
                    s.lapses -= 1;
                }
                s.lease_live = false;
            }
            Action::Duplicate(m) => {
                s.duplicates -= 1;
                s.wire = s.movers[m as usize].last_call;
            }
            Action::Deliver => {
                let call = s.wire.take()?;
                s.call(fixes, call);
            }
            Action::Again(m) => {
                s.duplicates -= 1;
                let call = s.movers[m as usize].last_call?;
                let answer = s.call(fixes, call);
                let mover = &mut s.movers[m as usize];
                mover.answer_pending = false;
                mover.step = Step::after(call, answer);
            }
            // The guard's, taken above.
            Action::Pause(_)
            | Action::Seize
            | Action::Fence
            | Action::Read
            | Action::Repair
            | Action::Unseize
            | Action::GuardCrash
            | Action::HoldLapse => return None,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        // The demarcation rule: a unit is in one place at every instant,
        // so none is sold twice and none is lost.
        // A count that comes out low holds units back; one that comes out
        // high makes them, and this breaks.
        vec![Property::<Self>::always(
            "units conserved (free + in transit + sold + held back = total)",
            |m, s| s.free() + s.in_transit() + s.sold + s.held_back == m.units,
        )]
    }
}
