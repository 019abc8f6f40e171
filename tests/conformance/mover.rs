//! The mover's model (model/src/mover.rs) held to the code: seeded random
//! walks through its actions, each also taken by the library's own step
//! against a real voucher in two buckets (`voucher add --buckets 2`,
//! `preload`), and after every step the pool, each bucket's stock, open
//! transfers (`last` too), transfers received, each meta's mover epoch,
//! the lease's holder and the units sold compared with the model's state.
//!
//! The steps: `gate::mover_lease::take` (lua/mover_lease.lua), and
//! `gate::transfer::take`, `give`, `settle` and `void` (the transfer
//! scripts), as src/worker/mover.rs calls them; a sale is
//! `gate::admission::admit` of a new user of the bucket (lua/seckill.lua).
//! A lease running out is its expiry moved to the past; a killed mover's
//! next incarnation has an owner token of its own; a call delivered twice
//! is the same step run again with the same arguments.
//!
//! The gate guard's rebuild of a bucket: `gate::pause::pause`, then
//! `mover_lease::hold_still` and `fence` per bucket (the two halves of
//! `mover_lease::seize`), each of the count's reads taken with the
//! function `reconcile::buckets::read_bucket` reads with
//! (`transfer::in_transit`, the pool's and a bucket's stock, the hold's
//! `mover_lease::holds`) and its value held to the model's; the repair
//! writes the model's count as the stock (reconcile's repair is not what
//! runs here) and reopens with `gate::pause::reopen`; `mover_lease::unseize`.

use std::collections::HashMap;

use redis::AsyncCommands;
use seckill::gate::admission::{self, Admission};
use seckill::gate::buckets::{bucket_of, Layout};
use seckill::gate::mover_lease;
use seckill::gate::pause::{self, Reopened};
use seckill::gate::transfer::{
    self, Given, Landing as RealLanding, Settled, Side as RealSide, Taken,
};
use seckill::store::keys::VoucherKeys;
use seckill::store::redis_conn::Redis;
use seckill_model::mover::{
    Action, Answer, Call, Count, Epoch, Fixes, Landing, Moving, Read, Refusal, Settlement, Side,
    State, Step, GUARD, SEIZE_RAISE,
};
use seckill_model::Model;

use super::common::{self, TestEnv};
use super::{seeds, Rng};

/// The scripts the mover's walks run.
pub const SCRIPTS_DRIVEN: &[&str] = &[
    "mover_lease.lua",     // Lease
    "transfer_take.lua",   // Move
    "transfer_give.lua",   // Give
    "transfer_settle.lua", // Settle
    "transfer_void.lua",   // Complete
    "pause.lua",           // Pause, Repair
];

const FIRST_VOUCHER: u64 = 100_000;
const STEPS: usize = 80;
/// Steps after those that only finish what is in hand.
const DRAIN: usize = 40;
/// Walks in every CI run (about 10 s).
const WALKS: u64 = 100;
const BUCKETS: u32 = 2;
/// Transfer ids: the model's 1, 2, … above this (a snowflake id is any
/// rising number to the scripts).
const ID_BASE: u64 = 1_000_000;
const LEASE: std::time::Duration = std::time::Duration::from_secs(600);

/// The walks' bounds: more than the exhaustive check's, since a walk
/// visits one path.
fn moving() -> Moving {
    Moving {
        units: 5,
        buckets: BUCKETS as u8,
        movers: 2,
        transfers: 10,
        want: 2,
        crashes: 2,
        lapses: 2,
        duplicates: 4,
        rebuilds: 2,
        fixes: Fixes::CODE,
    }
}

struct Real {
    redis: Redis,
    gates: Vec<VoucherKeys>,
    voucher: u64,
    /// The next user of each sale, and its order id: every sale is a new
    /// user.
    next_user: u64,
}

fn real_id(id: u8) -> u64 {
    ID_BASE + u64::from(id)
}

fn real_landing(l: Landing) -> RealLanding {
    match l {
        Landing::Given => RealLanding::Given,
        Landing::Void => RealLanding::Void,
    }
}

