//! Fault points for crash tests and the fault explorer (`tests/explore/`).
//! Unset (always, in production) each point costs a lookup in an empty
//! map and one of a task-local value.
//!
//! `SECKILL_TEST_PAUSE=<point>=<duration>[*<n>][,...]` pauses at a point
//! (only the first n times with `*n`) and says so on stderr, so a test can
//! kill -9 the process exactly there.
//!
//! `SECKILL_TEST_FAULT=<point>@<k>=<action>[,...]` acts on the k-th time
//! the process reaches the point (counted from 1, `@k` omitted: the first;
//! `@armed`: the first time after the file `arm` appeared in
//! `SECKILL_TEST_FAULT_DIR`, so the explorer can aim a fault at a moment
//! of the sale without knowing how many batches came before it):
//! `pause:<duration>`; `hold` (waits until the file `release` appears in
//! `SECKILL_TEST_FAULT_DIR`, so a second fault can be made while this
//! process stands there, or the file `release-<point>-<k>`, which lets
//! go of that hit alone: a test that holds two points in a row releases
//! the first without the second passing through); `abort` (the process dies at once, as a kill -9
//! there would have it); `error` (the step fails as a store error would
//! make it; a point that cannot fail holds this action for nothing and
//! says so); `resend`, at a script call's point only (below). Each action
//! says `fault <action> at <point> (hit <k>)` on stderr first, and a hold
//! `fault released at <point> (hit <k>)` when let go.
//!
//! Every script call (a lone EVALSHA) is a point too, `resend_<script>`
//! (the file stem: `resend_preload`), where `resend` sends the call, drops
//! its reply as a lost one is dropped and sends it again, answering with
//! the second reply: what a client that resends after an I/O error (the
//! cluster client does) makes the server run.
//!
//! The points, each between two durable writes: a batch's `after_lock`
//! (locks held, nothing in MySQL), `before_commit` (the transaction is
//! open), `after_commit` (committed, not yet acknowledged), `after_ack`
//! (acknowledged and unlocked); a payment deadline's `before_cancel_commit`
//! and `after_cancel` (cancelled in MySQL, the unit not yet given back in
//! Redis); preload and reconcile's `between_snapshot_reads` (a voucher's
//! row read, its orders not yet) and `between_gate_and_mysql_reads` (the
//! gates read, MySQL's snapshot not taken yet), reconcile's
//! `before_repair` (drift found, nothing repaired yet; the gate guard's
//! rebuild too), and its `before_forget` (a gap of lost commits nothing
//! kept names read, not yet taken off the gate's witness) and `before_raise`
//! (MySQL's count of orders read, the witness not yet set back up to it); `voucher update`'s `before_publish` (the policy changed
//! in MySQL, not yet published at the gate); the gate guard's `gate_paused` (a gate paused, not yet
//! rebuilt); the mover's `after_bounds_published` (a round's bounds and
//! lent units published, nothing moved yet), `before_publishing_again` (a
//! publish found a bucket unchecked, or checked again, and the round
//! publishes a second plan) and `between_take_and_give` (units
//! taken from one gate, in transit, not yet given to the other); `seckill
//! serve`'s `serve_after_admit` (admitted at the gate, the answer not yet
//! written) and its Redis connections' mender `mend_round` (before each
//! round); a payment's `after_pay` (`seckill pay` and serve's: paid in
//! MySQL, the deadline not yet taken off the gate, the answer not yet
//! given).
//!
//! A test in the same process can stand a task at each point it reaches
//! and let it go when it chooses ([`stepping`]).
//!
//! `SECKILL_TEST_PANIC=<place>` panics at `startup` (before the command
//! line is read) or in `command` (inside the command, on the runtime), so a
//! test can see what an operator sees of a bug: one line, whatever
//! RUST_BACKTRACE says.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};

pub const ENV: &str = "SECKILL_TEST_PAUSE";
pub const FAULT_ENV: &str = "SECKILL_TEST_FAULT";
pub const FAULT_DIR_ENV: &str = "SECKILL_TEST_FAULT_DIR";

/// How long to pause at a step, and how many more times (`*N`; unbounded
/// without it).
struct Pause {
    length: Duration,
    left: AtomicU64,
}

#[derive(Debug, Clone, PartialEq)]
enum Action {
    Pause(Duration),
    Hold,
    Abort,
    Error,
    Resend,
}

