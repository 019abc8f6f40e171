//! The model of serving waiting requests across a voucher's buckets
//! (design/buckets.md holes 4 and 5): the mover's round as
//! src/worker/mover.rs takes it (each bucket's line read, the free units
//! allotted to the earliest requests of any bucket by src/worker/
//! allotment.rs's rule, the bound published in each bucket with
//! lua/serve_up_to.lua with the units each bucket lends to the moves,
//! the moves of `fill_the_short` (src/worker/allotment.rs `Filling`),
//! each take counting its giver's lent units down, each bucket's
//! allotted requests served with a give of no units), and what the
//! buckets do meanwhile: newcomers admitted by lua/seckill.lua (bought
//! from the stock less the lent units, or queued when that cannot fill
//! them or a live bound keeps the units for the requests waiting there),
//! and units that come back (a release, lua/release.lua) served to a
//! bucket's own line by lua/lib/waitlist.lua from the stock less the lent
//! units, stopping at a live bound. The faults: the mover killed at any
//! step of its round (its bounds and lent units stay until they lapse) or
//! stopped between rounds (it lifts them and serves each line), a bound
//! and lent units that lapse (the mover stalled past them), a gate that
//! closes and reopens.
//!
//! Left to the mover's model (model/src/mover.rs): a move's three steps,
//! its lease and epoch. A move here is one step, which a sale at the
//! giver may have left short, or a closed gate refused: a gate paused
//! (lua/pause.lua) or on a server nobody has checked
//! (lua/lib/server_checked.lua) refuses takes and gives, and a give
//! refused leaves the units in transit until a later round completes
//! the transfer. The published `units_free` (the free units no request
//! read was allotted) refuses a request its bucket holds some but not
//! enough units for while it is fewer than asked. `even_out` runs after
//! a round's serves, one move a step. Left out: the read's depth of
//! 1,000 requests, clock skew between masters (queued times are one
//! order here), a rebuild that changes a closed gate's state.

use stateright::{Model, Property};

/// src/worker/mover.rs: `even_out` gives to a bucket below the average
/// over this.
const LOW_WATER_DIVISOR: u8 = 2;

/// Marks a round's second plan in `Bound::round` and `State::kept_by`.
const SECOND_PLAN: u8 = 0x80;

/// The rules whose removal the "it bites" test checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fixes {
    /// lib/waitlist.lua serves no request queued after a live bound; off,
    /// a unit that comes back at a bucket goes to its own line in order.
    pub serve_stops_at_bound: bool,
    /// lua/seckill.lua queues a newcomer at a bucket where requests wait
    /// while the bound is live (`held`); off, it sells from the stock.
    pub newcomers_held: bool,
    /// The allotment gives units to every request that fits, and the
    /// mover serves that many; off, only each line's first request, as
    /// the mover did before (a dry bucket's line served one per round).
    pub whole_line_allotted: bool,
    /// A bucket's line is served once every move to it is done; off,
    /// after each move that landed units there.
    pub serve_after_moves: bool,
    /// The round publishes in each bucket the units its moves are to
    /// take from there for requests elsewhere (meta `lent`), which the
    /// takes count down and which lapses with the bound; serves and
    /// newcomers there use the stock less those units. Off, a unit that
    /// comes back at a lending bucket serves a later request there from
    /// the lent units, and a newcomer at a lending bucket with no bound
    /// buys them (finding S1, docs/src/concepts/checked-model.md).
    pub keep_lent: bool,
    /// lua/seckill.lua sells a newcomer only the stock less the lent
    /// units; off, from the whole stock (the rest of `keep_lent` on).
    pub newcomers_leave_lent: bool,
    /// A round none of whose moves was refused or left undelivered evens
    /// out (src/worker/allotment.rs `Filling::cut_short`); off, every
    /// round does, and may move a lender's lent units on (review 42).
    pub no_even_out_after_refusal: bool,
    /// The mover remembers the buckets whose publish answered
    /// "unchecked", or whose give was refused, and plans them as paused
    /// (planning again once when the publish found otherwise), and never
    /// skips a publish as fresh while it remembers one (review 43); off,
    /// it plans on the paused flags it read.
    pub unchecked_planned_paused: bool,
    /// A bucket the round's second publish found unchecked (it closed
    /// between the two) takes no move that round; off, its fill goes on
    /// and the units are left in transit (found by this model).
    pub late_unchecked_not_filled: bool,
    /// The round serves a bucket only if its moves left it the units its
    /// allotted requests take; off, a bucket the fill left short (the
    /// pool's gate closed, a giver found empty) serves its line in order,
    /// and a later request takes units moved for an earlier one (found by
    /// the conformance walks, seed 18).
    pub serve_only_filled: bool,
}

impl Fixes {
    pub const CODE: Fixes = Fixes {
        serve_stops_at_bound: true,
        newcomers_held: true,
        whole_line_allotted: true,
        serve_after_moves: true,
        keep_lent: true,
        newcomers_leave_lent: true,
        no_even_out_after_refusal: true,
        unchecked_planned_paused: true,
        late_unchecked_not_filled: true,
        serve_only_filled: true,
    };
}

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Serving {
    /// Each bucket's stock at the start.
    pub stock: Vec<u8>,
    /// The pool's units at the start.
    pub pool: u8,
    /// The buyers, each at its bucket with the units it asks for; they
    /// come in any order.
    pub arrivals: Vec<(u8, u8)>,
    /// Units that come back (a cancelled order's, at the bucket it was
    /// sold at).
    pub releases: u8,
    /// Rounds the mover runs.
    pub rounds: u8,
    pub crashes: u8,
    /// Stops of the mover between rounds (where it left bounds).
    pub stops: u8,
    /// Bounds that lapse (one bucket's at a time).
    pub lapses: u8,
    /// Gates that close (paused for a rebuild, or found on a server
    /// nobody has checked), one at a time; each reopens (the guard).
    pub closures: u8,
    pub fixes: Fixes,
}

