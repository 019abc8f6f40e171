//! What one seed decides: the sale, the workload and the faults, before
//! anything runs. The same seed gives the same plan on every machine.

use std::fmt;

use super::rng::Rng;

#[derive(Debug, Clone)]
pub struct VoucherPlan {
    pub id: u64,
    pub stock: i64,
    pub per_user_limit: u32,
    pub waitlist_limit: Option<u32>,
    pub pay_timeout_ms: u64,
    /// Added and preloaded this long into the sale (0: before it).
    pub added_at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Http,
    Cli,
}

#[derive(Debug, Clone)]
pub struct Attempt {
    pub at_ms: u64,
    pub voucher: u64,
    pub user: u64,
    pub quantity: u32,
    pub via: Via,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Worker(usize),
    Serve,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Store {
    Redis,
    Mysql,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    BlackHole,
    Delay(u64),
    Reset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointAction {
    Pause(u64),
    Abort,
    Error,
}

/// What the explorer does while a process stands held at a fault point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Redis killed and started from the snapshot taken at `snapshot_at_ms`.
    RedisCrash,
    /// Redis killed and started with no data (every gate lost whole, the
    /// node-id leases with them); then, if the plan says so, `seckill
    /// preload` of every voucher while the worker is still held.
    RedisEmpty,
    /// MySQL set back to the dump taken at `snapshot_at_ms`.
    MysqlRestore,
    /// The other worker killed -9 (and started again).
    KillOther,
    /// The held worker itself SIGSTOPped this long (past its leases, so
    /// another takes its work over), then continued and let go: a process
    /// frozen inside its transaction.
    Freeze(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    Kill9 {
        target: Target,
        at_ms: u64,
        down_ms: u64,
    },
    Stop {
        target: Target,
        at_ms: u64,
        for_ms: u64,
    },
    Point {
        target: Target,
        point: &'static str,
        hit: u64,
        action: PointAction,
    },
    Hold {
        worker: usize,
        point: &'static str,
        hit: u64,
        snapshot_at_ms: u64,
        then: Then,
        /// Above 0: the hold fires on the first hit after this moment
        /// (`@armed`), not on the `hit`-th.
        armed_at_ms: u64,
    },
    RedisRollback {
        snapshot_at_ms: u64,
        crash_at_ms: u64,
        /// Started with no data instead of from the snapshot.
        empty: bool,
    },
    MysqlRollback {
        dump_at_ms: u64,
        restore_at_ms: u64,
    },
    Network {
        target: Target,
        store: Store,
        at_ms: u64,
        for_ms: u64,
        how: Net,
    },
    Skew {
        worker: usize,
        offset_s: i64,
    },
    /// A script call sent twice, its first reply lost on the way (what a
    /// client that resends after an I/O error makes Redis run).
    Resend {
        by: Caller,
        script: &'static str,
        hit: u64,
    },
}

/// Who makes a script call: a process of the sale, or `seckill preload`
/// run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Process(Target),
    Preload,
}

/// The scripts a worker calls that change state (file stems).
const WORKER_SCRIPTS: &[&str] = &[
    "lock_acquire",
    "lock_release",
    "finish",
    "timeouts",
    "release",
    "claim_due",
    "pause",
    "fence",
    "digest_sync",
    "run_id",
];

/// The scripts serve calls that change state (a purchase with no replica
/// wait is a lone call of the admission script).
const SERVE_SCRIPTS: &[&str] = &["seckill", "token", "timeouts"];

impl Fault {
    /// Whether it befalls serve alone, whose faults change what buyers are
    /// told, not what the workers persist.
    pub fn only_on_serve(&self) -> bool {
        matches!(
            self,
            Fault::Kill9 {
                target: Target::Serve,
                ..
            } | Fault::Stop {
                target: Target::Serve,
                ..
            } | Fault::Network {
                target: Target::Serve,
                ..
            } | Fault::Point {
                target: Target::Serve,
                ..
            } | Fault::Resend {
                by: Caller::Process(Target::Serve),
                ..
            }
        )
    }

    /// Its `SECKILL_TEST_FAULT` item, if it is a resent script call.
    pub fn resend_spec(&self) -> Option<String> {
        match self {
            Fault::Resend { script, hit, .. } => Some(format!("resend_{script}@{hit}=resend")),
            _ => None,
        }
    }

    /// The kind, as the coverage of a seed set counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill9 { .. } => "kill9",
            Fault::Stop { .. } => "sigstop",
            Fault::Point {
                action: PointAction::Pause(_),
                ..
            } => "point_pause",
            Fault::Point {
                action: PointAction::Abort,
                ..
            } => "point_abort",
            Fault::Point {
                action: PointAction::Error,
                ..
            } => "point_error",
            Fault::Hold { .. } => "hold_and_combine",
            Fault::RedisRollback { .. } => "redis_rollback",
            Fault::MysqlRollback { .. } => "mysql_rollback",
            Fault::Network {
                how: Net::BlackHole,
                ..
            } => "net_blackhole",
            Fault::Network {
                how: Net::Delay(_), ..
            } => "net_delay",
            Fault::Network {
                how: Net::Reset, ..
            } => "net_reset",
            Fault::Skew { .. } => "clock_skew",
            Fault::Resend { .. } => "script_resent",
        }
    }
}

/// Every kind [`Fault::kind`] names: CI's seed set covers each.
pub const KINDS: &[&str] = &[
    "kill9",
    "sigstop",
    "point_pause",
    "point_abort",
    "point_error",
    "hold_and_combine",
    "redis_rollback",
    "mysql_rollback",
    "net_blackhole",
    "net_delay",
    "net_reset",
    "clock_skew",
    "script_resent",
];

pub const WORKER_POINTS: &[&str] = &[
    "after_lock",
    "before_commit",
    "after_commit",
    "after_ack",
    "before_cancel_commit",
    "after_cancel",
    "gate_paused",
    "before_repair",
    "between_gate_and_mysql_reads",
    "between_snapshot_reads",
];

pub const SERVE_POINTS: &[&str] = &["serve_after_admit", "after_pay"];

/// Where a held worker is worth holding while another fault happens.
const HOLD_POINTS: &[&str] = &[
    "after_lock",
    "before_commit",
    "after_commit",
    "after_cancel",
    "gate_paused",
];

/// Every scenario family a seed may draw: CI's seed set draws each.
pub const FAMILIES: &[&str] = &[
    "stall_alone",
    "lost_batch_in_hand",
    "mysql_failover",
    "frozen_in_transaction",
    "redis_rollback_with_waitlist",
    "release_then_hold",
    "pauser_dies",
    "stopped_across_rollback",
    "racing_updates",
    "killed_behind_live",
    "preload_resent",
    "failover_past_keep",
    "requeued_then_failover",
];

/// Where a family holds a worker: inside the transaction two times in
/// three, else with its locks taken.
const FAMILY_HOLD_POINTS: &[&str] = &["before_commit", "before_commit", "after_lock"];

