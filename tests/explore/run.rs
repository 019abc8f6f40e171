//! One plan played against the real binary and real servers: a Redis of
//! the seed's own (so it can go back to a snapshot), a database of its own
//! on the project's MariaDB, `seckill serve` and one or two workers each
//! behind proxies of their own, buyers and payers over HTTP and the CLI,
//! an operator, and the plan's faults. Every answer a client got is kept
//! for the oracle.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::fault_proxy::{FaultProxy, Mode};
use crate::common::mysql_dump::Dump;
use crate::common::own_redis::OwnRedis;
use crate::common::process::WorkerProc;
use crate::common::serve_proc::Serve;
use crate::common::{fast_worker, free_port, TestEnv};

use seckill::store::keys::{VoucherKeys, WORKER_GROUP};

use super::plan::{Attempt, Caller, Fault, Net, Plan, PointAction, Store, Target, Then, Via};

/// Room for a loaded machine in the bound of a hung transaction.
const STALL_SLACK_MS: u64 = 2_500;

/// The event of a MySQL set back to a dump, logged as the switch begins
/// (the oracle's window of what it may undo starts there).
pub const MYSQL_RESTORE_BEGINS: &str = "MySQL switching back to its dump";
/// `second_loss`: MySQL dumped after the drops (the point it goes back to).
pub const SECOND_DUMP: &str = "MySQL dumped again, after the drops";

/// The event of a Redis snapshot, logged as SAVE is sent.
pub const REDIS_SNAPSHOT_BEGINS: &str = "Redis snapshot begins";

/// The event of a worker seen dead, kept down for the plan's restart
/// delay (after its name).
pub const DIED: &str = " died; down for the restart delay";

/// The event of a held worker saying it holds a voucher's gate for a
/// batch Redis lost, followed by the voucher's id.
pub const HOLD_TAKEN: &str = "hold taken of the gate of voucher ";

/// The book's bound for a worker stopped inside its transaction at the
/// explorer's flags: the `--lock-lease` (1 s), one lock wait (1 s), one
/// retry backoff (1 s here), the taker's `--claim-idle` and a half
/// (0.75 s), and the slack of a loaded machine.
const FROZEN_BOUND_MS: u64 = 1_000 + 1_000 + 1_000 + 750 + STALL_SLACK_MS;

/// What a client was told.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A unit is the buyer's: the order id.
    Success(u64),
    /// Already a buyer (a resend after a lost answer), with the order id
    /// when MySQL had it.
    Bought(Option<u64>),
    /// On the waitlist at this position.
    Waiting(u64),
    /// Seen bought while waiting: the waitlist gave them units.
    Promoted(Option<u64>),
    Refused(String),
    /// No answer, or one saying the outcome is unknown.
    Unknown(String),
    Paid(u64),
    PayRefused(u64, String),
}

#[derive(Debug, Clone)]
pub struct Told {
    pub voucher: u64,
    pub user: u64,
    pub sent_ms: u64,
    pub answered_ms: u64,
    pub via: Via,
    pub answer: Answer,
}

#[derive(Default)]
pub struct History {
    pub told: Vec<Told>,
    /// (ms, what happened): faults fired, processes started again.
    pub events: Vec<(u64, String)>,
    /// Violations seen while running (a process not answering in its bound).
    pub violations: Vec<String>,
    pub logs: Vec<(String, String)>,
    /// The highest per-user limit each voucher had.
    pub limits: BTreeMap<u64, u32>,
    /// Orders a held worker had in hand (read, not acknowledged) when
    /// Redis went back to a snapshot, with who held them: the book keeps
    /// such a batch, so no rollback excuses losing one.
    pub in_hand: BTreeMap<u64, String>,
}

impl History {
    /// The faults the explorer made and those the processes acted out at
    /// their fault points (a point's hit may never come).
    pub fn faults_fired(&self) -> usize {
        let made = self
            .events
            .iter()
            .filter(|e| e.1.starts_with("fault:"))
            .count();
        let acted: usize = self
            .logs
            .iter()
            .map(|(_, log)| {
                log.lines()
                    .filter(|l| l.starts_with("fault ") && !l.starts_with("fault released"))
                    .count()
            })
            .sum();
        made + acted
    }
}

enum Proc {
    Worker(WorkerProc),
    Serve(Serve),
}

impl Proc {
    fn pid(&self) -> u32 {
        match self {
            Proc::Worker(w) => w.pid(),
            Proc::Serve(s) => s.child.id(),
        }
    }

    fn exited(&mut self) -> bool {
        match self {
            Proc::Worker(w) => w.wait_for(Duration::ZERO).is_some(),
            Proc::Serve(s) => matches!(s.child.try_wait(), Ok(Some(_))),
        }
    }

    fn log_text(&self) -> String {
        match self {
            Proc::Worker(w) => w.log_text(),
            Proc::Serve(s) => s.log_text(),
        }
    }
}

fn signal(pid: u32, sig: &str) {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .ok();
}

struct Slot {
    proc: Option<Proc>,
    incarnation: u32,
    /// Not to be started again before this (a kill -9's time down).
    down_until: Option<Instant>,
    stopped: bool,
}

/// Everything the threads of a run share.
pub struct Stage {
    pub plan: Plan,
    pub env: TestEnv,
    redis: OwnRedis,
    t0: Instant,
    dir: PathBuf,
    serve_port: u16,
    slots: Mutex<HashMap<Target, Slot>>,
    proxies: HashMap<(Target, Store), FaultProxy>,
    pub history: Mutex<History>,
    /// The workload is over: the supervisor and the watchers stop.
    done: std::sync::atomic::AtomicBool,
    /// The dumps taken, by the fault that took them.
    dumps: Mutex<HashMap<usize, Dump>>,
    /// The processes are being stopped: the supervisor stops too.
    stopping: std::sync::atomic::AtomicBool,
    supervisor: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The runtime the proxies run on, for the threads that drive them.
    rt: tokio::runtime::Handle,
}

