//! Symmetry (model/src/symmetry.rs): buyers are interchangeable, so the
//! checker may visit one state of each class of renamings. That is sound
//! only if renaming the users commutes with every action and leaves every
//! property's verdict alone; the first test checks exactly that on the
//! states random walks reach, so a model change that makes a user id
//! matter (a choice of the least user, say) fails here rather than making
//! the reduced checks quietly wrong.

use seckill_model::sale::{Action, Fixes, Sale, State};
use seckill_model::{broken, Model};

use std::time::Instant;

use stateright::{Checker, Representative};

/// Every ordering of three users.
const RENAMINGS: [[u8; 3]; 6] = [
    [0, 1, 2],
    [0, 2, 1],
    [1, 0, 2],
    [1, 2, 0],
    [2, 0, 1],
    [2, 1, 0],
];

fn renamed_action(a: &Action, to: &[u8]) -> Action {
    match a {
        Action::Admit(u) => Action::Admit(to[*u as usize]),
        other => other.clone(),
    }
}

/// 3 buyers, two workers, both faults of each store: every action the
/// model has.
fn all_faults(fixes: Fixes) -> Sale {
    Sale {
        mysql_losses: 1,
        workers: 2,
        ..Sale::redis_loss(1, 3, fixes)
    }
}

/// The buyers (1 unit, 3 buyers, a kill and a Redis rollback)
/// without the canceller's sweep, as CI's Redis-loss check.
fn three_buyers(fixes: Fixes) -> Sale {
    Sale::redis_loss(
        1,
        3,
        Fixes {
            sweep_unreleased: false,
            ..fixes
        },
    )
}

/// The fixes with the one `MODEL_WITHOUT` names turned off (`default`
/// when it names none).
fn fixes_without(default: Option<&str>) -> Fixes {
    let mut fixes = Fixes::CODE;
    let off = std::env::var("MODEL_WITHOUT").ok();
    match off.as_deref().or(default) {
        Some("release_defers_while_paused") => fixes.release_defers_while_paused = false,
        Some("spoken_for") => fixes.spoken_for = false,
        Some("repair_gives_after_grace") => fixes.repair_gives_after_grace = false,
        Some(other) => panic!("MODEL_WITHOUT={other}: not a fix this check turns off"),
        None => {}
    }
    fixes
}

fn sorted_actions(model: &Sale, s: &State) -> Vec<String> {
    let mut actions = vec![];
    model.actions(s, &mut actions);
    let mut names: Vec<String> = actions.iter().map(|a| format!("{a:?}")).collect();
    names.sort();
    names
}

fn verdicts(model: &Sale, s: &State) -> Vec<bool> {
    model
        .properties()
        .iter()
        .map(|p| (p.condition)(model, s))
        .collect()
}

/// A seeded xorshift: the same walks on every machine.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Every fix the model can turn off, each off alone (the checks with
/// symmetry run with one off, `MODEL_WITHOUT`).
const EACH_OFF: [fn(&mut Fixes); 14] = [
    |f| f.hold_batch_in_hand = false,
    |f| f.release_defers_while_paused = false,
    |f| f.rebuild_subtracts_unreleased = false,
    |f| f.reopen_checks_token = false,
    |f| f.spoken_for = false,
    |f| f.reopen_waits_while_owed = false,
    |f| f.run_id_sign = false,
    |f| f.commit_looks_again = false,
    |f| f.restore_lost_commits = false,
    |f| f.count_stored_acks = false,
    |f| f.retry_no_stock_while_behind = false,
    |f| f.release_paid_cancelled = false,
    |f| f.sweep_unreleased = false,
    |f| f.repair_gives_after_grace = false,
];

/// What the commutation check met on its walks.
#[derive(Default)]
struct Met {
    renamings: usize,
    kinds: std::collections::BTreeSet<String>,
    /// States with two users or more in a set or a sequence of users
    /// (where a set sorted again and a sequence kept in order differ).
    crowded: usize,
}