#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub vouchers: Vec<VoucherPlan>,
    pub workers: usize,
    pub attempts: Vec<Attempt>,
    /// Percent of the buyers told success who pay, and the latest a payer
    /// pays, in percent of the payment deadline (above 100: some too late).
    pub pay_percent: u64,
    pub pay_latest_percent: u64,
    pub reconcile_at_ms: Vec<u64>,
    /// (when, voucher, new per-user limit)
    pub limit_updates: Vec<(u64, u64, u32)>,
    pub duration_ms: u64,
    pub faults: Vec<Fault>,
    /// The workers' `--gate-check` (the guard's period).
    pub gate_check_ms: u64,
    /// The workers' `--mysql-timeout` (None: the default, 10 s).
    pub mysql_timeout_ms: Option<u64>,
    /// (when, voucher): `seckill preload` run again on a live voucher.
    pub preloads: Vec<(u64, u64)>,
    /// How long a held worker stays held after the second fault (0: let
    /// go at once); past `--mysql-timeout`, its transaction's deadline
    /// passes while Redis has lost its batch.
    pub hold_linger_ms: u64,
    /// `seckill preload` of every voucher while a worker is held after
    /// Redis came back empty (an operator preloading the lost gates).
    pub preload_in_hold: bool,
    /// `reconcile --yes` while a worker is held after Redis went back (an
    /// operator repairing what looks stuck while a batch is in hand).
    pub reconcile_in_hold: bool,
    /// The scenario family the seed drew, if any ([`Plan::add_family`]).
    pub family: Option<&'static str>,
    /// How long a worker that died stays down before it is started again
    /// (systemd's `RestartSec`; 0: at once).
    pub restart_delay_ms: u64,
    /// `reconcile --yes` this long after a worker died (the first time),
    /// and the gates judged open right after it: the pauser is dead and
    /// nothing was lost, so the repair reopens what it paused (E02).
    pub reconcile_after_death_ms: Option<u64>,
    /// (when, voucher, limits): `voucher update --per-user-limit` run
    /// with each limit, the first stalled 1.2 s before its publish
    /// (`before_publish`) and the others at once 150 ms after it; the gate
    /// judged equal to MySQL once all exited.
    pub racing_updates: Option<(u64, u64, Vec<u32>)>,
    /// (worker, n): that worker reads and persists at most n entries a
    /// batch (`--batch n --max-batch n`), so one reclaim call looks at
    /// 10 n pending entries.
    pub small_batch: Option<(usize, u32)>,
    /// Every worker with one lane (`--lanes 1`): a held batch holds its
    /// worker's reclaiming too.
    pub one_lane: bool,
    /// After a Redis restart, a purchase made once serve's node-id lease
    /// would have lapsed (30 s after it; E41). In 40 % of the seeds, from
    /// a stream of their own: the wait costs up to 30 s a seed.
    pub probe_lease: bool,
    /// A preload of the plan refused for orders in flight is run again
    /// every 200 ms, for up to 3 s, as an operator retries it.
    pub retry_preload: bool,
    /// No buyer pays after this moment (the stretch MySQL then loses holds
    /// no payment).
    pub pays_until_ms: Option<u64>,
    /// Every voucher's acknowledged entries trimmed just before MySQL is
    /// set back (a worker's `--keep` shorter than the failover's reach):
    /// nothing kept names the commits MySQL loses.
    pub trim_before_restore: bool,
    /// At this moment the operator reads `reconcile --dry-run` and, for
    /// each voucher whose lost commits nothing kept can restore, runs
    /// `reconcile --voucher V --drop-lost-commits N --yes` three times at
    /// once (two operators, or a retried job, forgetting the gap).
    pub drop_lost_commits_at_ms: Option<u64>,
    /// From this moment no buyer may be told `paused`: the only gap MySQL
    /// lost is released units, which the guard accepts after one pause.
    pub no_pause_from_ms: Option<u64>,
    /// Watch every voucher's locks through the sale: none may outlive
    /// its batch (run.rs, `watch_locks`).
    pub watch_locks: bool,
    /// At this moment the operator runs `seckill pending --voucher V
    /// --requeue --yes` for every voucher, its script call sent twice (the
    /// first reply lost); no letter may come back "no such dead letter".
    pub requeue_at_ms: Option<u64>,
    /// `requeued_then_failover` with MySQL losing fewer commits than the
    /// Redis rollback took off the witness (E12).
    pub witness_short: bool,
    /// `failover_past_keep` with a second loss: right after the drops,
    /// worker 0's guard stands at its next raise of the witness
    /// (`before_raise`) while buyers buy, MySQL is dumped, set back to
    /// that dump (losing what was committed since, every entry kept), and
    /// only then let go. A witness the drops left short hides that loss
    /// (E38); the guard must find it and restore it from the kept entries.
    pub second_loss: bool,
}

impl Plan {
    pub fn from_seed(seed: u64) -> Plan {
        let mut r = Rng::new(seed);
        let duration_ms = r.range(2_500, 5_000);
        let workers = r.range(1, 2) as usize;
        let mut vouchers = Vec::new();
        let count = r.range(1, 2);
        for i in 0..count {
            vouchers.push(voucher(&mut r, 1 + i, 0));
        }
        if r.chance(25) {
            // Preloaded mid-sale beside the others.
            let at = r.range(300, duration_ms / 2);
            vouchers.push(voucher(&mut r, 1 + count, at));
        }
        let mut attempts = Vec::new();
        for v in &vouchers {
            let users = r.range(v.stock as u64 / 2 + 5, v.stock as u64 * 2 + 20);
            for user in 1..=users {
                let early = r.chance(50);
                let from = v.added_at_ms;
                let at = match early {
                    true => from + r.range(0, 500),
                    false => r.range(from, duration_ms),
                };
                let quantity = r.range(1, v.per_user_limit as u64) as u32;
                let via = match r.chance(80) {
                    true => Via::Http,
                    false => Via::Cli,
                };
                attempts.push(Attempt {
                    at_ms: at,
                    voucher: v.id,
                    user,
                    quantity,
                    via,
                });
                if r.chance(12) {
                    // The same request again, as an impatient buyer sends it.
                    attempts.push(Attempt {
                        at_ms: (at + r.range(0, 800)).min(duration_ms),
                        voucher: v.id,
                        user,
                        quantity,
                        via: *r.pick(&[Via::Http, Via::Cli]),
                    });
                }
            }
        }
        attempts.sort_by_key(|a| a.at_ms);
        let mut reconcile_at_ms = Vec::new();
        if r.chance(40) {
            reconcile_at_ms.push(r.range(200, duration_ms));
        }
        let mut limit_updates = Vec::new();
        if r.chance(20) {
            let v = r.pick(&vouchers).id;
            limit_updates.push((r.range(200, duration_ms), v, r.range(1, 3) as u32));
        }
        let fault_count = r.range(1, 3);
        let faults = (0..fault_count)
            .map(|_| fault(&mut r, workers, duration_ms))
            .collect();
        let mut plan = Plan {
            seed,
            vouchers,
            workers,
            attempts,
            pay_percent: r.range(30, 80),
            pay_latest_percent: r.range(50, 130),
            reconcile_at_ms,
            limit_updates,
            duration_ms,
            faults,
            gate_check_ms: 300,
            mysql_timeout_ms: None,
            preloads: Vec::new(),
            hold_linger_ms: 0,
            preload_in_hold: false,
            reconcile_in_hold: false,
            family: None,
            restart_delay_ms: 0,
            reconcile_after_death_ms: None,
            racing_updates: None,
            small_batch: None,
            one_lane: false,
            probe_lease: Rng::new(seed ^ 0x0E41).chance(40),
            retry_preload: false,
            pays_until_ms: None,
            trim_before_restore: false,
            drop_lost_commits_at_ms: None,
            no_pause_from_ms: None,
            watch_locks: false,
            requeue_at_ms: None,
            witness_short: false,
            second_loss: false,
        };
        plan.add_extras();
        plan.add_family();
        plan
    }

