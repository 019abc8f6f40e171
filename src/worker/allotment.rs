//! Which waiting requests a voucher's free units go to, across its buckets:
//! first come, first served by queued time (design/buckets.md hole 4). The
//! mover reads every bucket's line, this decides, the mover moves and
//! serves. Pure, so the rule is tested without a server.

use std::borrow::Borrow;

/// One bucket's waiting line as the mover read it.
#[derive(Debug, Clone, Default)]
pub struct Line {
    /// Free units at the bucket.
    pub stock: i64,
    /// Paused (being rebuilt): it neither serves nor gives.
    pub paused: bool,
    /// The first waiting requests, in order: queued time (µs of its
    /// master's TIME) and units wanted.
    pub waiting: Vec<(f64, i64)>,
    /// `waiting` is the whole line (not cut at the read's depth).
    pub seen_all: bool,
}

/// What the free units are for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Allotment {
    /// Per bucket, the units its allotted requests take.
    pub need: Vec<i64>,
    /// Per bucket, how many of its requests are allotted units.
    pub requests: Vec<usize>,
    /// The queued time up to which buckets serve their own lines: the
    /// first request no unit is left for (a unit freed anywhere is for
    /// it), or else the last one allotted (the units moved for them are
    /// theirs until served). None: nobody waits at an open bucket.
    pub up_to: Option<f64>,
    /// No unit is left for `up_to`: it bounds every bucket. Otherwise it
    /// bounds only the buckets with requests allotted, and the others
    /// serve and sell as they would alone (a bound there would keep units
    /// no request read fits from newcomers, for nobody).
    pub ran_out: bool,
}

impl Allotment {
    /// Some request is allotted units: the mover has work.
    pub fn any(&self) -> bool {
        self.requests.iter().any(|r| *r > 0)
    }

    /// The bound bucket `b` is to serve up to, if any.
    pub fn bound_of(&self, b: usize) -> Option<f64> {
        let bounded = self.ran_out || self.requests.get(b).is_some_and(|r| *r > 0);
        self.up_to.filter(|_| bounded)
    }
}

/// Gives the `pool`'s units and the open buckets' stock to the waiting
/// requests of every open bucket, earliest queued first, each whole or
/// passed over (it keeps its place and a later one that fits is served, as
/// a release serves one line). Requests after the shortest line that was
/// cut are not considered: an unread one of that line may have come first.
pub fn allot<L: Borrow<Line>>(lines: &[L], pool: i64) -> Allotment {
    let n = lines.len();
    let lines: Vec<&Line> = lines.iter().map(Borrow::borrow).collect();
    let mut out = Allotment {
        need: vec![0; n],
        requests: vec![0; n],
        up_to: None,
        ran_out: false,
    };
    let horizon = lines
        .iter()
        .filter(|l| !l.paused && !l.seen_all)
        .filter_map(|l| l.waiting.last().map(|(t, _)| *t))
        .reduce(f64::min);
    let mut entries: Vec<(f64, usize, i64)> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.paused)
        .flat_map(|(b, l)| l.waiting.iter().map(move |(t, k)| (*t, b, *k)))
        .filter(|(t, _, _)| horizon.is_none_or(|h| *t <= h))
        .collect();
    if entries.is_empty() {
        return out;
    }
    entries.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut free = pool.max(0)
        + lines
            .iter()
            .filter(|l| !l.paused)
            .map(|l| l.stock.max(0))
            .sum::<i64>();
    let mut last_allotted = None;
    for (queued, b, wants) in &entries {
        if free <= 0 {
            // The earliest request no unit is left for: a unit freed at
            // its own bucket serves it, one freed elsewhere is moved to it.
            out.up_to = Some(*queued);
            out.ran_out = true;
            return out;
        }
        if *wants <= free {
            out.need[*b] += wants;
            out.requests[*b] += 1;
            free -= wants;
            last_allotted = Some(*queued);
        }
    }
    out.up_to = last_allotted;
    out
}

/// One move of a fill: `units` from bucket `from` (None: the pool) to
/// bucket `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from: Option<usize>,
    pub to: usize,
    pub units: i64,
}

/// What a move's take got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Took {
    /// Units that arrived.
    Units(i64),
    /// The giver has nothing to give now: it held fewer units than the
    /// least worth moving (it sold them meanwhile), or it was paused or
    /// lost meanwhile; the holdings show it (what it said it holds, or it
    /// paused).
    Short,
    /// The take was refused for a cause that is not the giver's stock:
    /// the mover fenced, or its transfer id stale at that giver.
    Refused,
    /// Taken, but the receiver did not take the units: left in transit
    /// (it is paused, not loaded, on a server nobody has checked, or saw
    /// a later mover) or called off. No giver can fill it this round.
    Undelivered,
}