/// A bucket's gate as the scripts see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    Open,
    /// Paused (meta paused = 1, lua/pause.lua): admission answers
    /// "paused", a release defers, takes, gives and serves are refused,
    /// a publish is set; the mover's read sees it.
    Paused,
    /// On a server other than the one its state was last checked on
    /// (lua/lib/server_checked.lua): admission and releases go on, takes,
    /// gives, serves and publishes are refused; the mover's read does not
    /// see it.
    Unchecked,
}

/// Units taken for a move whose receiver did not take them: in transit
/// until a later round completes the transfer (void at the receiver, then
/// back to the giver's stock unless the giver is paused). `young`: left
/// by the round in hand or the one before it (a stale transfer is one
/// older than a round takes: src/worker/mover.rs `complete_stale`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transit {
    pub from: Option<u8>,
    pub to: u8,
    pub units: u8,
    pub young: bool,
}

/// A waiting request: when it was queued (one clock for every bucket)
/// and the units it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Waiting {
    pub queued: u8,
    pub wants: u8,
}

/// A bucket's live bound (meta serve_up_to): the queued time it serves
/// up to; for the property, the requests its round allotted units to (a
/// mask of queued times), and whether units the round counted went
/// where no bound held them (`eaten`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bound {
    pub up_to: u8,
    pub allotted: u32,
    pub eaten: bool,
    /// The round that published it (its `rounds` left, with
    /// `SECOND_PLAN` for the words of its second plan).
    pub round: u8,
}

/// What a round decided from its reads (src/worker/allotment.rs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    /// Per bucket, the units its allotted requests take.
    pub need: Vec<u8>,
    /// Per bucket, how many of its requests are allotted units.
    pub requests: Vec<u8>,
    pub up_to: Option<u8>,
    pub ran_out: bool,
    /// The requests allotted units (a mask of queued times).
    pub allotted: u32,
    /// Per bucket, the units `fill_the_short` takes from it, as read.
    pub lends: Vec<u8>,
    /// The free units no request read was allotted (`unpromised`),
    /// published in every bucket as `units_free`.
    pub unpromised: u8,
    /// The buckets planned as paused (a mask): read paused, or
    /// remembered unchecked; their lines and stock are not counted.
    pub paused: u32,
    /// The buckets whose line the read found requests in (a mask).
    pub waited: u32,
    /// The buckets the mover remembered unchecked when it planned (a
    /// mask): its publish plans again when it finds them otherwise.
    pub remembered: u32,
}

impl Plan {
    /// Some bucket is bounded (`publish_bounds`' `any`).
    fn bounds_any(&self, n: u8) -> bool {
        (0..n as usize).any(|b| self.bound_of(b, false, 0).is_some())
    }

    /// `Allotment::bound_of`, as published by `round`.
    pub fn bound_of(&self, b: usize, eaten: bool, round: u8) -> Option<Bound> {
        let bounded = self.ran_out || self.requests[b] > 0;
        // The first request no unit was left for is whom a unit freed
        // anywhere goes to: held for it as for those allotted.
        let first_unserved = match self.ran_out {
            true => self.up_to.map_or(0, |t| 1 << t),
            false => 0,
        };
        self.up_to.filter(|_| bounded).map(|up_to| Bound {
            up_to,
            allotted: self.allotted | first_unserved,
            eaten,
            round,
        })
    }
}

/// What a round read: each bucket's line, stock and paused flag, and
/// the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Read {
    pub lines: Vec<Vec<Waiting>>,
    pub stock: Vec<u8>,
    pub pool: u8,
    /// Read paused (a mask).
    pub paused: u32,
}

/// Where the mover's round is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Round {
    Idle,
    /// Bucket `next`'s line and stock read next (the pool with bucket 0).
    Reading {
        next: u8,
        read: Read,
    },
    /// Bucket `next`'s bound published next; `short` is
    /// `fill_the_short`'s order, from the lines read, and `fill` its start
    /// on the holdings read. `replanned`: the round planned again after a
    /// publish found its unchecked buckets otherwise (once a round).
    Publishing {
        next: u8,
        plan: Plan,
        short: Vec<u8>,
        fill: Fill,
        read: Read,
        replanned: bool,
    },
    /// `fill_the_short`: its next move.
    Moving {
        plan: Plan,
        short: Vec<u8>,
        fill: Fill,
    },
    /// Bucket `next`'s allotted requests served next.
    Serving {
        next: u8,
        plan: Plan,
        fill: Fill,
    },
    /// `even_out`: bucket `to` is looked at next; `wants`, once the pool
    /// was asked for it, what it still wants from a bucket.
    Evening {
        plan: Plan,
        fill: Fill,
        average: u8,
        to: u8,
        wants: Option<u8>,
    },
}

/// `fill_the_short`'s place: the short bucket it fills (an index of
/// the order), whether the pool was asked for it, and the round's
/// holdings as its moves left them (`paused`: a mask of the buckets
/// planned as paused or found so by a move).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fill {
    pub at: u8,
    pub pool_tried: bool,
    pub stock: Vec<u8>,
    pub pool: u8,
    pub paused: u32,
    /// A move was left undelivered, or a receiver found closed since the
    /// plan was passed (`Filling::cut_short`): no even out.
    pub refused: bool,
}

/// What a move's take and give got (src/worker/allotment.rs `Took`; one
/// mover here, so never fenced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Took {
    Units(u8),
    /// The giver held none, or its gate is closed.
    Short,
    /// Taken, and the receiver's gate refused the give: in transit.
    Undelivered,
}

/// `even_out`'s next move.
enum Even {
    Done,
    /// From the pool, what `to` wants.
    Pool {
        to: usize,
        wants: u8,
    },
    Bucket {
        from: usize,
        to: usize,
        units: u8,
    },
}

/// `fill_the_short`'s next step.
enum Next {
    Done,
    /// On to the next short bucket.
    Skip,
    /// On to the next short bucket: this one was found closed since the
    /// plan, and what the round counted for it stays where it is (no even
    /// out).
    Closed,
    Take {
        from: Option<usize>,
        to: usize,
        units: u8,
    },
}