/// `walks` seeded walks of `model`; in every state reached, each renaming
/// of the users must give the renamed actions, the same verdicts, and for
/// each action the renamed successor (or none where there is none).
fn check_commutes(model: &Sale, walks: usize, seed: u64, met: &mut Met) {
    let mut rng = Rng(seed);
    for _walk in 0..walks {
        let mut s = model.initial();
        for _step in 0..80 {
            let mut actions = vec![];
            model.actions(&s, &mut actions);
            let next: Vec<(Action, Option<State>)> = actions
                .into_iter()
                .map(|a| (a.clone(), model.next_state(&s, a)))
                .collect();
            let r = &s.redis;
            if r.waitlist.len() >= 2 || r.buyers.len() >= 2 || r.dead.len() >= 2 {
                met.crowded += 1;
            }
            for to in RENAMINGS {
                let renamed = s.renamed(&to);
                let mut expected: Vec<String> = next
                    .iter()
                    .map(|(a, _)| format!("{:?}", renamed_action(a, &to)))
                    .collect();
                expected.sort();
                assert_eq!(
                    sorted_actions(model, &renamed),
                    expected,
                    "renamed by {to:?}, the actions differ in {s:#?}"
                );
                assert_eq!(
                    verdicts(model, &renamed),
                    verdicts(model, &s),
                    "renamed by {to:?}, a property's verdict differs in {s:#?}"
                );
                for (a, n) in &next {
                    let via_renamed = model.next_state(&renamed, renamed_action(a, &to));
                    assert_eq!(
                        via_renamed,
                        n.as_ref().map(|n| n.renamed(&to)),
                        "renamed by {to:?}, {a:?} leads elsewhere from {s:#?}"
                    );
                    let kind = format!("{a:?}");
                    met.kinds
                        .insert(kind.split('(').next().unwrap_or_default().to_owned());
                }
                met.renamings += 1;
            }
            let taken: Vec<State> = next.into_iter().filter_map(|(_, n)| n).collect();
            if taken.is_empty() {
                break;
            }
            s = taken[rng.below(taken.len())].clone();
        }
    }
}

#[test]
fn renaming_the_buyers_commutes_with_every_action_and_property() {
    let mut met = Met::default();
    check_commutes(
        &all_faults(Fixes::CODE),
        3000,
        0x5eed_c0ff_ee15_0001,
        &mut met,
    );
    for (i, off) in EACH_OFF.iter().enumerate() {
        let mut fixes = Fixes::CODE;
        off(&mut fixes);
        check_commutes(&all_faults(fixes), 200, 0x5eed + i as u64, &mut met);
    }
    eprintln!(
        "renamings checked: {}; kinds of action taken: {}; states with two users or more in a set: {}",
        met.renamings,
        met.kinds.len(),
        met.crowded
    );
    // Every kind of action the model has (31) was met on the walks (the
    // check above says nothing of an action never taken), and sets of
    // users long enough for their order to matter.
    assert!(met.kinds.len() == 31, "actions met: {:?}", met.kinds);
    assert!(met.crowded > 0, "no state with two users in a set");
}

#[test]
fn a_representative_is_one_of_its_states_renamings() {
    let model = all_faults(Fixes::CODE);
    let mut s = model.initial();
    for a in [
        Action::Admit(2),
        Action::Admit(0),
        Action::Read(0),
        Action::Lock(0),
    ] {
        s = model.next_state(&s, a).expect("the action applies");
    }
    let rep = s.representative();
    assert!(RENAMINGS.iter().any(|to| s.renamed(to) == rep));
    for to in RENAMINGS {
        assert_eq!(s.renamed(&to).representative(), rep);
    }
}

/// Every state of `sale`, one per class of renamings (depth first), with
/// its size and time printed under `label`: what it broke.
fn checked_with_symmetry(label: &str, sale: Sale) -> Vec<(&'static str, usize)> {
    let started = Instant::now();
    let checker = sale.checker().threads(2).symmetry().spawn_dfs().join();
    let found = broken(&checker);
    eprintln!(
        "{label} with symmetry: {} unique states, {:.1} s, broken {found:?}",
        checker.unique_state_count(),
        started.elapsed().as_secs_f64(),
    );
    found
}

/// CI's Redis-loss bounds (check.rs) with symmetry on the depth-first
/// search: the same verdicts, fewer states.
#[test]
#[ignore]
fn ci_bounds_with_symmetry() {
    let sale = Sale::redis_loss(
        1,
        2,
        Fixes {
            sweep_unreleased: false,
            ..Fixes::CODE
        },
    );
    let found = checked_with_symmetry("CI's bounds", sale);
    assert!(found.is_empty(), "{found:?}");
}