impl Took {
    pub fn units(self) -> i64 {
        match self {
            Took::Units(k) => k,
            Took::Short | Took::Refused | Took::Undelivered => 0,
        }
    }
}

/// The course of the mover's `fill_the_short`: the buckets whose allotted
/// requests lack units, the one whose line's first request came earliest
/// first; for each, the pool gives first, then the open bucket with the
/// most units beyond its own allotted requests, until it has them or
/// nobody has units to spare. A giver found short (it sold meanwhile, or
/// was paused) is passed for the next; a move its receiver did not take
/// (`Took::Undelivered`), or a bucket's take refused (`Took::Refused`),
/// ends the fill of its receiver (the next round moves what this one
/// could not), and the round then does not even out (`cut_short`). Pure,
/// so a round knows before it moves what each bucket lends (`lends`), and
/// publishes it so those units stay for the moves.
#[derive(Debug, Clone)]
pub struct Filling {
    short: Vec<usize>,
    at: usize,
    pool_tried: bool,
    refused: bool,
}

impl Filling {
    pub fn new<L: Borrow<Line>>(lines: &[L], allotted: &Allotment) -> Filling {
        let earliest = |b: usize| lines[b].borrow().waiting.first().map_or(f64::MAX, |w| w.0);
        let mut short: Vec<usize> = (0..lines.len())
            .filter(|b| allotted.need[*b] > lines[*b].borrow().stock)
            .collect();
        short.sort_by(|a, b| earliest(*a).total_cmp(&earliest(*b)));
        Filling {
            short,
            at: 0,
            pool_tried: false,
            refused: false,
        }
    }

    /// The next move, on the holdings as the moves so far left them
    /// (`lines`' stock, the `pool`, which gives only when `pool_usable`);
    /// None: the fill is done.
    pub fn next<L: Borrow<Line>>(
        &mut self,
        lines: &[L],
        pool: i64,
        pool_usable: bool,
        allotted: &Allotment,
    ) -> Option<Move> {
        loop {
            let to = *self.short.get(self.at)?;
            let lacks = allotted.need[to] - lines[to].borrow().stock;
            if lacks <= 0 {
                self.skip();
                continue;
            }
            // Paused since the plan (found unchecked by a later publish):
            // its give would be refused, the units left in transit. What
            // the round counted for it stays where it is: no even out.
            if lines[to].borrow().paused {
                self.refused = true;
                self.skip();
                continue;
            }
            if !self.pool_tried {
                self.pool_tried = true;
                if pool_usable && pool > 0 {
                    let units = lacks.min(pool);
                    return Some(Move {
                        from: None,
                        to,
                        units,
                    });
                }
                continue;
            }
            let spare = |d: usize| lines[d].borrow().stock - allotted.need[d];
            let from = (0..lines.len())
                .filter(|d| *d != to && !lines[*d].borrow().paused && spare(*d) > 0)
                .max_by_key(|d| spare(*d));
            let Some(from) = from else {
                self.skip();
                continue;
            };
            let units = lacks.min(spare(from));
            return Some(Move {
                from: Some(from),
                to,
                units,
            });
        }
    }

    /// `step` took `took` (the caller's holdings already show it: the
    /// units moved, or a short giver with what it said it holds, or
    /// paused: either leaves it no units to spare).
    pub fn moved(&mut self, step: &Move, took: Took) {
        self.refused |= matches!(took, Took::Refused | Took::Undelivered);
        // A receiver that would not take the units ends its fill whoever
        // gave; a take the pool refused passes on to the buckets, which
        // keep transfer ids of their own.
        let ends = match took {
            Took::Undelivered => true,
            Took::Refused | Took::Units(0) => step.from.is_some(),
            _ => false,
        };
        if ends {
            self.skip();
        }
    }

    /// A move was refused, or not delivered (`Took::Refused`,
    /// `Took::Undelivered`):
    /// units the round counted for a request may still be in the pool or
    /// at a lender, where the holdings no longer say what is there (a
    /// refused give leaves the units taken in transit). The round then
    /// does not even out, or it could move them to a bucket nobody waits
    /// at, where newcomers buy them.
    pub fn cut_short(&self) -> bool {
        self.refused
    }

    fn skip(&mut self) {
        self.at += 1;
        self.pool_tried = false;
    }