impl Took {
    fn units(self) -> u8 {
        match self {
            Took::Units(k) => k,
            Took::Short | Took::Undelivered => 0,
        }
    }
}

impl Fill {
    fn next(&self, plan: &Plan, short: &[u8]) -> Next {
        let Some(to) = short.get(self.at as usize).map(|t| *t as usize) else {
            return Next::Done;
        };
        let lacks = plan.need[to].saturating_sub(self.stock[to]);
        if lacks == 0 {
            return Next::Skip;
        }
        if self.is_paused(to) {
            return Next::Closed;
        }
        if !self.pool_tried {
            // A pool that is not usable (bucket 0 paused) is passed: a
            // move of no units, which calls nothing.
            let pool = if self.pool_usable() { self.pool } else { 0 };
            return Next::Take {
                from: None,
                to,
                units: lacks.min(pool),
            };
        }
        let spare = |d: usize| self.stock[d].saturating_sub(plan.need[d]);
        let from = (0..self.stock.len())
            .filter(|d| *d != to && !self.is_paused(*d) && spare(*d) > 0)
            .max_by_key(|d| spare(*d));
        match from {
            None => Next::Skip,
            Some(d) => Next::Take {
                from: Some(d),
                to,
                units: lacks.min(spare(d)),
            },
        }
    }

    fn is_paused(&self, b: usize) -> bool {
        self.paused & (1 << b) != 0
    }

    /// `bucket_look::pool_usable`: bucket 0 is not paused.
    fn pool_usable(&self) -> bool {
        !self.is_paused(0)
    }

    /// A move of the round (the fill's or `even_out`'s) took `took`: the
    /// holdings as `Mover::move_units` keeps them.
    fn took(&mut self, from: Option<usize>, to: usize, took: Took, closed: bool) {
        match (took, from) {
            (Took::Units(k), None) => self.pool -= k,
            (Took::Units(k), Some(d)) => self.stock[d] -= k,
            (Took::Short, None) => self.pool = 0,
            (Took::Short, Some(d)) if closed => {
                self.paused |= 1 << d;
                self.stock[d] = 0;
            }
            // It sold meanwhile and said what it holds: none.
            (Took::Short, Some(d)) => self.stock[d] = 0,
            // The giver's units taken still show (they come back once the
            // transfer is completed); the receiver takes no more.
            (Took::Undelivered, _) => {
                self.paused |= 1 << to;
                self.refused = true;
            }
        }
        if let Took::Units(k) = took {
            self.stock[to] += k;
        }
    }

    /// The fill's move took `took`, the holdings already show it
    /// (`Filling::moved`): a giver found short is passed for the next; a
    /// receiver that did not take the units ends its fill.
    fn moved(&mut self, from: Option<usize>, took: Took) {
        if from.is_none() {
            self.pool_tried = true;
        }
        if took == Took::Undelivered {
            self.skip();
        }
    }

    fn skip(&mut self) {
        self.at += 1;
        self.pool_tried = false;
    }

    /// `even_out`'s next move from bucket `to` on (`wants`: what `to`
    /// still wants once the pool was asked): a bucket nobody waited at
    /// that holds less than the average over `LOW_WATER_DIVISOR` gets
    /// units up to the average, from the pool first (when usable), then
    /// from the bucket nobody waited at that holds the most, of what it
    /// holds above the average.
    fn even_next(&self, plan: &Plan, average: u8, mut to: u8, mut wants: Option<u8>) -> Even {
        let n = self.stock.len() as u8;
        while to < n {
            let b = to as usize;
            let w = match wants {
                Some(w) => w,
                None => {
                    let low = self.stock[b] * LOW_WATER_DIVISOR < average;
                    if !low || self.is_paused(b) || plan.waited & (1 << b) != 0 {
                        to += 1;
                        continue;
                    }
                    let w = average - self.stock[b];
                    if self.pool_usable() && self.pool.min(w) > 0 {
                        return Even::Pool { to: b, wants: w };
                    }
                    w
                }
            };
            let richest = (0..n as usize)
                .filter(|d| *d != b && !self.is_paused(*d) && plan.waited & (1 << d) == 0)
                .max_by_key(|d| self.stock[*d]);
            let spare = richest.map_or(0, |d| self.stock[d].saturating_sub(average));
            if let Some(from) = richest.filter(|_| w > 0 && spare > 0) {
                return Even::Bucket {
                    from,
                    to: b,
                    units: w.min(spare),
                };
            }
            (to, wants) = (to + 1, None);
        }
        Even::Done
    }