/// The faults asked for one point, by the hit they fire on, and how many
/// times the process reached it so far.
#[derive(Default)]
struct Point {
    at: Vec<(u64, Action)>,
    /// The action to take on the first hit after the `arm` file appeared,
    /// and whether it was taken.
    armed: Option<(Action, AtomicBool)>,
    hits: AtomicU64,
}

static PAUSES: LazyLock<HashMap<String, Pause>> = LazyLock::new(|| {
    std::env::var(ENV)
        .map(|spec| parse(&spec))
        .unwrap_or_default()
});

static FAULTS: LazyLock<HashMap<String, Point>> = LazyLock::new(|| {
    std::env::var(FAULT_ENV)
        .map(|spec| parse_faults(&spec))
        .unwrap_or_default()
});

fn parse(spec: &str) -> HashMap<String, Pause> {
    spec.split(',')
        .filter_map(|item| {
            let (step, d) = item.split_once('=')?;
            let (d, times) = match d.split_once('*') {
                Some((d, n)) => (d, n.trim().parse().ok()?),
                None => (d, u64::MAX),
            };
            Some((
                step.trim().to_string(),
                Pause {
                    length: humantime::parse_duration(d.trim()).ok()?,
                    left: AtomicU64::new(times),
                },
            ))
        })
        .collect()
}

fn parse_action(text: &str) -> Option<Action> {
    match text.trim() {
        "hold" => Some(Action::Hold),
        "abort" => Some(Action::Abort),
        "error" => Some(Action::Error),
        "resend" => Some(Action::Resend),
        other => {
            let d = other.strip_prefix("pause:")?;
            humantime::parse_duration(d.trim()).ok().map(Action::Pause)
        }
    }
}

fn parse_faults(spec: &str) -> HashMap<String, Point> {
    let mut points: HashMap<String, Point> = HashMap::new();
    for item in spec.split(',') {
        let Some((place, action)) = item.split_once('=') else {
            continue;
        };
        let (name, k) = match place.split_once('@') {
            Some((name, k)) if k.trim() == "armed" => (name, None),
            Some((name, k)) => match k.trim().parse::<u64>() {
                Ok(k) if k > 0 => (name, Some(k)),
                _ => continue,
            },
            None => (place, Some(1)),
        };
        if let Some(action) = parse_action(action) {
            let point = points.entry(name.trim().to_string()).or_default();
            match k {
                Some(k) => point.at.push((k, action)),
                None => point.armed = Some((action, AtomicBool::new(false))),
            }
        }
    }
    points
}

/// A point a test stands the code at: the point's name, and the sender
/// that lets the code go on (dropped: it goes on too).
pub struct Stop {
    pub point: &'static str,
    pub go: oneshot::Sender<()>,
}

tokio::task_local! {
    /// Where the points this task reaches are sent ([`stepping`]).
    static STEPPER: mpsc::UnboundedSender<Stop>;
}

/// Runs `work` with every point it reaches sent to `stops`, each waiting
/// there until the test lets it go: how the conformance test takes the
/// gate guard's pass one step at a time, with other steps between.
pub async fn stepping<F: Future>(stops: mpsc::UnboundedSender<Stop>, work: F) -> F::Output {
    STEPPER.scope(stops, work).await
}

/// Waits at `point` while a test running this task [`stepping`] holds it.
async fn stand(point: &'static str) {
    let Ok(stepper) = STEPPER.try_with(|s| s.clone()) else {
        return;
    };
    let (go, wait) = oneshot::channel();
    if stepper.send(Stop { point, go }).is_ok() {
        // A dropped sender lets it go on as well.
        let _ = wait.await;
    }
}

/// A fault point whose step can fail: `error` makes it fail here.
pub async fn point(step: &'static str) -> Result<()> {
    stand(step).await;
    timed_pause(step).await;
    match reach(step).await {
        Some(Action::Error) => Err(Error::redis(format!(
            "test fault: an error injected at {step}"
        ))),
        _ => Ok(()),
    }
}

/// A fault point whose step cannot fail (an `error` there does nothing).
pub async fn pause(step: &'static str) {
    stand(step).await;
    timed_pause(step).await;
    if reach(step).await == Some(Action::Error) {
        eprintln!("fault error at {step} fails nothing: this step cannot fail");
    }
}

async fn timed_pause(step: &str) {
    if let Some(p) = PAUSES.get(step) {
        let taken = p
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if taken.is_ok() {
            tracing::warn!(
                "test pause at {step} for {}",
                humantime::format_duration(p.length)
            );
            tokio::time::sleep(p.length).await;
        }
    }
}