    /// Per bucket, the units of its stock the fill takes to requests
    /// elsewhere if every move takes what it asks.
    pub fn lends<L: Borrow<Line>>(
        &self,
        lines: &[L],
        mut pool: i64,
        pool_usable: bool,
        allotted: &Allotment,
    ) -> Vec<i64> {
        let mut dry = self.clone();
        let mut stock: Vec<Line> = lines
            .iter()
            .map(|l| Line {
                stock: l.borrow().stock,
                paused: l.borrow().paused,
                waiting: vec![],
                seen_all: true,
            })
            .collect();
        let mut lends = vec![0; lines.len()];
        while let Some(step) = dry.next(&stock, pool, pool_usable, allotted) {
            match step.from {
                None => pool -= step.units,
                Some(d) => {
                    stock[d].stock -= step.units;
                    lends[d] += step.units;
                }
            }
            stock[step.to].stock += step.units;
            dry.moved(&step, Took::Units(step.units));
        }
        lends
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(stock: i64, waiting: &[(f64, i64)]) -> Line {
        Line {
            stock,
            paused: false,
            waiting: waiting.to_vec(),
            seen_all: true,
        }
    }

    #[test]
    fn nobody_waiting_sets_no_bound() {
        let a = allot(&[line(5, &[]), line(0, &[])], 3);
        assert_eq!(a.up_to, None);
        assert!(!a.any());
    }

    #[test]
    fn units_go_to_the_earliest_requests_of_any_bucket() {
        // One unit (at bucket 2): bucket 1's request came first.
        let a = allot(
            &[line(0, &[(20.0, 1)]), line(0, &[(10.0, 1)]), line(1, &[])],
            0,
        );
        assert_eq!(a.need, vec![0, 1, 0]);
        // Bucket 0's request waits: the bound stops there, everywhere.
        assert_eq!(a.up_to, Some(20.0));
        assert_eq!(a.bound_of(2), Some(20.0));
    }

    #[test]
    fn a_bucket_s_own_units_wait_for_an_earlier_request_elsewhere() {
        // Bucket 0 holds one unit and a request of its own; bucket 1's
        // came first and gets it.
        let a = allot(&[line(1, &[(20.0, 1)]), line(0, &[(10.0, 1)])], 0);
        assert_eq!(a.need, vec![0, 1]);
        assert_eq!(a.requests, vec![0, 1]);
        assert_eq!(a.up_to, Some(20.0));
    }

    #[test]
    fn a_request_too_big_is_passed_over_and_keeps_its_place() {
        let a = allot(
            &[line(2, &[(10.0, 4), (30.0, 1)]), line(0, &[(20.0, 1)])],
            0,
        );
        assert_eq!(a.need, vec![1, 1]);
        // Up to the last request allotted, where requests are allotted:
        // the units are theirs until served; the one for 4 keeps its place.
        assert_eq!(a.up_to, Some(30.0));
        assert_eq!(a.bound_of(0), Some(30.0));
        // A unit is left over: a bucket with nothing allotted is not held.
        let b = allot(
            &[line(2, &[(10.0, 4)]), line(0, &[(20.0, 1)]), line(0, &[])],
            0,
        );
        assert_eq!(b.bound_of(0), None);
        assert_eq!(b.bound_of(1), Some(20.0));
        assert_eq!(b.bound_of(2), None);
    }

    #[test]
    fn units_no_request_read_fits_are_not_held() {
        // Nothing fits the 3 units: no bound, so bucket 0 sells them to
        // newcomers as it would alone instead of holding them for nobody.
        let a = allot(&[line(3, &[(10.0, 4), (20.0, 5)]), line(0, &[])], 0);
        assert!(!a.any());
        assert_eq!(a.up_to, None);
    }

    #[test]
    fn a_cut_line_bounds_what_is_allotted() {
        // Bucket 0's line was cut after 30: bucket 1's request at 40 may
        // come after unread ones of bucket 0, and is not allotted.
        let mut cut = line(0, &[(10.0, 1), (30.0, 1)]);
        cut.seen_all = false;
        let a = allot(&[cut, line(0, &[(20.0, 1), (40.0, 1)])], 10);
        assert_eq!(a.need, vec![2, 1]);
        assert_eq!(a.up_to, Some(30.0));
    }

    #[test]
    fn a_paused_bucket_neither_gives_nor_is_served() {
        let mut paused = line(5, &[(1.0, 1)]);
        paused.paused = true;
        let a = allot(&[paused, line(0, &[(2.0, 1)])], 0);
        assert_eq!(a.need, vec![0, 0]);
        assert_eq!(a.up_to, Some(2.0));
    }

    fn lends_of(lines: &[Line], pool: i64) -> Vec<i64> {
        let allotted = allot(lines, pool);
        Filling::new(lines, &allotted).lends(lines, pool, true, &allotted)
    }

    #[test]
    fn the_pool_gives_first_then_the_bucket_with_the_most_to_spare() {
        // Bucket 2's request for 3: the pool's one unit, then bucket 1
        // (3 spare) before bucket 0 (1 spare beyond its own request).
        let lines = [line(2, &[(20.0, 1)]), line(3, &[]), line(0, &[(10.0, 3)])];
        assert_eq!(lends_of(&lines, 1), vec![0, 2, 0]);
        // Without the pool, bucket 1's three.
        assert_eq!(lends_of(&lines, 0), vec![0, 3, 0]);
    }

    #[test]
    fn a_bucket_lends_only_beyond_its_own_allotted_requests() {
        // Bucket 0 holds 2 and its own request takes 1: it lends 1, and
        // bucket 1's second request (queued after bucket 0's) gets none.
        let lines = [line(2, &[(20.0, 1)]), line(0, &[(10.0, 1), (30.0, 1)])];
        let allotted = allot(&lines, 0);
        assert_eq!(allotted.need, vec![1, 1]);
        assert_eq!(lends_of(&lines, 0), vec![1, 0]);
    }

    #[test]
    fn the_earliest_short_bucket_is_filled_first_and_nobody_lends_without_a_need() {
        let lines = [line(1, &[]), line(0, &[(30.0, 1)]), line(0, &[(10.0, 1)])];
        let allotted = allot(&lines, 0);
        let mut filling = Filling::new(&lines, &allotted);
        let first = filling.next(&lines, 0, true, &allotted);
        assert_eq!(
            first,
            Some(Move {
                from: Some(0),
                to: 2,
                units: 1
            })
        );
        assert_eq!(lends_of(&[line(3, &[]), line(1, &[])], 5), vec![0, 0]);
    }

    #[test]
    fn a_move_refused_ends_its_receiver_s_fill_and_a_short_giver_is_passed() {
        let lines = [line(2, &[]), line(1, &[]), line(0, &[(10.0, 2)])];
        let allotted = allot(&lines, 0);
        let mut filling = Filling::new(&lines, &allotted);
        let step = filling.next(&lines, 0, true, &allotted).expect("a move");
        assert_eq!(step.from, Some(0));
        filling.moved(&step, Took::Refused);
        assert_eq!(filling.next(&lines, 0, true, &allotted), None);
        assert!(filling.cut_short());
        // Not delivered from the pool: no bucket is asked for the same
        // receiver; refused at the pool (its own ids): the buckets are.
        let mut filling = Filling::new(&lines, &allotted);
        let step = filling.next(&lines, 1, true, &allotted).expect("a move");
        assert_eq!(step.from, None);
        filling.moved(&step, Took::Undelivered);
        assert_eq!(filling.next(&lines, 1, true, &allotted), None);
        assert!(filling.cut_short());
        let mut filling = Filling::new(&lines, &allotted);
        let step = filling.next(&lines, 1, true, &allotted).expect("a move");
        filling.moved(&step, Took::Refused);
        assert_eq!(
            filling.next(&lines, 1, true, &allotted).map(|m| m.from),
            Some(Some(0))
        );
        assert!(filling.cut_short());
        // Short: bucket 0 sold its units meanwhile; bucket 1 gives.
        let mut filling = Filling::new(&lines, &allotted);
        let step = filling.next(&lines, 0, true, &allotted).expect("a move");
        let mut held = lines.clone();
        held[0].stock = 0;
        filling.moved(&step, Took::Short);
        assert!(
            !filling.cut_short(),
            "a short giver sold the units: none left"
        );
        let next = filling.next(&held, 0, true, &allotted);
        assert_eq!(
            next,
            Some(Move {
                from: Some(1),
                to: 2,
                units: 1
            })
        );
    }

    #[test]
    fn a_receiver_paused_since_the_plan_takes_no_move() {
        let mut lines = [line(2, &[]), line(0, &[(10.0, 1)]), line(0, &[(11.0, 1)])];
        let allotted = allot(&lines, 0);
        let mut filling = Filling::new(&lines, &allotted);
        // Bucket 1 found unchecked by the round's second publish.
        lines[1].paused = true;
        let step = filling.next(&lines, 0, true, &allotted).expect("a move");
        assert_eq!(step.to, 2, "bucket 1 is passed");
        filling.moved(&step, Took::Units(1));
        lines[0].stock -= 1;
        lines[2].stock += 1;
        assert_eq!(filling.next(&lines, 0, true, &allotted), None);
        assert!(
            filling.cut_short(),
            "the units counted for bucket 1 are not evened out"
        );
    }

    #[test]
    fn the_pool_counts_and_the_bound_is_the_last_request_served() {
        let a = allot(&[line(0, &[(1.0, 1), (3.0, 1)]), line(0, &[(2.0, 1)])], 3);
        assert_eq!(a.need, vec![2, 1]);
        assert_eq!(a.up_to, Some(3.0));
    }
}