    /// What each bucket gives if every move takes what it asks.
    fn lends(mut self, plan: &Plan, short: &[u8]) -> Vec<u8> {
        let mut lends = vec![0; self.stock.len()];
        loop {
            match self.next(plan, short) {
                Next::Done => return lends,
                Next::Skip | Next::Closed => self.skip(),
                Next::Take { from, to, units } => {
                    if let Some(d) = from {
                        lends[d] += units;
                    }
                    self.took(from, to, Took::Units(units), false);
                    self.moved(from, Took::Units(units));
                }
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub stock: Vec<u8>,
    pub pool: u8,
    pub lines: Vec<Vec<Waiting>>,
    pub bounds: Vec<Option<Bound>>,
    /// Per bucket, the live units kept for the round's moves (meta
    /// `lent`): its takes count them down; they lapse with the bound.
    pub lent: Vec<u8>,
    /// Per bucket, the round (its `rounds` left) whose publish there
    /// governs what the bucket serves and sells: the lent units it kept
    /// and the bound it set or lifted. None: never published, or lapsed
    /// since (its units are kept for nobody).
    pub kept_by: Vec<Option<u8>>,
    /// Units sold at each bucket (newcomers and promotions).
    pub sold: Vec<u8>,
    /// The buyers come (a mask of `arrivals`' indexes).
    pub arrived: u32,
    /// The next queued time.
    pub clock: u8,
    pub round: Round,
    /// Since the round's first read, units it may have counted went
    /// where no bound held them.
    pub round_eaten: bool,
    /// The free units this process last published (`Mover::published`,
    /// taken as fresh while they are the same): lost with it.
    pub published: Option<u8>,
    /// Per bucket, the live `units_free` published there: the voucher's
    /// free units no waiting request was allotted.
    pub units_free: Vec<Option<u8>>,
    /// The mover's memory that it left bounds (`Mover::bounded`): lost
    /// with its process.
    pub bounded: bool,
    /// The first unit given to a request while an earlier one a live
    /// bound's round allotted needed it: (given to, deprived).
    pub deprived: Option<(u8, u8)>,
    pub gates: Vec<Gate>,
    /// Units taken for moves their receivers refused.
    pub transit: Vec<Transit>,
    /// The buckets the mover remembers unchecked or refusing (a mask,
    /// `Mover::unchecked`): lost with its process.
    pub unchecked: u32,
    /// The first bucket whose lent units `even_out` took while a request
    /// its round allotted them to still waited.
    pub evened_lent: Option<u8>,
    /// The buckets whose publish this round answered "unchecked" (a
    /// mask).
    pub told_unchecked: u32,
    /// The first bucket a round sent units to, left in transit, after
    /// its publish there answered "unchecked".
    pub sent_unchecked: Option<u8>,
    pub releases: u8,
    pub rounds: u8,
    pub crashes: u8,
    pub stops: u8,
    pub lapses: u8,
    pub closures: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Buyer `i` of `arrivals` presses buy (lua/seckill.lua).
    Arrive(u8),
    /// `units` (1 or 2) come back at bucket `b`, an order of that many or
    /// two of one in one call, and its line is served (lua/release.lua).
    Release(u8, u8),
    /// The mover's round starts (the lease, and transfers left open
    /// completed: the mover's model).
    Start,
    /// A bucket's line read (`look_all`).
    Read,
    /// A bucket's bound published (lua/serve_up_to.lua).
    Publish,
    /// The next move of `fill_the_short`.
    Move,
    /// A bucket's allotted requests served (lua/transfer_give.lua of no
    /// units).
    Serve,
    /// The mover killed: its round ends where it is.
    Crash,
    /// The mover stops between rounds (`Mover::run` told to stop): where
    /// it left bounds it lifts them and the lent units
    /// (`lift_every_bound`), and each bucket where requests wait next to
    /// stock serves its own line, as many requests as it holds units.
    Stop,
    /// Bucket `b`'s bound, lent units and `units_free` lapse (one
    /// `until` for the three).
    Lapse(u8),
    /// Bucket `b`'s gate closes: paused, or found on a server nobody has
    /// checked.
    Close(u8, Gate),
    /// Bucket `b`'s gate reopens (the guard's rebuild or check; its state
    /// as it was).
    Reopen(u8),
}

/// How a give of units is held to the property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Give {
    /// Checked under the bucket's live bound (none: as `Unheld`).
    Held,
    /// A sale at a bucket nobody waits at, which no bound holds: the
    /// bounds of the rounds that counted its units promise nothing more,
    /// unless the units lent from there are kept.
    Unheld,
}

/// Serves waiting requests of `line` from `pool` units in order, each
/// whole or passed over, up to `most` of them and not past `up_to`;
/// returns who was served (lib/waitlist.lua).
fn serve_line(line: &mut Vec<Waiting>, mut pool: u8, most: u8, up_to: Option<u8>) -> Vec<Waiting> {
    let mut served = vec![];
    let mut at = 0;
    while pool > 0 && (served.len() as u8) < most && at < line.len() {
        let head = line[at];
        if up_to.is_some_and(|u| head.queued > u) {
            break;
        }
        if head.wants <= pool {
            line.remove(at);
            pool -= head.wants;
            served.push(head);
        } else {
            at += 1;
        }
    }
    served
}

/// How many of `earlier` (in queued order) `free` units serve, each whole
/// or passed over.
fn fitted(earlier: &[Waiting], mut free: u8) -> usize {
    let mut n = 0;
    for w in earlier {
        if w.wants <= free {
            free -= w.wants;
            n += 1;
        }
    }
    n
}

impl State {
    /// The voucher's free units: every bucket's stock and the pool.
    pub fn free(&self) -> u8 {
        self.stock.iter().sum::<u8>() + self.pool
    }

    /// Units in transit.
    pub fn in_transit(&self) -> u8 {
        self.transit.iter().map(|t| t.units).sum()
    }

    fn open(&self, b: usize) -> bool {
        self.gates[b] == Gate::Open
    }

    /// Some request `plan` allotted units to still waits.
    fn allotted_waiting(&self, plan: &Plan) -> bool {
        self.waiting()
            .any(|(_, w)| plan.allotted & (1 << w.queued) != 0)
    }

    /// Every request waiting, with its bucket.
    fn waiting(&self) -> impl Iterator<Item = (usize, Waiting)> + '_ {
        self.lines
            .iter()
            .enumerate()
            .flat_map(|(b, l)| l.iter().map(move |w| (b, *w)))
    }

    /// The round in hand has read bucket `b`'s units and not yet
    /// published there what it lends from them: a give there may take
    /// units the round counts for a request elsewhere.
    fn counted_unkept(&self, b: usize) -> bool {
        match &self.round {
            Round::Idle | Round::Moving { .. } | Round::Serving { .. } | Round::Evening { .. } => {
                false
            }
            Round::Reading { next, .. } => (b as u8) < *next,
            Round::Publishing { next, .. } => (b as u8) >= *next,
        }
    }

    /// Before `wants` free units go to a request queued at `queued` at
    /// bucket `b`: under a live bound there, no request its round
    /// allotted units to and still waiting, queued earlier, may be left
    /// unable to be served by what stays free.
    ///
    /// A sale at a bucket nobody waits at (design/buckets.md hole 4) is
    /// not held: it may take a unit that came back, which a bound that
    /// ran out promises to the first request no unit was left for.
    /// Where requests wait but no live bound holds the give (a bucket
    /// that only lends, or none of whose requests a round allotted):
    /// with the lent units kept, it takes none the round that last
    /// published there counted, so it is held to that round's live
    /// bounds elsewhere (not to an earlier round's, still live where
    /// this one has not published yet: this round re-planned). Without
    /// them, in the window between the round's read of the bucket and
    /// its publish there, or once the bucket's bound lapsed, it may take
    /// units a round counted for its allotted requests. Then its moves
    /// come up short, and the rule is not kept for them.
    fn give(&mut self, fixes: Fixes, b: usize, queued: u8, wants: u8, kind: Give) {
        let checked: Vec<Bound> = match (self.bounds[b], self.kept_by[b]) {
            (Some(bound), _) if kind == Give::Held => vec![bound],
            (None, Some(round))
                if kind == Give::Held && fixes.keep_lent && !self.counted_unkept(b) =>
            {
                self.bounds
                    .iter()
                    .flatten()
                    .filter(|x| x.round == round)
                    .copied()
                    .collect()
            }
            _ => {
                // A round counted these units if it read this bucket
                // already.
                self.round_eaten |= match &self.round {
                    Round::Idle => false,
                    Round::Reading { next, .. } => (b as u8) < *next,
                    _ => true,
                };
                self.eat_every_bound();
                return;
            }
        };
        if self.deprived.is_some() {
            return;
        }
        for bound in checked.into_iter().filter(|x| !x.eaten) {
            let mut earlier: Vec<Waiting> = self
                .waiting()
                .map(|(_, w)| w)
                .filter(|w| w.queued < queued && bound.allotted & (1 << w.queued) != 0)
                .collect();
            earlier.sort_unstable();
            // Units in transit come back (to their giver) once the
            // transfer is completed: nobody later takes them meanwhile.
            let free = self.free() + self.in_transit();
            if fitted(&earlier, free) > fitted(&earlier, free.saturating_sub(wants)) {
                let first = earlier
                    .iter()
                    .find(|w| w.wants <= free)
                    .map_or(0, |w| w.queued);
                self.deprived = Some((queued, first));
                return;
            }
        }
    }

    /// Units a round counted went where no bound holds them: the live
    /// bounds promise nothing more.
    fn eat_every_bound(&mut self) {
        for other in self.bounds.iter_mut().flatten() {
            other.eaten = true;
        }
    }

    /// Bucket `b` serves its line from its stock less the units kept for
    /// the round's moves (a release, or the mover's serve), up to `most`
    /// requests, under its live bound.
    fn serve(&mut self, fixes: Fixes, b: usize, most: u8) {
        let up_to = match fixes.serve_stops_at_bound {
            true => self.bounds[b].map(|x| x.up_to),
            false => None,
        };
        let kept = self.lent[b].min(self.stock[b]);
        let mut line = self.lines[b].clone();
        let served = serve_line(&mut line, self.stock[b] - kept, most, up_to);
        for w in &served {
            self.give(fixes, b, w.queued, w.wants, Give::Held);
            self.lines[b].retain(|x| x != w);
            self.stock[b] -= w.wants;
            self.sold[b] += w.wants;
        }
    }

    /// Moves up to `units` from bucket `from` (None: the pool, whose
    /// gate is bucket 0's) to `to` in one step: the take
    /// (lua/transfer_take.lua), then the give (lua/transfer_give.lua) and
    /// the settle, or, the receiver closed, the units left in transit.
    /// Returns what it took, and whether a take found its giver closed.
    fn transfer(&mut self, from: Option<usize>, to: usize, units: u8) -> (Took, bool) {
        if units == 0 {
            // The mover calls nothing for no units.
            return (Took::Units(0), false);
        }
        if !self.open(from.unwrap_or(0)) {
            return (Took::Short, true);
        }
        let held = match from {
            None => &mut self.pool,
            Some(d) => &mut self.stock[d],
        };
        let moved = units.min(*held);
        if moved == 0 {
            return (Took::Short, false);
        }
        *held -= moved;
        // What is left kept, within the stock left.
        if let Some(d) = from {
            self.lent[d] = self.lent[d].saturating_sub(moved).min(self.stock[d]);
        }
        if !self.open(to) {
            self.transit.push(Transit {
                from: from.map(|d| d as u8),
                to: to as u8,
                units: moved,
                young: true,
            });
            return (Took::Undelivered, false);
        }
        self.stock[to] += moved;
        (Took::Units(moved), false)
    }

    /// `Mover::complete_stale` at a round's start: each transfer left in
    /// transit before the round before this one is called off at its
    /// receiver and its units go back to the giver's stock, unless the
    /// giver is paused (it stays in transit); younger ones wait.
    fn complete_stale(&mut self) {
        let mut left = vec![];
        for t in std::mem::take(&mut self.transit) {
            let giver = t.from.map_or(0, usize::from);
            if t.young || self.gates[giver] == Gate::Paused {
                left.push(Transit { young: false, ..t });
                continue;
            }
            match t.from {
                None => self.pool += t.units,
                Some(d) => self.stock[d as usize] += t.units,
            }
        }
        self.transit = left;
    }
}

impl Serving {
    fn buckets(&self) -> usize {
        self.stock.len()
    }

