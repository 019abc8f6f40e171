//! The mover's model (model/src/mover.rs, docs/src/concepts/checked-model.md):
//! every state within CI's bounds keeps the units conserved, and each fix
//! of the transfer protocol's holes, turned off alone, gives a
//! counterexample.

use std::time::Instant;

use seckill_model::mover::{Fixes, Moving};
use seckill_model::{broken, unnoticed, Off};
use stateright::{Checker, Model};

/// CI's bounds: 3 units in 2 buckets and the pool, 2 movers, 2
/// transfers of one unit, one mover killed, one lease run out under a
/// live mover, one call delivered twice (moves of up to 2 units: 9.1
/// million states, about 40 s, by hand with `sizes`).
fn ci_moving(fixes: Fixes) -> Moving {
    Moving {
        units: 3,
        buckets: 2,
        movers: 2,
        transfers: 2,
        want: 1,
        crashes: 1,
        lapses: 1,
        duplicates: 1,
        rebuilds: 0,
        fixes,
    }
}

#[test]
fn the_mover_keeps_every_unit_in_one_place_in_every_reachable_state() {
    let started = Instant::now();
    let checker = ci_moving(Fixes::CODE)
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    eprintln!(
        "mover model: {} states ({} unique), {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
}

/// design/buckets.md §8's hole 1 and the fixes built for it.
const BITES: [Off<Fixes>; 3] = [
    ("void_marker", |f| f.void_marker = false),
    ("take_refuses_stale_ids", |f| {
        f.take_refuses_stale_ids = false
    }),
    ("received_kept", |f| f.received_kept = false),
];

#[test]
fn each_transfer_fix_turned_off_gives_a_counterexample() {
    let missed = unnoticed(Fixes::CODE, &BITES, ci_moving);
    assert!(missed.is_empty(), "no counterexample without {missed:?}");
}

/// The shortest counterexample of each fix turned off, step by step
/// (`cargo test -p seckill-model --test mover explain -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn explain() {
    let bites = BITES.iter().map(|b| (b, ci_moving as fn(Fixes) -> Moving));
    let count_bites = COUNT_BITES
        .iter()
        .map(|b| (b, ci_counting as fn(Fixes) -> Moving));
    for ((name, off), model) in bites.chain(count_bites) {
        let mut fixes = Fixes::CODE;
        off(&mut fixes);
        let checker = model(fixes).checker().threads(2).spawn_bfs().join();
        for (property, path) in checker.discoveries() {
            eprintln!("== without {name}: {property}");
            for action in path.into_actions() {
                eprintln!("  {action:?}");
            }
        }
    }
}

/// State counts of other bounds, to size CI's (`cargo test -p
/// seckill-model --test mover sizes -- --ignored --nocapture`).
#[test]
#[ignore]
fn sizes() {
    let code = Fixes::CODE;
    let runs = [
        ("mover", ci_moving(code)),
        (
            "mover, moves of 2 units",
            Moving {
                want: 2,
                ..ci_moving(code)
            },
        ),
        (
            "count, 2 transfers and a kill",
            Moving {
                crashes: 1,
                ..ci_counting(code)
            },
        ),
        (
            "count, 2 rebuilds",
            Moving {
                rebuilds: 2,
                ..ci_counting(code)
            },
        ),
        (
            "count, a call delivered twice",
            Moving {
                duplicates: 1,
                ..ci_counting(code)
            },
        ),
    ];
    for (name, moving) in runs {
        let started = Instant::now();
        let checker = moving.checker().threads(2).spawn_bfs().join();
        eprintln!(
            "{name}: {} unique states, {:.1} s, broken {:?}",
            checker.unique_state_count(),
            started.elapsed().as_secs_f64(),
            broken(&checker)
        );
    }
}

/// The gate guard's count of a paused bucket: 3 units in 3 buckets, one
/// mover, 2 transfers of one unit, one rebuild, one lease or hold run out
/// under a live process (a kill as well: 12 million states, about 35 s,
/// by hand with `sizes`).
fn ci_counting(fixes: Fixes) -> Moving {
    Moving {
        units: 3,
        buckets: 3,
        movers: 1,
        transfers: 2,
        want: 1,
        crashes: 0,
        lapses: 1,
        duplicates: 0,
        rebuilds: 1,
        fixes,
    }
}

/// As `ci_counting`, with a kill (the mover or the guard) and one transfer.
fn ci_counting_killed(fixes: Fixes) -> Moving {
    Moving {
        transfers: 1,
        crashes: 1,
        ..ci_counting(fixes)
    }
}

#[test]
fn the_guard_s_count_never_makes_a_unit() {
    for (name, model) in [
        ("counting", ci_counting(Fixes::CODE)),
        ("counting, a kill", ci_counting_killed(Fixes::CODE)),
    ] {
        let started = Instant::now();
        let checker = model.checker().threads(2).spawn_bfs().join();
        eprintln!(
            "{name}: {} unique states, {:.1} s",
            checker.unique_state_count(),
            started.elapsed().as_secs_f64()
        );
        checker.assert_properties();
    }
}

/// The count's fixes (design/buckets.md §5), each off alone.
const COUNT_BITES: [Off<Fixes>; 4] = [
    ("seize_fences", |f| f.seize_fences = false),
    ("epoch_fence", |f| f.epoch_fence = false),
    ("hold_rechecked", |f| f.hold_rechecked = false),
    ("mysql_read_last", |f| f.mysql_read_last = false),
];

#[test]
fn each_count_fix_turned_off_gives_a_counterexample() {
    let missed = unnoticed(Fixes::CODE, &COUNT_BITES, ci_counting);
    assert!(missed.is_empty(), "no counterexample without {missed:?}");
}

/// Reading the pool and transit again after the buckets keeps nothing
/// while the mover is held and fenced: every move needs a take and a give
/// the fence refuses (docs/src/concepts/checked-model.md).
#[test]
fn under_a_fenced_hold_the_second_read_of_transit_keeps_nothing() {
    let off: [Off<Fixes>; 1] = [("transit_reread", |f| f.transit_reread = false)];
    let missed = unnoticed(Fixes::CODE, &off, ci_counting);
    assert_eq!(missed, ["transit_reread"]);
}