    /// What a seed decides beyond the first plans, drawn from a second
    /// stream so the seeds measured before keep their sale, workload and
    /// faults: buyers still arriving after the faults (a loss shows where
    /// new buyers meet the units it freed), a big voucher (more pending
    /// entries than a reclaim reads at once), a slow guard, a short MySQL
    /// timeout with long stalls inside the transaction, a held worker
    /// frozen, and preload run again mid-sale.
    fn add_extras(&mut self) {
        let mut r = Rng::new(self.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xE7_7A5);
        if r.chance(12) {
            let id = self.vouchers.len() as u64 + 1;
            let mut big = voucher(&mut r, id, 0);
            big.stock = r.range(150, 400) as i64;
            big.per_user_limit = 1;
            let users = big.stock as u64 * 5 / 4;
            for user in 1..=users {
                let at = r.range(0, self.duration_ms / 2);
                let via = match r.chance(90) {
                    true => Via::Http,
                    false => Via::Cli,
                };
                self.attempts.push(Attempt {
                    at_ms: at,
                    voucher: id,
                    user,
                    quantity: 1,
                    via,
                });
            }
            self.vouchers.push(big);
        }
        if r.chance(25) {
            self.gate_check_ms = r.range(2_000, 5_000);
        }
        if r.chance(40) {
            self.mysql_timeout_ms = Some(2_000);
        }
        let stalls = ["before_commit", "before_cancel_commit", "after_lock"];
        for f in self.faults.iter_mut() {
            match f {
                Fault::Point {
                    point,
                    action: PointAction::Pause(ms),
                    ..
                } if stalls.contains(point) && r.chance(50) => *ms = r.range(3_000, 7_000),
                Fault::Hold { then, .. } if r.chance(35) => {
                    *then = Then::Freeze(r.range(1_500, 4_000))
                }
                _ => {}
            }
        }
        if r.chance(30) {
            let v = r.pick(&self.vouchers).clone();
            let at = r
                .range(300, self.duration_ms + 2_000)
                .max(v.added_at_ms + 300);
            self.preloads.push((at, v.id));
        }
        if r.chance(60) {
            let from = self.faults_end() + r.range(500, 2_500);
            for v in self.vouchers.clone() {
                let past = self.last_user(v.id);
                let late = r
                    .range(v.stock as u64 / 2 + 3, v.stock as u64 + 10)
                    .min(120);
                for user in past + 1..=past + late {
                    let at = from + r.range(0, 1_500);
                    self.attempts.push(new_buyer(&mut r, &v, user, at));
                }
            }
        }
        // Drawn last, so the draws above keep their values.
        if r.chance(20) {
            // A batch's transaction stalled far past a short
            // --mysql-timeout: the voucher must move again within the
            // book's bound for a hung transaction, not when the stall
            // ends (run.rs watches for it).
            self.mysql_timeout_ms = Some(2_000);
            self.faults.push(Fault::Point {
                target: Target::Worker(r.range(0, self.workers as u64 - 1) as usize),
                point: "before_commit",
                hit: r.range(1, 3),
                action: PointAction::Pause(r.range(9_000, 12_000)),
            });
            if r.chance(50) {
                // Alone (serve's faults aside, which change nothing a worker
                // persists), so a slower MySQL has no other explanation:
                // run.rs judges the bound only then, and the stall's window
                // spans the whole sale.
                if let Some(stall) = self.faults.pop() {
                    self.faults.retain(Fault::only_on_serve);
                    self.faults.push(stall);
                }
                self.family = Some("stall_alone");
                self.reconcile_at_ms.clear();
                self.preloads.clear();
            }
        }
        if let Some(timeout) = self.mysql_timeout_ms {
            if r.chance(50) {
                self.hold_linger_ms = timeout + 700;
            }
        }
        let crashes: Vec<u64> = self
            .faults
            .iter()
            .filter_map(|f| match f {
                Fault::RedisRollback { crash_at_ms, .. } => Some(*crash_at_ms),
                _ => None,
            })
            .collect();
        for crash in crashes {
            if r.chance(50) {
                // An operator repairing right after Redis came back, with
                // the guard's rebuild and the orders in flight around it.
                self.reconcile_at_ms.push(crash + r.range(200, 1_500));
            }
        }
        if r.chance(30) {
            let by = match self.preloads.is_empty() || r.chance(40) {
                true => Caller::Process(target(&mut r, self.workers)),
                false => Caller::Preload,
            };
            let script = match by {
                Caller::Process(Target::Worker(_)) => *r.pick(WORKER_SCRIPTS),
                Caller::Process(Target::Serve) => *r.pick(SERVE_SCRIPTS),
                Caller::Preload => "preload",
            };
            // A preload calls its script once; the others, batch after batch.
            let hit = r.range(1, 5);
            self.faults.push(Fault::Resend {
                by,
                script,
                hit: if by == Caller::Preload { 1 } else { hit },
            });
        }
        let restores: Vec<u64> = self
            .faults
            .iter()
            .filter_map(|f| match f {
                Fault::MysqlRollback { restore_at_ms, .. } => Some(*restore_at_ms),
                _ => None,
            })
            .collect();
        for restore in restores {
            // An operator after MySQL failed over to a replica that lacked
            // its last commits: preload and reconcile, with the workers'
            // detection and restore of the lost orders around them.
            if r.chance(50) {
                let v = r.pick(&self.vouchers).clone();
                let at = (restore + r.range(300, 1_500)).max(v.added_at_ms + 300);
                self.preloads.push((at, v.id));
            }
            if r.chance(40) {
                self.reconcile_at_ms.push(restore + r.range(300, 2_000));
            }
        }
        for (at, v) in self.preloads.clone() {
            if r.chance(60) {
                // Buyers pressing again after the preload: a gate that
                // forgot who bought sells to them again.
                let before: Vec<Attempt> = self
                    .attempts
                    .iter()
                    .filter(|a| a.voucher == v && a.at_ms + 200 < at)
                    .cloned()
                    .collect();
                self.press_again(&mut r, &before, at);
            }
        }
        for f in self.faults.iter_mut() {
            // Back with nothing: a failover to a replica that had synced
            // nothing, every gate and node-id lease lost whole.
            match f {
                Fault::RedisRollback { empty, .. } if r.chance(30) => *empty = true,
                Fault::Hold { then, .. } if *then == Then::RedisCrash && r.chance(40) => {
                    *then = Then::RedisEmpty;
                    self.preload_in_hold |= r.chance(50);
                }
                _ => {}
            }
        }
        self.attempts.sort_by_key(|a| a.at_ms);
    }

    /// A scenario family, in half the seeds, from a third stream (so the
    /// draws above keep their values): a schedule shaped like a class of
    /// defect the history holds, which random schedules reach rarely
    /// (design/explorer.md, the misses), made alone (every other fault
    /// but serve's dropped, no operator run but the family's) so that
    /// the oracle judges it without excuses.
    fn add_family(&mut self) {
        let mut r = Rng::new(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xFA_1117);
        // A stall made alone is a family of its own, drawn before.
        if self.family.is_some() {
            return;
        }
        if !r.chance(60) {
            // A third of the others draw the family added last, from a
            // stream of its own (the seeds that drew a family keep it).
            let mut last = Rng::new(self.seed ^ 0x0E16);
            if last.chance(35) {
                self.make_alone();
                self.release_then_hold(&mut last);
                self.attempts.sort_by_key(|a| a.at_ms);
                return;
            }
            // Of those left, half draw one of the families added in
            // round 7 (a stream of their own again).
            let mut later = Rng::new(self.seed ^ 0x0E02);
            if later.chance(50) {
                self.make_alone();
                match later.range(0, 3) {
                    0 => self.pauser_dies(&mut later),
                    1 => self.stopped_across_rollback(&mut later),
                    2 => self.racing_updates(&mut later),
                    _ => self.killed_behind_live(&mut later),
                }
                self.attempts.sort_by_key(|a| a.at_ms);
                return;
            }
            // Of those left, 60 % draw a family of round 8 (a stream of
            // their own again).
            let mut eighth = Rng::new(self.seed ^ 0x0E04);
            if eighth.chance(60) {
                self.make_alone();
                match eighth.range(0, 1) {
                    0 => self.preload_resent(&mut eighth),
                    _ => self.failover_past_keep(&mut eighth),
                }
                self.attempts.sort_by_key(|a| a.at_ms);
                return;
            }
            // And half of those left the family added last (its own
            // stream, so the seeds above keep theirs).
            let mut last = Rng::new(self.seed ^ 0x0E33);
            if last.chance(50) {
                self.make_alone();
                self.requeued_then_failover(&mut last);
                self.attempts.sort_by_key(|a| a.at_ms);
            }
            return;
        }
        self.make_alone();
        // In turn by seed, so that a dozen seeds meet each family; a
        // quarter of them, chosen from a stream of their own (so the
        // others keep their draws), go to the family added last.
        let later = Rng::new(self.seed ^ 99).chance(25);
        match self.seed % 3 {
            _ if later => self.redis_rollback_with_waitlist(&mut r),
            0 => self.lost_batch_in_hand(&mut r),
            1 => self.mysql_failover(&mut r),
            _ => self.frozen_in_transaction(&mut r),
        }
        self.attempts.sort_by_key(|a| a.at_ms);
    }