impl Stage {
    pub async fn new(plan: Plan) -> Arc<Stage> {
        let redis = OwnRedis::start();
        let env = TestEnv::on_redis(&redis.url()).await;
        let dir =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("explore-{}", env.prefix));
        std::fs::create_dir_all(&dir).expect("the run's folder");
        let mysql = url::Url::parse(&env.cfg.mysql_url).expect("mysql url");
        let mysql_addr = format!("127.0.0.1:{}", mysql.port().unwrap_or(3306))
            .parse()
            .expect("mysql address");
        let redis_addr = format!("127.0.0.1:{}", redis.port)
            .parse()
            .expect("redis address");
        let mut targets: Vec<Target> = (0..plan.workers).map(Target::Worker).collect();
        targets.push(Target::Serve);
        let mut proxies = HashMap::new();
        for t in &targets {
            proxies.insert((*t, Store::Redis), FaultProxy::start(redis_addr).await);
            proxies.insert((*t, Store::Mysql), FaultProxy::start(mysql_addr).await);
        }
        let slots = targets
            .iter()
            .map(|t| {
                (
                    *t,
                    Slot {
                        proc: None,
                        incarnation: 0,
                        down_until: None,
                        stopped: false,
                    },
                )
            })
            .collect();
        let mut history = History::default();
        for v in &plan.vouchers {
            history.limits.insert(v.id, v.per_user_limit);
        }
        Arc::new(Stage {
            plan,
            env,
            redis,
            t0: Instant::now(),
            dir,
            serve_port: free_port(),
            slots: Mutex::new(slots),
            proxies,
            history: Mutex::new(history),
            done: Default::default(),
            dumps: Mutex::default(),
            stopping: Default::default(),
            supervisor: Mutex::default(),
            rt: tokio::runtime::Handle::current(),
        })
    }

    pub fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    fn sleep_until(&self, at_ms: u64) {
        let now = self.ms();
        if at_ms > now {
            std::thread::sleep(Duration::from_millis(at_ms - now));
        }
    }

    pub fn event(&self, what: String) {
        let at = self.ms();
        self.history.lock().unwrap().events.push((at, what));
    }

    pub fn violation(&self, what: String) {
        self.history.lock().unwrap().violations.push(what);
    }

    fn tell(&self, attempt: (u64, u64, Via), sent_ms: u64, answer: Answer) {
        let (voucher, user, via) = attempt;
        let answered_ms = self.ms();
        self.history.lock().unwrap().told.push(Told {
            voucher,
            user,
            sent_ms,
            answered_ms,
            via,
            answer,
        });
    }

    /// The store URLs a process behind its own proxies uses.
    fn proxied_env(&self, target: Target) -> Vec<(String, String)> {
        let redis = &self.proxies[&(target, Store::Redis)];
        let mysql = &self.proxies[&(target, Store::Mysql)];
        let mut url = url::Url::parse(&self.env.cfg.mysql_url).expect("mysql url");
        url.set_port(Some(mysql.port)).expect("a port");
        // Through the proxy: the driver would move a local connection to
        // the server's unix socket.
        url.query_pairs_mut().append_pair("prefer_socket", "false");
        vec![
            (
                "SECKILL_REDIS_URL".into(),
                format!("redis://127.0.0.1:{}/", redis.port),
            ),
            ("SECKILL_MYSQL_URL".into(), url.to_string()),
        ]
    }

    fn fault_dir(&self, target: Target) -> PathBuf {
        self.dir.join(match target {
            Target::Worker(i) => format!("worker-{i}"),
            Target::Serve => "serve".into(),
        })
    }

    /// The fault points and clock the plan gives this process: points on
    /// its first start only (a fault fires once), the clock on every one.
    fn fault_env(&self, target: Target, incarnation: u32) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        let dir = self.fault_dir(target);
        std::fs::create_dir_all(&dir).ok();
        vars.push(("SECKILL_TEST_FAULT_DIR".into(), dir.display().to_string()));
        let mut spec = Vec::new();
        for f in &self.plan.faults {
            match f {
                Fault::Point {
                    target: t,
                    point,
                    hit,
                    action,
                } if *t == target && incarnation == 0 => {
                    let a = match action {
                        PointAction::Pause(ms) => format!("pause:{ms}ms"),
                        PointAction::Abort => "abort".into(),
                        PointAction::Error => "error".into(),
                    };
                    spec.push(format!("{point}@{hit}={a}"));
                }
                Fault::Hold {
                    worker,
                    point,
                    hit,
                    armed_at_ms,
                    ..
                } if Target::Worker(*worker) == target && incarnation == 0 => match armed_at_ms {
                    0 => spec.push(format!("{point}@{hit}=hold")),
                    _ => spec.push(format!("{point}@armed=hold")),
                },
                Fault::Resend {
                    by: Caller::Process(t),
                    ..
                } if *t == target && incarnation == 0 => spec.extend(f.resend_spec()),
                Fault::Skew { worker, offset_s } if Target::Worker(*worker) == target => {
                    let offset = format!("{offset_s:+}s");
                    for (k, v) in crate::common::clock::skewed_clock(&offset, offset_s / 2) {
                        vars.push((k.to_string(), v));
                    }
                }
                _ => {}
            }
        }
        if self.plan.second_loss && target == Target::Worker(0) && incarnation == 0 {
            spec.push("before_raise@armed=hold".into());
        }
        if !spec.is_empty() {
            vars.push(("SECKILL_TEST_FAULT".into(), spec.join(",")));
        }
        vars
    }

    fn spawn(&self, target: Target, incarnation: u32) -> Proc {
        let mut vars = self.proxied_env(target);
        vars.extend(self.fault_env(target, incarnation));
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        match target {
            Target::Worker(_) => {
                let gate_check = format!("{}ms", self.plan.gate_check_ms);
                let mysql_timeout = self.plan.mysql_timeout_ms.map(|ms| format!("{ms}ms"));
                let mut flags = worker_flags(&[]);
                set_flag(&mut flags, "--gate-check", &gate_check);
                let small = match self.plan.small_batch {
                    Some((w, n)) if target == Target::Worker(w) => Some(n.to_string()),
                    _ => None,
                };
                if let Some(n) = small.as_deref() {
                    flags.extend(["--batch", n, "--max-batch", n]);
                }
                if self.plan.one_lane {
                    flags.extend(["--lanes", "1"]);
                }
                if let Some(t) = mysql_timeout.as_deref() {
                    flags.extend(["--mysql-timeout", t]);
                }
                let mut w = self.env.spawn_worker_with(&flags, &vars);
                // Pauses are the guard's answer to many of these faults; a
                // gate left paused is the oracle's to find.
                w.expect_gate_pauses();
                Proc::Worker(w)
            }
            Target::Serve => Proc::Serve(Serve::start_at(
                self.serve_port,
                &self.env,
                &[],
                &[],
                "seckill=info",
                &vars,
            )),
        }
    }

    /// Starts every process of the plan.
    pub fn start_processes(&self) {
        let mut slots = self.slots.lock().unwrap();
        for (target, slot) in slots.iter_mut() {
            slot.proc = Some(self.spawn(*target, 0));
        }
    }

    /// Starts again, as systemd would, a process that died (a kill -9, an
    /// abort at a fault point) once its time down is over.
    fn supervise(&self) {
        while !self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            self.restart_dead();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn restart_dead(&self) {
        let mut slots = self.slots.lock().unwrap();
        let mut restarted = Vec::new();
        let mut died = Vec::new();
        for (target, slot) in slots.iter_mut() {
            if slot.down_until.is_some_and(|t| Instant::now() < t) {
                continue;
            }
            let dead = match slot.proc.as_mut() {
                Some(p) => p.exited(),
                None => true,
            };
            let delay = self.plan.restart_delay_ms;
            if dead && slot.down_until.is_none() && delay > 0 && *target != Target::Serve {
                // Down for systemd's RestartSec first.
                slot.down_until = Some(Instant::now() + Duration::from_millis(delay));
                died.push(*target);
                continue;
            }
            if dead {
                if let Some(p) = slot.proc.take() {
                    let log = p.log_text();
                    self.history
                        .lock()
                        .unwrap()
                        .logs
                        .push((format!("{target} #{}", slot.incarnation), log));
                }
                slot.incarnation += 1;
                slot.down_until = None;
                slot.proc = Some(self.spawn(*target, slot.incarnation));
                restarted.push(*target);
            }
        }
        drop(slots);
        for t in died {
            self.event(format!("{t}{DIED}"));
        }
        for t in restarted {
            self.event(format!("{t} started again"));
        }
    }

    fn kill9(&self, target: Target, down_ms: u64) {
        let mut slots = self.slots.lock().unwrap();
        if let Some(slot) = slots.get_mut(&target) {
            if let Some(p) = slot.proc.as_ref() {
                signal(p.pid(), "KILL");
            }
            slot.down_until = Some(Instant::now() + Duration::from_millis(down_ms));
        }
    }

    fn stop(&self, target: Target, stopped: bool) {
        let mut slots = self.slots.lock().unwrap();
        if let Some(slot) = slots.get_mut(&target) {
            if let Some(p) = slot.proc.as_ref() {
                signal(p.pid(), if stopped { "STOP" } else { "CONT" });
            }
            slot.stopped = stopped;
        }
    }

    /// The plan's timed faults, each at its moment.
    fn drive_faults(self: &Arc<Self>) {
        let mut steps: Vec<(u64, usize, bool)> = Vec::new();
        for (i, f) in self.plan.faults.iter().enumerate() {
            match f {
                Fault::Kill9 { at_ms, .. } => steps.push((*at_ms, i, true)),
                Fault::Stop { at_ms, for_ms, .. } | Fault::Network { at_ms, for_ms, .. } => {
                    steps.push((*at_ms, i, true));
                    steps.push((at_ms + for_ms, i, false));
                }
                Fault::RedisRollback {
                    snapshot_at_ms,
                    crash_at_ms,
                    ..
                } => {
                    steps.push((*snapshot_at_ms, i, true));
                    steps.push((*crash_at_ms, i, false));
                }
                Fault::MysqlRollback {
                    dump_at_ms,
                    restore_at_ms,
                } => {
                    steps.push((*dump_at_ms, i, true));
                    steps.push((*restore_at_ms, i, false));
                }
                Fault::Hold {
                    snapshot_at_ms,
                    armed_at_ms,
                    ..
                } => {
                    steps.push((*snapshot_at_ms, i, true));
                    if *armed_at_ms > 0 {
                        steps.push((*armed_at_ms, i, false));
                    }
                }
                Fault::Point { .. } | Fault::Skew { .. } | Fault::Resend { .. } => {}
            }
        }
        steps.sort();
        for (at, i, first) in steps {
            self.sleep_until(at);
            let f = self.plan.faults[i].clone();
            self.act(i, &f, first);
        }
    }

    fn act(&self, index: usize, f: &Fault, first: bool) {
        match (f, first) {
            (
                Fault::Kill9 {
                    target, down_ms, ..
                },
                _,
            ) => {
                self.kill9(*target, *down_ms);
                self.event(format!("fault: kill -9 {target}"));
            }
            (Fault::Stop { target, .. }, start) => {
                self.stop(*target, start);
                self.event(match start {
                    true => format!("fault: SIGSTOP {target}"),
                    false => format!("healed: SIGCONT {target}"),
                });
            }
            (
                Fault::Network {
                    target, store, how, ..
                },
                true,
            ) => {
                let proxy = &self.proxies[&(*target, *store)];
                match how {
                    Net::BlackHole => proxy.set(Mode::BlackHole),
                    Net::Delay(ms) => proxy.set(Mode::Delay(Duration::from_millis(*ms))),
                    Net::Reset => self.rt.block_on(proxy.reset()),
                }
                self.event(format!("fault: {how:?} between {target} and {store:?}"));
            }
            (Fault::Network { target, store, .. }, false) => {
                self.proxies[&(*target, *store)].heal();
                self.event(format!("healed: {target} and {store:?}"));
            }
            (Fault::RedisRollback { .. } | Fault::Hold { .. }, true) => {
                // Logged as SAVE is sent: an admission answered while it
                // runs may be after its cut, so the oracle's window opens here.
                self.event(REDIS_SNAPSHOT_BEGINS.into());
                self.redis.snapshot();
                self.event("Redis snapshot taken".into());
                if let Fault::Hold {
                    then: Then::MysqlRestore,
                    ..
                } = f
                {
                    let dump = self.env.dump_mysql();
                    self.dumps.lock().unwrap().insert(index, dump);
                }
            }
            (Fault::Hold { worker, .. }, false) => {
                // Armed: the hold fires on the worker's next hit of its point.
                let target = Target::Worker(*worker);
                std::fs::write(self.fault_dir(target).join("arm"), b"").ok();
                self.event(format!("armed: the hold of {target}"));
            }
            (Fault::RedisRollback { empty: true, .. }, false) => self.redis_back_empty(),
            (Fault::RedisRollback { .. }, false) => {
                self.redis.crash_and_restart();
                self.event("fault: Redis killed -9, started from its snapshot".into());
            }
            (Fault::MysqlRollback { .. }, true) => {
                let dump = self.env.dump_mysql();
                self.dumps.lock().unwrap().insert(index, dump);
                self.event("MySQL dumped".into());
            }
            (Fault::MysqlRollback { .. }, false) => {
                if self.plan.trim_before_restore {
                    self.trim_streams();
                }
                self.event(MYSQL_RESTORE_BEGINS.into());
                if let Some(d) = self.dumps.lock().unwrap().remove(&index) {
                    self.env.restore_mysql(&d);
                }
                self.event("fault: MySQL set back to its dump".into());
            }
            _ => {}
        }
    }

    /// The keys of every voucher of the plan.
    fn voucher_keys(&self) -> Vec<VoucherKeys> {
        self.plan
            .vouchers
            .iter()
            .filter_map(|v| VoucherKeys::new(&self.env.prefix, v.id).ok())
            .collect()
    }

    /// A CLI run's resent script calls (its `fault resend` lines) counted
    /// as fired faults, as a process's are.
    fn resends_fired(&self, err: &str, by: &str) {
        for line in err.lines().filter(|l| l.starts_with("fault resend")) {
            self.event(format!("fault: {line}, by {by}"));
        }
    }

    /// Every voucher's acknowledged entries trimmed, as a worker's trim
    /// does past `--keep` (nothing undelivered or pending).
    fn trim_streams(&self) {
        let all = self.voucher_keys();
        let env = &self.env;
        let trimmed = self.rt.block_on(async move {
            let mut redis = env.new_redis_connection().await;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let mut trimmed = 0;
            for keys in &all {
                trimmed += seckill::worker::group::trim(&mut redis, keys, 0, now)
                    .await
                    .unwrap_or(0);
            }
            trimmed
        });
        self.event(format!(
            "fault: {trimmed} acknowledged entries trimmed (--keep past)"
        ));
    }

    /// The operator requeueing every voucher's dead letters, each call
    /// sent twice (its first reply lost): a letter the first run requeued
    /// must be reported so by the second's answer, not "no such dead
    /// letter" (docs/src/guide/pending.md: "a call resent after a lost
    /// reply reports the same outcome"; E07).
    fn requeue(&self, at: u64) {
        self.sleep_until(at);
        // In Redis's script cache first (a Redis started again has none):
        // else the first call is answered NOSCRIPT, and the resend spent
        // on it (the client loads the script and calls again, once).
        let env = &self.env;
        self.rt.block_on(async move {
            let mut redis = env.new_redis_connection().await;
            let _: Result<String, _> = seckill::store::scripts::REQUEUE
                .prepare_invoke()
                .load_async(&mut redis)
                .await;
        });
        let vars = vec![(
            "SECKILL_TEST_FAULT".to_string(),
            "resend_requeue@1=resend".to_string(),
        )];
        for v in &self.plan.vouchers {
            let id = v.id.to_string();
            let (code, report, err) = self.cli_with(
                &[
                    "pending",
                    "--voucher",
                    &id,
                    "--requeue",
                    "--yes",
                    "--format",
                    "json",
                ],
                &vars,
            );
            let entries: Vec<&Value> = report["entries"]
                .as_array()
                .map(|e| e.iter().collect())
                .unwrap_or_default();
            let outcomes: Vec<String> = entries
                .iter()
                .map(|e| format!("{} {}", e["outcome"], e["reason"]))
                .collect();
            self.event(format!(
                "pending --voucher {id} --requeue --yes: exit {code:?}, {} letter(s): {}",
                entries.len(),
                outcomes.join("; ")
            ));
            self.resends_fired(&err, "pending --requeue");
            for e in entries
                .iter()
                .filter(|e| e["reason"] == "no such dead letter")
            {
                self.violation(format!(
                    "voucher {id}: pending --requeue (its call sent twice) reported dead letter {} \"no such dead letter\", a letter it had just listed",
                    e["id"]
                ));
            }
        }
    }

    /// Every gate watched (meta `paused`, every 10 ms) from when no pause
    /// may come any more (`no_pause_from_ms`) to the sale's end, or to
    /// MySQL's second loss if the plan has one: a pause
    /// then is one no buyer need meet to be wrong (the guard's rebuild
    /// reopens within milliseconds; E39 paused and reopened every other
    /// pass, 300 ms apart).
    fn watch_pauses(&self, from: u64) {
        self.sleep_until(from);
        let end = self.plan.duration_ms;
        let all = self.voucher_keys();
        let env = &self.env;
        let seen = self.rt.block_on(async move {
            let mut redis = env.new_redis_connection().await;
            let mut seen: BTreeMap<u64, (u64, Option<String>)> = BTreeMap::new();
            let started = Instant::now();
            while started.elapsed() < Duration::from_millis(end.saturating_sub(from)) {
                for keys in &all {
                    let v = &keys.voucher();
                    let (paused, reason): (Option<String>, Option<String>) = redis::cmd("HMGET")
                        .arg(keys.meta())
                        .arg("paused")
                        .arg("paused_reason")
                        .query_async(&mut redis)
                        .await
                        .unwrap_or((None, None));
                    if paused.as_deref() == Some("1") && !seen.contains_key(v) {
                        seen.insert(*v, (from + started.elapsed().as_millis() as u64, reason));
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            seen
        });
        // Up to MySQL's second loss, if the plan has one, as the oracle
        // judges what buyers were told: the guard pauses for that loss, as
        // it must. The drops before it take longer on a loaded machine,
        // so it can come past `from` (CI, seed 34: its pause at 8809 ms).
        let second_loss = self
            .history
            .lock()
            .unwrap()
            .events
            .iter()
            .find(|(_, what)| what == SECOND_DUMP)
            .map_or(u64::MAX, |(at, _)| *at);
        for (v, (at, reason)) in seen.into_iter().filter(|(_, (at, _))| *at < second_loss) {
            self.violation(format!(
                "voucher {v}: its gate paused at {at} ms (reason {reason:?}), after the guard had its passes over what the drop of the lost commits left (from {from} ms)"
            ));
        }
    }

    /// The operator dropping lost commits nothing kept can restore, by
    /// their count, from three runs at once, each slow between its read
    /// and its write:
    /// `reconcile --dry-run` names the amount of
    /// `orders_lost_unrestorable` per voucher.
    fn drop_lost_commits(&self, at: u64) {
        self.sleep_until(at);
        if self.plan.second_loss {
            // Worker 0's guard stands at its first raise from now on: the
            // one after the drops, which would set a witness they left
            // short back up to MySQL's count.
            std::fs::write(self.fault_dir(Target::Worker(0)).join("arm"), b"").ok();
            self.event("armed: worker 0's guard held at its next raise".into());
        }
        let (_, report) = self.reconcile(&["--dry-run"]);
        for (v, n) in drift_of(&report, "orders_lost_unrestorable") {
            let (v, n) = (v.to_string(), n.to_string());
            let runs: Vec<_> = (0..3)
                .map(|_| {
                    let args = [
                        "reconcile",
                        "--voucher",
                        &v,
                        "--drop-lost-commits",
                        &n,
                        "--yes",
                        "--settle",
                        "0s",
                        "--format",
                        "json",
                    ]
                    .map(str::to_string);
                    let mut run = self.env.cmd();
                    // Each stands 300 ms between its read of the gap and
                    // taking it off the witness, so the three, started
                    // together, read the same gap (a read alone is
                    // bracketed: one that saw the gate move reads again),
                    // and 600 ms before it sets the witness back up to
                    // MySQL's count, so every run has taken its gap off
                    // (or found it gone) before any raise heals a double
                    // take: what the runs' reads then meet is what the
                    // takes left (E38: below 0, every read failed).
                    run.env(
                        "SECKILL_TEST_FAULT",
                        "before_forget@1=pause:300ms,before_raise@1=pause:600ms",
                    );
                    std::thread::spawn(move || {
                        run.args(&args).timeout(Duration::from_secs(30)).output()
                    })
                })
                .collect();
            for run in runs {
                let code = run
                    .join()
                    .ok()
                    .and_then(|o| o.ok())
                    .and_then(|o| o.status.code());
                self.event(format!(
                    "reconcile --voucher {v} --drop-lost-commits {n} --yes: exit {code:?}"
                ));
                // Done (0), repaired (4), or drift left (3: a sale that
                // moved under its reads more than --attempts times, as
                // a running sale may): another run's drop must not make
                // this one fail (1: E38's witness below 0 failed its reads).
                if !matches!(code, Some(0 | 3 | 4)) {
                    self.violation(format!(
                        "reconcile --voucher {v} --drop-lost-commits {n} --yes, one of three at once, exited {code:?}"
                    ));
                }
            }
        }
        if self.plan.second_loss {
            self.lose_again();
        }
    }

    /// MySQL loses the commits of the next second (every entry of them
    /// kept) while worker 0's guard stands at its raise, then the guard is
    /// let go: the loss must be seen and restored, not hidden by a
    /// witness the drops left short.
    fn lose_again(&self) {
        std::thread::sleep(Duration::from_millis(300));
        let dump = self.env.dump_mysql();
        self.event(SECOND_DUMP.into());
        std::thread::sleep(Duration::from_millis(1_000));
        self.event(MYSQL_RESTORE_BEGINS.into());
        self.env.restore_mysql(&dump);
        self.event("fault: MySQL set back to its second dump".into());
        std::fs::write(self.fault_dir(Target::Worker(0)).join("release"), b"").ok();
        self.event("released: worker 0's guard".into());
    }

    /// Redis killed -9 and started with no data: every gate, stream and
    /// node-id lease lost whole.
    fn redis_back_empty(&self) {
        self.redis.crash_and_restart_empty();
        self.event("fault: Redis killed -9, started empty".into());
    }

    /// Watches for a held process and makes the second fault while it
    /// stands there, then lets it go.
    fn combine_holds(&self) {
        let holds: Vec<(usize, usize, &'static str, Then)> = self
            .plan
            .faults
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match f {
                Fault::Hold {
                    worker,
                    point,
                    then,
                    ..
                } => Some((i, *worker, *point, *then)),
                _ => None,
            })
            .collect();
        for (index, worker, point, then) in holds {
            let target = Target::Worker(worker);
            let needle = format!("fault hold at {point}");
            loop {
                if self.done.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                if self.log_of(target).contains(&needle) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            self.event(format!("held: {target} at {point}"));
            let watching = std::sync::atomic::AtomicBool::new(true);
            std::thread::scope(|scope| {
                if matches!(then, Then::RedisCrash | Then::RedisEmpty)
                    && self.only_redis_loss(index, target)
                {
                    scope.spawn(|| self.watch_holds_taken(target, &watching));
                }
                self.hold_and_combine(index, worker, point, then);
                watching.store(false, std::sync::atomic::Ordering::SeqCst);
            });
        }
    }

    /// Whether the hold at `index` is the plan's only loss of Redis's
    /// writes and nothing else befalls its worker: then the hold's
    /// promise (the book, "Batches in hand": no reopen, no repair giving
    /// units back while it is live) is judged alone.
    fn only_redis_loss(&self, index: usize, target: Target) -> bool {
        self.nothing_else_befalls(index, target)
            && self.plan.faults.iter().enumerate().all(|(i, f)| {
                i == index
                    || !matches!(
                        f,
                        Fault::RedisRollback { .. }
                            | Fault::Hold {
                                then: Then::RedisCrash | Then::RedisEmpty,
                                ..
                            }
                    )
            })
    }

    /// Notes when the held worker says it holds a voucher's gate for the
    /// batch Redis lost (the oracle's Redis window closes there for that
    /// voucher), until `watching` goes false.
    fn watch_holds_taken(&self, target: Target, watching: &std::sync::atomic::AtomicBool) {
        let mut seen: Vec<u64> = Vec::new();
        while watching.load(std::sync::atomic::Ordering::SeqCst) {
            let log = self.log_of(target);
            for v in &self.plan.vouchers {
                let line = format!("voucher {}: Redis no longer has every entry", v.id);
                if !seen.contains(&v.id) && log.contains(&line) {
                    seen.push(v.id);
                    self.event(format!("{HOLD_TAKEN}{}", v.id));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The second fault made while `target` stands held at `point`, then
    /// the hold let go.
    fn hold_and_combine(&self, index: usize, worker: usize, point: &'static str, then: Then) {
        let target = Target::Worker(worker);
        let mut again: Vec<Attempt> = Vec::new();
        let mut preload_now = false;
        // Read before Redis goes: the buyers of the batch in hand are the
        // ones MySQL and a preload's image lack.
        let held = match then {
            Then::RedisCrash | Then::RedisEmpty => self.in_hand(target),
            _ => Vec::new(),
        };
        if matches!(then, Then::RedisCrash | Then::RedisEmpty)
            && self.nothing_else_befalls(index, target)
        {
            let who = format!("{target}, held at {point}");
            let mut h = self.history.lock().unwrap();
            h.in_hand.extend(held.iter().map(|o| (*o, who.clone())));
        }
        match then {
            Then::RedisCrash => {
                self.redis.crash_and_restart();
                self.event("fault: Redis killed -9, started from its snapshot".into());
            }
            Then::RedisEmpty => {
                self.redis_back_empty();
                if self.plan.preload_in_hold {
                    // After the held worker saw its batch lost and
                    // took the hold (or 5 s): an operator preloading
                    // the lost gates once the worker said so.
                    self.wait_log(target, "Redis no longer has every entry", 5_000);
                    // The buyers of the batch in hand (then the
                    // earliest), whose orders MySQL lacks and the
                    // preload's image with them, press buy again at once,
                    // inside the keep-alive's tick: a gate published open
                    // sells to them twice (E17).
                    again = self.buyers_of(&held);
                    self.event(format!(
                        "{} buyer(s) of the batch in hand press buy again after the preload",
                        again.len()
                    ));
                    again.extend(self.plan.attempts.iter().take(8).cloned());
                    again.truncate(8);
                    preload_now = true;
                }
            }
            Then::MysqlRestore => {
                let dump = self.dumps.lock().unwrap().remove(&index);
                let dump = dump.unwrap_or_else(|| self.env.dump_mysql());
                self.event(MYSQL_RESTORE_BEGINS.into());
                self.env.restore_mysql(&dump);
                self.event("fault: MySQL set back to its dump".into());
            }
            Then::KillOther => {
                let other = Target::Worker((worker + 1) % self.plan.workers.max(1));
                if other != target {
                    if self.plan.small_batch.is_some() {
                        // The other worker reads on meanwhile: the entries
                        // it holds when killed are behind the held batch.
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    let live = self.in_hand(target);
                    let dying = self.in_hand(other);
                    self.kill9(other, 200);
                    let began = self.ms();
                    self.event(format!(
                        "fault: kill -9 {other} ({} entries pending to it, {} in the hand of {target})",
                        dying.len(),
                        live.len()
                    ));
                    // The family's own stall of worker 0 ends before it.
                    if self.plan.family == Some("killed_behind_live") {
                        self.judge_reclaimed(other, began, &live);
                    }
                }
            }
            Then::Freeze(ms) => {
                self.stop(target, true);
                let began = self.ms();
                self.event(format!("fault: SIGSTOP {target} where it is held"));
                if point == "before_commit" {
                    self.judge_frozen(index, target, began, ms);
                }
                self.sleep_until(began + ms);
                self.stop(target, false);
                self.event(format!("healed: SIGCONT {target}"));
            }
        }
        // Held on while they are answered (each buy retries a paused
        // gate for up to 2.4 s), but no longer than the plan's linger.
        std::thread::scope(|scope| {
            if preload_now {
                // Each voucher's returning buyers right after its preload.
                for v in &self.plan.vouchers {
                    let id = v.id.to_string();
                    let (code, _, err) = self.cli(&["preload", "--voucher", &id]);
                    for a in again.iter().filter(|a| a.voucher == v.id) {
                        scope.spawn(move || self.buy(a));
                    }
                    self.event(format!(
                        "preload --voucher {id} while {target} is held: exit {code:?} {}",
                        err.trim()
                    ));
                }
            } else {
                for a in &again {
                    scope.spawn(move || self.buy(a));
                }
            }
            if self.plan.reconcile_in_hold && matches!(then, Then::RedisCrash | Then::RedisEmpty) {
                let (code, _, err) =
                    self.cli(&["reconcile", "--yes", "--settle", "0s", "--format", "json"]);
                self.event(format!(
                    "reconcile --yes while {target} is held: exit {code:?} {}",
                    err.trim()
                ));
            }
            if self.plan.hold_linger_ms > 0 && !matches!(then, Then::Freeze(_)) {
                std::thread::sleep(Duration::from_millis(self.plan.hold_linger_ms));
            }
        });
        self.release(target);
    }

    /// The attempts of the buyers told success with these orders (at most
    /// 8), made again now.
    fn buyers_of(&self, orders: &[u64]) -> Vec<Attempt> {
        let h = self.history.lock().unwrap();
        h.told
            .iter()
            .filter(|t| matches!(t.answer, Answer::Success(o) if orders.contains(&o)))
            .filter_map(|t| {
                self.plan
                    .attempts
                    .iter()
                    .find(|a| a.voucher == t.voucher && a.user == t.user)
                    .cloned()
            })
            .take(8)
            .collect()
    }

    /// The log of `target`'s current process (empty: none running).
    fn log_of(&self, target: Target) -> String {
        self.slots.lock().unwrap()[&target]
            .proc
            .as_ref()
            .map(|p| p.log_text())
            .unwrap_or_default()
    }

    /// Waits up to `ms` for `needle` in `target`'s log.
    fn wait_log(&self, target: Target, needle: &str, ms: u64) {
        let until = self.ms() + ms;
        while self.ms() < until {
            if self.log_of(target).contains(needle) {
                std::thread::sleep(Duration::from_millis(200));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the plan makes no fault but the one at `index` on `target`
    /// (one that kills, stops or cuts off the held worker may lose its
    /// batch, as docs/src/concepts/redis-loss.md lists).
    fn nothing_else_befalls(&self, index: usize, target: Target) -> bool {
        let worker = match target {
            Target::Worker(w) => w,
            Target::Serve => return false,
        };
        self.plan.faults.iter().enumerate().all(|(i, f)| {
            i == index
                || match f {
                    Fault::Kill9 { target: t, .. }
                    | Fault::Stop { target: t, .. }
                    | Fault::Point { target: t, .. }
                    | Fault::Network { target: t, .. } => *t != target,
                    Fault::Hold { worker: w, .. } | Fault::Skew { worker: w, .. } => *w != worker,
                    Fault::Resend {
                        by: Caller::Process(t),
                        ..
                    } => *t != target,
                    Fault::RedisRollback { .. }
                    | Fault::MysqlRollback { .. }
                    | Fault::Resend {
                        by: Caller::Preload,
                        ..
                    } => true,
                }
        })
    }

    /// The orders in the entries pending to `target`'s consumer (its host
    /// name and pid): read and not acknowledged, so in its hand.
    fn in_hand(&self, target: Target) -> Vec<u64> {
        let Some(pid) = self.slots.lock().unwrap()[&target]
            .proc
            .as_ref()
            .map(|p| p.pid())
        else {
            return Vec::new();
        };
        let suffix = format!("-{pid}");
        let all = self.voucher_keys();
        let env = &self.env;
        self.rt.block_on(async move {
            let mut redis = env.new_redis_connection().await;
            let mut orders = Vec::new();
            for keys in &all {
                let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                    .arg(keys.orders())
                    .arg(WORKER_GROUP)
                    .arg("-")
                    .arg("+")
                    .arg(100_000)
                    .query_async(&mut redis)
                    .await
                    .unwrap_or_default();
                for (id, consumer, _, _) in pending {
                    if !consumer.ends_with(&suffix) {
                        continue;
                    }
                    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
                        .arg(keys.orders())
                        .arg(&id)
                        .arg(&id)
                        .query_async(&mut redis)
                        .await
                        .unwrap_or_default();
                    orders.extend(entries.iter().flat_map(|(_, fields)| {
                        fields
                            .iter()
                            .filter(|(k, _)| k == "order")
                            .filter_map(|(_, o)| o.parse::<u64>().ok())
                    }));
                }
            }
            orders
        })
    }

    /// A worker SIGSTOPped inside its batch's transaction (the voucher
    /// row locked) for `ms`: within the book's bound for a stopped
    /// worker (its lease, one lock wait, one retry backoff; here also the
    /// taker's `--claim-idle` and a half, and room for a loaded machine),
    /// every order told success before the freeze must be in MySQL, not
    /// when the process wakes. Judged only where nothing else of the plan
    /// can explain a slower MySQL.
    fn judge_frozen(&self, index: usize, target: Target, began: u64, ms: u64) {
        let bound = FROZEN_BOUND_MS;
        if ms < bound + 2_000 || self.plan.workers < 2 {
            return;
        }
        if !self.quiet_around(index, began, began + bound) {
            self.event(format!(
                "{target} frozen inside a transaction at {began} ms: other faults near, not judged"
            ));
            return;
        }
        self.held_up_past(
            began,
            bound,
            &format!("{target} frozen (SIGSTOP) inside a transaction at {began} ms for {ms} ms"),
            "a worker stopped inside its transaction",
            &[],
        );
    }

    /// The entries `killed` left pending must be reclaimed and persisted
    /// within the bound of a killed worker (its `--lock-lease`, the
    /// taker's `--claim-idle` and a half, a retry backoff and the slack
    /// of a loaded machine: `FROZEN_BOUND_MS`, with one lock wait more),
    /// however many live entries of the held worker stand ahead of them:
    /// every order told success before the kill but those in the held
    /// worker's hand.
    fn judge_reclaimed(&self, killed: Target, began: u64, live: &[u64]) {
        self.held_up_past(
            began,
            FROZEN_BOUND_MS,
            &format!(
                "{killed} killed -9 at {began} ms beside a held batch of {} entries",
                live.len()
            ),
            "a killed worker's entries (those in the held batch left out)",
            live,
        );
    }

    /// Waits until `began + bound` and reports, as `what` breaking the
    /// book's bound for `bounded`, the orders told success before
    /// `began` (but those `excused`) that MySQL still does not have.
    fn held_up_past(&self, began: u64, bound: u64, what: &str, bounded: &str, excused: &[u64]) {
        let told: Vec<u64> = self
            .told_success_before(began)
            .into_iter()
            .filter(|o| !excused.contains(o))
            .collect();
        self.sleep_until(began + bound);
        let missing = self.not_in_mysql(&told);
        if !missing.is_empty() {
            self.violation(format!(
                "{what}: {} of {} order(s) told success before it were not in MySQL {bound} ms later, the book's bound for {bounded} (e.g. {:?})",
                missing.len(),
                told.len(),
                &missing[..missing.len().min(5)]
            ));
        }
    }

    /// The orders of buyers told success (or bought, or promoted) with an
    /// order id, answered before `ms`.
    fn told_success_before(&self, ms: u64) -> Vec<u64> {
        let h = self.history.lock().unwrap();
        h.told
            .iter()
            .filter(|t| t.answered_ms < ms)
            .filter_map(|t| match t.answer {
                Answer::Success(o) | Answer::Bought(Some(o)) | Answer::Promoted(Some(o)) => Some(o),
                _ => None,
            })
            .collect()
    }

    /// A user's lock is held only while a batch has that user's entry in
    /// hand: the batch renews it (its watchdog) and gives it back after
    /// its ack. A lock whose value (expiry, count, owner) stays the same
    /// 600 ms while nothing of its voucher is pending was given back by
    /// no release (E05: a resent acquisition counted twice, the one
    /// release left it held until its lease ran out, the user's next
    /// batch denied meanwhile). Watched only where the plan befalls the
    /// workers with nothing but resent calls (a worker that dies or loses
    /// Redis leaves its locks to their lease).
    fn watch_locks(&self) {
        const STALE_MS: u64 = 600;
        let all = self.voucher_keys();
        let env = &self.env;
        let done = &self.done;
        let found = self.rt.block_on(async move {
            let mut redis = env.new_redis_connection().await;
            let started = Instant::now();
            // (voucher, user) -> (value, first seen with nothing pending)
            let mut seen: HashMap<(u64, String), (String, u64)> = HashMap::new();
            let mut found = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let now = started.elapsed().as_millis() as u64;
                for keys in &all {
                    let v = &keys.voucher();
                    let locks: HashMap<String, String> = redis::cmd("HGETALL")
                        .arg(keys.locks())
                        .query_async(&mut redis)
                        .await
                        .unwrap_or_default();
                    let pending: (u64, redis::Value, redis::Value, redis::Value) =
                        redis::cmd("XPENDING")
                            .arg(keys.orders())
                            .arg(WORKER_GROUP)
                            .query_async(&mut redis)
                            .await
                            .unwrap_or((1, redis::Value::Nil, redis::Value::Nil, redis::Value::Nil));
                    if pending.0 > 0 {
                        seen.retain(|(voucher, _), _| voucher != v);
                        continue;
                    }
                    seen.retain(|(voucher, user), (value, _)| {
                        voucher != v || locks.get(user) == Some(value)
                    });
                    for (user, value) in locks.into_iter().filter(|(u, _)| u != "encoding") {
                        let key = (*v, user.clone());
                        let since = seen.entry(key).or_insert((value.clone(), now)).1;
                        if now >= since + STALE_MS {
                            found.push(format!(
                                "voucher {v}: user {user}'s lock ({value}) held {} ms with nothing of the voucher pending: no release gave it back",
                                now - since
                            ));
                            seen.remove(&(*v, user));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            found
        });
        for f in found {
            self.violation(f);
        }
    }

    /// Watches for a stall inside a batch's transaction longer than the
    /// book's bound for a hung transaction (`--mysql-timeout`, plus the
    /// taker's `--claim-idle` and a half, plus a lock wait): by the end of
    /// that bound, every order told success before the stall began must
    /// be in MySQL (the stalled batch abandoned and taken over), not when
    /// the stall ends. Only where no other fault of the plan can explain
    /// a slower MySQL.
    fn watch_stalls(&self) {
        let Some(timeout) = self.plan.mysql_timeout_ms else {
            return;
        };
        let bound = timeout + STALL_SLACK_MS + 750 + 1_000;
        let stalls: Vec<(usize, usize, u64, u64)> = self
            .plan
            .faults
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match f {
                Fault::Point {
                    target: Target::Worker(w),
                    point: "before_commit",
                    hit,
                    action: PointAction::Pause(ms),
                } if *ms >= bound + 2_000 => Some((i, *w, *hit, *ms)),
                _ => None,
            })
            .collect();
        for (index, worker, hit, ms) in stalls {
            let target = Target::Worker(worker);
            let needle = format!("at before_commit (hit {hit})");
            let began = loop {
                if self.done.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let seen = self
                    .log_of(target)
                    .lines()
                    .any(|l| l.starts_with("fault pause") && l.contains(&needle));
                if seen {
                    break self.ms();
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            if !self.quiet_around(index, began, began + bound) {
                self.event(format!(
                    "{target} stalled before COMMIT at {began} ms: other faults near, not judged"
                ));
                continue;
            }
            self.event(format!("{target} stalled before COMMIT for {ms} ms"));
            self.held_up_past(
                began,
                bound,
                &format!("{target} stalled inside a transaction at {began} ms (a {ms} ms pause before COMMIT, --mysql-timeout {timeout}ms)"),
                "a hung transaction",
                &[],
            );
        }
    }

    /// Whether no fault of the plan but the one at `index` is near
    /// `from..to` (within 3 s before), nor can have changed what MySQL or
    /// Redis keep before `to`. A fault point's moment is unknown: any
    /// other one on a worker is near.
    fn quiet_around(&self, index: usize, from: u64, to: u64) -> bool {
        let near = |at: u64, end: u64| at <= to && end + 3_000 >= from;
        let operator_near = self
            .plan
            .reconcile_at_ms
            .iter()
            .chain(self.plan.preloads.iter().map(|(at, _)| at))
            .any(|at| near(*at, *at));
        !operator_near
            && self.plan.faults.iter().enumerate().all(|(i, f)| {
                i == index
                    || f.only_on_serve()
                    || match f {
                        Fault::Kill9 { at_ms, down_ms, .. } => !near(*at_ms, at_ms + down_ms),
                        Fault::Stop { at_ms, for_ms, .. }
                        | Fault::Network { at_ms, for_ms, .. } => !near(*at_ms, at_ms + for_ms),
                        Fault::RedisRollback { crash_at_ms, .. } => *crash_at_ms > to,
                        Fault::MysqlRollback { restore_at_ms, .. } => *restore_at_ms > to,
                        // A fault point's or a resent call's moment is not
                        // known: near.
                        Fault::Point { .. }
                        | Fault::Resend { .. }
                        | Fault::Hold { .. }
                        | Fault::Skew { .. } => false,
                    }
            })
    }

    /// Of these orders, those MySQL does not have.
    fn not_in_mysql(&self, orders: &[u64]) -> Vec<u64> {
        use mysql_async::prelude::Queryable;
        if orders.is_empty() {
            return Vec::new();
        }
        let list = orders
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let env = &self.env;
        let stored: Vec<u64> = self.rt.block_on(async move {
            let mut conn = env.db().await.conn().await.expect("mysql");
            conn.query(format!("SELECT id FROM seckill_order WHERE id IN ({list})"))
                .await
                .expect("orders by id")
        });
        orders
            .iter()
            .filter(|o| !stored.contains(o))
            .copied()
            .collect()
    }

    fn release(&self, target: Target) {
        std::fs::write(self.fault_dir(target).join("release"), b"").ok();
    }

    /// Every fault undone: holds let go, stopped processes continued,
    /// networks healed, dead processes started again.
    pub fn heal(&self) {
        let targets: Vec<Target> = self.slots.lock().unwrap().keys().copied().collect();
        for t in targets {
            self.release(t);
            self.stop(t, false);
        }
        for proxy in self.proxies.values() {
            proxy.heal();
        }
        let mut slots = self.slots.lock().unwrap();
        for slot in slots.values_mut() {
            slot.down_until = None;
        }
        drop(slots);
        self.restart_dead();
        self.event("healed every fault".into());
    }

    pub fn serve_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.serve_port)
    }

    /// The buyers, payers, operator, watcher, faults and supervisor, until
    /// the workload is over and every timed fault has happened.
    pub fn play(self: &Arc<Self>) {
        let mut threads = Vec::new();
        let lanes = 6;
        for lane in 0..lanes {
            let stage = self.clone();
            let mine: Vec<Attempt> = self
                .plan
                .attempts
                .iter()
                .enumerate()
                .filter(|(i, _)| i % lanes == lane)
                .map(|(_, a)| a.clone())
                .collect();
            threads.push(std::thread::spawn(move || {
                for a in mine {
                    stage.sleep_until(a.at_ms);
                    stage.buy(&a);
                }
            }));
        }
        let stage = self.clone();
        threads.push(std::thread::spawn(move || stage.operate()));
        if let Some(after) = self.plan.reconcile_after_death_ms {
            let stage = self.clone();
            threads.push(std::thread::spawn(move || {
                stage.reconcile_after_death(after)
            }));
        }
        if let Some(from) = self.plan.no_pause_from_ms {
            let stage = self.clone();
            threads.push(std::thread::spawn(move || stage.watch_pauses(from)));
        }
        if let Some(at) = self.plan.requeue_at_ms {
            let stage = self.clone();
            threads.push(std::thread::spawn(move || stage.requeue(at)));
        }
        if let Some(at) = self.plan.drop_lost_commits_at_ms {
            let stage = self.clone();
            threads.push(std::thread::spawn(move || stage.drop_lost_commits(at)));
        }
        if self.plan.racing_updates.is_some() {
            let stage = self.clone();
            threads.push(std::thread::spawn(move || stage.race_updates()));
        }
        let stage = self.clone();
        let faults = std::thread::spawn(move || stage.drive_faults());
        let stage = self.clone();
        let holds = std::thread::spawn(move || stage.combine_holds());
        let stage = self.clone();
        let stalls = std::thread::spawn(move || stage.watch_stalls());
        let stage = self.clone();
        let locks = std::thread::spawn(move || {
            if stage.plan.watch_locks {
                stage.watch_locks()
            }
        });
        let stage = self.clone();
        *self.supervisor.lock().unwrap() = Some(std::thread::spawn(move || stage.supervise()));
        let stage = self.clone();
        let payer = std::thread::spawn(move || stage.pay_and_watch());
        for t in threads {
            t.join().ok();
        }
        faults.join().ok();
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        holds.join().ok();
        stalls.join().ok();
        locks.join().ok();
        payer.join().ok();
    }

    fn http(&self) -> ureq::Agent {
        // A buyer's application server gives up on an answer after a while.
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into()
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http()
            .post(&self.serve_url(path))
            .header("content-type", "application/json")
            .send(body.to_string());
        Serve::answer(r)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        Serve::answer(self.http().get(&self.serve_url(path)).call())
    }

    fn cli(&self, args: &[&str]) -> (Option<i32>, Value, String) {
        self.cli_with(args, &[])
    }

    /// The script calls of `seckill preload` run again that the plan sends
    /// twice (each run a process of its own, so each run's hits count
    /// from 1).
    fn preload_resends(&self) -> Vec<(String, String)> {
        let spec: Vec<String> = self
            .plan
            .faults
            .iter()
            .filter(|f| {
                matches!(
                    f,
                    Fault::Resend {
                        by: Caller::Preload,
                        ..
                    }
                )
            })
            .filter_map(Fault::resend_spec)
            .collect();
        match spec.is_empty() {
            true => Vec::new(),
            false => vec![("SECKILL_TEST_FAULT".into(), spec.join(","))],
        }
    }

    /// `seckill reconcile --settle 0s --format json` with these flags: its
    /// exit code and report. One that printed no report (it refused, as
    /// when units MySQL lost were sold again) gives its error as the
    /// report: the oracle's to judge, not a reason to stop.
    pub fn reconcile(&self, extra: &[&str]) -> (i32, Value) {
        let mut args = vec!["reconcile", "--settle", "0s", "--format", "json"];
        args.extend(extra);
        let (code, report, err) = self.cli(&args);
        match report {
            Value::Null => (code.unwrap_or(-1), Value::String(err.trim().to_string())),
            report => (code.unwrap_or(-1), report),
        }
    }

    fn cli_with(&self, args: &[&str], vars: &[(String, String)]) -> (Option<i32>, Value, String) {
        let out = self
            .env
            .cmd()
            .args(args)
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .timeout(Duration::from_secs(30))
            .output();
        match out {
            Ok(out) => (
                out.status.code(),
                serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ),
            Err(e) => (None, Value::Null, e.to_string()),
        }
    }

    /// One purchase, resent as a client resends one whose outcome it does
    /// not know (no answer, 503, paused), up to 8 times.
    /// A purchase over HTTP by a buyer of voucher 1 no attempt named,
    /// made as a client makes one (resent while the outcome is unknown),
    /// after serve's node-id lease outlived a Redis restart: its answer
    /// (recorded, judged with the others), or None when it got none.
    pub fn probe_purchase(&self) -> Option<Answer> {
        let v = self.plan.vouchers.first()?;
        let user = self.plan.last_user(v.id) + 1_000;
        self.buy(&Attempt {
            at_ms: self.ms(),
            voucher: v.id,
            user,
            quantity: 1,
            via: Via::Http,
        });
        let h = self.history.lock().unwrap();
        h.told
            .iter()
            .rev()
            .find(|t| t.voucher == v.id && t.user == user)
            .map(|t| t.answer.clone())
    }

    /// When Redis was last killed and started again (None: never).
    pub fn last_redis_restart_ms(&self) -> Option<u64> {
        let h = self.history.lock().unwrap();
        h.events
            .iter()
            .filter(|(_, what)| what.starts_with("fault: Redis killed -9"))
            .map(|(at, _)| *at)
            .max()
    }

    fn buy(&self, a: &Attempt) {
        for _ in 0..8 {
            let sent = self.ms();
            let answer = match a.via {
                Via::Http => {
                    let (status, body) = self.post(
                        &format!("/v1/vouchers/{}/purchases", a.voucher),
                        &json!({ "user": a.user, "quantity": a.quantity }),
                    );
                    read_purchase(status, &body)
                }
                Via::Cli => {
                    let (code, body, err) = self.cli(&[
                        "buy",
                        "--voucher",
                        &a.voucher.to_string(),
                        "--user",
                        &a.user.to_string(),
                        "--quantity",
                        &a.quantity.to_string(),
                        "--format",
                        "json",
                    ]);
                    match body.get("outcome") {
                        Some(_) => read_purchase(200, &body),
                        None => Answer::Unknown(format!("exit {code:?}: {}", err.trim())),
                    }
                }
            };
            let again = matches!(&answer, Answer::Unknown(_))
                || matches!(&answer, Answer::Refused(r) if r == "paused");
            self.tell((a.voucher, a.user, a.via), sent, answer);
            if !again {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Whether (and how late, in percent of the deadline) this buyer pays:
    /// from the seed and the buyer, not from the order threads run in.
    fn pays(&self, voucher: u64, user: u64) -> Option<u64> {
        let mut r = super::rng::Rng::new(self.plan.seed ^ (voucher << 32) ^ user);
        r.chance(self.plan.pay_percent)
            .then(|| r.range(0, self.plan.pay_latest_percent))
    }

    /// Pays the orders of buyers told success who pay, each at its moment,
    /// and watches the waiting buyers for a promotion.
    fn pay_and_watch(&self) {
        let mut paid: std::collections::BTreeSet<u64> = Default::default();
        let mut promoted: std::collections::BTreeSet<(u64, u64)> = Default::default();
        let mut last_watch = 0;
        loop {
            let done = self.done.load(std::sync::atomic::Ordering::SeqCst);
            let told: Vec<Told> = self.history.lock().unwrap().told.clone();
            let now = self.ms();
            for t in &told {
                let order = match t.answer {
                    Answer::Success(o) | Answer::Promoted(Some(o)) => o,
                    _ => continue,
                };
                let Some(late) = self.pays(t.voucher, t.user) else {
                    continue;
                };
                if self.plan.pays_until_ms.is_some_and(|until| now > until) {
                    continue;
                }
                let timeout = self.pay_timeout(t.voucher);
                if paid.contains(&order) || now < t.answered_ms + timeout * late / 100 {
                    continue;
                }
                paid.insert(order);
                self.pay(t, order);
            }
            if now >= last_watch + 400 {
                last_watch = now;
                let waiting: Vec<(u64, u64)> = told
                    .iter()
                    .filter(|t| matches!(t.answer, Answer::Waiting(_)))
                    .map(|t| (t.voucher, t.user))
                    .collect();
                for (v, u) in waiting {
                    if !promoted.contains(&(v, u)) && self.watch_promotion(v, u) {
                        promoted.insert((v, u));
                    }
                }
            }
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pay_timeout(&self, voucher: u64) -> u64 {
        self.plan
            .vouchers
            .iter()
            .find(|v| v.id == voucher)
            .map(|v| v.pay_timeout_ms)
            .unwrap_or(0)
    }

    /// Whether the buyer is seen bought (told so).
    pub fn watch_promotion(&self, voucher: u64, user: u64) -> bool {
        let sent = self.ms();
        let (status, body) = self.get(&format!("/v1/vouchers/{voucher}/purchases/{user}"));
        if status != 200 || body["bought"] != json!(true) {
            return false;
        }
        let order = body["order"]["id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| body["order"]["id"].as_u64());
        self.tell((voucher, user, Via::Http), sent, Answer::Promoted(order));
        true
    }

    /// One payment, asked again while the outcome is unknown or the order
    /// not in MySQL yet (the worker persists within about a second).
    fn pay(&self, t: &Told, order: u64) {
        let via = match order % 5 {
            0 => Via::Cli,
            _ => Via::Http,
        };
        for _ in 0..20 {
            let sent = self.ms();
            let outcome = match via {
                Via::Http => {
                    let (status, body) =
                        self.post(&format!("/v1/orders/{order}/payment"), &json!({}));
                    match body["outcome"].as_str() {
                        Some(o) if status != 503 => o.to_string(),
                        _ => format!("unknown (status {status})"),
                    }
                }
                Via::Cli => {
                    let (_, body, err) =
                        self.cli(&["pay", "--order", &order.to_string(), "--format", "json"]);
                    match body["outcome"].as_str() {
                        Some(o) => o.to_string(),
                        None => format!("unknown ({})", err.trim()),
                    }
                }
            };
            let answer = match outcome.as_str() {
                "paid" | "already_paid" => Answer::Paid(order),
                o => Answer::PayRefused(order, o.to_string()),
            };
            let again = outcome == "unknown_order" || outcome.starts_with("unknown");
            self.tell((t.voucher, t.user, via), sent, answer);
            if !again {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The operator's part: vouchers added mid-sale, reconcile --yes and
    /// voucher update at their moments.
    fn operate(&self) {
        let mut steps: Vec<(u64, String, Vec<String>)> = Vec::new();
        for v in self.plan.vouchers.iter().filter(|v| v.added_at_ms > 0) {
            steps.push((v.added_at_ms, "add".into(), vec![v.id.to_string()]));
        }
        for at in &self.plan.reconcile_at_ms {
            steps.push((*at, "reconcile".into(), vec![]));
        }
        for (at, v) in &self.plan.preloads {
            steps.push((*at, "preload".into(), vec![v.to_string()]));
        }
        for (at, v, limit) in &self.plan.limit_updates {
            steps.push((*at, "update".into(), vec![v.to_string(), limit.to_string()]));
        }
        steps.sort();
        for (at, what, args) in steps {
            self.sleep_until(at);
            match what.as_str() {
                "add" => {
                    let id: u64 = args[0].parse().unwrap_or_default();
                    self.add_voucher(id);
                }
                "reconcile" => {
                    let (code, _, err) =
                        self.cli(&["reconcile", "--yes", "--settle", "0s", "--format", "json"]);
                    self.event(format!("reconcile --yes: exit {code:?} {}", err.trim()));
                }
                "preload" => {
                    // Refused while orders are in flight: an answer, not a
                    // fault (retried where the plan says so).
                    let vars = self.preload_resends();
                    let give_up = self.ms() + 3_000;
                    let (code, _, err) = loop {
                        let (code, out, err) =
                            self.cli_with(&["preload", "--voucher", &args[0]], &vars);
                        let refused = code != Some(0) && err.contains("in flight");
                        if !(self.plan.retry_preload && refused && self.ms() < give_up) {
                            break (code, out, err);
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    };
                    self.event(format!(
                        "preload --voucher {} again: exit {code:?} {}",
                        args[0],
                        err.trim()
                    ));
                    self.resends_fired(&err, "preload");
                }
                _ => {
                    let (code, _, err) = self.cli(&[
                        "voucher",
                        "update",
                        "--id",
                        &args[0],
                        "--per-user-limit",
                        &args[1],
                    ]);
                    if code == Some(0) {
                        let v: u64 = args[0].parse().unwrap_or_default();
                        let l: u32 = args[1].parse().unwrap_or(1);
                        let mut h = self.history.lock().unwrap();
                        let e = h.limits.entry(v).or_insert(l);
                        *e = (*e).max(l);
                    }
                    self.event(format!(
                        "voucher update --id {} --per-user-limit {}: exit {code:?} {}",
                        args[0],
                        args[1],
                        err.trim()
                    ));
                }
            }
        }
    }

    /// `reconcile --yes` `after` ms after a worker died (the first time,
    /// waited for up to the sale's end and 10 s), then every gate judged
    /// open: the plan (`pauser_dies`) kills the only pauser right after
    /// its pause of a Redis restart that lost nothing, so the gates are
    /// consistent, no hold is live and the pause's grace is over; the
    /// repair reopens them (the book, "pause"), not the worker's restart.
    fn reconcile_after_death(&self, after: u64) {
        let until = self.plan.duration_ms + 10_000;
        let died = loop {
            let seen = self
                .history
                .lock()
                .unwrap()
                .events
                .iter()
                .find(|(_, what)| what.ends_with(DIED))
                .map(|(at, _)| *at);
            match seen {
                Some(at) => break at,
                None if self.ms() > until => {
                    self.event("no worker died: nothing to reconcile after".into());
                    return;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        self.sleep_until(died + after);
        let (code, _, err) =
            self.cli(&["reconcile", "--yes", "--settle", "0s", "--format", "json"]);
        self.event(format!(
            "reconcile --yes after the pauser died: exit {code:?} {}",
            err.trim()
        ));
        let paused: Vec<u64> = self.rt.block_on(async {
            let mut redis = self.env.new_redis_connection().await;
            let mut paused = Vec::new();
            for v in &self.plan.vouchers {
                let keys = VoucherKeys::new(&self.env.prefix, v.id).expect("keys");
                if super::oracle::gate_paused(&mut redis, &keys).await {
                    paused.push(v.id);
                }
            }
            paused
        });
        let restarted = self
            .history
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|(_, what)| what.ends_with(" started again"));
        if !paused.is_empty() && !restarted {
            self.violation(format!(
                "voucher(s) {paused:?}: the gate is still paused after `reconcile --yes` (exit {code:?}), {after} ms after its pauser died, with nothing lost and no hold: a gate whose pauser died waits for another worker"
            ));
        }
    }

    /// The plan's `voucher update`s of one voucher run at once; once every
    /// one exited, the gate's per-user limit must be MySQL's: of two
    /// publishes, the older policy may not land last (E13).
    fn race_updates(&self) {
        let Some((at, voucher, limits)) = self.plan.racing_updates.clone() else {
            return;
        };
        self.sleep_until(at);
        let id = voucher.to_string();
        let stalled = vec![(
            "SECKILL_TEST_FAULT".to_string(),
            "before_publish@1=pause:1200ms".to_string(),
        )];
        let codes: Vec<(u32, Option<i32>)> = std::thread::scope(|scope| {
            let runs: Vec<_> = limits
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let (id, l) = (&id, *l);
                    let vars = match i {
                        0 => stalled.clone(),
                        _ => Vec::new(),
                    };
                    if i == 1 {
                        // The first is past its MySQL update by then.
                        std::thread::sleep(Duration::from_millis(150));
                    }
                    scope.spawn(move || {
                        let limit = l.to_string();
                        let args = ["voucher", "update", "--id", id, "--per-user-limit", &limit];
                        let (code, _, _) = self.cli_with(&args, &vars);
                        (l, code)
                    })
                })
                .collect();
            runs.into_iter().filter_map(|r| r.join().ok()).collect()
        });
        let updated: Vec<u32> = codes
            .iter()
            .filter(|(_, c)| *c == Some(0))
            .map(|(l, _)| *l)
            .collect();
        if let Some(most) = updated.iter().max() {
            let mut h = self.history.lock().unwrap();
            let e = h.limits.entry(voucher).or_insert(*most);
            *e = (*e).max(*most);
        }
        self.event(format!(
            "{} voucher updates of voucher {voucher}, the first stalled before its publish: {} exited 0",
            limits.len(),
            updated.len()
        ));
        let (gate, mysql) = self.rt.block_on(async {
            use mysql_async::prelude::Queryable;
            let keys = VoucherKeys::new(&self.env.prefix, voucher).expect("keys");
            let mut redis = self.env.new_redis_connection().await;
            let gate: Option<u32> =
                redis::AsyncCommands::hget(&mut redis, keys.meta(), "per_user_limit")
                    .await
                    .unwrap_or(None);
            let mut conn = self.env.db().await.conn().await.expect("mysql");
            let mysql: Option<u32> = conn
                .exec_first(
                    "SELECT per_user_limit FROM seckill_voucher WHERE voucher_id = ?",
                    (voucher,),
                )
                .await
                .unwrap_or(None);
            (gate, mysql)
        });
        if gate != mysql {
            self.violation(format!(
                "voucher {voucher}: after {} updates, one stalled before its publish, the gate's per-user limit is {gate:?} and MySQL's {mysql:?}: an older policy was published last",
                limits.len()
            ));
        }
    }

    /// `voucher add` and `preload` as an operator runs them.
    pub fn add_voucher(&self, id: u64) {
        let Some(v) = self.plan.vouchers.iter().find(|v| v.id == id) else {
            return;
        };
        let mut args = vec![
            "voucher".to_string(),
            "add".into(),
            "--id".into(),
            id.to_string(),
            "--stock".into(),
            v.stock.to_string(),
            "--begin".into(),
            "-1m".into(),
            "--pay-timeout".into(),
            format!("{}ms", v.pay_timeout_ms),
            "--per-user-limit".into(),
            v.per_user_limit.to_string(),
        ];
        if let Some(w) = v.waitlist_limit {
            args.extend(["--waitlist-limit".into(), w.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = self.cli(&args);
        assert_eq!(code, Some(0), "voucher add {id}: {err}");
        let (code, _, err) = self.cli(&["preload", "--voucher", &id.to_string()]);
        assert_eq!(code, Some(0), "preload {id}: {err}");
    }

    /// Logs of the processes running now (the dead ones' are kept already).
    pub fn collect_logs(&self) {
        let slots = self.slots.lock().unwrap();
        let mut h = self.history.lock().unwrap();
        for (t, slot) in slots.iter() {
            if let Some(p) = slot.proc.as_ref() {
                h.logs
                    .push((format!("{t} #{}", slot.incarnation), p.log_text()));
            }
        }
    }

    /// SIGTERM to every process; each must stop within its bound.
    pub fn stop_processes(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(s) = self.supervisor.lock().unwrap().take() {
            s.join().ok();
        }
        let mut slots = self.slots.lock().unwrap();
        let mut late = Vec::new();
        for (t, slot) in slots.iter_mut() {
            let Some(mut p) = slot.proc.take() else {
                continue;
            };
            signal(p.pid(), "TERM");
            let until = Instant::now() + Duration::from_secs(30);
            while !p.exited() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !p.exited() {
                late.push(format!("{t} did not stop within 30 s of SIGTERM"));
            }
            self.history
                .lock()
                .unwrap()
                .logs
                .push((format!("{t} #{} (stopped)", slot.incarnation), p.log_text()));
        }
        drop(slots);
        for l in late {
            self.violation(l);
        }
    }

    pub async fn cleanup(self: Arc<Self>) {
        std::fs::remove_dir_all(&self.dir).ok();
        match Arc::try_unwrap(self) {
            Ok(stage) => stage.env.cleanup().await,
            Err(_) => eprintln!("explore: a thread still holds the run; its stores are left"),
        }
    }
}

/// The explorer's workers: the tests' short leases, and the guard and the
/// sweep of lost deadlines quick, so a run's bounds are seconds.
pub fn worker_flags<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = fast_worker(&[
        "--gate-check",
        "300ms",
        "--sweep-every",
        "1s",
        "--sweep-grace",
        "1s",
    ]);
    flags.extend_from_slice(extra);
    flags
}

/// Sets a flag `worker_flags` already gives to another value.
fn set_flag<'a>(flags: &mut [&'a str], name: &str, value: &'a str) {
    if let Some(i) = flags.iter().position(|f| *f == name) {
        if let Some(v) = flags.get_mut(i + 1) {
            *v = value;
        }
    }
}

/// A purchase's answer as the buyer reads it.
fn read_purchase(status: u16, body: &Value) -> Answer {
    let order = |k: &str| {
        body[k]
            .as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| body[k].as_u64())
    };
    match body["outcome"].as_str() {
        Some("success") => match order("order_id") {
            Some(o) => Answer::Success(o),
            None => Answer::Unknown(format!("success without an order id: {body}")),
        },
        Some("already_bought") => Answer::Bought(order("order_id")),
        Some("sold_out" | "waiting_for_units") if body["waitlist_position"].is_u64() => {
            Answer::Waiting(body["waitlist_position"].as_u64().unwrap_or(0))
        }
        Some(other) if status != 503 && status != 0 => Answer::Refused(other.to_string()),
        _ => Answer::Unknown(format!("status {status}: {body}")),
    }
}

/// A `reconcile --format json` report's drifts, in its order: voucher,
/// class, amount.
pub fn drifts(report: &Value) -> Vec<(u64, String, u64)> {
    report["vouchers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| {
            let voucher = v["voucher"].as_u64().unwrap_or(0);
            v["drifts"].as_array().into_iter().flatten().map(move |d| {
                let class = d["class"].as_str().unwrap_or_default().to_string();
                (voucher, class, d["amount"].as_u64().unwrap_or(0))
            })
        })
        .collect()
}

/// Each voucher's amount of drift `class` in a reconcile report.
pub fn drift_of(report: &Value, class: &str) -> Vec<(u64, u64)> {
    drifts(report)
        .into_iter()
        .filter(|(_, c, _)| c == class)
        .map(|(v, _, amount)| (v, amount))
        .collect()
}
