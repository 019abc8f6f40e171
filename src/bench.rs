//! `seckill bench`: a load generator for the admission script.
//!
//! `concurrency` tasks share `connections` multiplexed connections (each one
//! pipelines the requests in flight on it) and pull attempt numbers from one
//! counter. Attempt `i` is made by user `user_offset + i % users + 1`, so with
//! `attempts = 2 * users` every user tries exactly twice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::gate::admission::{Admission, ReplicaWait, OUTCOME_NAMES};
use crate::gate::buckets::bucket_of;
use crate::gate::token;
use crate::orders::voucher::{validate_id, MAX_ID};
use crate::purchase::{purchase, Request};
use crate::store::config::Config;
use crate::store::keys::VoucherKeys;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct BenchPlan {
    pub voucher: u64,
    pub users: u64,
    pub user_offset: u64,
    pub attempts: u64,
    pub concurrency: usize,
    pub connections: usize,
    /// The snowflake node id asked for (none: a free one is leased).
    pub node_id: Option<u16>,
    /// Issue an admission token to every user first, and attempt with it.
    pub tokens: bool,
    /// After each success, wait for replicas to have it (Redis WAIT).
    pub wait_replicas: Option<ReplicaWait>,
    /// Units per attempt: drawn from this range (inclusive) per attempt.
    pub quantity: (u32, u32),
}

impl BenchPlan {
    /// The quantity of attempt `i`: spread over the range by a fixed mix of
    /// `i`, so two runs of one plan ask alike.
    fn quantity_of(&self, i: u64) -> u32 {
        let (lo, hi) = self.quantity;
        let span = u64::from(hi.saturating_sub(lo)) + 1;
        let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17;
        lo + (mixed % span) as u32
    }
}