    /// Every fault but serve's dropped, no operator run: the family's
    /// schedule alone.
    fn make_alone(&mut self) {
        self.faults.retain(Fault::only_on_serve);
        self.reconcile_at_ms.clear();
        self.preloads.clear();
        self.limit_updates.clear();
        self.hold_linger_ms = 0;
        self.preload_in_hold = false;
        // The late waves drawn for the faults just dropped: the family
        // draws its own.
        let end = self.duration_ms;
        self.attempts.retain(|a| a.at_ms <= end);
    }

    /// Units released after a Redis snapshot, then a worker held with a
    /// batch (the first after the releases) while Redis goes back to that
    /// snapshot: the rebuilt view has those units stuck (MySQL has them
    /// back, the snapshot has not), and a repair must not give them to the
    /// waitlist or the stock while the batch in hand may need them
    /// (the book, "Batches in hand"). A rush that sells every unit, an
    /// uncapped waitlist, short deadlines few pay, two workers (the
    /// other persists what the repair would promote), `reconcile --yes`
    /// inside the hold in 60 %.
    fn release_then_hold(&mut self, r: &mut Rng) {
        self.family = Some("release_then_hold");
        self.workers = 2;
        self.mysql_timeout_ms = Some(2_000);
        self.hold_linger_ms = 2_000 + 700;
        self.gate_check_ms = 300;
        self.attempts.clear();
        for v in self.vouchers.iter_mut() {
            v.waitlist_limit = None;
            v.pay_timeout_ms = r.range(1_500, 2_000);
            v.added_at_ms = 0;
        }
        self.rush(r, 8, 400);
        self.pay_percent = r.range(10, 30);
        self.pay_latest_percent = r.range(20, 60);
        let snapshot = r.range(900, 1_300);
        // Before the first deadline: the first batch after it holds what
        // its releases promoted or sold.
        let armed = 1_400;
        let worker = r.range(0, 1) as usize;
        let point = *r.pick(FAMILY_HOLD_POINTS);
        self.faults.push(Fault::Hold {
            worker,
            point,
            hit: 1,
            snapshot_at_ms: snapshot,
            then: Then::RedisCrash,
            armed_at_ms: armed,
        });
        self.reconcile_in_hold = r.chance(60);
        self.steady_buyers(r, armed, armed + 3_000);
    }

    /// The only worker pauses its gates after a Redis restart that lost
    /// nothing (a graceful one changes the run id too) and dies right
    /// there, before its rebuild; systemd starts it again 4-6 s later.
    /// Meanwhile an operator runs `reconcile --yes`, which must reopen
    /// the gates it finds consistent (the book, "pause": "a gate whose
    /// pauser died does not wait for another worker"); run.rs judges
    /// them right after it (E02).
    fn pauser_dies(&mut self, r: &mut Rng) {
        self.family = Some("pauser_dies");
        self.workers = 1;
        self.attempts.clear();
        for v in self.vouchers.iter_mut() {
            v.added_at_ms = 0;
            // No deadline comes due around the restart: a release the
            // snapshot missed would make the gate inconsistent, which
            // any repair reopens.
            v.pay_timeout_ms = 8_000;
        }
        self.rush(r, 5, 500);
        self.pay_percent = r.range(30, 70);
        self.pay_latest_percent = 10;
        let crash = r.range(2_000, 2_500);
        // Taken just before the crash, with nothing sold or paid since
        // the rush: the restart loses nothing.
        self.faults.push(Fault::RedisRollback {
            snapshot_at_ms: crash - 50,
            crash_at_ms: crash,
            empty: false,
        });
        self.faults.push(Fault::Point {
            target: Target::Worker(0),
            point: "gate_paused",
            hit: 1,
            action: PointAction::Abort,
        });
        self.gate_check_ms = 300;
        self.restart_delay_ms = r.range(4_000, 6_000);
        // Past the pause's grace (`--lock-lease`, 1 s here).
        self.reconcile_after_death_ms = Some(r.range(1_300, 2_000));
        self.duration_ms = self.duration_ms.max(crash + 500);
        let from = crash + 3_500;
        self.steady_buyers(r, from, from + 2_000);
    }