/// CI's Redis-loss bounds with a second worker reading the stream
/// (`cargo test -p seckill-model --test symmetry two_workers_with_symmetry
/// -- --ignored --nocapture`): breadth first, without symmetry, it
/// outgrew 24 GiB. `TWO_WORKERS_CRASHES=0` leaves the kill out;
/// `TWO_WORKERS_USERS=1` has one buyer (9.7 million states, 50 s).
#[test]
#[ignore]
fn two_workers_with_symmetry() {
    let crashes = std::env::var("TWO_WORKERS_CRASHES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    let users = std::env::var("TWO_WORKERS_USERS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2);
    let sale = Sale {
        workers: 2,
        crashes,
        ..Sale::redis_loss(
            1,
            users,
            Fixes {
                sweep_unreleased: false,
                ..Fixes::CODE
            },
        )
    };
    let found = checked_with_symmetry("CI's bounds, two workers", sale);
    assert!(found.is_empty(), "{found:?}");
}

/// The buyers: 1 unit, 3 buyers, a kill and a Redis rollback
/// (`cargo test -p seckill-model --test symmetry three_buyers_with_symmetry
/// -- --ignored --nocapture`, about 3.5 minutes; `MODEL_WITHOUT=<fix>`
/// turns one fix off).
#[test]
#[ignore]
fn three_buyers_with_symmetry() {
    let fixes = fixes_without(None);
    let sale = three_buyers(fixes);
    let found = checked_with_symmetry("1 unit, 3 buyers", sale);
    // Every fix on: nothing broken; one off: that fix's hole found.
    assert_eq!(found.is_empty(), fixes == Fixes::CODE, "{found:?}");
}

/// The counterexample of the 3-buyer check with a fix off (M6's unless
/// `MODEL_WITHOUT` names another), made short: actions taken out one at a
/// time while the rest still reaches a state that breaks the property
/// (`cargo test -p seckill-model --test symmetry explain_three_buyers --
/// --ignored --nocapture`; about 3 minutes).
#[test]
#[ignore]
fn explain_three_buyers() {
    let sale = three_buyers(fixes_without(Some("repair_gives_after_grace")));
    let checker = sale
        .clone()
        .checker()
        .threads(2)
        .symmetry()
        .spawn_dfs()
        .join();
    assert!(
        !checker.discoveries().is_empty(),
        "nothing broken to explain"
    );
    for (name, path) in checker.discoveries() {
        let property = sale
            .properties()
            .into_iter()
            .find(|p| p.name == name)
            .expect("a property of the model");
        let breaks = |actions: &[Action]| -> Option<State> {
            let mut s = sale.initial();
            for a in actions {
                let mut allowed = vec![];
                sale.actions(&s, &mut allowed);
                if !allowed.contains(a) {
                    return None;
                }
                s = sale.next_state(&s, a.clone())?;
                if !(property.condition)(&sale, &s) {
                    return Some(s);
                }
            }
            None
        };
        let mut actions = path.into_actions();
        assert!(breaks(&actions).is_some(), "the path does not replay");
        let mut i = 0;
        while i < actions.len() {
            let mut shorter = actions.clone();
            shorter.remove(i);
            if breaks(&shorter).is_some() {
                actions = shorter;
            } else {
                i += 1;
            }
        }
        eprintln!("== {name}: {} actions", actions.len());
        let mut s = sale.initial();
        for a in &actions {
            s = sale.next_state(&s, a.clone()).expect("replays");
            eprintln!("  {a:?}");
        }
        eprintln!("{s:#?}");
    }
}

/// MySQL's loss at 2 units and 3 buyers (a kill, MySQL back to an
/// earlier snapshot once), with symmetry (`cargo test -p seckill-model
/// --test symmetry mysql_loss_two_units_three_buyers -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn mysql_loss_two_units_three_buyers() {
    let sale = Sale {
        units: 2,
        rollbacks: 0,
        mysql_losses: 1,
        ..Sale::redis_loss(1, 3, Fixes::CODE)
    };
    let found = checked_with_symmetry("MySQL's loss, 2 units, 3 buyers", sale);
    assert!(found.is_empty(), "{found:?}");
}

/// Redis's loss at 2 units and 3 buyers (a kill, a Redis rollback), with
/// symmetry (`cargo test -p seckill-model --test symmetry
/// redis_loss_two_units_three_buyers -- --ignored --nocapture`): it did
/// not finish within 20 minutes on the 2-core machine (2026-12-07); for a
/// larger one.
#[test]
#[ignore]
fn redis_loss_two_units_three_buyers() {
    let sale = Sale {
        units: 2,
        ..three_buyers(Fixes::CODE)
    };
    let found = checked_with_symmetry("Redis's loss, 2 units, 3 buyers", sale);
    assert!(found.is_empty(), "{found:?}");
}