impl BenchPlan {
    pub fn validate(&self) -> Result<()> {
        validate_id("voucher id", self.voucher)?;
        let bad = |m: &str| Err(Error::InvalidInput(m.to_string()));
        if self.users == 0 {
            return bad("--users must be at least 1");
        }
        if self.user_offset.saturating_add(self.users) > MAX_ID {
            return bad("--user-offset plus --users exceeds the largest user id");
        }
        if self.attempts == 0 {
            return bad("--attempts must be at least 1");
        }
        if !(1..=10_000).contains(&self.concurrency) {
            return bad("--concurrency must be between 1 and 10000");
        }
        if !(1..=256).contains(&self.connections) {
            return bad("--connections must be between 1 and 256");
        }
        if self.tokens && self.users > MAX_TOKEN_USERS {
            return bad("--tokens keeps a token per user in memory: at most 10000000 --users");
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

/// How many attempts ended in each outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OutcomeCounts {
    pub success: u64,
    pub already_bought: u64,
    pub sold_out: u64,
    pub not_started: u64,
    pub ended: u64,
    pub unknown_voucher: u64,
    pub paused: u64,
    pub rate_limited: u64,
    pub bad_token: u64,
    pub not_enough_stock: u64,
}

impl From<[u64; OUTCOMES]> for OutcomeCounts {
    /// From counts indexed by the script's return code.
    fn from(c: [u64; OUTCOMES]) -> Self {
        OutcomeCounts {
            success: c[0],
            already_bought: c[1],
            sold_out: c[2],
            not_started: c[3],
            ended: c[4],
            unknown_voucher: c[5],
            paused: c[6],
            rate_limited: c[7],
            bad_token: c[8],
            not_enough_stock: c[9],
        }
    }
}

impl OutcomeCounts {
    /// (name, count) in the script's code order, for tables.
    pub fn pairs(&self) -> [(&'static str, u64); OUTCOMES] {
        let c: [u64; OUTCOMES] = [
            self.success,
            self.already_bought,
            self.sold_out,
            self.not_started,
            self.ended,
            self.unknown_voucher,
            self.paused,
            self.rate_limited,
            self.bad_token,
            self.not_enough_stock,
        ];
        std::array::from_fn(|i| (OUTCOME_NAMES[i], c[i]))
    }
}

const OUTCOMES: usize = OUTCOME_NAMES.len();

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub voucher: u64,
    pub attempts: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed_ms: u64,
    pub attempts_per_sec: f64,
    pub concurrency: usize,
    pub connections: usize,
    pub outcomes: OutcomeCounts,
    pub latency: Latency,
    /// With --tokens: how long issuing the users' tokens took (not part of
    /// `elapsed_ms`).
    pub tokens_ms: Option<u64>,
    /// With --wait-replicas: successes that fewer replicas than asked had
    /// acknowledged when the wait timed out.
    pub replicas_short: Option<u64>,
    /// Units the successes took (beside `outcomes.success`, the orders).
    pub units_admitted: u64,
}

/// Tokens issued by the bench live as long as tokens may.
const BENCH_TOKEN_TTL_MS: u64 = 24 * 3_600_000;
/// `--tokens` keeps a token per user in memory: a bound a machine can hold.
const MAX_TOKEN_USERS: u64 = 10_000_000;

struct TaskResult {
    counts: [u64; OUTCOMES],
    replicas_short: u64,
    units: u64,
    errors: u64,
    first_error: Option<String>,
    hist: Histogram<u64>,
}

/// Runs the plan; `progress` counts finished attempts for a progress bar.
pub async fn run(cfg: &Config, plan: &BenchPlan, progress: Arc<AtomicU64>) -> Result<BenchReport> {
    plan.validate()?;
    VoucherKeys::new(&cfg.prefix, plan.voucher)?;
    let mut conns = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        conns.push(redis_conn::connect(cfg).await?);
    }
    // Every bucket's keys, made once: an attempt picks its user's.
    let layout =
        crate::gate::buckets::for_routing(&mut conns[0], &cfg.prefix, plan.voucher, async || {
            crate::store::db::Db::connect(cfg).await
        })
        .await?;
    let keys = Arc::new(layout.all_keys()?);
    let ids = OrderIds::lease(cfg, plan.node_id).await?;
    let stop_renewing = CancellationToken::new();
    let renewing = ids.keep_alive(stop_renewing.clone());
    // Load the script once up front so no attempt pays for NOSCRIPT.
    crate::store::scripts::ADMISSION
        .load_async(&mut conns[0])
        .await?;

    let (tokens, tokens_ms) = if plan.tokens {
        let t0 = Instant::now();
        let tokens = issue_tokens(&conns, &keys, plan).await?;
        (Arc::new(tokens), Some(t0.elapsed().as_millis() as u64))
    } else {
        (Arc::new(Vec::new()), None)
    };

    let shared = Arc::new(Attempts {
        plan: plan.clone(),
        keys,
        ids,
        tokens,
        next: AtomicU64::new(0),
        progress,
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..plan.concurrency)
        .map(|t| {
            let conn = conns[t % conns.len()].clone();
            tokio::spawn(shared.clone().make(conn))
        })
        .collect();
    let mut total = TaskResult::new();
    for task in tasks {
        let r = task
            .await
            .map_err(|e| Error::redis(format!("a bench task failed: {e}")))?;
        total.add(r);
    }
    let elapsed = started.elapsed();
    stop_renewing.cancel();
    renewing.await.ok();
    if total.errors == plan.attempts {
        return Err(Error::redis(format!(
            "every attempt failed; the first with: {}",
            total.first_error.unwrap_or_default()
        )));
    }
    Ok(total.report(plan, elapsed, tokens_ms))
}

/// What the tasks making the attempts share: the plan, where each user's
/// gate is, the ids, the tokens, the next attempt's number.
struct Attempts {
    plan: BenchPlan,
    keys: Arc<Vec<VoucherKeys>>,
    ids: Arc<OrderIds>,
    tokens: Arc<Vec<String>>,
    next: AtomicU64,
    progress: Arc<AtomicU64>,
}

impl Attempts {
    /// One task: attempts, by the next number left, until none is.
    async fn make(self: Arc<Self>, mut conn: redis_conn::Redis) -> TaskResult {
        let plan = &self.plan;
        let mut r = TaskResult::new();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= plan.attempts {
                break;
            }
            let user = plan.user_offset + i % plan.users + 1;
            let t0 = Instant::now();
            let quantity = plan.quantity_of(i);
            let token = self.tokens.get((i % plan.users) as usize);
            let request = Request {
                voucher: plan.voucher,
                user,
                token: token.map(String::as_str),
                quantity,
                client_reference: None,
            };
            let purchased = purchase(
                &mut conn,
                &self.keys[..],
                &self.ids,
                request,
                plan.wait_replicas,
            )
            .await;
            match purchased {
                Ok(purchased) => {
                    r.counts[purchased.outcome.code()] += 1;
                    if matches!(purchased.outcome, Admission::Admitted { .. }) {
                        r.units += u64::from(quantity);
                    }
                    r.replicas_short += u64::from(purchased.replicas_short(plan.wait_replicas));
                }
                Err(e) => {
                    r.errors += 1;
                    r.first_error.get_or_insert_with(|| e.to_string());
                }
            }
            r.hist.saturating_record(t0.elapsed().as_micros() as u64);
            self.progress.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

impl TaskResult {
    fn new() -> TaskResult {
        TaskResult {
            counts: [0; OUTCOMES],
            replicas_short: 0,
            units: 0,
            errors: 0,
            first_error: None,
            hist: new_histogram(),
        }
    }

    /// Adds another task's results to these.
    fn add(&mut self, r: TaskResult) {
        for (sum, c) in self.counts.iter_mut().zip(r.counts) {
            *sum += c;
        }
        self.errors += r.errors;
        self.replicas_short += r.replicas_short;
        self.units += r.units;
        if self.first_error.is_none() {
            self.first_error = r.first_error;
        }
        self.hist.add(&r.hist).ok();
    }

    /// Every task's results as the run's report.
    fn report(self, plan: &BenchPlan, elapsed: Duration, tokens_ms: Option<u64>) -> BenchReport {
        let hist = &self.hist;
        BenchReport {
            voucher: plan.voucher,
            attempts: plan.attempts,
            errors: self.errors,
            elapsed_ms: elapsed.as_millis() as u64,
            attempts_per_sec: plan.attempts as f64
                / elapsed.max(Duration::from_micros(1)).as_secs_f64(),
            concurrency: plan.concurrency,
            connections: plan.connections,
            outcomes: OutcomeCounts::from(self.counts),
            tokens_ms,
            replicas_short: plan.wait_replicas.map(|_| self.replicas_short),
            units_admitted: self.units,
            latency: Latency {
                p50_us: hist.value_at_quantile(0.50),
                p90_us: hist.value_at_quantile(0.90),
                p99_us: hist.value_at_quantile(0.99),
                p999_us: hist.value_at_quantile(0.999),
                max_us: hist.max(),
                mean_us: hist.mean(),
            },
            first_error: self.first_error,
        }
    }
}

/// A token for each of the plan's users (index = user - offset - 1), issued
/// concurrently over the bench's connections.
async fn issue_tokens(
    conns: &[crate::store::redis_conn::Redis],
    keys: &Arc<Vec<VoucherKeys>>,
    plan: &BenchPlan,
) -> Result<Vec<String>> {
    let tokens: Vec<String> = (0..plan.users)
        .map(|_| token::mint())
        .collect::<Result<_>>()?;
    let tokens = Arc::new(tokens);
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(plan.concurrency);
    for t in 0..plan.concurrency {
        let (mut conn, keys, tokens, next, plan) = (
            conns[t % conns.len()].clone(),
            keys.clone(),
            tokens.clone(),
            next.clone(),
            plan.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= plan.users {
                    return Ok::<(), Error>(());
                }
                let user = plan.user_offset + i + 1;
                token::store(
                    &mut conn,
                    &keys[bucket_of(user, keys.len() as u32) as usize],
                    user,
                    &tokens[i as usize],
                    BENCH_TOKEN_TTL_MS,
                )
                .await?;
            }
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Error::redis(format!("a token task failed: {e}")))??;
    }
    Ok(Arc::try_unwrap(tokens).unwrap_or_else(|shared| (*shared).clone()))
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant digits; the bounds are constants, so
    // this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant histogram bounds are valid")
}