    pub fn initial(&self) -> State {
        let n = self.buckets();
        State {
            stock: self.stock.clone(),
            pool: self.pool,
            lines: vec![vec![]; n],
            bounds: vec![None; n],
            lent: vec![0; n],
            kept_by: vec![None; n],
            units_free: vec![None; n],
            sold: vec![0; n],
            arrived: 0,
            clock: 0,
            round: Round::Idle,
            round_eaten: false,
            published: None,
            bounded: false,
            deprived: None,
            gates: vec![Gate::Open; n],
            transit: vec![],
            unchecked: 0,
            evened_lent: None,
            told_unchecked: 0,
            sent_unchecked: None,
            releases: self.releases,
            rounds: self.rounds,
            crashes: self.crashes,
            stops: self.stops,
            lapses: self.lapses,
            closures: self.closures,
        }
    }

    /// src/worker/allotment.rs `allot` on what the round read, the
    /// buckets of `paused` (a mask) left out, and the pool with bucket 0
    /// (`bucket_look::pool_usable`).
    pub fn allot(&self, lines: &[Vec<Waiting>], stock: &[u8], pool: u8, paused: u32) -> Plan {
        let n = lines.len();
        let open = |b: usize| paused & (1 << b) == 0;
        let waited = (0..n)
            .filter(|b| !lines[*b].is_empty())
            .fold(0, |m, b| m | 1 << b);
        let mut plan = Plan {
            need: vec![0; n],
            requests: vec![0; n],
            up_to: None,
            ran_out: false,
            allotted: 0,
            lends: vec![0; n],
            unpromised: 0,
            paused,
            waited,
            remembered: 0,
        };
        let mut entries: Vec<(u8, usize, u8)> = lines
            .iter()
            .enumerate()
            .filter(|(b, _)| open(*b))
            .flat_map(|(b, l)| {
                let first = match self.fixes.whole_line_allotted {
                    true => l.len(),
                    false => 1,
                };
                l.iter().take(first).map(move |w| (w.queued, b, w.wants))
            })
            .collect();
        let pool = if open(0) { pool } else { 0 };
        let mut free = pool + (0..n).filter(|b| open(*b)).map(|b| stock[b]).sum::<u8>();
        plan.unpromised = free;
        if entries.is_empty() {
            return plan;
        }
        entries.sort_unstable();
        let mut last = None;
        for (queued, b, wants) in entries {
            if free == 0 {
                plan.up_to = Some(queued);
                plan.ran_out = true;
                plan.unpromised = 0;
                return plan;
            }
            if wants <= free {
                plan.need[b] += wants;
                plan.requests[b] += 1;
                plan.allotted |= 1 << queued;
                free -= wants;
                last = Some(queued);
            }
        }
        plan.up_to = last;
        plan.unpromised = free;
        plan
    }

