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
//! and lent units that lapse (the mover stalled past them).
//!
//! Left to the mover's model (model/src/mover.rs): a move's three steps,
//! its lease and epoch. A move here is one step, which a sale at the
//! giver may have left short. The published `units_free` (the free
//! units no request read was allotted) refuses a request its bucket holds
//! some but not enough units for while it is fewer than asked. Left out:
//! `even_out` (it moves units to buckets nobody waited at when read,
//! only after a fill no refused move cut short: then none the
//! allotment counted; docs/src/concepts/checked-model.md), a paused
//! bucket, the read's depth of 1,000 requests, clock skew between
//! masters (queued times are one order here).

use stateright::{Model, Property};

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
}

impl Fixes {
    pub const CODE: Fixes = Fixes {
        serve_stops_at_bound: true,
        newcomers_held: true,
        whole_line_allotted: true,
        serve_after_moves: true,
        keep_lent: true,
        newcomers_leave_lent: true,
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
    pub fixes: Fixes,
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
    /// The round that published it (its `rounds` left).
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

/// Where the mover's round is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Round {
    Idle,
    /// Bucket `next`'s line and stock read next (the pool with bucket 0).
    Reading {
        next: u8,
        lines: Vec<Vec<Waiting>>,
        stock: Vec<u8>,
        pool: u8,
    },
    /// Bucket `next`'s bound published next; `short` is
    /// `fill_the_short`'s order, from the lines read, and `fill` its start
    /// on the holdings read.
    Publishing {
        next: u8,
        plan: Plan,
        short: Vec<u8>,
        fill: Fill,
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
    },
}

/// `fill_the_short`'s place: the short bucket it fills (an index of
/// the order), whether the pool was asked for it, and the round's
/// holdings as its moves left them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fill {
    pub at: u8,
    pub pool_tried: bool,
    pub stock: Vec<u8>,
    pub pool: u8,
}

/// `fill_the_short`'s next step.
enum Next {
    Done,
    /// On to the next short bucket.
    Skip,
    Take {
        from: Option<usize>,
        to: usize,
        units: u8,
    },
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
        if !self.pool_tried {
            return Next::Take {
                from: None,
                to,
                units: lacks.min(self.pool),
            };
        }
        let spare = |d: usize| self.stock[d].saturating_sub(plan.need[d]);
        let from = (0..self.stock.len())
            .filter(|d| *d != to && spare(*d) > 0)
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

    /// `moved` units went as `next` asked.
    fn moved(&mut self, from: Option<usize>, to: usize, moved: u8) {
        match from {
            None => {
                self.pool_tried = true;
                self.pool -= moved;
            }
            // Nothing from a bucket: the take found it short (it sold
            // meanwhile) and said what it holds, none; the next giver is
            // asked (`Took::Short`).
            Some(d) if moved == 0 => self.stock[d] = 0,
            Some(d) => self.stock[d] -= moved,
        }
        self.stock[to] += moved;
    }

    fn skip(&mut self) {
        self.at += 1;
        self.pool_tried = false;
    }