    /// Every worker stopped (SIGSTOP) or down while Redis goes back to a snapshot,
    /// and the buyers it forgot press buy again, with new ones, before any
    /// guard looks: their admissions make the buyers match MySQL's orders
    /// again, so only the run id tells the loss (E19). The oracle's window
    /// reaches to the guard's first pass after the workers continue; the
    /// lost buyers press again after it too.
    fn stopped_across_rollback(&mut self, r: &mut Rng) {
        self.family = Some("stopped_across_rollback");
        self.attempts.clear();
        for v in self.vouchers.iter_mut() {
            v.added_at_ms = 0;
            v.stock = v.stock.max(20);
        }
        let stop = r.range(1_300, 1_700);
        for v in self.vouchers.clone() {
            // Fewer than the stock before the stop: units stay for the
            // ones after it.
            for user in 1..=v.stock as u64 / 2 {
                let at = r.range(0, stop - 300);
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
        let snapshot = r.range(400, 800);
        let stopped = r.range(2_000, 3_000);
        // In half (a stream of its own), the workers are not stopped but
        // down (killed, started again as cron or systemd would): a worker
        // started after the restart sees the run id change only in what
        // the gate recorded (E08).
        let killed = Rng::new(self.seed ^ 0x0E08).chance(50);
        for w in 0..self.workers {
            let target = Target::Worker(w);
            self.faults.push(match killed {
                true => Fault::Kill9 {
                    target,
                    at_ms: stop,
                    down_ms: stopped,
                },
                false => Fault::Stop {
                    target,
                    at_ms: stop,
                    for_ms: stopped,
                },
            });
        }
        let crash = stop + r.range(200, 400);
        self.faults.push(Fault::RedisRollback {
            snapshot_at_ms: snapshot,
            crash_at_ms: crash,
            empty: false,
        });
        self.gate_check_ms = 300;
        let lost: Vec<Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.at_ms > snapshot)
            .cloned()
            .collect();
        // Half of them while the workers are stopped, the other half once
        // the guard had its pass after they continued: a gate never
        // rebuilt still lacks those buyers then, and sells to them twice.
        let resumed = stop + stopped;
        for (half, at) in [crash, resumed + 300 + 1_500 + 500].into_iter().enumerate() {
            for again in lost.iter().skip(half).step_by(2).take(8) {
                self.attempts.push(Attempt {
                    at_ms: at + r.range(100, 800),
                    ..again.clone()
                });
            }
        }
        self.duration_ms = resumed + 300 + 1_500 + 1_500;
        self.steady_buyers(r, crash, self.duration_ms);
    }

    /// A worker killed -9 with entries pending behind a live worker's
    /// big batch: worker 0 held with its locks taken (`after_lock`, its
    /// second batch, read after its first stalled while a rush piled up)
    /// while worker 1, reading two entries a batch, is killed and started
    /// again. Worker 1's reclaim looks at 20 pending entries a
    /// call, and the live batch is ahead of its own dead entries: they must
    /// be reached (README: "idle entries behind any number of live ones
    /// are reached") and persisted within the bound run.rs judges, while
    /// worker 0 is still held (E42).
    fn killed_behind_live(&mut self, r: &mut Rng) {
        self.family = Some("killed_behind_live");
        self.workers = 2;
        self.small_batch = Some((1, 2));
        // Else the held worker's other lane, reading 256 a batch, reclaims
        // the dead entries itself (seed 135 with the defect put back).
        self.one_lane = true;
        self.mysql_timeout_ms = None;
        self.attempts.clear();
        self.vouchers.truncate(1);
        // More units than buyers: every admission is an entry, and worker
        // 1 has some in hand when it is killed.
        let stock = r.range(700, 800) as i64;
        if let Some(v) = self.vouchers.first_mut() {
            v.stock = stock;
            v.added_at_ms = 0;
            v.per_user_limit = 1;
            v.pay_timeout_ms = 4_000;
        }
        let v = self.vouchers[0].clone();
        // A rush, and a second one faster than worker 1 alone persists
        // (two entries a batch) around the kill.
        for user in 1..=600 {
            let at = match user <= 300 {
                true => r.range(0, 400),
                false => r.range(600, 1_200),
            };
            self.attempts.push(new_buyer(r, &v, user, at));
        }
        // Its first batch stalled inside its transaction while the rush
        // piles up, so the next, the held one, is big (up to 256 entries;
        // armed in the rush instead, it was 4 to 46, often fewer than one
        // reclaim call looks at, and seed 87 caught E42 1 run in 6).
        self.faults.push(Fault::Point {
            target: Target::Worker(0),
            point: "before_commit",
            hit: 1,
            action: PointAction::Pause(r.range(250, 400)),
        });
        self.faults.push(Fault::Hold {
            worker: 0,
            point: "after_lock",
            hit: 2,
            snapshot_at_ms: 0,
            then: Then::KillOther,
            armed_at_ms: 0,
        });
        self.hold_linger_ms = 1_000;
        self.steady_buyers(r, 400, 3_000);
    }

    /// Operators (or their automation) changing one voucher's per-user
    /// limit at once mid-sale: one `voucher update` stalled between its
    /// MySQL update and its publish, 8-24 others with another limit made
    /// meanwhile. Whichever publish lands last, the gate must end with
    /// MySQL's policy (E13).
    fn racing_updates(&mut self, r: &mut Rng) {
        self.family = Some("racing_updates");
        let v = r.pick(&self.vouchers).clone();
        let at = r.range(
            v.added_at_ms + 300,
            (self.duration_ms / 2).max(v.added_at_ms + 400),
        );
        let first = r.range(1, 3) as u32;
        let others: Vec<u32> = [1, 2, 3].into_iter().filter(|l| *l != first).collect();
        let other = *r.pick(&others);
        let mut limits = vec![first];
        limits.extend((0..r.range(8, 24)).map(|_| other));
        self.racing_updates = Some((at, v.id, limits));
        self.steady_buyers(r, at, at + 2_000);
    }

    /// Redis back to a snapshot taken while the first deadlines were
    /// still ahead, after units were released, waiting buyers promoted,
    /// persisted and paid: a waitlist on every voucher, short deadlines,
    /// and `reconcile --yes` after the guard's bound, with buyers still
    /// coming. The rebuild and the repair must not give again a unit an
    /// order holds, nor promote from the lost buyers while paused.
    fn redis_rollback_with_waitlist(&mut self, r: &mut Rng) {
        self.family = Some("redis_rollback_with_waitlist");
        for v in self.vouchers.iter_mut() {
            v.waitlist_limit = None;
            v.pay_timeout_ms = r.range(1_500, 2_200);
        }
        self.pay_percent = r.range(40, 70);
        self.pay_latest_percent = r.range(30, 80);
        self.gate_check_ms = match r.chance(50) {
            true => 300,
            false => r.range(1_000, 2_500),
        };
        let snapshot = r.range(600, 1_400);
        let crash = snapshot + r.range(1_500, 3_000);
        self.faults.push(Fault::RedisRollback {
            snapshot_at_ms: snapshot,
            crash_at_ms: crash,
            empty: false,
        });
        if r.chance(60) {
            self.reconcile_at_ms.push(crash + r.range(1_600, 2_600));
        }
        self.steady_buyers(r, crash, crash + 3_000);
        // In half (a stream of its own, so the draws above keep their
        // values), one worker whose guard, having paused the gate after
        // the crash, stands there 2.5-4 s before its rebuild, while
        // deadlines come due: a release must not promote from the lost
        // buyers the paused gate still lists (E10). One worker, so no
        // other guard rebuilds first.
        let mut paused = Rng::new(self.seed ^ 0x0E10);
        if paused.chance(50) {
            self.workers = 1;
            self.faults.push(Fault::Point {
                target: Target::Worker(0),
                point: "gate_paused",
                hit: 1,
                action: PointAction::Pause(paused.range(2_500, 4_000)),
            });
        }
    }

    /// A worker holds a batch Redis then loses (back to a snapshot from
    /// before the sale, or empty), and stays held past `--mysql-timeout`
    /// while buyers keep coming, sometimes with an operator's preload or
    /// repair inside the hold: the batch must be kept and committed, and
    /// the gate held for it.
    fn lost_batch_in_hand(&mut self, r: &mut Rng) {
        self.family = Some("lost_batch_in_hand");
        self.mysql_timeout_ms = Some(2_000);
        self.hold_linger_ms = 2_000 + 700;
        self.gate_check_ms = 300;
        let then = match r.chance(50) {
            true => {
                self.preload_in_hold = r.chance(80);
                Then::RedisEmpty
            }
            false => Then::RedisCrash,
        };
        self.reconcile_in_hold = r.chance(60);
        let worker = r.range(0, self.workers as u64 - 1) as usize;
        let point = *r.pick(FAMILY_HOLD_POINTS);
        self.faults.push(Fault::Hold {
            worker,
            point,
            hit: r.range(1, 2),
            snapshot_at_ms: 0,
            then,
            armed_at_ms: 0,
        });
        self.steady_buyers(r, 200, self.duration_ms + 3_000);
    }

    /// MySQL set back to a dump taken mid-sale (a failover to a replica
    /// that lacked its last commits), with payments and deadlines in the
    /// lost stretch, often a guard slower than the deadlines, and an
    /// operator preloading before or after the guard restored the lost
    /// orders, the lost buyers pressing buy again.
    fn mysql_failover(&mut self, r: &mut Rng) {
        self.family = Some("mysql_failover");
        let d = self.duration_ms;
        // After every voucher was added: a dump from before one has not
        // its row, which MySQL losing is another fault than this one's.
        let added = self
            .vouchers
            .iter()
            .map(|v| v.added_at_ms)
            .max()
            .unwrap_or(0);
        let dump = r.range(d / 4, d / 2).max(added + 1_000);
        let restore = dump + r.range(1_500, 3_000);
        self.faults.push(Fault::MysqlRollback {
            dump_at_ms: dump,
            restore_at_ms: restore,
        });
        self.pay_percent = r.range(60, 95);
        self.pay_latest_percent = r.range(30, 90);
        self.gate_check_ms = match r.chance(60) {
            true => r.range(2_000, 5_000),
            false => 300,
        };
        let v = r.pick(&self.vouchers).clone();
        let at = match r.chance(50) {
            true => restore + r.range(100, 600),
            false => restore + self.gate_check_ms + r.range(500, 2_000),
        }
        .max(v.added_at_ms + 300);
        self.preloads.push((at, v.id));
        let lost: Vec<Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.voucher == v.id && a.at_ms >= dump && a.at_ms < restore)
            .cloned()
            .collect();
        self.press_again(r, &lost, at);
        if r.chance(40) {
            self.reconcile_at_ms.push(restore + r.range(300, 3_000));
        }
        self.steady_buyers(r, restore, restore + 2_500);
        // A preload before the guard's pass is followed by one after it
        // (an operator preloading again once the guard restored the lost
        // orders): the restored held orders, some paid, are in MySQL's
        // image then. From a stream of its own, so the draws above keep
        // their values.
        let after = restore + self.gate_check_ms + 500;
        if at < after {
            let mut again = Rng::new(self.seed ^ 0x0E37);
            self.preloads.push((after + again.range(0, 1_500), v.id));
        }
    }

