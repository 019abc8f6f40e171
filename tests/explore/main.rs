//! The fault explorer: one seed decides a sale, a workload and a schedule
//! of faults (plan.rs); the real binary plays it against real servers
//! (run.rs); then every fault is healed, the workers run until idle, and
//! the oracle (oracle.rs) checks what the clients were told against what
//! the stores hold. `scripts/explore.sh` is its entry point; the tests
//! named `seed_*` are the fixed set CI runs.

#[path = "../common/mod.rs"]
mod common;
mod oracle;
mod plan;
mod rng;
mod run;

use std::sync::Arc;
use std::time::{Duration, Instant};

use plan::Plan;
use run::{Answer, Stage};

/// One seed's run.
pub struct Outcome {
    pub plan: Plan,
    pub faults_fired: usize,
    pub violations: Vec<String>,
    pub undone: Vec<String>,
    pub events: Vec<(u64, String)>,
    pub logs: Vec<(String, String)>,
    pub setup: Duration,
    pub total: Duration,
}

pub async fn run_plan(plan: Plan) -> Outcome {
    let started = Instant::now();
    let stage = Stage::new(plan).await;
    for v in stage.plan.vouchers.iter().filter(|v| v.added_at_ms == 0) {
        stage.add_voucher(v.id);
    }
    {
        let s = stage.clone();
        tokio::task::spawn_blocking(move || s.start_processes())
            .await
            .expect("start the processes");
    }
    let setup = started.elapsed();
    {
        let s = stage.clone();
        tokio::task::spawn_blocking(move || s.play())
            .await
            .expect("the workload");
    }
    let s = stage.clone();
    tokio::task::spawn_blocking(move || s.heal())
        .await
        .expect("heal");
    settle(&stage).await;
    let verdict = oracle::judge(&stage).await;
    let (events, logs, mut violations, faults_fired) = {
        let mut h = stage.history.lock().unwrap();
        let fired = h.faults_fired();
        (
            h.events.clone(),
            std::mem::take(&mut h.logs),
            std::mem::take(&mut h.violations),
            fired,
        )
    };
    violations.extend(verdict.violations);
    let plan = stage.plan.clone();
    stage.cleanup().await;
    Outcome {
        plan,
        faults_fired,
        violations,
        undone: verdict.undone,
        events,
        logs,
        setup,
        total: started.elapsed(),
    }
}