/// Whether any fault was asked of this process (a script call looks for
/// its point only then).
pub fn armed() -> bool {
    !FAULTS.is_empty()
}

/// Counts a hit of a script call's point: whether to send this call twice.
pub fn resend(step: &str) -> bool {
    hit(step).is_some_and(|(action, _)| action == Action::Resend)
}

/// Counts a hit of `step` and says the fault asked for this hit, if any,
/// and which hit it is.
fn hit(step: &str) -> Option<(Action, u64)> {
    let point = FAULTS.get(step)?;
    let hit = point.hits.fetch_add(1, Ordering::SeqCst) + 1;
    let action = match point.at.iter().find(|(k, _)| *k == hit) {
        Some((_, action)) => action,
        None => armed_now(point)?,
    };
    let name = match action {
        Action::Pause(d) => format!("pause {}", humantime::format_duration(*d)),
        Action::Hold => "hold".into(),
        Action::Abort => "abort".into(),
        Action::Error => "error".into(),
        Action::Resend => "resend".into(),
    };
    // Straight to stderr: the explorer waits for this line, whatever the
    // log filter says.
    eprintln!("fault {name} at {step} (hit {hit})");
    Some((action.clone(), hit))
}

/// Counts a hit of `step` and acts out the fault asked for this hit (all
/// but `error`, which is the caller's to return).
async fn reach(step: &str) -> Option<Action> {
    let (action, hit) = hit(step)?;
    match &action {
        Action::Pause(d) => tokio::time::sleep(*d).await,
        Action::Hold => {
            let release = release_file();
            let this_hit = fault_file(&format!("release-{step}-{hit}"));
            let exists = |f: &Option<PathBuf>| f.as_ref().is_some_and(|f| f.exists());
            while !exists(&release) && !exists(&this_hit) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            eprintln!("fault released at {step} (hit {hit})");
        }
        Action::Abort => std::process::abort(),
        Action::Error => {}
        Action::Resend => eprintln!("fault resend at {step} resends nothing: no script call"),
    }
    Some(action)
}

/// The point's armed action, once, if the `arm` file appeared.
fn armed_now(point: &Point) -> Option<&Action> {
    let (action, taken) = point.armed.as_ref()?;
    if taken.load(Ordering::SeqCst) || !fault_file("arm").is_some_and(|f| f.exists()) {
        return None;
    }
    (!taken.swap(true, Ordering::SeqCst)).then_some(action)
}

fn release_file() -> Option<PathBuf> {
    fault_file("release")
}

fn fault_file(name: &str) -> Option<PathBuf> {
    std::env::var_os(FAULT_DIR_ENV).map(|d| PathBuf::from(d).join(name))
}

pub const PANIC_ENV: &str = "SECKILL_TEST_PANIC";

/// Panics at `place` when the test hook asks for it.
pub fn panic_at(place: &str) {
    if std::env::var(PANIC_ENV).is_ok_and(|p| p == place) {
        panic!("test panic at {place}");
    }
}

#[cfg(test)]
mod tests {
    use super::Action;

    #[test]
    fn parses_steps_and_ignores_garbage() {
        let p = super::parse("after_commit=1s, before_commit=250ms*2,junk,x=forever,y=1s*z");
        assert_eq!(p.len(), 2);
        assert_eq!(p["after_commit"].length.as_millis(), 1000);
        assert_eq!(p["before_commit"].length.as_millis(), 250);
        assert_eq!(p["before_commit"].left.load(super::Ordering::SeqCst), 2);
    }

    #[test]
    fn parses_faults_by_hit_and_ignores_garbage() {
        let p = super::parse_faults(
            "after_lock@3=abort,after_lock@1=pause:20ms, gate_paused=hold,x@0=abort,y=boom,z@2=error,junk",
        );
        assert_eq!(p.len(), 3);
        let lock = &p["after_lock"].at;
        assert!(lock.contains(&(3, Action::Abort)));
        assert!(lock.contains(&(1, Action::Pause(std::time::Duration::from_millis(20)))));
        assert_eq!(p["gate_paused"].at, vec![(1, Action::Hold)]);
        assert_eq!(p["z"].at, vec![(2, Action::Error)]);
        let r = super::parse_faults("resend_preload@2=resend");
        assert_eq!(r["resend_preload"].at, vec![(2, Action::Resend)]);
        let a = super::parse_faults("after_lock@armed=hold");
        assert!(a["after_lock"].at.is_empty());
        assert!(matches!(a["after_lock"].armed, Some((Action::Hold, _))));
    }
}