    /// `fill_the_short`'s order: the buckets whose allotted requests lack
    /// units, the one whose line's first request is earliest first.
    fn short(&self, plan: &Plan, lines: &[Vec<Waiting>], stock: &[u8]) -> Vec<u8> {
        let mut short: Vec<u8> = (0..self.buckets())
            .filter(|b| plan.need[*b] > stock[*b])
            .map(|b| b as u8)
            .collect();
        short.sort_by_key(|b| lines[*b as usize].first().map_or(u8::MAX, |w| w.queued));
        short
    }

    /// The round's plan from what it read, with the buckets the mover
    /// remembers unchecked planned as paused, to publish; or, with no
    /// bound to set, none left and its last word fresh, nothing written
    /// and the round on to `even_out`.
    fn plan(&self, s: &State, read: &Read, replanned: bool) -> Round {
        let n = self.buckets() as u8;
        let paused = read.paused | s.unchecked;
        let mut plan = self.allot(&read.lines, &read.stock, read.pool, paused);
        plan.remembered = s.unchecked;
        let fill = Fill {
            at: 0,
            pool_tried: false,
            stock: read.stock.clone(),
            pool: read.pool,
            paused,
            refused: false,
        };
        let fresh = s.published == Some(plan.unpromised) && s.unchecked == 0;
        if !plan.bounds_any(n) && !s.bounded && fresh {
            // No write (`publish_bounds`), no request to fill or serve:
            // the round goes on to `even_out`.
            return self.evening(plan, fill);
        }
        let short = self.short(&plan, &read.lines, &read.stock);
        plan.lends = fill.clone().lends(&plan, &short);
        Round::Publishing {
            next: 0,
            plan,
            short,
            fill,
            read: read.clone(),
            replanned,
        }
    }

    /// `even_out`'s start, on the round's holdings.
    fn evening(&self, plan: Plan, fill: Fill) -> Round {
        let total = fill.stock.iter().sum::<u8>() + fill.pool;
        Round::Evening {
            plan,
            fill,
            average: total / self.buckets() as u8,
            to: 0,
            wants: None,
        }
    }

    /// One move of the round, by the fill (`fill_the_short`) or by
    /// `even_out`; the holdings in `fill` as it left them.
    fn move_units(
        &self,
        s: &mut State,
        fill: &mut Fill,
        from: Option<usize>,
        to: usize,
        units: u8,
    ) -> Took {
        let held = match from {
            None => fill.pool,
            Some(d) => fill.stock[d],
        };
        let (took, closed) = s.transfer(from, to, units.min(held));
        if took == Took::Undelivered {
            if s.told_unchecked & (1 << to) != 0 {
                s.sent_unchecked.get_or_insert(to as u8);
            }
            // A refused give: planned as paused until the next publish
            // there says which.
            if self.fixes.unchecked_planned_paused {
                s.unchecked |= 1 << to;
            }
        }
        fill.took(from, to, took, closed);
        took
    }