/// After the faults: serve answers within its bound, every deadline
/// passes, the workers drain and reopen everything within theirs, stop
/// on SIGTERM, and a last `worker --until-idle` and `reconcile --yes`
/// leave the stores quiet for the oracle.
async fn settle(stage: &Arc<Stage>) {
    let healed = Instant::now();
    // serve's stall bound: twice (connect timeout + 4 s) + 0.5 s.
    let serve_bound = Duration::from_secs(20);
    loop {
        let s = stage.clone();
        let (status, _) = tokio::task::spawn_blocking(move || s.get("/v1/vouchers/1"))
            .await
            .expect("ask serve");
        if status == 200 {
            break;
        }
        if healed.elapsed() > serve_bound {
            stage.violation(format!(
                "serve did not answer GET /v1/vouchers/1 within {serve_bound:?} after every fault healed (last status {status})"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // serve keeps minting order ids after a Redis restart: its node-id
    // lease's connection broke with it, and a lease renewed on none lapses
    // after its usable life (27 s; E41). A purchase past that must be
    // answered with an outcome.
    let restart = stage
        .last_redis_restart_ms()
        .filter(|_| stage.plan.probe_lease);
    if let Some(restart) = restart {
        let lease_life = 30_000;
        while stage.ms() < restart + lease_life {
            tokio::time::sleep(Duration::from_millis(400)).await;
            watch_waiting(stage).await;
        }
        let s = stage.clone();
        let answer = tokio::task::spawn_blocking(move || s.probe_purchase())
            .await
            .expect("probe");
        // A gate paused (503 `paused`) answered; a lapsed lease cannot.
        let answered = match &answer {
            Some(Answer::Unknown(what)) => what.contains("\"outcome\":\"paused\""),
            Some(_) => true,
            None => false,
        };
        if !answered {
            stage.violation(format!(
                "serve gave no outcome to a purchase {} ms after Redis came back (past a node-id lease's life): {answer:?}",
                stage.ms() - restart
            ));
        }
    }
    let last_success = {
        let h = stage.history.lock().unwrap();
        h.told
            .iter()
            .filter(|t| matches!(t.answer, Answer::Success(_) | Answer::Promoted(_)))
            .map(|t| t.answered_ms)
            .max()
            .unwrap_or(0)
    };
    let longest = stage
        .plan
        .vouchers
        .iter()
        .map(|v| v.pay_timeout_ms)
        .max()
        .unwrap_or(0);
    // Past every deadline, and past the sweep's grace and period for a
    // deadline Redis lost.
    let quiet_at = last_success.max(stage.ms()) + longest + 3_500;
    // The waiting buyers are watched until then: a promotion is an answer.
    while stage.ms() < quiet_at {
        tokio::time::sleep(Duration::from_millis(400)).await;
        watch_waiting(stage).await;
    }
    let drain_bound = Duration::from_secs(60);
    let draining = Instant::now();
    let mut env_redis = stage.env.new_redis_connection().await;
    loop {
        let mut busy = Vec::new();
        for v in &stage.plan.vouchers {
            let keys =
                seckill::store::keys::VoucherKeys::new(&stage.env.prefix, v.id).expect("keys");
            let backlog = seckill::stream::backlog::backlog(&mut env_redis, &keys).await;
            let paused = oracle::gate_paused(&mut env_redis, &keys).await;
            match backlog {
                Ok(b) if b.in_flight() == 0 && !paused => {}
                Ok(b) => busy.push(format!(
                    "voucher {}: {} in flight, paused {}",
                    v.id,
                    b.in_flight(),
                    paused
                )),
                Err(e) => busy.push(format!("voucher {}: {e}", v.id)),
            }
        }
        if busy.is_empty() {
            break;
        }
        if draining.elapsed() > drain_bound {
            stage.violation(format!(
                "frozen: {drain_bound:?} after every fault healed and every deadline passed: {}",
                busy.join("; ")
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch_waiting(stage).await;
    let s = stage.clone();
    tokio::task::spawn_blocking(move || restorable_losses_left(&s))
        .await
        .expect("look for lost commits");
    let s = stage.clone();
    tokio::task::spawn_blocking(move || {
        s.collect_logs();
        s.stop_processes()
    })
    .await
    .expect("stop the processes");
    let idle = stage
        .env
        .cmd()
        .arg("worker")
        .args(run::worker_flags(&["--until-idle"]))
        .timeout(Duration::from_secs(90))
        .output();
    match idle {
        Ok(out) if out.status.success() => {}
        Ok(out) => stage.violation(format!(
            "worker --until-idle did not end well ({:?}): {}",
            out.status.code(),
            tail(&String::from_utf8_lossy(&out.stderr), 20)
        )),
        Err(e) => stage.violation(format!("worker --until-idle: {e}")),
    }
    left_for_the_operator(stage);
    let (code, report) = stage.reconcile(&["--yes"]);
    stage.event(format!("reconcile --yes after the drain: exit {code}"));
    if ![0, 4].contains(&code) {
        stage.violation(format!(
            "reconcile --yes after the drain: exit {code}: {report}"
        ));
    }
}

/// The workers mend what a fault did by themselves ("no operator is
/// needed"): drift `reconcile --dry-run` still finds once they went idle
/// is a violation, unless a Redis rollback happened (what remains exposed
/// then includes units only an operator's reconcile gives back).
fn left_for_the_operator(stage: &Arc<Stage>) {
    let (code, report) = stage.reconcile(&["--dry-run"]);
    if code == 0 {
        return;
    }
    let drifts: Vec<String> = run::drifts(&report)
        .into_iter()
        .map(|(v, class, amount)| format!("voucher {v}: {class:?} {amount}"))
        .collect();
    let what = format!(
        "the workers left drift for an operator after every fault healed (reconcile --dry-run exit {code}): {}",
        drifts.join(", ")
    );
    let redis_rolled_back = stage
        .history
        .lock()
        .unwrap()
        .events
        .iter()
        .any(|e| e.1.starts_with("fault: Redis killed -9"));
    match redis_rolled_back {
        true => stage.event(format!("{what} (after a Redis rollback: documented)")),
        false => stage.violation(what),
    }
}

/// The sale's own workers restore the commits MySQL lost that kept
/// entries name, at their guard's next pass ("When MySQL loses its last
/// commits"): past every deadline, with the workers still running, a
/// `reconcile --dry-run` that finds such orders means no guard saw the
/// loss (the drain after runs a fresh guard, which would hide a guard's
/// stale view). After a Redis rollback what is exposed is wider: not
/// checked then.
fn restorable_losses_left(stage: &Arc<Stage>) {
    let (restored, redis_rolled_back) = {
        let h = stage.history.lock().unwrap();
        (
            h.events.iter().any(|e| e.1 == run::MYSQL_RESTORE_BEGINS),
            h.events
                .iter()
                .any(|e| e.1.starts_with("fault: Redis killed -9")),
        )
    };
    if !restored || redis_rolled_back {
        return;
    }
    let (_, report) = stage.reconcile(&["--dry-run"]);
    let lost: Vec<String> = run::drift_of(&report, "orders_lost_by_mysql")
        .into_iter()
        .map(|(v, amount)| format!("voucher {v}: {amount}"))
        .collect();
    if !lost.is_empty() {
        stage.violation(format!(
            "MySQL's lost commits that kept entries name were not restored by the running workers, past every deadline: orders_lost_by_mysql {}",
            lost.join(", ")
        ));
    }
}

/// Asks serve whether each buyer told waiting has been given units.
async fn watch_waiting(stage: &Arc<Stage>) {
    let s = stage.clone();
    tokio::task::spawn_blocking(move || {
        let told = s.history.lock().unwrap().told.clone();
        let promoted: std::collections::BTreeSet<(u64, u64)> = told
            .iter()
            .filter(|t| matches!(t.answer, Answer::Promoted(_)))
            .map(|t| (t.voucher, t.user))
            .collect();
        for t in told
            .iter()
            .filter(|t| matches!(t.answer, Answer::Waiting(_)))
        {
            if !promoted.contains(&(t.voucher, t.user)) {
                s.watch_promotion(t.voucher, t.user);
            }
        }
    })
    .await
    .ok();
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What a violation prints: the seed, the schedule, what broke, what
/// happened and when, and the end of each process's log.
fn report(o: &Outcome) -> String {
    let head = match o.violations.is_empty() {
        true => "NO VIOLATION",
        false => "VIOLATION",
    };
    let mut r = format!("{head}\n{}", o.plan);
    for v in &o.violations {
        r.push_str(&format!("  broken: {v}\n"));
    }
    for u in &o.undone {
        r.push_str(&format!("  undone by a documented fault: {u}\n"));
    }
    for (at, e) in &o.events {
        r.push_str(&format!("  {at:>6} ms  {e}\n"));
    }
    for (name, log) in &o.logs {
        let wanted: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.starts_with("fault"))
            .collect();
        r.push_str(&format!(
            "  --- {name}: {} line(s), warnings and faults:\n{}\n",
            log.lines().count(),
            tail(&wanted.join("\n"), 30)
        ));
    }
    r
}

/// Drops faults while the violation persists: the shortest schedule found.
async fn shrink(plan: &Plan) -> Vec<usize> {
    let mut keep: Vec<usize> = (0..plan.faults.len()).collect();
    let mut i = 0;
    while i < keep.len() && keep.len() > 1 {
        let mut fewer = keep.clone();
        fewer.remove(i);
        let o = run_plan(plan.keeping(&fewer)).await;
        if o.violations.is_empty() {
            i += 1;
        } else {
            println!(
                "explore: seed {} still breaks without fault {}",
                plan.seed, keep[i]
            );
            keep = fewer;
        }
    }
    keep
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `scripts/explore.sh`: SECKILL_EXPLORE_SEED, _COUNT, _SEEDS (a list) or _MINUTES, _FAULTS
/// (indices of the faults to keep), _SHRINK=0 to skip shrinking,
/// _UNTIL_CAUGHT to stop at the first violation. Prints one
/// line per seed, a report per violation, and the sum; exits 1 on any.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the explorer's entry point: scripts/explore.sh"]
async fn explore() {
    let started = Instant::now();
    let minutes = env_u64("SECKILL_EXPLORE_MINUTES");
    let first = env_u64("SECKILL_EXPLORE_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_000)
            .unwrap_or(1)
    });
    // A list of seeds, played in its order (the seeds of a family, say).
    let list: Option<Vec<u64>> = std::env::var("SECKILL_EXPLORE_SEEDS")
        .ok()
        .map(|s| s.split(',').filter_map(|i| i.trim().parse().ok()).collect());
    let count = match &list {
        Some(l) => l.len() as u64,
        None => env_u64("SECKILL_EXPLORE_COUNT").unwrap_or(1),
    };
    let keep: Option<Vec<usize>> = std::env::var("SECKILL_EXPLORE_FAULTS")
        .ok()
        .map(|s| s.split(',').filter_map(|i| i.trim().parse().ok()).collect());
    let shrinking = std::env::var("SECKILL_EXPLORE_SHRINK").map_or(true, |v| v != "0");
    // Measuring a defect put back: the first seed that catches it, and when.
    let until_caught = std::env::var_os("SECKILL_EXPLORE_UNTIL_CAUGHT").is_some();
    // The history of a seed that broke nothing too (what fired, when).
    let every_report = std::env::var_os("SECKILL_EXPLORE_REPORT").is_some();
    let (mut seeds, mut faults, mut violations) = (0u64, 0usize, 0usize);
    let (mut setup, mut running) = (Duration::ZERO, Duration::ZERO);
    let mut seed = list
        .as_ref()
        .and_then(|l| l.first().copied())
        .unwrap_or(first);
    loop {
        match minutes {
            Some(m) if started.elapsed() >= Duration::from_secs(m * 60) => break,
            None if seeds >= count => break,
            _ => {}
        }
        let mut plan = Plan::from_seed(seed);
        if let Some(keep) = &keep {
            plan = plan.keeping(keep);
        }
        let o = run_plan(plan.clone()).await;
        seeds += 1;
        faults += o.faults_fired;
        setup += o.setup;
        running += o.total;
        println!(
            "explore: seed {seed}: {} fault(s) planned, {} fired, {} violation(s), {} undone by documented faults, {:.1} s",
            o.plan.faults.len(),
            o.faults_fired,
            o.violations.len(),
            o.undone.len(),
            o.total.as_secs_f64()
        );
        // Minutes to the first violation, before shrinking spends more.
        let found_after = started.elapsed().as_secs_f64() / 60.0;
        if o.violations.is_empty() && every_report {
            println!("{}", report(&o));
        }
        if !o.violations.is_empty() {
            violations += o.violations.len();
            println!("{}", report(&o));
            if shrinking && plan.faults.len() > 1 {
                let kept = shrink(&plan).await;
                let shrunk = plan.keeping(&kept);
                println!(
                    "explore: seed {seed} shrunk to {} fault(s) (replay: scripts/explore.sh --seed {seed} --faults {}):\n{shrunk}",
                    kept.len(),
                    kept.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
                );
            }
        }
        if until_caught && !o.violations.is_empty() {
            println!("explore: caught by seed {seed} after {seeds} seed(s), {found_after:.1} min");
            break;
        }
        seed = match (&list, minutes) {
            (Some(l), _) => l.get(seeds as usize).copied().unwrap_or(seed),
            (None, Some(_)) => rng::Rng::new(seed).next() % 1_000_000_000,
            (None, None) => seed + 1,
        };
    }
    println!(
        "explore: set-up {:.0}% of {:.0} s, {:.1} seeds a minute",
        100.0 * setup.as_secs_f64() / running.as_secs_f64().max(0.001),
        running.as_secs_f64(),
        seeds as f64 * 60.0 / started.elapsed().as_secs_f64().max(0.001)
    );
    println!(
        "explore: {seeds} seeds, {faults} faults, {violations} violations, {} s",
        started.elapsed().as_secs()
    );
    std::process::exit(if violations > 0 { 1 } else { 0 });
}

/// Runs one seed of CI's set: fails with the violation's report.
async fn seed_holds(seed: u64) {
    let o = run_plan(Plan::from_seed(seed)).await;
    assert!(o.violations.is_empty(), "{}", report(&o));
}

/// CI's seeds (`list_plans` shows their faults): together they cover
/// every fault kind, each test one seed, so nextest runs them side by side.
/// 143 draws `requeued_then_failover`'s witness_short (E12), 34
/// `failover_past_keep`'s second loss (E38).
const CI_SEEDS: &[u64] = &[
    2, 10, 11, 12, 13, 15, 19, 23, 28, 32, 34, 35, 42, 44, 66, 87, 143,
];

macro_rules! ci_seeds {
    ($($name:ident: $seed:expr,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                seed_holds($seed).await;
            }
        )*
    };
}

ci_seeds! {
    seed_2: 2,
    seed_10: 10,
    seed_11: 11,
    seed_12: 12,
    seed_13: 13,
    seed_15: 15,
    seed_19: 19,
    seed_23: 23,
    seed_28: 28,
    seed_32: 32,
    seed_34: 34,
    seed_35: 35,
    seed_42: 42,
    seed_44: 44,
    seed_66: 66,
    seed_87: 87,
    seed_143: 143,
}

/// The schedule that found E4 (design/explorer.md: a half-open Redis
/// connection held SIGTERM past systemd's stop timeout): seed 5's sale and
/// workload with its faults 0 and 3 as they were drawn before a stall was
/// made the only fault of half the seeds with one (seed 5's now is).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e4_a_stalled_transaction_on_a_half_open_redis_connection() {
    use plan::{Fault, Net, PointAction, Store, Target};
    let mut p = Plan::from_seed(5);
    p.faults = vec![
        Fault::Network {
            target: Target::Worker(0),
            store: Store::Redis,
            at_ms: 411,
            for_ms: 2_545,
            how: Net::BlackHole,
        },
        Fault::Point {
            target: Target::Worker(0),
            point: "before_commit",
            hit: 1,
            action: PointAction::Pause(10_791),
        },
    ];
    p.reconcile_at_ms = vec![2_760];
    let o = run_plan(p).await;
    assert!(o.violations.is_empty(), "{}", report(&o));
}

#[test]
fn ci_seeds_cover_every_fault_kind_and_family() {
    let covered: std::collections::BTreeSet<&str> = CI_SEEDS
        .iter()
        .flat_map(|s| Plan::from_seed(*s).faults)
        .map(|f| f.kind())
        .collect();
    let missing: Vec<&&str> = plan::KINDS
        .iter()
        .filter(|k| !covered.contains(*k))
        .collect();
    assert!(missing.is_empty(), "no CI seed makes {missing:?}");
    let families: std::collections::BTreeSet<&str> = CI_SEEDS
        .iter()
        .filter_map(|s| Plan::from_seed(*s).family)
        .collect();
    let missing: Vec<&&str> = plan::FAMILIES
        .iter()
        .filter(|f| !families.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "no CI seed draws the family {missing:?}"
    );
}

/// Prints the fault kinds of seeds (`SECKILL_EXPLORE_SEED`, `_COUNT`; with
/// `SECKILL_EXPLORE_PLANS` set, each whole plan) without running them: how
/// CI's seed set was picked.
#[test]
#[ignore = "a listing for choosing seeds"]
fn list_plans() {
    let first = env_u64("SECKILL_EXPLORE_SEED").unwrap_or(1);
    for seed in first..first + env_u64("SECKILL_EXPLORE_COUNT").unwrap_or(50) {
        let p = Plan::from_seed(seed);
        let kinds: Vec<&str> = p.faults.iter().map(|f| f.kind()).collect();
        println!("{seed}: {}", kinds.join(" "));
        if std::env::var_os("SECKILL_EXPLORE_PLANS").is_some() {
            println!("{p}");
        }
    }
}

/// Every past defect of design/defects/ can still be put back into the
/// code (`scripts/explore-defect.sh` applies its patch to a worktree): a
/// change to the code a patch touches must carry the patch along, or the
/// measure of what the explorer catches quietly loses that defect.
#[test]
fn every_defect_patch_still_applies_to_the_code() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = std::path::Path::new(root).join("design/defects");
    let mut patches: Vec<_> = std::fs::read_dir(&dir)
        .expect("design/defects")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "patch"))
        .collect();
    patches.sort();
    assert!(patches.len() >= 30, "{} patches", patches.len());
    let stale: Vec<String> = patches
        .iter()
        .filter(|p| {
            let checked = std::process::Command::new("git")
                .args(["apply", "--check"])
                .arg(p)
                .current_dir(root)
                .output()
                .expect("git runs");
            !checked.status.success()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(stale.is_empty(), "patches that no longer apply: {stale:?}");
}
