//! The model of serving waiting requests across buckets
//! (model/src/serving.rs, docs/src/concepts/checked-model.md): every
//! state within CI's bounds keeps its properties, and each rule of the
//! serve, turned off alone, gives a counterexample.

use std::time::Instant;

use seckill_model::broken;
use seckill_model::serving::{Fixes, Serving};
use stateright::{Checker, Model};

/// CI's bounds: 2 buckets, two units in bucket 0 and one in the pool,
/// five buyers (three at bucket 0, two at bucket 1, one of each for 2
/// units), one release (of one unit or two), two rounds of the mover,
/// one kill, one stop, one lapse.
fn ci_serving(fixes: Fixes) -> Serving {
    Serving {
        stock: vec![2, 0],
        pool: 1,
        arrivals: vec![(0, 1), (1, 2), (0, 2), (1, 1), (0, 1)],
        releases: 1,
        rounds: 2,
        crashes: 1,
        stops: 1,
        lapses: 1,
        fixes,
    }
}

#[test]
fn serving_keeps_its_promises_in_every_reachable_state() {
    let started = Instant::now();
    let checker = ci_serving(Fixes::CODE)
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    eprintln!(
        "serving model: {} states ({} unique), {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
}

// The rules of design/buckets.md holes 4 and 5, the defect the
// allotment fixed, and finding S1's fix.
seckill_model::bites!(
    each_serving_rule_turned_off_gives_a_counterexample,
    BITES: Fixes,
    ci_serving;
    serve_stops_at_bound,
    newcomers_held,
    whole_line_allotted,
    serve_after_moves,
    keep_lent,
    newcomers_leave_lent,
);

/// A counterexample of each rule turned off, step by step (the last the
/// search met: not the shortest)
/// (`cargo test -p seckill-model --test serving explain -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn explain() {
    let offs = BITES.iter().map(|(name, off)| {
        let mut fixes = Fixes::CODE;
        off(&mut fixes);
        (*name, ci_serving(fixes))
    });
    for (name, model) in offs {
        // One thread: the same counterexample each run.
        let checker = model.checker().threads(1).spawn_bfs().join();
        eprintln!("== without {name}: {:?}", broken(&checker));
        for (property, path) in checker.discoveries() {
            eprintln!("-- {property}");
            for action in path.into_actions() {
                eprintln!("  {action:?}");
            }
        }
    }
}

/// A larger bound, by hand: 3 buckets (one unit in each of two, one in
/// the pool), five buyers, two releases (of one unit or two each), two
/// lapses
/// (`cargo test -p seckill-model --test serving larger -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn larger() {
    let started = Instant::now();
    let serving = Serving {
        stock: vec![1, 1, 0],
        pool: 1,
        arrivals: vec![(0, 1), (1, 2), (2, 1), (2, 2), (0, 1)],
        releases: 2,
        rounds: 3,
        crashes: 1,
        stops: 0,
        lapses: 2,
        fixes: Fixes::CODE,
    };
    let checker = serving.checker().threads(2).spawn_bfs().join();
    eprintln!(
        "serving model, larger: {} states ({} unique), {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
}

/// Finding S1 (docs/src/concepts/checked-model.md): without the lent
/// units kept, what breaks is the order the bounds promise, and only
/// that.
#[test]
fn without_the_lent_units_kept_a_later_request_takes_units_lent_to_an_earlier_one() {
    let mut fixes = Fixes::CODE;
    fixes.keep_lent = false;
    let checker = ci_serving(fixes).checker().threads(2).spawn_bfs().join();
    let found = broken(&checker);
    eprintln!("without keep_lent: {found:?}");
    assert_eq!(
        found.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        ["no unit a live bound holds for a request goes to a later one"]
    );
}