    /// One step of the mover's round.
    fn mover_step(&self, s: &mut State) {
        let fixes = self.fixes;
        let n = self.buckets() as u8;
        match std::mem::replace(&mut s.round, Round::Idle) {
            Round::Idle => {
                s.rounds -= 1;
                s.round_eaten = false;
                s.told_unchecked = 0;
                s.complete_stale();
                s.round = Round::Reading {
                    next: 0,
                    read: Read::default(),
                };
            }
            Round::Reading { next, mut read } => {
                let b = next as usize;
                read.lines.push(s.lines[b].clone());
                read.stock.push(s.stock[b]);
                if s.gates[b] == Gate::Paused {
                    read.paused |= 1 << b;
                }
                if next == 0 {
                    read.pool = s.pool;
                }
                if next + 1 < n {
                    s.round = Round::Reading {
                        next: next + 1,
                        read,
                    };
                    return;
                }
                s.round = self.plan(s, &read, false);
            }
            Round::Publishing {
                next,
                plan,
                short,
                fill,
                read,
                replanned,
            } => {
                let b = next as usize;
                // A second plan's words are another round's: they
                // supersede the first's where they are published.
                let round = s.rounds | if replanned { SECOND_PLAN } else { 0 };
                if s.gates[b] == Gate::Unchecked {
                    // lua/serve_up_to.lua: nothing written.
                    s.told_unchecked |= 1 << b;
                    if fixes.unchecked_planned_paused {
                        s.unchecked |= 1 << b;
                    }
                } else {
                    s.unchecked &= !(1 << b);
                    s.bounds[b] = plan.bound_of(b, s.round_eaten, round);
                    if fixes.keep_lent {
                        s.lent[b] = plan.lends[b];
                    }
                    s.units_free[b] = Some(plan.unpromised);
                    s.kept_by[b] = Some(round);
                }
                if next + 1 < n {
                    s.round = Round::Publishing {
                        next: next + 1,
                        plan,
                        short,
                        fill,
                        read,
                        replanned,
                    };
                    return;
                }
                s.bounded = plan.bounds_any(n);
                s.published = Some(plan.unpromised);
                // The publish found the unchecked buckets otherwise than
                // the plan took them: planned again, once.
                if fixes.unchecked_planned_paused && s.unchecked != plan.remembered && !replanned {
                    s.round = self.plan(s, &read, true);
                    return;
                }
                let mut fill = fill;
                if fixes.late_unchecked_not_filled {
                    fill.paused |= s.unchecked;
                }
                s.round = Round::Moving { plan, short, fill };
            }
            Round::Moving {
                plan,
                short,
                mut fill,
            } => {
                match fill.next(&plan, &short) {
                    Next::Done => {
                        s.round = Round::Serving {
                            next: 0,
                            plan,
                            fill,
                        };
                        return;
                    }
                    Next::Skip => fill.skip(),
                    Next::Closed => {
                        fill.refused = true;
                        fill.skip();
                    }
                    Next::Take { from, to, units } => {
                        let took = self.move_units(s, &mut fill, from, to, units);
                        fill.moved(from, took);
                        if matches!(took, Took::Units(k) if k > 0) && !fixes.serve_after_moves {
                            s.serve(fixes, to, plan.requests[to]);
                        }
                    }
                }
                s.round = Round::Moving { plan, short, fill };
            }
            Round::Serving { next, plan, fill } => {
                let b = next as usize;
                // lua/transfer_give.lua of no units: refused at a closed
                // gate.
                let filled = !fixes.serve_only_filled || fill.stock[b] >= plan.need[b];
                if plan.requests[b] > 0 && s.open(b) && filled {
                    s.serve(fixes, b, plan.requests[b]);
                }
                if next + 1 < n {
                    s.round = Round::Serving {
                        next: next + 1,
                        plan,
                        fill,
                    };
                    return;
                }
                if fixes.no_even_out_after_refusal && fill.refused {
                    return;
                }
                s.round = self.evening(plan, fill);
            }
            Round::Evening {
                plan,
                mut fill,
                average,
                to,
                wants,
            } => {
                let (to, wants) = match fill.even_next(&plan, average, to, wants) {
                    Even::Done => return,
                    Even::Pool { to, wants } => {
                        let took = self.move_units(s, &mut fill, None, to, wants);
                        match fill.is_paused(to) {
                            true => (to + 1, None),
                            false => (to, Some(wants - took.units())),
                        }
                    }
                    Even::Bucket { from, to, units } => {
                        if s.lent[from] > 0
                            && s.stock[from] > 0
                            && s.open(from)
                            && s.allotted_waiting(&plan)
                        {
                            s.evened_lent.get_or_insert(from as u8);
                        }
                        self.move_units(s, &mut fill, Some(from), to, units);
                        (to + 1, None)
                    }
                };
                s.round = Round::Evening {
                    plan,
                    fill,
                    average,
                    to: to as u8,
                    wants,
                };
            }
        }
    }

    /// The buyer's admission at its bucket (lua/seckill.lua's stock path).
    fn arrive(&self, s: &mut State, i: usize) {
        let (b, wants) = self.arrivals[i];
        let b = b as usize;
        s.arrived |= 1 << i;
        let queued = s.clock;
        s.clock += 1;
        let kept = match self.fixes.newcomers_leave_lent {
            true => s.lent[b].min(s.stock[b]),
            false => 0,
        };
        let left = s.stock[b] - kept;
        let held = self.fixes.newcomers_held
            && left > 0
            && s.bounds[b].is_some()
            && !s.lines[b].is_empty();
        // A request the bucket holds some units for but not enough is
        // refused ("not enough stock", nothing written) while the mover's
        // last word is that fewer units are free than it asks; lapsed or
        // enough, it waits for the mover.
        let elsewhere = s.units_free[b].is_none_or(|f| f >= wants);
        if left > 0 && !held && left < wants && !elsewhere {
            return;
        }
        if left == 0 || held || left < wants {
            s.lines[b].push(Waiting { queued, wants });
            return;
        }
        // A bucket nobody waits at sells to newcomers until the next
        // round moves its units (design/buckets.md hole 4): only a sale
        // beside waiting requests is held to the rule.
        let kind = match s.lines[b].is_empty() {
            true => Give::Unheld,
            false => Give::Held,
        };
        s.give(self.fixes, b, queued, wants, kind);
        s.stock[b] -= wants;
        s.sold[b] += wants;
    }

