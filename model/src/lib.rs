//! A checked model of seckill's protocols (docs/src/concepts/checked-model.md): what the Lua
//! scripts, the SQL statements and the Rust code between them do, one
//! action per step between two durable writes, for the model checker
//! (stateright) to visit every state of within small bounds. The
//! conformance test (tests/conformance/ of the seckill crate) holds it
//! to the real scripts.

pub mod mover;
pub mod sale;
pub mod serving;
pub mod symmetry;

/// The checker's trait, for callers that walk the model (the conformance
/// test) without depending on stateright themselves.
pub use stateright::Model;

/// The properties a check broke, each with its counterexample's number
/// of actions (the "it bites" tests and tables). Not the shortest: for
/// an `always` property stateright 0.31 keeps the last violating state
/// its breadth-first search met (each one found replaces the one before).
pub fn broken<M>(checker: &impl stateright::Checker<M>) -> Vec<(&'static str, usize)>
where
    M: Model,
    M::State: Clone + PartialEq,
    M::Action: Clone + PartialEq,
{
    checker
        .discoveries()
        .into_iter()
        .map(|(property, path)| (property, path.into_actions().len()))
        .collect()
}

/// A fix, by name, and how to turn it off.
pub type Off<F> = (&'static str, fn(&mut F));

/// "It bites", one test per fix: `bites!(module, Fixes, model; fix,
/// ...)` defines in `module` a test per named fix (a `bool` of `Fixes`)
/// that turns it off alone (from `Fixes::CODE`) and fails unless `model`
/// then breaks; `bites!(module, LIST: Fixes, model; ...)` also defines
/// `LIST`, the same fixes as [`Off`]s, for a test that explains them. One
/// test each, not one loop: nextest runs them side by side instead of
/// one long test at the end of CI's run, and a failure names its fix.
#[macro_export]
macro_rules! bites {
    ($module:ident, $list:ident: $fixes:ty, $model:expr; $($fix:ident),+ $(,)?) => {
        const $list: &[$crate::Off<$fixes>] =
            &[$((stringify!($fix), |f: &mut $fixes| f.$fix = false)),+];
        $crate::bites!($module, $fixes, $model; $($fix),+);
    };
    ($module:ident, $fixes:ty, $model:expr; $($fix:ident),+ $(,)?) => {
        mod $module {
            use super::*;
            $(
                #[test]
                fn $fix() {
                    let off: [$crate::Off<$fixes>; 1] =
                        [(stringify!($fix), |f: &mut $fixes| f.$fix = false)];
                    let missed = $crate::unnoticed(<$fixes>::CODE, &off, $model);
                    assert!(missed.is_empty(), "no counterexample without {}", stringify!($fix));
                }
            )+
        }
    };
}

/// Each fix turned off alone (`offs`, from `all` on): the model of those
/// fixes checked on both cores, what broke printed with its length and
/// the check's size; returns the fixes whose removal broke nothing (their
/// hole is not checked at these bounds).
pub fn unnoticed<F, M>(all: F, offs: &[Off<F>], model: impl Fn(F) -> M) -> Vec<&'static str>
where
    F: Copy,
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static,
{
    use stateright::Checker;
    let mut missed = vec![];
    for (name, off) in offs {
        let mut fixes = all;
        off(&mut fixes);
        let started = std::time::Instant::now();
        let checker = model(fixes).checker().threads(2).spawn_bfs().join();
        let found = broken(&checker);
        eprintln!(
            "without {name}: {found:?} ({} states, {:.1} s)",
            checker.unique_state_count(),
            started.elapsed().as_secs_f64()
        );
        if found.is_empty() {
            missed.push(*name);
        }
    }
    missed
}