fn model_landing(l: RealLanding) -> Landing {
    match l {
        RealLanding::Given => Landing::Given,
        RealLanding::Void => Landing::Void,
    }
}

/// A mover's owner token: its own per incarnation; the guard's for
/// `GUARD`.
fn owner(mover: u8, incarnation: u8) -> String {
    match mover {
        GUARD => format!("conformance-guard.{incarnation}"),
        m => format!("conformance-m{m}.{incarnation}"),
    }
}

/// A model epoch as the scripts count it: a seize raises by 2^20
/// (lua/mover_lease.lua), the model by `SEIZE_RAISE`.
fn real_epoch(epoch: Epoch) -> u64 {
    u64::from(epoch / SEIZE_RAISE) * (1 << 20) + u64::from(epoch % SEIZE_RAISE)
}

impl Real {
    async fn new(env: &TestEnv, voucher: u64) -> Real {
        let (layout, _): (Layout, Redis) = env
            .live_voucher_in_buckets(voucher, i64::from(moving().units), BUCKETS)
            .await;
        Real {
            redis: env.new_redis_connection().await,
            gates: layout.all_keys().unwrap(),
            voucher,
            next_user: 1,
        }
    }

    fn side(&self, side: Side) -> RealSide<'_> {
        RealSide::all(&self.gates)[side as usize]
    }

    /// Runs `call` with the library's step; its answer in the model's
    /// terms (a give's read as the mover reads it: `Given::landing`).
    async fn run(&mut self, call: Call) -> Result<Answer, String> {
        let conn = &mut self.redis.clone();
        let unexpected = |what: String| Err(format!("{call:?} answered {what}"));
        Ok(match call {
            Call::Take {
                from,
                to,
                id,
                want,
                epoch,
            } => {
                let taken = transfer::take(
                    conn,
                    self.side(from),
                    self.side(to),
                    real_id(id),
                    u64::from(want),
                    1,
                    real_epoch(epoch),
                )
                .await
                .map_err(|e| e.to_string())?;
                Answer::Taken(match taken {
                    Taken::Units(k) => Ok(u8::try_from(k).map_err(|e| e.to_string())?),
                    Taken::StaleId => Err(Refusal::StaleId),
                    Taken::Fenced(_) => Err(Refusal::Fenced),
                    Taken::Short(_) => Err(Refusal::Short),
                    Taken::Paused => Err(Refusal::Paused),
                    other => return unexpected(format!("{other:?}")),
                })
            }
            Call::Give {
                to,
                id,
                units,
                epoch,
                ..
            } => {
                let given = transfer::give(
                    conn,
                    self.side(to),
                    real_id(id),
                    u64::from(units),
                    real_epoch(epoch),
                    &[],
                )
                .await
                .map_err(|e| e.to_string())?;
                // As the mover reads it: its landing first, so that a
                // refusal read as a landing shows.
                Answer::Landed(match given.landing() {
                    Some(landing) => Ok(model_landing(landing)),
                    None if matches!(given, Given::Fenced(_)) => Err(Refusal::Fenced),
                    None if given == Given::Paused => Err(Refusal::Paused),
                    None => return unexpected(format!("{given:?}")),
                })
            }
            Call::Settle { from, id, landing } => {
                let settled =
                    transfer::settle(conn, self.side(from), real_id(id), real_landing(landing))
                        .await
                        .map_err(|e| e.to_string())?;
                Answer::Settled(match settled {
                    Settled::Done { units_back } => {
                        Settlement::Back(u8::try_from(units_back).map_err(|e| e.to_string())?)
                    }
                    Settled::NoRecord => Settlement::NoRecord,
                    Settled::Paused => Settlement::Paused,
                })
            }
            Call::Void { to, id, .. } => Answer::Landed(Ok(model_landing(
                transfer::void(conn, self.side(to), real_id(id))
                    .await
                    .map_err(|e| e.to_string())?,
            ))),
        })
    }

    /// Runs `call` and holds its answer to the model's, run on `before`.
    async fn run_as_modelled(&mut self, call: Call, before: &State) -> Result<(), String> {
        let expected = before.clone().call(moving().fixes, call);
        let got = self.run(call).await?;
        if got != expected {
            return Err(format!("{call:?} answered {got:?}; the model {expected:?}"));
        }
        Ok(())
    }

    /// A new user of bucket `b`.
    fn user_of(&mut self, b: u32) -> u64 {
        loop {
            let user = self.next_user;
            self.next_user += 1;
            if bucket_of(user, BUCKETS) == b {
                return user;
            }
        }
    }

    /// The call `action` makes in the model, and the state it runs on
    /// (None: the action calls no script).
    fn call_of(action: Action, before: &State) -> Option<Call> {
        let mover = |m: u8| &before.movers[m as usize];
        match action {
            Action::Move {
                mover: m,
                from,
                to,
                want,
            } => Some(Call::Take {
                from,
                to,
                id: before.next_id,
                want,
                epoch: mover(m).epoch,
            }),
            Action::Give(m) => match mover(m).step {
                Step::Taken {
                    from,
                    to,
                    id,
                    units,
                } => Some(Call::Give {
                    from,
                    to,
                    id,
                    units,
                    epoch: mover(m).epoch,
                }),
                _ => None,
            },
            Action::Settle(m) => match mover(m).step {
                Step::Answered { from, id, landing } => Some(Call::Settle { from, id, landing }),
                _ => None,
            },
            Action::Void(m) => match mover(m).step {
                Step::Completing { from, to, id } => Some(Call::Void { from, to, id }),
                _ => None,
            },
            Action::Again(m) => mover(m).last_call,
            Action::Deliver => before.wire,
            _ => None,
        }
    }

    /// Takes `action` with the real code; `before` and `after` are the
    /// model's states around it.
    async fn take(&mut self, action: Action, before: &State, after: &State) -> Result<(), String> {
        if let Some(call) = Real::call_of(action, before) {
            return self.run_as_modelled(call, before).await;
        }
        match action {
            Action::Lease(m) => {
                let incarnation = before.movers[m as usize].incarnation;
                let conn = &mut self.redis.clone();
                let epoch =
                    mover_lease::take(conn, &self.gates[0], &owner(m, incarnation), LEASE, 0)
                        .await
                        .map_err(|e| e.to_string())?;
                let expected = match after.movers[m as usize].epoch {
                    0 => None,
                    e => Some(real_epoch(e)),
                };
                if epoch != expected {
                    return Err(format!(
                        "the lease answered {epoch:?}; the model {expected:?}"
                    ));
                }
            }
            Action::Sell(side) => {
                let b = u32::from(side) - 1;
                let user = self.user_of(b);
                // Any id unique in the voucher will do for the gate.
                let order = self.voucher * 1_000_000 + user;
                let keys = self.gates[b as usize].clone();
                let got = admission::admit(&mut self.redis, &keys, self.voucher, user, order, None)
                    .await
                    .map_err(|e| e.to_string())?;
                if !matches!(got, Admission::Admitted { .. }) {
                    return Err(format!("a sale at bucket {b} answered {got:?}"));
                }
            }
            Action::Lapse => {
                // The lease's expiry moves to the past: time passed.
                let meta = self.gates[0].meta();
                let held: Option<String> = self
                    .redis
                    .hget(&meta, "mover")
                    .await
                    .map_err(|e| e.to_string())?;
                let holder = held
                    .as_deref()
                    .and_then(|h| h.split(' ').next())
                    .ok_or("the model's lease has no holder in Redis")?
                    .to_string();
                let _: () = self
                    .redis
                    .hset(&meta, "mover", format!("{holder} 1"))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Action::Pause(side) => {
                let keys = &self.gates[side as usize - 1];
                super::pause_now(&mut self.redis.clone(), keys).await?;
            }
            Action::Seize => {
                let guard = owner(GUARD, before.guard.incarnation);
                let conn = &mut self.redis.clone();
                let epoch = mover_lease::hold_still(conn, &self.gates[0], &guard, LEASE)
                    .await
                    .map_err(|e| e.to_string())?;
                let expected = match after.guard.step {
                    Count::Seizing => None,
                    _ => Some(real_epoch(after.epochs[0])),
                };
                if epoch != expected {
                    return Err(format!(
                        "the seize answered {epoch:?}; the model {expected:?}"
                    ));
                }
            }
            Action::Fence => {
                let Count::Fencing { next, epoch } = before.guard.step else {
                    return Err("a fence with no seize".into());
                };
                let guard = owner(GUARD, before.guard.incarnation);
                let conn = &mut self.redis.clone();
                let seen =
                    mover_lease::fence(conn, &self.gates[next as usize], &guard, real_epoch(epoch))
                        .await
                        .map_err(|e| e.to_string())?;
                let expected = real_epoch(after.epochs[next as usize]);
                if seen != expected {
                    return Err(format!("the fence answered {seen}; the model {expected}"));
                }
            }
            Action::Read => self.read(before).await?,
            Action::Repair => {
                let side = before.paused.ok_or("a repair with no bucket paused")?;
                let keys = self.gates[side as usize - 1].clone();
                let share = i64::from(after.sides[side as usize].units);
                let _: () = self
                    .redis
                    .set(keys.stock(), share)
                    .await
                    .map_err(|e| e.to_string())?;
                let conn = &mut self.redis.clone();
                let reopened = pause::reopen(conn, &keys, 0, None)
                    .await
                    .map_err(|e| e.to_string())?;
                if reopened != Reopened::Now {
                    return Err(format!("the reopen answered {reopened:?}"));
                }
            }
            Action::Unseize => {
                let guard = owner(GUARD, before.guard.incarnation);
                let conn = &mut self.redis.clone();
                mover_lease::unseize(conn, &self.gates[0], &guard)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Action::HoldLapse => {
                // The hold's expiry, and its seize's lease if no mover took
                // it since, moved to the past.
                let (inc, _) = before.hold.ok_or("the model has no hold")?;
                let guard = owner(GUARD, inc);
                let _: () = self
                    .redis
                    .zadd(self.gates[0].mover_holds(), &guard, 1)
                    .await
                    .map_err(|e| e.to_string())?;
                if before.holder == Some((GUARD, inc)) {
                    let _: () = self
                        .redis
                        .hset(self.gates[0].meta(), "mover", format!("{guard} 1"))
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            // No script: the process's own memory, or a copy put on the
            // wire.
            Action::EndRound(_)
            | Action::Complete { .. }
            | Action::Crash(_)
            | Action::GuardCrash
            | Action::Duplicate(_) => {}
            other => return Err(format!("{other:?} has no call in the model")),
        }
        Ok(())
    }

    /// The count's next read, taken as `read_bucket` takes it, held to the
    /// model's.
    async fn read(&mut self, before: &State) -> Result<(), String> {
        let (Count::Reading { next, .. }, Some(side)) = (before.guard.step, before.paused) else {
            return Err("a read with no count in hand".into());
        };
        let read = moving().reads(side)[next as usize];
        let conn = &mut self.redis.clone();
        let (got, modelled) = match read {
            Read::TransitAndPool | Read::Again => {
                let transit = transfer::in_transit(conn, &self.gates)
                    .await
                    .map_err(|e| e.to_string())?;
                let pool = self.number(&self.gates[0].pool()).await?;
                (
                    (transit as i64, pool),
                    (
                        i64::from(before.in_transit()),
                        i64::from(before.sides[0].units),
                    ),
                )
            }
            Read::Bucket(k) => (
                (self.number(&self.gates[k as usize - 1].stock()).await?, 0),
                (i64::from(before.sides[k as usize].units), 0),
            ),
            Read::Mysql => ((self.sold().await? as i64, 0), (i64::from(before.sold), 0)),
            Read::Hold => {
                let guard = owner(GUARD, before.guard.incarnation);
                let live = mover_lease::holds(conn, &self.gates[0], &guard)
                    .await
                    .map_err(|e| e.to_string())?;
                let modelled = before.hold == Some((before.guard.incarnation, true));
                ((i64::from(live), 0), (i64::from(modelled), 0))
            }
        };
        if got != modelled {
            return Err(format!("{read:?} read {got:?}; the model {modelled:?}"));
        }
        Ok(())
    }

    /// Units sold: the buyers of every bucket (the walk's sales are
    /// admissions).
    async fn sold(&mut self) -> Result<u64, String> {
        let mut sold = 0;
        for keys in &self.gates {
            let buyers: u64 = self
                .redis
                .scard(keys.buyers())
                .await
                .map_err(|e| e.to_string())?;
            sold += buyers;
        }
        Ok(sold)
    }

    async fn number(&mut self, key: &str) -> Result<i64, String> {
        let v: Option<i64> = self.redis.get(key).await.map_err(|e| e.to_string())?;
        Ok(v.unwrap_or(0))
    }

    /// The stores against the model's state.
    async fn compare(&mut self, s: &State) -> Result<(), String> {
        let label = |side: Side| match side {
            0 => "pool".to_string(),
            b => (b - 1).to_string(),
        };
        for side in 0..=BUCKETS as u8 {
            let h = &s.sides[side as usize];
            let (units_key, open_key, received_key) = match side {
                0 => (
                    self.gates[0].pool(),
                    self.gates[0].pool_transfers(),
                    self.gates[0].pool_received(),
                ),
                b => {
                    let k = &self.gates[b as usize - 1];
                    (k.stock(), k.transfers(), k.received())
                }
            };
            let name = label(side);
            let units = self.number(&units_key).await?;
            if units != i64::from(h.units) {
                return Err(format!("{name}: {units} units; the model {}", h.units));
            }
            let conn = &mut self.redis.clone();
            let open: Vec<(u64, String, u64)> = transfer::open(conn, self.side(side))
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|t| (t.id, t.to, t.units))
                .collect();
            let modelled: Vec<(u64, String, u64)> = h
                .open
                .iter()
                .map(|r| (real_id(r.id), label(r.to), u64::from(r.units)))
                .collect();
            if open != modelled {
                return Err(format!("{name}: open {open:?}; the model {modelled:?}"));
            }
            let last: Option<u64> = self
                .redis
                .hget(&open_key, "last")
                .await
                .map_err(|e| e.to_string())?;
            let modelled_last = (h.last != 0).then(|| real_id(h.last));
            if last != modelled_last {
                return Err(format!(
                    "{name}: last {last:?}; the model {modelled_last:?}"
                ));
            }
            let received: HashMap<u64, String> = self
                .redis
                .hgetall(&received_key)
                .await
                .map_err(|e| e.to_string())?;
            let modelled: HashMap<u64, String> = h
                .received
                .iter()
                .map(|(id, l)| {
                    let word = match l {
                        Landing::Given => "given",
                        Landing::Void => "void",
                    };
                    (real_id(*id), word.to_string())
                })
                .collect();
            if received != modelled {
                return Err(format!(
                    "{name}: received {received:?}; the model {modelled:?}"
                ));
            }
        }
        for (b, keys) in self.gates.clone().iter().enumerate() {
            let epoch: Option<u64> = self
                .redis
                .hget(keys.meta(), "mover_epoch")
                .await
                .map_err(|e| e.to_string())?;
            if epoch.unwrap_or(0) != real_epoch(s.epochs[b]) {
                return Err(format!(
                    "bucket {b}: mover_epoch {epoch:?}; the model {}",
                    real_epoch(s.epochs[b])
                ));
            }
            let conn = &mut self.redis.clone();
            let paused = pause::is_paused(conn, keys)
                .await
                .map_err(|e| e.to_string())?;
            if paused != (s.paused == Some(b as u8 + 1)) {
                return Err(format!(
                    "bucket {b}: paused {paused}; the model {:?}",
                    s.paused
                ));
            }
        }
        let sold = self.sold().await?;
        if sold != u64::from(s.sold) {
            return Err(format!("{sold} sold; the model {}", s.sold));
        }
        self.compare_holder(s).await?;
        self.compare_hold(s).await
    }

    /// The live holds on the mover against the model's.
    async fn compare_hold(&mut self, s: &State) -> Result<(), String> {
        let now = common::redis_now_ms(&mut self.redis)
            .await
            .map_err(|e| e.to_string())?;
        let holds: Vec<String> = self
            .redis
            .zrangebyscore(self.gates[0].mover_holds(), now + 1, "+inf")
            .await
            .map_err(|e| e.to_string())?;
        let modelled: Vec<String> = match s.hold {
            Some((inc, true)) => vec![owner(GUARD, inc)],
            _ => vec![],
        };
        if holds != modelled {
            return Err(format!("live holds {holds:?}; the model {modelled:?}"));
        }
        Ok(())
    }

    async fn compare_holder(&mut self, s: &State) -> Result<(), String> {
        let held: Option<String> = self
            .redis
            .hget(self.gates[0].meta(), "mover")
            .await
            .map_err(|e| e.to_string())?;
        let now = common::redis_now_ms(&mut self.redis)
            .await
            .map_err(|e| e.to_string())?;
        // "<owner> <expires_ms>" (lua/mover_lease.lua).
        let mut parts = held.as_deref().unwrap_or_default().split(' ');
        let holder = parts.next().filter(|o| !o.is_empty()).map(str::to_string);
        let live = parts
            .next()
            .and_then(|at| at.parse::<i64>().ok())
            .is_some_and(|at| at > now);
        let modelled = s.holder.map(|(m, inc)| owner(m, inc));
        if holder == modelled && (live == s.lease_live || holder.is_none()) {
            Ok(())
        } else {
            Err(format!(
                "the lease is {held:?} (live: {live}); the model {modelled:?} (live: {})",
                s.lease_live
            ))
        }
    }
}

/// What the walks saw, for the coverage asserts.
#[derive(Default)]
struct Seen {
    actions: HashMap<String, usize>,
    /// The scripts' answers, by call and answer ("Take Err(StaleId)").
    answers: HashMap<String, usize>,
    /// Walks that ended quiet, completed as a round at rest does.
    rested: usize,
}

async fn walk(env: &TestEnv, seed: u64, seen: &mut Seen) -> Result<(), String> {
    let model = moving();
    let mut rng = Rng::new(seed);
    let mut real = Real::new(env, FIRST_VOUCHER + seed).await;
    let mut state = model.initial();
    let mut taken = vec![];
    let result = async {
        real.compare(&state).await?;
        for step in 0..STEPS + DRAIN {
            let mut actions = vec![];
            model.actions(&state, &mut actions);
            if step >= STEPS {
                // Moves and rebuilds in hand finished, nothing new begun,
                // so that the walk ends at rest.
                if state.quiet() {
                    break;
                }
                actions.retain(|a| {
                    matches!(
                        a,
                        Action::Give(_)
                            | Action::Settle(_)
                            | Action::Void(_)
                            | Action::Deliver
                            | Action::Seize
                            | Action::Fence
                            | Action::Read
                            | Action::Repair
                            | Action::Unseize
                            | Action::HoldLapse
                    )
                });
            }
            // Nothing left but rounds that find nothing to do.
            if actions
                .iter()
                .all(|a| matches!(a, Action::Lease(_) | Action::EndRound(_)))
            {
                break;
            }
            // Taken as often as the others, a round's end (which leads
            // only to the next lease) and sales (which leave the movers
            // nothing to move) would end most walks before their moves
            // meet: both are drawn again twice.
            let mut action = actions[rng.below(actions.len())];
            for _ in 0..2 {
                if !matches!(action, Action::EndRound(_) | Action::Sell(_)) {
                    break;
                }
                action = actions[rng.below(actions.len())];
            }
            let after = model
                .next_state(&state, action)
                .ok_or("the model refused its own action")?;
            note(&state, action, &after, seen);
            taken.push(action);
            real.take(action, &state, &after).await?;
            real.compare(&after).await?;
            state = after;
        }
        if state.quiet() {
            // A round at rest: every open transfer completed, receiver
            // first (src/gate/transfer.rs `complete`, as the mover's
            // complete_stale calls it).
            seen.rested += 1;
            for from in 0..=BUCKETS as u8 {
                for record in &state.sides[from as usize].open {
                    let (giver, receiver) = (real.side(from), real.side(record.to));
                    let conn = &mut real.redis.clone();
                    transfer::complete(conn, giver, receiver, real_id(record.id))
                        .await
                        .map_err(|e| format!("at rest: {e}"))?;
                }
            }
            real.compare(&model.completed(&state))
                .await
                .map_err(|e| format!("at rest, every transfer completed: {e}"))?;
        }
        Ok::<_, String>(())
    }
    .await;
    result.map_err(|e| {
        format!(
            "mover, seed {seed}: {e}\n  after {} steps: {taken:?}",
            taken.len()
        )
    })
}

fn note(before: &State, action: Action, after: &State, seen: &mut Seen) {
    let name = format!("{action:?}");
    let name = name
        .split(['(', ' '])
        .next()
        .unwrap_or_default()
        .to_string();
    *seen.actions.entry(name).or_default() += 1;
    let answer = match (action, Real::call_of(action, before)) {
        (_, Some(call)) => {
            let script = format!("{call:?}");
            let script = script.split(' ').next().unwrap_or_default().to_string();
            format!("{script} {:?}", before.clone().call(moving().fixes, call))
        }
        (Action::Lease(m), None) if after.movers[m as usize].epoch == 0 => "Lease refused".into(),
        (Action::Seize, None) if after.guard.step == Count::Seizing => "Seize refused".into(),
        // A count that starts again with a seize: what its read found.
        (Action::Read, None) => match (before.guard.step, before.paused, after.guard.step) {
            (Count::Reading { next, .. }, Some(side), Count::Seizing) => {
                match moving().reads(side)[next as usize] {
                    Read::Again => "Read moved: seized again".into(),
                    _ => "Read hold lost: seized again".into(),
                }
            }
            _ => return,
        },
        _ => return,
    };
    *seen.answers.entry(answer).or_default() += 1;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_walks_of_the_mover_s_model_match_the_transfer_scripts() {
    let env = TestEnv::new().await;
    let mut seen = Seen::default();
    for seed in seeds(WALKS) {
        if let Err(e) = walk(&env, seed, &mut seen).await {
            panic!("{e}");
        }
    }
    env.cleanup().await;
    let mut table: Vec<_> = seen.actions.iter().collect();
    table.sort();
    eprintln!("mover actions taken over the walks: {table:?}");
    let mut answers: Vec<_> = seen.answers.iter().collect();
    answers.sort();
    eprintln!(
        "answers: {answers:?}; walks completed at rest: {}",
        seen.rested
    );
    for name in [
        "Lease",
        "EndRound",
        "Move",
        "Give",
        "Settle",
        "Complete",
        "Void",
        "Sell",
        "Crash",
        "Lapse",
        "Duplicate",
        "Deliver",
        "Again",
        "Pause",
        "Seize",
        "Fence",
        "Read",
        "Repair",
        "Unseize",
        "GuardCrash",
        "HoldLapse",
    ] {
        assert!(
            seen.actions.get(name).copied().unwrap_or(0) > 0,
            "no walk took {name}: {table:?}"
        );
    }
    // Every answer the fixes and the mover's branches are about came up
    // and was compared.
    for answer in [
        "Take Taken(Err(StaleId))",
        "Take Taken(Err(Fenced))",
        "Take Taken(Err(Short))",
        "Give Landed(Err(Fenced))",
        "Give Landed(Ok(Void))",
        "Void Landed(Ok(Void))",
        "Void Landed(Ok(Given))",
        "Settle Settled(NoRecord)",
        "Take Taken(Err(Paused))",
        "Give Landed(Err(Paused))",
        "Settle Settled(Paused)",
        "Seize refused",
        "Read moved: seized again",
        "Read hold lost: seized again",
        "Lease refused",
    ] {
        assert!(
            seen.answers.get(answer).copied().unwrap_or(0) > 0,
            "no walk met {answer}: {answers:?}"
        );
    }
    assert!(seen.rested > 0, "no walk came to rest");
}