    /// A worker SIGSTOPped inside its batch's transaction (before
    /// COMMIT, the voucher row locked) or after taking its locks, far
    /// past its leases, with another worker to take its batch over: the
    /// sale must move again within the book's bound for a stopped
    /// worker (run.rs judges it), not when the process wakes.
    fn frozen_in_transaction(&mut self, r: &mut Rng) {
        self.family = Some("frozen_in_transaction");
        self.workers = 2;
        let worker = r.range(0, 1) as usize;
        let point = *r.pick(FAMILY_HOLD_POINTS);
        self.faults.push(Fault::Hold {
            worker,
            point,
            hit: r.range(1, 3),
            snapshot_at_ms: 0,
            then: Then::Freeze(r.range(8_500, 11_000)),
            armed_at_ms: 0,
        });
        self.steady_buyers(r, 300, self.duration_ms + 2_000);
        // And buyers when the frozen worker wakes (a stream of its own, so
        // the draws above keep their values): one that takes the entries
        // another took over and acknowledged for lost pauses the gate for
        // nothing (E18).
        let mut late = Rng::new(self.seed ^ 0x0E18);
        self.steady_buyers(&mut late, 8_500, 14_000);
    }

    /// `seckill preload` of a voucher mid-sale at a quiet moment (nothing
    /// in flight, so it publishes; retried while refused), its script
    /// call sent twice, the first reply lost: the second run must keep
    /// the gate's buyers, and the buyers of the rush, pressing buy again
    /// after it while units are left, must be told they bought (E04).
    /// A worker's lock acquisition is sent twice too, and every lock
    /// watched (E05).
    fn preload_resent(&mut self, r: &mut Rng) {
        self.family = Some("preload_resent");
        self.attempts.clear();
        for v in self.vouchers.iter_mut() {
            v.added_at_ms = 0;
            v.stock = v.stock.max(10);
            // No deadline comes due around the preload.
            v.pay_timeout_ms = 6_000;
        }
        // Half the stock: units are left for a buyer the gate forgot.
        for v in self.vouchers.clone() {
            for user in 1..=v.stock as u64 / 2 {
                let at = r.range(0, 400);
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
        let v = r.pick(&self.vouchers).clone();
        let at = r.range(1_200, 2_000);
        self.preloads.push((at, v.id));
        self.retry_preload = true;
        self.faults.push(Fault::Resend {
            by: Caller::Preload,
            script: "preload",
            hit: 1,
        });
        let rush: Vec<Attempt> = self
            .attempts
            .iter()
            .filter(|a| a.voucher == v.id)
            .cloned()
            .collect();
        self.press_again(r, &rush, at);
        self.duration_ms = self.duration_ms.max(at + 2_000);
        self.steady_buyers(r, at + 1_500, at + 3_000);
        // And one of a worker's first lock acquisitions sent twice: the
        // batch's one release must give the lock back (E05).
        self.faults.push(Fault::Resend {
            by: Caller::Process(Target::Worker(0)),
            script: "lock_acquire",
            hit: r.range(1, 3),
        });
        self.watch_locks = true;
    }

    /// MySQL set back to a dump (a failover to a lagging replica) after
    /// the stream was trimmed past the commits it loses (`--keep` shorter
    /// than the failover's reach), so nothing kept restores them: the
    /// gates wait for the operator, who drops their buyers by their count,
    /// from three runs at once. The gates must reopen, reconcile read the
    /// vouchers after (E38: three runs forgetting the same gap took the
    /// witness below 0), and no buyer be told `paused` once the guard had
    /// its passes over what the drop left (E39: a gap nothing closes
    /// paused and reopened the gate every pass). In half (a stream of its
    /// own), every order of the lost stretch was cancelled and its unit
    /// released before the failover, so MySQL lacks their cancellations
    /// too.
    fn failover_past_keep(&mut self, r: &mut Rng) {
        self.family = Some("failover_past_keep");
        self.attempts.clear();
        self.gate_check_ms = 300;
        let released = Rng::new(self.seed ^ 0x0E39).chance(50);
        let deadline = match released {
            true => r.range(1_200, 1_600),
            false => 8_000,
        };
        for v in self.vouchers.iter_mut() {
            v.added_at_ms = 0;
            v.stock = v.stock.max(10);
            v.waitlist_limit = None;
            v.pay_timeout_ms = deadline;
        }
        for v in self.vouchers.clone() {
            for user in 1..=v.stock as u64 / 2 {
                let at = r.range(0, 400);
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
        self.pay_percent = r.range(40, 80);
        self.pay_latest_percent = 10;
        // Released: after the rush's unpaid orders were cancelled, so the
        // dump has them so.
        let dump = match released {
            true => r.range(2_600, 3_000),
            false => r.range(900, 1_200),
        };
        self.pays_until_ms = Some(dump);
        // More than a quarter of the stock (a third of what the witness
        // then counts): three runs taking the gap off each would take the
        // witness below 0.
        for v in self.vouchers.clone() {
            let past = self.last_user(v.id);
            let stock = v.stock as u64;
            for user in past + 1..=past + r.range(stock / 4 + 3, stock / 2 + 1) {
                let at = dump + r.range(100, 500);
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
        // Released: past every deadline of the stretch and the sweep.
        let restore = match released {
            true => dump + 500 + deadline + r.range(1_200, 1_800),
            false => dump + r.range(1_200, 1_800),
        };
        self.faults.push(Fault::MysqlRollback {
            dump_at_ms: dump,
            restore_at_ms: restore,
        });
        self.trim_before_restore = true;
        // After the guard's pass (`--gate-check` and one pass) paused the
        // gates for what nothing kept restores.
        let drop = restore + 300 + 1_500 + r.range(500, 1_500);
        self.drop_lost_commits_at_ms = Some(drop);
        // The drop takes the gap off the witness; the guard's next passes
        // accept whatever it left: three passes and the rebuild's room.
        self.no_pause_from_ms = Some(drop + 3_000);
        self.duration_ms = drop + 5_000;
        self.steady_buyers(r, restore + 300, drop + 5_000);
        // In half of those where nothing was released (a stream of its
        // own, so the draws above keep their values), MySQL loses again
        // after the drops, before the guard's next raise: one worker, so
        // no other guard raises the witness first; units to spare, so the
        // buyers after the drops are sold to (and their commits lost).
        if !released && Rng::new(self.seed ^ 0x0E38).chance(50) {
            self.second_loss = true;
            self.workers = 1;
            for v in self.vouchers.iter_mut() {
                v.stock += 15;
            }
        }
    }

    /// Dead letters `no stock in MySQL` (buyers the gate sold to between
    /// a Redis rollback and the guard's pass, MySQL sold out), requeued by
    /// the operator once the unpaid orders' cancellations gave MySQL units
    /// again (readmitted: a unit taken at the gate for each), its call
    /// sent twice; then MySQL set back to a dump taken late in the rush
    /// (before the dead letters were admitted).
    /// A requeued user has two kept entries, the dead letter's and the
    /// requeued one: the restore of the lost commits must count the user
    /// once (E33), and the resent requeue report what the first run did
    /// (E07).
    fn requeued_then_failover(&mut self, r: &mut Rng) {
        self.family = Some("requeued_then_failover");
        self.attempts.clear();
        self.vouchers.truncate(1);
        for v in self.vouchers.iter_mut() {
            v.added_at_ms = 0;
            v.stock = v.stock.clamp(10, 20);
            v.per_user_limit = 1;
            v.waitlist_limit = Some(0);
            v.pay_timeout_ms = 1_500;
        }
        // Nobody pays: every unit of the rush comes back after its deadline.
        self.pay_percent = 0;
        self.rush(r, 0, 400);
        // Late in the rush: the commits the rollback takes off the
        // witness are the units the gate then sells again.
        let snapshot = r.range(150, 250);
        let crash = r.range(600, 800);
        self.faults.push(Fault::RedisRollback {
            snapshot_at_ms: snapshot,
            crash_at_ms: crash,
            empty: false,
        });
        // A slow guard: the gate sells what MySQL no longer has meanwhile.
        self.gate_check_ms = 2_000;
        for v in self.vouchers.clone() {
            let past = self.last_user(v.id);
            for user in past + 1..=past + r.range(4, 8) {
                let at = crash + r.range(50, 400);
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
        // MySQL dumped late in the rush: it loses commits older than the
        // dead letters' first entries, so a restore reading the kept
        // entries newest first reaches those entries (each requeued
        // user's older one) before it has every lost user's.
        let dump = r.range(snapshot + 50, snapshot + 150);
        // After the rush's deadlines, their sweep and the guard's rebuild.
        let requeue = r.range(5_300, 5_900);
        self.requeue_at_ms = Some(requeue);
        let restore = requeue + r.range(1_500, 2_000);
        self.faults.push(Fault::MysqlRollback {
            dump_at_ms: dump,
            restore_at_ms: restore,
        });
        // New buyers of the units the cancellations gave back, between the
        // requeue and the failover: MySQL loses more commits than the
        // Redis rollback took off the witness, so the guard would see the
        // loss even with a witness left short by the rollback. In half
        // (`seed ^ 0x0E12`, a stream of its own) only one or two: as the
        // family was first built, when MySQL's loss was smaller than that
        // shortfall and went unseen until the witness was set back up at
        // the guard's rebuild (E12 of the defects found on main).
        let mut fewer = Rng::new(self.seed ^ 0x0E12);
        self.witness_short = !fewer.chance(50);
        for v in self.vouchers.clone() {
            let past = self.last_user(v.id);
            let count = match self.witness_short {
                true => fewer.range(1, 2),
                false => v.stock as u64 / 2 + 3,
            };
            for user in past + 1..=past + count {
                let at = r.range(requeue + 200, restore - 300);
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
        self.duration_ms = restore + 3_000;
        self.steady_buyers(r, restore + 500, restore + 3_000);
        // The witness set back up after the Redis rollback counts the
        // orders MySQL committed between its dump and that rollback, whose
        // entries Redis lost: nothing kept restores them, so the gate
        // waits for the operator (the book, "Redis back in time, then
        // MySQL"), who drops them by their count after the guard's pass,
        // as in `failover_past_keep`; buyers come until after. (Drawn
        // from the variant's stream: the draws above stay the seed's.)
        let drop = restore + 2_000 + 500 + fewer.range(500, 1_500);
        self.drop_lost_commits_at_ms = Some(drop);
        self.duration_ms = drop + 3_000;
        self.steady_buyers(&mut fewer, drop + 500, drop + 3_000);
    }

    /// The stock and `extra` buyers of every voucher, each at a moment of
    /// the first `within_ms`: a rush that sells out.
    fn rush(&mut self, r: &mut Rng, extra: u64, within_ms: u64) {
        for v in self.vouchers.clone() {
            for user in 1..=v.stock as u64 + extra {
                let at = r.range(0, within_ms);
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
    }

    /// New buyers of every voucher, arriving evenly from `from` to `to`
    /// (more than its stock), so that buyers meet whatever a fault kept
    /// or freed while it stands.
    fn steady_buyers(&mut self, r: &mut Rng, from: u64, to: u64) {
        for v in self.vouchers.clone() {
            let past = self.last_user(v.id);
            let count = (v.stock as u64 + 10).min(120);
            for user in past + 1..=past + count {
                let at = r.range(from.max(v.added_at_ms), to.max(v.added_at_ms + 1));
                self.attempts.push(new_buyer(r, &v, user, at));
            }
        }
    }

    /// Up to 8 of these attempts made again 0.1–1.5 s after `at` (buyers
    /// pressing buy again after an operator's preload).
    fn press_again(&mut self, r: &mut Rng, earlier: &[Attempt], at: u64) {
        for _ in 0..earlier.len().min(8) {
            let again = r.pick(earlier).clone();
            self.attempts.push(Attempt {
                at_ms: at + r.range(100, 1_500),
                ..again
            });
        }
    }

    /// The highest user id the plan has for the voucher (0: none).
    pub fn last_user(&self, voucher: u64) -> u64 {
        self.attempts
            .iter()
            .filter(|a| a.voucher == voucher)
            .map(|a| a.user)
            .max()
            .unwrap_or(0)
    }

    /// When the last timed fault is over (a fault point's moment is not
    /// known: the sale's end stands for it).
    fn faults_end(&self) -> u64 {
        self.faults
            .iter()
            .map(|f| match f {
                Fault::Kill9 { at_ms, down_ms, .. } => at_ms + down_ms,
                Fault::Stop { at_ms, for_ms, .. } | Fault::Network { at_ms, for_ms, .. } => {
                    at_ms + for_ms
                }
                Fault::RedisRollback { crash_at_ms, .. } => *crash_at_ms,
                Fault::MysqlRollback { restore_at_ms, .. } => *restore_at_ms,
                Fault::Point { .. }
                | Fault::Hold { .. }
                | Fault::Skew { .. }
                | Fault::Resend { .. } => 0,
            })
            .max()
            .unwrap_or(0)
            .max(self.duration_ms)
    }

    /// Whether a fault of the plan loses a store's writes: Redis back to a
    /// snapshot or empty, MySQL back to a dump. (A resent `seckill
    /// preload` must not: its second publish keeps the gate's buyers.)
    pub fn loses_writes(&self) -> bool {
        self.faults.iter().any(|f| {
            matches!(
                f,
                Fault::RedisRollback { .. }
                    | Fault::MysqlRollback { .. }
                    | Fault::Hold {
                        then: Then::RedisCrash | Then::RedisEmpty | Then::MysqlRestore,
                        ..
                    }
            )
        })
    }

    /// The plan with only the faults at `keep` (a shrunk schedule).
    pub fn keeping(&self, keep: &[usize]) -> Plan {
        let mut p = self.clone();
        p.faults = keep
            .iter()
            .filter_map(|&i| self.faults.get(i).cloned())
            .collect();
        p
    }
}

fn voucher(r: &mut Rng, id: u64, added_at_ms: u64) -> VoucherPlan {
    let per_user_limit = match r.chance(30) {
        true => r.range(2, 3) as u32,
        false => 1,
    };
    VoucherPlan {
        id,
        stock: r.range(3, 40) as i64,
        per_user_limit,
        waitlist_limit: r.chance(30).then(|| r.range(1, 10) as u32),
        pay_timeout_ms: r.range(1_500, 4_000),
        added_at_ms,
    }
}

/// A new buyer's attempt at `at_ms`: a quantity within the voucher's
/// limit, 80 % over HTTP.
fn new_buyer(r: &mut Rng, v: &VoucherPlan, user: u64, at_ms: u64) -> Attempt {
    Attempt {
        at_ms,
        voucher: v.id,
        user,
        quantity: r.range(1, v.per_user_limit as u64) as u32,
        via: match r.chance(80) {
            true => Via::Http,
            false => Via::Cli,
        },
    }
}

fn target(r: &mut Rng, workers: usize) -> Target {
    match r.chance(70) {
        true => Target::Worker(r.range(0, workers as u64 - 1) as usize),
        false => Target::Serve,
    }
}

fn fault(r: &mut Rng, workers: usize, duration_ms: u64) -> Fault {
    let at = r.range(100, duration_ms);
    match r.range(0, 9) {
        0 => Fault::Kill9 {
            target: target(r, workers),
            at_ms: at,
            down_ms: r.range(0, 1_500),
        },
        1 => Fault::Stop {
            target: target(r, workers),
            at_ms: at,
            for_ms: r.range(200, 3_000),
        },
        2 | 3 => {
            let t = target(r, workers);
            let point = match t {
                Target::Worker(_) => *r.pick(WORKER_POINTS),
                Target::Serve => *r.pick(SERVE_POINTS),
            };
            let action = match r.range(0, 2) {
                0 => PointAction::Pause(r.range(100, 3_000)),
                1 => PointAction::Abort,
                _ => PointAction::Error,
            };
            Fault::Point {
                target: t,
                point,
                hit: r.range(1, 6),
                action,
            }
        }
        4 => Fault::Hold {
            worker: r.range(0, workers as u64 - 1) as usize,
            point: HOLD_POINTS[r.range(0, HOLD_POINTS.len() as u64 - 1) as usize],
            hit: r.range(1, 4),
            snapshot_at_ms: r.range(0, duration_ms / 2),
            then: match r.range(0, 2) {
                0 => Then::RedisCrash,
                1 => Then::MysqlRestore,
                _ => Then::KillOther,
            },
            armed_at_ms: 0,
        },
        5 => {
            let snapshot = r.range(0, duration_ms);
            Fault::RedisRollback {
                snapshot_at_ms: snapshot,
                crash_at_ms: r.range(snapshot, duration_ms + 500),
                empty: false,
            }
        }
        6 => {
            let dump = r.range(0, duration_ms);
            Fault::MysqlRollback {
                dump_at_ms: dump,
                restore_at_ms: r.range(dump, duration_ms + 500),
            }
        }
        7 | 8 => Fault::Network {
            target: target(r, workers),
            store: *r.pick(&[Store::Redis, Store::Mysql]),
            at_ms: at,
            for_ms: r.range(300, 4_000),
            how: match r.range(0, 2) {
                0 => Net::BlackHole,
                1 => Net::Delay(r.range(20, 400)),
                _ => Net::Reset,
            },
        },
        _ => Fault::Skew {
            worker: r.range(0, workers as u64 - 1) as usize,
            offset_s: *r.pick(&[-1_800, -90, 90, 1_800]),
        },
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Worker(i) => write!(f, "worker {i}"),
            Target::Serve => write!(f, "serve"),
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Process(t) => write!(f, "{t}"),
            Caller::Preload => write!(f, "preload again"),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill9 {
                target,
                at_ms,
                down_ms,
            } => write!(f, "kill -9 {target} at {at_ms} ms, back {down_ms} ms later"),
            Fault::Stop {
                target,
                at_ms,
                for_ms,
            } => write!(f, "SIGSTOP {target} at {at_ms} ms for {for_ms} ms"),
            Fault::Point {
                target,
                point,
                hit,
                action,
            } => write!(f, "{action:?} {target} at {point} (hit {hit})"),
            Fault::Hold {
                worker,
                point,
                hit,
                snapshot_at_ms,
                then,
                armed_at_ms: 0,
            } => write!(
                f,
                "hold worker {worker} at {point} (hit {hit}), then {then:?} (snapshot at {snapshot_at_ms} ms), release"
            ),
            Fault::Hold {
                worker,
                point,
                snapshot_at_ms,
                then,
                armed_at_ms,
                ..
            } => write!(
                f,
                "hold worker {worker} at {point} (first hit after {armed_at_ms} ms), then {then:?} (snapshot at {snapshot_at_ms} ms), release"
            ),
            Fault::RedisRollback {
                snapshot_at_ms,
                crash_at_ms,
                empty: false,
            } => write!(
                f,
                "Redis snapshot at {snapshot_at_ms} ms, kill -9 and restart from it at {crash_at_ms} ms"
            ),
            Fault::RedisRollback {
                crash_at_ms,
                empty: true,
                ..
            } => write!(f, "Redis killed -9 at {crash_at_ms} ms, started empty"),
            Fault::MysqlRollback {
                dump_at_ms,
                restore_at_ms,
            } => write!(
                f,
                "MySQL dumped at {dump_at_ms} ms, set back to the dump at {restore_at_ms} ms"
            ),
            Fault::Network {
                target,
                store,
                at_ms,
                for_ms,
                how,
            } => write!(
                f,
                "{how:?} between {target} and {store:?} at {at_ms} ms for {for_ms} ms"
            ),
            Fault::Skew { worker, offset_s } => {
                write!(f, "worker {worker}'s clock {offset_s:+} s off")
            }
            Fault::Resend { by, script, hit } => {
                write!(f, "{script}.lua's call by {by} sent twice (hit {hit})")
            }
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} worker(s), {} attempts over {} ms, {}% pay (latest {}% of the deadline)",
            self.seed,
            self.workers,
            self.attempts.len(),
            self.duration_ms,
            self.pay_percent,
            self.pay_latest_percent
        )?;
        for v in &self.vouchers {
            writeln!(
                f,
                "  voucher {}: stock {}, limit {}, waitlist {:?}, pay within {} ms, added at {} ms",
                v.id, v.stock, v.per_user_limit, v.waitlist_limit, v.pay_timeout_ms, v.added_at_ms
            )?;
        }
        for at in &self.reconcile_at_ms {
            writeln!(f, "  reconcile --yes at {at} ms")?;
        }
        if self.gate_check_ms != 300 || self.mysql_timeout_ms.is_some() {
            writeln!(
                f,
                "  workers: --gate-check {}ms, --mysql-timeout {}",
                self.gate_check_ms,
                self.mysql_timeout_ms
                    .map_or("default".to_string(), |ms| format!("{ms}ms"))
            )?;
        }
        if let Some(family) = self.family {
            writeln!(f, "  scenario family: {family}")?;
        }
        if self.reconcile_in_hold {
            writeln!(
                f,
                "  reconcile --yes while a worker is held after Redis went back"
            )?;
        }
        if self.preload_in_hold {
            writeln!(
                f,
                "  every voucher preloaded while a worker is held after Redis came back empty"
            )?;
        }
        if self.hold_linger_ms > 0 {
            writeln!(
                f,
                "  a held worker stays held {} ms after the second fault",
                self.hold_linger_ms
            )?;
        }
        if self.restart_delay_ms > 0 {
            writeln!(
                f,
                "  a worker that dies is started again {} ms later",
                self.restart_delay_ms
            )?;
        }
        if let Some((w, n)) = self.small_batch {
            writeln!(f, "  worker {w}: --batch {n} --max-batch {n}")?;
        }
        if self.one_lane {
            writeln!(f, "  every worker: --lanes 1")?;
        }
        if self.probe_lease {
            writeln!(
                f,
                "  after a Redis restart, a purchase once a node-id lease would have lapsed"
            )?;
        }
        if let Some((at, v, limits)) = &self.racing_updates {
            writeln!(
                f,
                "  at {at} ms, {} voucher updates of voucher {v}, the first stalled before its publish (--per-user-limit {limits:?})",
                limits.len()
            )?;
        }
        if let Some(after) = self.reconcile_after_death_ms {
            writeln!(
                f,
                "  reconcile --yes {after} ms after a worker died, the gates judged open right after"
            )?;
        }
        for (at, v) in &self.preloads {
            writeln!(f, "  preload --voucher {v} again at {at} ms")?;
        }
        if self.retry_preload {
            writeln!(
                f,
                "  a preload refused for orders in flight retried every 200 ms for 3 s"
            )?;
        }
        if let Some(until) = self.pays_until_ms {
            writeln!(f, "  no buyer pays after {until} ms")?;
        }
        if self.trim_before_restore {
            writeln!(
                f,
                "  every acknowledged entry trimmed just before MySQL is set back (--keep past)"
            )?;
        }
        if let Some(at) = self.drop_lost_commits_at_ms {
            writeln!(
                f,
                "  at {at} ms, reconcile --drop-lost-commits N --yes three times at once per voucher with lost commits nothing kept restores"
            )?;
        }
        if let Some(at) = self.requeue_at_ms {
            writeln!(
                f,
                "  at {at} ms, pending --requeue --yes of every voucher, its script call sent twice"
            )?;
        }
        if self.witness_short {
            writeln!(
                f,
                "  MySQL loses fewer commits than the Redis rollback took off the witness"
            )?;
        }
        if self.second_loss {
            writeln!(
                f,
                "  after the drops, worker 0's guard held at its next raise while MySQL is dumped and, 1 s later, set back to that dump; then let go"
            )?;
        }
        if self.watch_locks {
            writeln!(f, "  every lock watched: none outlives its batch")?;
        }
        if let Some(from) = self.no_pause_from_ms {
            writeln!(f, "  no buyer told paused from {from} ms")?;
        }
        for (at, v, l) in &self.limit_updates {
            writeln!(
                f,
                "  voucher update --id {v} --per-user-limit {l} at {at} ms"
            )?;
        }
        for (i, fault) in self.faults.iter().enumerate() {
            writeln!(f, "  fault {i}: {fault}")?;
        }
        Ok(())
    }
}