    /// What each bucket gives if every move takes what it asks.
    fn lends(mut self, plan: &Plan, short: &[u8]) -> Vec<u8> {
        let mut lends = vec![0; self.stock.len()];
        loop {
            match self.next(plan, short) {
                Next::Done => return lends,
                Next::Skip => self.skip(),
                Next::Take { from, to, units } => {
                    if let Some(d) = from {
                        lends[d] += units;
                    }
                    self.moved(from, to, units);
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
    pub releases: u8,
    pub rounds: u8,
    pub crashes: u8,
    pub stops: u8,
    pub lapses: u8,
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
            Round::Idle | Round::Moving { .. } | Round::Serving { .. } => false,
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
            let free = self.free();
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

    /// Moves up to `units` from bucket `from` (None: the pool) to `to` in
    /// one step; what the giver still holds. Returns the units moved.
    fn transfer(&mut self, from: Option<usize>, to: usize, units: u8) -> u8 {
        let held = match from {
            None => &mut self.pool,
            Some(d) => &mut self.stock[d],
        };
        let moved = units.min(*held);
        *held -= moved;
        self.stock[to] += moved;
        // lua/transfer_take.lua: what is left kept, within the stock left.
        if let Some(d) = from.filter(|_| moved > 0) {
            self.lent[d] = self.lent[d].saturating_sub(moved).min(self.stock[d]);
        }
        moved
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
            releases: self.releases,
            rounds: self.rounds,
            crashes: self.crashes,
            stops: self.stops,
            lapses: self.lapses,
        }
    }

    /// src/worker/allotment.rs `allot` on what the round read.
    pub fn allot(&self, lines: &[Vec<Waiting>], stock: &[u8], pool: u8) -> Plan {
        let n = lines.len();
        let mut plan = Plan {
            need: vec![0; n],
            requests: vec![0; n],
            up_to: None,
            ran_out: false,
            allotted: 0,
            lends: vec![0; n],
            unpromised: 0,
        };
        let mut entries: Vec<(u8, usize, u8)> = lines
            .iter()
            .enumerate()
            .flat_map(|(b, l)| {
                let first = match self.fixes.whole_line_allotted {
                    true => l.len(),
                    false => 1,
                };
                l.iter().take(first).map(move |w| (w.queued, b, w.wants))
            })
            .collect();
        let mut free = pool + stock.iter().sum::<u8>();
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

    /// One step of the mover's round.
    fn mover_step(&self, s: &mut State) {
        let fixes = self.fixes;
        let n = self.buckets() as u8;
        match std::mem::replace(&mut s.round, Round::Idle) {
            Round::Idle => {
                s.rounds -= 1;
                s.round_eaten = false;
                s.round = Round::Reading {
                    next: 0,
                    lines: vec![],
                    stock: vec![],
                    pool: 0,
                };
            }
            Round::Reading {
                next,
                mut lines,
                mut stock,
                mut pool,
            } => {
                lines.push(s.lines[next as usize].clone());
                stock.push(s.stock[next as usize]);
                if next == 0 {
                    pool = s.pool;
                }
                if next + 1 < n {
                    s.round = Round::Reading {
                        next: next + 1,
                        lines,
                        stock,
                        pool,
                    };
                    return;
                }
                let mut plan = self.allot(&lines, &stock, pool);
                if !plan.bounds_any(n) && !s.bounded && s.published == Some(plan.unpromised) {
                    // No bound to set, none left, and its last word
                    // fresh: no write (`publish_bounds`).
                    return;
                }
                let short = self.short(&plan, &lines, &stock);
                let fill = Fill {
                    at: 0,
                    pool_tried: false,
                    stock,
                    pool,
                };
                plan.lends = fill.clone().lends(&plan, &short);
                s.round = Round::Publishing {
                    next: 0,
                    plan,
                    short,
                    fill,
                };
            }
            Round::Publishing {
                next,
                plan,
                short,
                fill,
            } => {
                s.bounds[next as usize] = plan.bound_of(next as usize, s.round_eaten, s.rounds);
                if fixes.keep_lent {
                    s.lent[next as usize] = plan.lends[next as usize];
                }
                s.units_free[next as usize] = Some(plan.unpromised);
                s.kept_by[next as usize] = Some(s.rounds);
                if next + 1 < n {
                    s.round = Round::Publishing {
                        next: next + 1,
                        plan,
                        short,
                        fill,
                    };
                    return;
                }
                s.bounded = plan.bounds_any(n);
                s.published = Some(plan.unpromised);
                s.round = Round::Moving { plan, short, fill };
            }
            Round::Moving {
                plan,
                short,
                mut fill,
            } => {
                match fill.next(&plan, &short) {
                    Next::Done => {
                        s.round = Round::Serving { next: 0, plan };
                        return;
                    }
                    Next::Skip => fill.skip(),
                    Next::Take { from, to, units } => {
                        let moved = s.transfer(from, to, units);
                        fill.moved(from, to, moved);
                        if moved > 0 && !fixes.serve_after_moves {
                            s.serve(fixes, to, plan.requests[to]);
                        }
                    }
                }
                s.round = Round::Moving { plan, short, fill };
            }
            Round::Serving { next, plan } => {
                let b = next as usize;
                if plan.requests[b] > 0 {
                    s.serve(fixes, b, plan.requests[b]);
                }
                if next + 1 < n {
                    s.round = Round::Serving {
                        next: next + 1,
                        plan,
                    };
                }
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
        let Round::Moving { plan, short, fill } = &s.round else {
            return None;
        };
        match fill.next(plan, short) {
            Next::Take { from, to, units } => Some((from, to, units)),
            Next::Done | Next::Skip => None,
        }
    }

    /// The faults stop and the mover runs: its round to its end, then
    /// `rounds` whole ones; nobody new comes, nothing comes back.
    pub fn settled(&self, s: &State, rounds: u8) -> State {
        let mut r = s.clone();
        r.rounds = u8::MAX;
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
        for i in 0..self.arrivals.len() {
            if s.arrived & (1 << i) == 0 {
                actions.push(Action::Arrive(i as u8));
            }
        }
        if s.releases > 0 {
            for b in 0..self.buckets() {
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
            Round::Moving { .. } => actions.push(Action::Move),
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
            }
            Action::Stop => {
                s.stops -= 1;
                for b in 0..self.buckets() {
                    s.bounds[b] = None;
                    s.lent[b] = 0;
                    s.kept_by[b] = None;
                }
                for b in 0..self.buckets() {
                    let most = (s.lines[b].len() as u8).min(s.stock[b]);
                    if most > 0 {
                        s.serve(self.fixes, b, most);
                    }
                }
                s.bounded = false;
                s.published = None;
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
                "units conserved (free + sold = total)",
                |m, s| {
                    let total = m.stock.iter().sum::<u8>() + m.pool;
                    s.free() + s.sold.iter().sum::<u8>() == total
                },
            ),
            Property::<Self>::always(
                "no unit a live bound holds for a request goes to a later one",
                |_, s| s.deprived.is_none(),
            ),
            Property::<Self>::always(
                "once the faults stop, the mover's rounds leave no request waiting that the free units fit",
                |m, s| {
                    let r = m.settled(s, 2);
                    let free = r.free();
                    let fits = r.waiting().any(|(_, w)| w.wants <= free);
                    !fits
                },
            ),
        ]
    }
}