    /// What the next `Move` asks: units from bucket `from` (None: the
    /// pool) to `to`. None: it moves nothing (on to the next bucket, or
    /// to the serves).
    pub fn move_of(&self, s: &State) -> Option<(Option<usize>, usize, u8)> {
        let (from, to, units, fill) = match &s.round {
            Round::Moving { plan, short, fill } => match fill.next(plan, short) {
                Next::Take { from, to, units } => (from, to, units, fill),
                Next::Done | Next::Skip | Next::Closed => return None,
            },
            Round::Evening {
                plan,
                fill,
                average,
                to,
                wants,
            } => match fill.even_next(plan, *average, *to, *wants) {
                Even::Pool { to, wants } => (None, to, wants, fill),
                Even::Bucket { from, to, units } => (Some(from), to, units, fill),
                Even::Done => return None,
            },
            _ => return None,
        };
        // No more than the holdings show (`Mover::move_units`).
        let held = match from {
            None => fill.pool,
            Some(d) => fill.stock[d],
        };
        Some((from, to, units.min(held)))
    }

    /// The faults stop and the mover runs: every gate reopens (the
    /// guard), the mover's round goes to its end, then `rounds` whole
    /// ones; nobody new comes, nothing comes back.
    pub fn settled(&self, s: &State, rounds: u8) -> State {
        let mut r = s.clone();
        r.rounds = u8::MAX;
        r.gates.fill(Gate::Open);
        while r.round != Round::Idle {
            self.mover_step(&mut r);
        }
        for _ in 0..rounds {
            self.mover_step(&mut r);
            while r.round != Round::Idle {
                self.mover_step(&mut r);
            }
        }
        r
    }
}

impl Model for Serving {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // A paused gate answers a buyer "paused" (it tries again once
        // open) and defers a release.
        for (i, (b, _)) in self.arrivals.iter().enumerate() {
            if s.arrived & (1 << i) == 0 && s.gates[*b as usize] != Gate::Paused {
                actions.push(Action::Arrive(i as u8));
            }
        }
        if s.releases > 0 {
            for b in 0..self.buckets() {
                if s.gates[b] == Gate::Paused {
                    continue;
                }
                for units in 1..=s.sold[b].min(2) {
                    actions.push(Action::Release(b as u8, units));
                }
            }
        }
        match s.round {
            Round::Idle if s.rounds > 0 => actions.push(Action::Start),
            Round::Idle => {}
            Round::Reading { .. } => actions.push(Action::Read),
            Round::Publishing { .. } => actions.push(Action::Publish),
            Round::Moving { .. } | Round::Evening { .. } => actions.push(Action::Move),
            Round::Serving { .. } => actions.push(Action::Serve),
        }
        if s.crashes > 0 && s.round != Round::Idle {
            actions.push(Action::Crash);
        }
        // With no bound left, a stop lifts and serves nothing (a restart
        // between rounds, as a kill then).
        if s.stops > 0 && s.round == Round::Idle && s.bounded {
            actions.push(Action::Stop);
        }
        if s.lapses > 0 {
            for b in 0..self.buckets() {
                if s.bounds[b].is_some() || s.lent[b] > 0 || s.units_free[b].is_some() {
                    actions.push(Action::Lapse(b as u8));
                }
            }
        }
        for b in 0..self.buckets() {
            match s.gates[b] {
                Gate::Open if s.closures > 0 => {
                    actions.push(Action::Close(b as u8, Gate::Paused));
                    actions.push(Action::Close(b as u8, Gate::Unchecked));
                }
                Gate::Open => {}
                Gate::Paused | Gate::Unchecked => actions.push(Action::Reopen(b as u8)),
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Arrive(i) => self.arrive(&mut s, i as usize),
            Action::Release(b, units) => {
                let b = b as usize;
                s.releases -= 1;
                s.sold[b] -= units;
                s.stock[b] += units;
                s.serve(self.fixes, b, u8::MAX);
            }
            Action::Start | Action::Read | Action::Publish | Action::Move | Action::Serve => {
                self.mover_step(&mut s)
            }
            Action::Crash => {
                s.crashes -= 1;
                s.round = Round::Idle;
                s.bounded = false;
                s.published = None;
                s.unchecked = 0;
            }
            Action::Close(b, gate) => {
                s.closures -= 1;
                s.gates[b as usize] = gate;
            }
            Action::Reopen(b) => s.gates[b as usize] = Gate::Open,
            Action::Stop => {
                s.stops -= 1;
                // An unchecked gate refuses the lift (its bound lapses),
                // and a closed one the serve.
                for b in 0..self.buckets() {
                    if s.gates[b] != Gate::Unchecked {
                        s.bounds[b] = None;
                        s.lent[b] = 0;
                        s.kept_by[b] = None;
                    }
                }
                for b in 0..self.buckets() {
                    let most = (s.lines[b].len() as u8).min(s.stock[b]);
                    if most > 0 && s.open(b) {
                        s.serve(self.fixes, b, most);
                    }
                }
                s.bounded = false;
                s.published = None;
                s.unchecked = 0;
            }
            Action::Lapse(b) => {
                s.lapses -= 1;
                s.bounds[b as usize] = None;
                s.lent[b as usize] = 0;
                s.units_free[b as usize] = None;
                // Its word aged past the bound's life: the mover's next
                // round finds it stale and publishes again.
                s.published = None;
                s.kept_by[b as usize] = None;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always(
                "units conserved (free + in transit + sold = total)",
                |m, s| {
                    let total = m.stock.iter().sum::<u8>() + m.pool;
                    s.free() + s.in_transit() + s.sold.iter().sum::<u8>() == total
                },
            ),
            Property::<Self>::always(
                "no unit a live bound holds for a request goes to a later one",
                |_, s| s.deprived.is_none(),
            ),
            Property::<Self>::always(
                "even_out moves no unit lent to a request still waiting",
                |_, s| s.evened_lent.is_none(),
            ),
            Property::<Self>::always(
                "no unit is sent to a bucket the round's publish found unchecked",
                |_, s| s.sent_unchecked.is_none(),
            ),
            Property::<Self>::always(
                "once the faults stop, the mover's rounds leave no request waiting that the free units fit",
                |m, s| {
                    // A transfer left in transit comes back at the
                    // second round's start.
                    let r = m.settled(s, 3);
                    let free = r.free();
                    let fits = r.waiting().any(|(_, w)| w.wants <= free);
                    !fits
                },
            ),
        ]
    }
}
