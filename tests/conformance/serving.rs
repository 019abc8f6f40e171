//! The serving model (model/src/serving.rs) held to the code: seeded
//! random walks through its actions, each also taken against a real
//! voucher in three buckets (`voucher add --buckets 3 --per-user-limit
//! 2`, `preload`, then each bucket's stock and the pool set to the
//! model's), and after every step each bucket's stock, waiting line
//! (who, in which order, wanting how many), live bound, units sold and
//! gate, the pool, and each giver's open transfers compared with the
//! model's state.
//!
//! The steps: an arrival is `gate::admission::admit_durably` of a new
//! user of the bucket for 1 or 2 units (lua/seckill.lua); a unit that
//! comes back is `orders::deadline::release` of an order of one or two
//! units (lua/release.lua); the mover's bound is `gate::transfer::set_bound`
//! (lua/serve_up_to.lua) at the queued time of the request the model's
//! bound names, and lifted where the model lifts it; a move is
//! `transfer::take`, `give` and `settle` in turn (the transfer scripts:
//! the mover's model holds their steps apart); a serve is
//! `transfer::promote_waiting` (lua/transfer_give.lua of no units); a
//! transfer the model completes at a round's start is
//! `transfer::complete` (lua/transfer_void.lua, lua/transfer_settle.lua);
//! a gate paused and reopened is `gate::pause::pause` and `reopen`
//! (lua/pause.lua), one found on a server nobody has checked has meta's
//! `run_id` set to another server's (dropped when checked). A
//! bound that lapses has its `serve_up_to_until` moved to the past. The
//! line's read takes no script: the comparison after each step reads
//! what a read would.
//!
//! Not the mover's own code: the round's steps here are the model's,
//! each run with the library's function the mover calls. Each publish
//! writes the model's `units_free` with the bound and the lent units, so
//! a request its bucket holds some but not enough units for is refused
//! ("not enough stock") while that count is live and below it.

use std::collections::HashMap;
use std::sync::Arc;

use redis::AsyncCommands;
use seckill::gate::admission::{self, Admission, Attempt};
use seckill::gate::buckets::{bucket_of, Layout};
use seckill::gate::mover_lease;
use seckill::gate::pause::{self, Reopened};
use seckill::gate::transfer::{self, BoundWord, Bounded, Given, Landing, Settled, Side, Taken};
use seckill::orders::deadline::{self, WhilePaused};
use seckill::store::keys::VoucherKeys;
use seckill::store::node_lease::OrderIds;
use seckill::store::redis_conn::Redis;
use seckill::worker::allotment;
use seckill_model::serving::{Action, Fixes, Gate, Read, Round, Serving, State, Waiting};
use seckill_model::Model;

use super::common::{self, TestEnv};
use super::{seeds, Rng};

/// The scripts the serving walks run.
pub const SCRIPTS_DRIVEN: &[&str] = &[
    "serve_up_to.lua",     // Publish
    "release.lua",         // Release
    "seckill.lua",         // Arrive
    "pause.lua",           // Close, Reopen
    "transfer_void.lua",   // Start (a transfer left in transit)
    "transfer_settle.lua", // Start, Move
];

const FIRST_VOUCHER: u64 = 200_000;
const STEPS: usize = 120;
/// Walks in every CI run.
const WALKS: u64 = 100;
const PER_USER_LIMIT: u32 = 2;
/// Transfer and serve ids: rising, above any the scripts saw.
const ID_BASE: u64 = 1_000_000;
/// A bound holds this long (the most `serve_up_to.lua` takes): a walk
/// ends well within it, so only `Lapse` ends one.
const BOUND_MS: u64 = 60_000;
/// The run id a closed gate's meta names: not this server's.
const ANOTHER_SERVER: &str = "0123456789abcdef";
const LEASE: std::time::Duration = std::time::Duration::from_secs(600);

/// The walks' bounds: more buyers, units back and rounds than the
/// exhaustive check's, since a walk visits one path.
fn serving() -> Serving {
    Serving {
        stock: vec![3, 0, 2],
        pool: 1,
        arrivals: vec![
            (0, 1),
            (1, 2),
            (0, 2),
            (1, 1),
            (2, 1),
            (0, 1),
            (1, 1),
            (1, 2),
            (2, 2),
            (0, 1),
        ],
        releases: 3,
        rounds: 8,
        crashes: 2,
        stops: 2,
        lapses: 3,
        closures: 3,
        fixes: Fixes::CODE,
    }
}

struct Real {
    redis: Redis,
    gates: Vec<VoucherKeys>,
    voucher: u64,
    epoch: u64,
    ids: Arc<OrderIds>,
    next_id: u64,
    next_user: u64,
    /// Each request by the model's queued time: its user, the units it
    /// wants, and its score in the real waiting line (when it waited).
    requests: HashMap<u8, (u64, u8, Option<f64>)>,
    /// Units given back at each bucket (a release leaves its buyer).
    released: Vec<u8>,
    /// Releases of two units so far, and of them those taken as two
    /// orders of one in one call (the canceller's batch): every other one.
    two_units_back: usize,
    two_orders_back: usize,
    /// The ids of the model's transfers in transit, in its order.
    transit: Vec<u64>,
}

impl Real {
    async fn new(
        env: &TestEnv,
        ids: &Arc<OrderIds>,
        voucher: u64,
        model: &Serving,
    ) -> Result<Real, String> {
        let (layout, mut redis): (Layout, Redis) = env
            .live_voucher_in_buckets_with(
                voucher,
                // Enough for each bucket to hold a buyer's limit; the
                // stocks are set to the model's below.
                i64::from(PER_USER_LIMIT) * model.stock.len() as i64,
                model.stock.len() as u32,
                &["--per-user-limit", &PER_USER_LIMIT.to_string()],
            )
            .await;
        let gates = layout.all_keys().map_err(|e| e.to_string())?;
        for (keys, units) in gates.iter().zip(&model.stock) {
            let _: () = redis
                .set(keys.stock(), *units)
                .await
                .map_err(|e| e.to_string())?;
        }
        let _: () = redis
            .set(gates[0].pool(), model.pool)
            .await
            .map_err(|e| e.to_string())?;
        let epoch = mover_lease::take(&mut redis, &gates[0], "conformance-serving", LEASE, 0)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no mover lease")?;
        Ok(Real {
            redis,
            gates,
            voucher,
            epoch,
            ids: ids.clone(),
            next_id: ID_BASE,
            next_user: 1,
            requests: HashMap::new(),
            released: vec![0; model.stock.len()],
            two_units_back: 0,
            two_orders_back: 0,
            transit: vec![],
        })
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A new user of bucket `b`.
    fn user_of(&mut self, b: u32) -> u64 {
        loop {
            let user = self.next_user;
            self.next_user += 1;
            if bucket_of(user, self.gates.len() as u32) == b {
                return user;
            }
        }
    }

    fn side(&self, b: Option<usize>) -> Side<'_> {
        match b {
            None => Side::Pool(&self.gates[0]),
            Some(b) => Side::Bucket(b as u32, &self.gates[b]),
        }
    }

    /// Takes `action` with the real code; `before` and `after` are the
    /// model's states around it.
    async fn take(
        &mut self,
        model: &Serving,
        action: Action,
        before: &State,
        after: &State,
    ) -> Result<(), String> {
        match action {
            Action::Arrive(i) => {
                let (b, wants) = model.arrivals[i as usize];
                let user = self.user_of(u32::from(b));
                let order_id = self.id();
                let attempt = Attempt {
                    voucher: self.voucher,
                    user,
                    order_id,
                    token: None,
                    quantity: u32::from(wants),
                    client_reference: None,
                };
                let keys = self.gates[b as usize].clone();
                let (reply, _) =
                    admission::admit_durably(&mut self.redis, &keys, attempt, None, None)
                        .await
                        .map_err(|e| e.to_string())?;
                let waits = after.lines[b as usize].len() > before.lines[b as usize].len();
                let sells = after.sold[b as usize] > before.sold[b as usize];
                // lua/seckill.lua's reason: "waiting for units" while the
                // bucket has units for sale (its stock less the lent ones)
                // and no bound holds them; the units for sale in a code 9.
                let stock = before.stock[b as usize];
                let left = i64::from(stock - before.lent[b as usize].min(stock));
                let held = left > 0
                    && before.bounds[b as usize].is_some()
                    && !before.lines[b as usize].is_empty();
                let for_units = left > 0 && !held;
                let score = match (&reply.outcome, waits) {
                    (Admission::Admitted { .. }, false) if sells => None,
                    // Refused: nothing written, the buyer gone.
                    (Admission::NotEnoughStock { left: said }, false)
                        if !sells && *said == left =>
                    {
                        None
                    }
                    (Admission::SoldOut { waitlist_position }, true)
                    | (Admission::WaitingForUnits { waitlist_position }, true)
                        if *waitlist_position > 0
                            && matches!(reply.outcome, Admission::WaitingForUnits { .. })
                                == for_units =>
                    {
                        let score: Option<f64> = self
                            .redis
                            .zscore(keys.waitlist(), user)
                            .await
                            .map_err(|e| e.to_string())?;
                        Some(score.ok_or("queued, and not in the waiting line")?)
                    }
                    (outcome, _) => {
                        return Err(format!(
                            "arrival {i} at bucket {b} answered {outcome:?}; the model {}",
                            match (waits, sells) {
                                (true, _) => "queues it",
                                (_, true) => "sells",
                                _ => "refuses it (not enough stock)",
                            }
                        ))
                    }
                };
                self.requests.insert(before.clock, (user, wants, score));
            }
            Action::Release(b, units) => {
                let keys = self.gates[b as usize].clone();
                // Two units come back as one order of two or, every
                // other time (a walk's first by its voucher's parity), two
                // orders of one in one call: the script serves the line
                // from the units of both at once.
                let mut orders = vec![(self.id(), u64::from(units))];
                if units == 2 {
                    self.two_units_back += 1;
                    if (self.voucher + self.two_units_back as u64) % 2 == 1 {
                        orders = vec![(orders[0].0, 1), (self.id(), 1)];
                        self.two_orders_back += 1;
                    }
                }
                let conn = &mut self.redis.clone();
                let events_before = last_event(conn, &keys).await?;
                let released = deadline::release(
                    conn,
                    &keys,
                    self.voucher,
                    &orders,
                    PER_USER_LIMIT,
                    &[],
                    &self.ids,
                    WhilePaused::Defer,
                )
                .await
                .map_err(|e| e.to_string())?;
                self.released[b as usize] += units;
                let promoted = u64::from(after.sold[b as usize] + units - before.sold[b as usize]);
                if (released.released, released.promoted) != (u64::from(units), promoted) {
                    return Err(format!(
                        "the release answered {released:?}; the model promotes {promoted} unit(s)"
                    ));
                }
                // Each promotion names an order of this call as the one
                // its units came back with.
                let after_them = format!("({events_before}");
                for (_, fields) in stream_from(conn, &keys.events(), &after_them).await? {
                    let named = fields.get("released_order").and_then(|o| o.parse().ok());
                    if fields.get("type").map(String::as_str) == Some("promoted")
                        && !named.is_some_and(|o: u64| orders.iter().any(|(id, _)| *id == o))
                    {
                        return Err(format!(
                            "a promotion of the release of {orders:?} names {fields:?}"
                        ));
                    }
                }
            }
            Action::Publish => {
                let Round::Publishing { next, .. } = &before.round else {
                    return Err("a publish with no round publishing".into());
                };
                let b = *next as usize;
                let up_to = match after.bounds[b] {
                    None => None,
                    Some(bound) => Some(self.score_of(bound.up_to)?),
                };
                let keys = self.gates[b].clone();
                let conn = &mut self.redis.clone();
                let word = BoundWord {
                    lent: Some(i64::from(after.lent[b])),
                    free: after.units_free[b].map(i64::from),
                    ..BoundWord::bound(up_to, BOUND_MS)
                };
                let set = transfer::set_bound(conn, &keys, self.epoch, &word)
                    .await
                    .map_err(|e| e.to_string())?;
                if set != publish_answer(before.gates[b]) {
                    return Err(format!(
                        "the bound answered {set:?} at a {:?} gate",
                        before.gates[b]
                    ));
                }
                // The pass found the unchecked buckets otherwise than its
                // plan took them: the round's second plan, as the code's.
                let Round::Publishing { read, .. } = &before.round else {
                    return Err("a publish with no round publishing".into());
                };
                if planned_again(before, after) {
                    self.plan_as_the_code(read, after.unchecked, after)?;
                }
            }
            Action::Move => {
                let Some((from, to, units)) = model.move_of(before) else {
                    return Ok(());
                };
                if units == 0 {
                    // The mover calls nothing for no units.
                    return Ok(());
                }
                let giver_open = before.gates[from.unwrap_or(0)] == Gate::Open;
                let held = match from {
                    None => before.pool,
                    Some(d) => before.stock[d],
                };
                let id = self.id();
                let conn = &mut self.redis.clone();
                let taken = transfer::take(
                    conn,
                    self.side(from),
                    self.side(Some(to)),
                    id,
                    u64::from(units),
                    1,
                    self.epoch,
                )
                .await
                .map_err(|e| e.to_string())?;
                let k = match taken {
                    Taken::Units(k) if giver_open && k == u64::from(units.min(held)) => k,
                    Taken::Paused if !giver_open => return Ok(()),
                    // The model's giver holds none then.
                    Taken::Short(0) if giver_open && held == 0 => return Ok(()),
                    other => {
                        return Err(format!(
                            "the take of {units} answered {other:?}; the model's giver holds {held}, its gate {:?}",
                            before.gates[from.unwrap_or(0)]
                        ))
                    }
                };
                let given = transfer::give(conn, self.side(Some(to)), id, k, self.epoch, &[])
                    .await
                    .map_err(|e| e.to_string())?;
                if before.gates[to] != Gate::Open {
                    // Left in transit: a later round completes it.
                    if given != Given::Paused {
                        return Err(format!(
                            "the give at a {:?} gate answered {given:?}",
                            before.gates[to]
                        ));
                    }
                    self.transit.push(id);
                    return Ok(());
                }
                if given != (Given::Landed { promoted: 0 }) {
                    return Err(format!("the give answered {given:?}"));
                }
                let settled = transfer::settle(conn, self.side(from), id, Landing::Given)
                    .await
                    .map_err(|e| e.to_string())?;
                if settled != (Settled::Done { units_back: 0 }) {
                    return Err(format!("the settle answered {settled:?}"));
                }
            }
            Action::Serve => {
                let Round::Serving { next, plan, fill } = &before.round else {
                    return Err("a serve with no round serving".into());
                };
                let b = *next as usize;
                let requests = plan.requests[b];
                if requests == 0 || fill.stock[b] < plan.need[b] {
                    return Ok(());
                }
                let promoted = match before.gates[b] {
                    Gate::Open => Some(u64::from(after.sold[b] - before.sold[b])),
                    Gate::Paused | Gate::Unchecked => None,
                };
                self.serve(b, usize::from(requests), promoted).await?;
            }
            Action::Start => self.complete_stale(before).await?,
            Action::Close(b, gate) => {
                let keys = self.gates[b as usize].clone();
                let conn = &mut self.redis.clone();
                match gate {
                    Gate::Paused => super::pause_now(conn, &keys).await?,
                    // As a restart of its master leaves it: meta names
                    // another server (lua/lib/server_checked.lua).
                    Gate::Unchecked | Gate::Open => {
                        let _: () = conn
                            .hset(keys.meta(), "run_id", ANOTHER_SERVER)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            Action::Reopen(b) => {
                let keys = self.gates[b as usize].clone();
                let conn = &mut self.redis.clone();
                match before.gates[b as usize] {
                    Gate::Paused => {
                        let reopened = pause::reopen(conn, &keys, 0, None)
                            .await
                            .map_err(|e| e.to_string())?;
                        if reopened != Reopened::Now {
                            return Err(format!("the reopen answered {reopened:?}"));
                        }
                    }
                    // Checked (lua/run_id.lua would record this server).
                    Gate::Unchecked | Gate::Open => {
                        let _: () = conn
                            .hdel(keys.meta(), "run_id")
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            Action::Lapse(b) => {
                let _: () = self
                    .redis
                    .hset_multiple(
                        self.gates[b as usize].meta(),
                        &[
                            ("serve_up_to_until", 1),
                            ("lent_until", 1),
                            ("units_free_until", 1),
                        ],
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Action::Read => self.allot_as_the_code(model, before, after)?,
            // `Mover::lift_bound`: every bound and lent unit lifted, then
            // each line next to stock served.
            Action::Stop if before.bounded => {
                let word = BoundWord {
                    lent: Some(0),
                    ..BoundWord::bound(None, BOUND_MS)
                };
                for (b, keys) in self.gates.clone().iter().enumerate() {
                    let set = transfer::set_bound(&mut self.redis.clone(), keys, self.epoch, &word)
                        .await
                        .map_err(|e| e.to_string())?;
                    if set != publish_answer(before.gates[b]) {
                        return Err(format!(
                            "the lift answered {set:?} at a {:?} gate",
                            before.gates[b]
                        ));
                    }
                }
                for b in 0..self.gates.len() {
                    let requests = before.lines[b].len().min(usize::from(before.stock[b]));
                    if requests == 0 || before.gates[b] != Gate::Open {
                        continue;
                    }
                    let promoted = u64::from(after.sold[b] - before.sold[b]);
                    self.serve(b, requests, Some(promoted)).await?;
                }
            }
            // No script: the mover's own memory.
            Action::Crash | Action::Stop => {}
        }
        Ok(())
    }

    /// `transfer::promote_waiting` of up to `requests` of bucket `b`'s
    /// line, which the model says promotes `promoted` units (None: its
    /// gate refuses).
    async fn serve(
        &mut self,
        b: usize,
        requests: usize,
        promoted: Option<u64>,
    ) -> Result<(), String> {
        let id = self.id();
        let fresh: Vec<u64> = (0..requests).map(|_| self.id()).collect();
        let side = Side::Bucket(b as u32, &self.gates[b]);
        let given =
            transfer::promote_waiting(&mut self.redis.clone(), side, id, self.epoch, &fresh)
                .await
                .map_err(|e| e.to_string())?;
        let expected = match promoted {
            Some(promoted) => Given::Landed { promoted },
            None => Given::Paused,
        };
        if given != expected {
            return Err(format!(
                "the serve answered {given:?}; the model {expected:?}"
            ));
        }
        Ok(())
    }

    /// `Mover::complete_stale` at a round's start, as the model takes it:
    /// each transfer in transit since before the last round is called off
    /// at its receiver (lua/transfer_void.lua) and its units go back to
    /// the giver (lua/transfer_settle.lua), unless the giver is paused.
    async fn complete_stale(&mut self, before: &State) -> Result<(), String> {
        let mut left = vec![];
        for (t, id) in before.transit.iter().zip(std::mem::take(&mut self.transit)) {
            if t.young {
                left.push(id);
                continue;
            }
            let giver = t.from.map(usize::from);
            let paused = before.gates[giver.unwrap_or(0)] == Gate::Paused;
            let conn = &mut self.redis.clone();
            let done = transfer::complete(conn, self.side(giver), self.side(Some(t.to.into())), id)
                .await
                .map_err(|e| e.to_string())?;
            let expected = match paused {
                true => (Landing::Void, Settled::Paused),
                false => (
                    Landing::Void,
                    Settled::Done {
                        units_back: u64::from(t.units),
                    },
                ),
            };
            if done != expected {
                return Err(format!(
                    "completing transfer {id} ({t:?}) answered {done:?}; the model {expected:?}"
                ));
            }
            if paused {
                left.push(id);
            }
        }
        self.transit = left;
        Ok(())
    }

    /// After a round's last read: the code's allotment
    /// (`worker::allotment::allot`) of what the round read (each read
    /// compared with the stores when it was taken), held to the model's
    /// plan, and each bucket's bound to the model's.
    fn allot_as_the_code(
        &self,
        model: &Serving,
        before: &State,
        after: &State,
    ) -> Result<(), String> {
        let Round::Reading { next, read } = &before.round else {
            return Err("a read with no round reading".into());
        };
        let n = model.stock.len();
        if *next as usize + 1 < n {
            return Ok(());
        }
        let mut read = read.clone();
        read.lines.push(before.lines[n - 1].clone());
        read.stock.push(before.stock[n - 1]);
        if before.gates[n - 1] == Gate::Paused {
            read.paused |= 1 << (n - 1);
        }
        self.plan_as_the_code(&read, before.unchecked, after)
    }

    /// The code's allotment of what a round `read`, the buckets read
    /// paused or `remembered` unchecked planned as paused, held to the
    /// model's plan `after` it.
    fn plan_as_the_code(&self, read: &Read, remembered: u32, after: &State) -> Result<(), String> {
        let n = read.stock.len();
        let paused = read.paused | remembered;
        let mut real_lines = vec![];
        for (b, (line, units)) in read.lines.iter().zip(&read.stock).enumerate() {
            let mut waiting = vec![];
            for w in line {
                waiting.push((self.score_of(w.queued)? as f64, i64::from(w.wants)));
            }
            real_lines.push(allotment::Line {
                stock: i64::from(*units),
                paused: paused & (1 << b) != 0,
                waiting,
                seen_all: true,
            });
        }
        let usable = paused & 1 == 0;
        let pool = if usable { i64::from(read.pool) } else { 0 };
        let real = allotment::allot(&real_lines, pool);
        let real_bounds: Vec<Option<u64>> = (0..n)
            .map(|b| real.bound_of(b).map(|t| t.max(1.0) as u64))
            .collect();
        let real_lends = allotment::Filling::new(&real_lines, &real).lends(
            &real_lines,
            i64::from(read.pool),
            usable,
            &real,
        );
        // A plan published, or none written (nothing bounded, nothing
        // lent: the round goes on to `even_out`).
        let (plan, written) = match &after.round {
            Round::Publishing { plan, .. } => (plan, true),
            Round::Evening { plan, .. } => (plan, false),
            other => return Err(format!("a round planned, and then {other:?}")),
        };
        let mut bounds = vec![None; n];
        let mut lends = vec![0; n];
        if written {
            for b in 0..n {
                if let Some(bound) = plan.bound_of(b, false, 0) {
                    bounds[b] = Some(self.score_of(bound.up_to)?);
                }
                lends[b] = i64::from(plan.lends[b]);
            }
        }
        let need: Vec<i64> = plan.need.iter().map(|u| i64::from(*u)).collect();
        let requests: Vec<usize> = plan.requests.iter().map(|r| *r as usize).collect();
        if (&real.need, &real.requests, &real_bounds, &real_lends)
            != (&need, &requests, &bounds, &lends)
        {
            return Err(format!(
                "the code allots need {:?}, requests {:?}, bounds {real_bounds:?}, lends {real_lends:?}; the model need {need:?}, requests {requests:?}, bounds {bounds:?}, lends {lends:?}",
                real.need, real.requests
            ));
        }
        Ok(())
    }

    /// Bucket `b`'s order stream: one entry per buyer, `promote` for a
    /// request that waited and `admit` for one that bought at once, with
    /// the units it wanted; and the wants kept for requests still
    /// waiting (`waitlist_quantity`: those for more than one unit).
    /// `buyers` and `waiting`: the bucket's, and `promotions`, meta's
    /// count, as the comparison read them.
    async fn compare_orders(
        &mut self,
        b: usize,
        keys: &VoucherKeys,
        (buyers, waiting): (&[u64], &[u64]),
        promotions: usize,
    ) -> Result<(), String> {
        let entries = stream_from(&mut self.redis, &keys.orders(), "-").await?;
        let mut got: Vec<(u64, String, u8)> = vec![];
        for (_, fields) in entries {
            let user: u64 = fields
                .get("user")
                .and_then(|u| u.parse().ok())
                .ok_or("an order entry without its user")?;
            let quantity: u8 = match fields.get("quantity") {
                None => 1,
                Some(q) => q
                    .parse()
                    .map_err(|e| format!("an order's quantity {q:?}: {e}"))?,
            };
            let kind = fields.get("kind").cloned().unwrap_or_default();
            got.push((user, kind, quantity));
        }
        got.sort();
        let mut expected = vec![];
        for &user in buyers {
            let (_, wants, score) = self
                .request_of(user)
                .ok_or(format!("bucket {b}: buyer {user} the walk never sent"))?;
            let kind = match score {
                Some(_) => "promote",
                None => "admit",
            };
            expected.push((user, kind.to_string(), wants));
        }
        expected.sort();
        if got != expected {
            return Err(format!(
                "bucket {b}: order entries (user, kind, units) {got:?}; expected {expected:?}"
            ));
        }
        // Each promotion: a `promoted` event with its units, and one in
        // meta's count.
        let promoted: Vec<(u64, u8)> = expected
            .iter()
            .filter(|(_, kind, _)| kind == "promote")
            .map(|(user, _, units)| (*user, *units))
            .collect();
        let events = stream_from(&mut self.redis, &keys.events(), "-").await?;
        let mut told: Vec<(u64, u8)> = vec![];
        for (_, fields) in events {
            if fields.get("type").map(String::as_str) != Some("promoted") {
                continue;
            }
            let user = fields.get("user").and_then(|u| u.parse().ok());
            let units = fields.get("quantity").and_then(|q| q.parse().ok());
            let (Some(user), Some(units)) = (user, units) else {
                return Err(format!("bucket {b}: a promoted event {fields:?}"));
            };
            told.push((user, units));
        }
        told.sort();
        if told != promoted {
            return Err(format!(
                "bucket {b}: promoted events (user, units) {told:?}; the promotions {promoted:?}"
            ));
        }
        if promotions != promoted.len() {
            return Err(format!(
                "bucket {b}: meta promotions {promotions}; {} promoted",
                promoted.len()
            ));
        }
        let wants: HashMap<u64, u8> = self
            .redis
            .hgetall(keys.waitlist_quantity())
            .await
            .map_err(|e| e.to_string())?;
        let mut modelled = HashMap::new();
        for &user in waiting {
            if let Some((_, wanted)) = self.time_of(user) {
                if wanted > 1 {
                    modelled.insert(user, wanted);
                }
            }
        }
        if wants != modelled {
            return Err(format!(
                "bucket {b}: waitlist_quantity {wants:?}; the waiting requests want {modelled:?}"
            ));
        }
        Ok(())
    }

    /// The real queued time of the request the model queued at `t`.
    fn score_of(&self, t: u8) -> Result<u64, String> {
        match self.requests.get(&t) {
            Some((_, _, Some(score))) => Ok((*score).max(1.0) as u64),
            _ => Err(format!("no request waited at the model's time {t}")),
        }
    }

    /// The model's time of a real waiting user.
    fn time_of(&self, user: u64) -> Option<(u8, u8)> {
        self.request_of(user).map(|(t, wants, _)| (t, wants))
    }

    /// A real user's request: the model's time, the units it wants, its
    /// score in the line if it waited.
    fn request_of(&self, user: u64) -> Option<(u8, u8, Option<f64>)> {
        self.requests
            .iter()
            .find(|(_, (u, _, _))| *u == user)
            .map(|(t, (_, wants, score))| (*t, *wants, *score))
    }

    /// The stores against the model's state.
    async fn compare(&mut self, s: &State) -> Result<(), String> {
        let now = common::redis_now_ms(&mut self.redis)
            .await
            .map_err(|e| e.to_string())?;
        for (b, keys) in self.gates.clone().iter().enumerate() {
            let stock: Option<i64> = self
                .redis
                .get(keys.stock())
                .await
                .map_err(|e| e.to_string())?;
            if stock.unwrap_or(0) != i64::from(s.stock[b]) {
                return Err(format!(
                    "bucket {b}: stock {stock:?}; the model {}",
                    s.stock[b]
                ));
            }
            let line: Vec<(u64, f64)> = self
                .redis
                .zrange_withscores(keys.waitlist(), 0, -1)
                .await
                .map_err(|e| e.to_string())?;
            let waiting: Vec<u64> = line.iter().map(|(user, _)| *user).collect();
            let line: Vec<Option<(u8, u8)>> =
                waiting.iter().map(|user| self.time_of(*user)).collect();
            let modelled: Vec<Option<(u8, u8)>> = s.lines[b]
                .iter()
                .map(|w: &Waiting| Some((w.queued, w.wants)))
                .collect();
            if line != modelled {
                return Err(format!(
                    "bucket {b}: waiting (time, wants) {line:?}; the model {modelled:?}"
                ));
            }
            let meta: HashMap<String, String> = self
                .redis
                .hgetall(keys.meta())
                .await
                .map_err(|e| e.to_string())?;
            // A field the mover publishes, while its `until` is later
            // than now.
            let live = |field: &str, until: &str| -> Option<u64> {
                let until: i64 = meta.get(until)?.parse().ok()?;
                meta.get(field)?.parse().ok().filter(|_| until > now)
            };
            let live_free = live("units_free", "units_free_until").map(|f| f as u8);
            if live_free != s.units_free[b] {
                return Err(format!(
                    "bucket {b}: units_free live {live_free:?}; the model {:?}",
                    s.units_free[b]
                ));
            }
            let live_lent = live("lent", "lent_until").unwrap_or(0);
            if live_lent != u64::from(s.lent[b]) {
                return Err(format!(
                    "bucket {b}: {live_lent} unit(s) lent live; the model {}",
                    s.lent[b]
                ));
            }
            let bound = live("serve_up_to", "serve_up_to_until");
            let modelled = match s.bounds[b] {
                None => None,
                Some(bound) => Some(self.score_of(bound.up_to)?),
            };
            if bound != modelled {
                return Err(format!(
                    "bucket {b}: live bound {bound:?}; the model {modelled:?}"
                ));
            }
            let gate = match (
                meta.get("paused").map(String::as_str),
                meta.get("run_id").map(String::as_str),
            ) {
                (Some("1"), _) => Gate::Paused,
                (_, Some(ANOTHER_SERVER)) => Gate::Unchecked,
                _ => Gate::Open,
            };
            if gate != s.gates[b] {
                return Err(format!(
                    "bucket {b}: gate {gate:?}; the model {:?}",
                    s.gates[b]
                ));
            }
            let promotions: usize = meta
                .get("promotions")
                .map_or(Ok(0), |n| n.parse())
                .map_err(|e| format!("bucket {b}: meta promotions: {e}"))?;
            let buyers: Vec<u64> = self
                .redis
                .smembers(keys.buyers())
                .await
                .map_err(|e| e.to_string())?;
            let mut units = 0u32;
            for &user in &buyers {
                let (_, wants) = self
                    .time_of(user)
                    .ok_or(format!("bucket {b}: buyer {user} the walk never sent"))?;
                units += u32::from(wants);
            }
            self.compare_orders(b, keys, (&buyers, &waiting), promotions)
                .await?;
            let sold = units - u32::from(self.released[b]);
            if sold != u32::from(s.sold[b]) {
                return Err(format!(
                    "bucket {b}: {sold} unit(s) sold; the model {}",
                    s.sold[b]
                ));
            }
        }
        let pool: Option<i64> = self
            .redis
            .get(self.gates[0].pool())
            .await
            .map_err(|e| e.to_string())?;
        if pool.unwrap_or(0) != i64::from(s.pool) {
            return Err(format!("pool {pool:?}; the model {}", s.pool));
        }
        // Each giver's open transfers: (receiver, units), in the order
        // taken.
        for giver in std::iter::once(None).chain((0..self.gates.len()).map(Some)) {
            let mut open: Vec<(String, u64, u64)> =
                transfer::open(&mut self.redis.clone(), self.side(giver))
                    .await
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .map(|t| (t.to, t.units, t.id))
                    .collect();
            open.sort_by_key(|t| t.2);
            let open: Vec<(String, u64)> = open.into_iter().map(|t| (t.0, t.1)).collect();
            let modelled: Vec<(String, u64)> = s
                .transit
                .iter()
                .filter(|t| t.from.map(usize::from) == giver)
                .map(|t| (t.to.to_string(), u64::from(t.units)))
                .collect();
            if open != modelled {
                return Err(format!(
                    "giver {giver:?}: open transfers {open:?}; the model {modelled:?}"
                ));
            }
        }
        Ok(())
    }
}

/// A step from a round's first publishing pass to its second plan (to
/// publish, or none to write: on to `even_out`).
fn planned_again(before: &State, after: &State) -> bool {
    let first_pass = matches!(
        before.round,
        Round::Publishing {
            replanned: false,
            ..
        }
    );
    let second = match &after.round {
        Round::Publishing { replanned, .. } => *replanned,
        Round::Evening { .. } => true,
        _ => false,
    };
    first_pass && second
}

/// What `lua/serve_up_to.lua` answers at a gate: nothing written at one
/// on a server nobody has checked; a paused one takes it.
fn publish_answer(gate: Gate) -> Bounded {
    match gate {
        Gate::Unchecked => Bounded::Unchecked,
        Gate::Open | Gate::Paused => Bounded::Set,
    }
}

/// What the walks saw, for the coverage asserts.
#[derive(Default)]
struct Seen {
    actions: HashMap<String, usize>,
    /// Arrivals queued behind a live bound with units at their bucket.
    held: usize,
    /// Serves (a release's or the mover's) a live bound stopped short of
    /// a request that fitted.
    stopped_at_bound: usize,
    /// Arrivals and releases at a bucket with units lent live.
    met_lent: usize,
    /// Releases of two units at once.
    two_units_back: usize,
    /// Of them, two orders of one in one call.
    two_orders_back: usize,
    /// Arrivals refused for not enough stock (`units_free` live and
    /// below the quantity).
    refused: usize,
    /// Moves left in transit (their receiver closed), and transfers a
    /// round completed.
    undelivered: usize,
    completed: usize,
    /// Moves of `even_out`.
    evened: usize,
    /// Rounds that planned again after a publish found their unchecked
    /// buckets otherwise.
    second_plans: usize,
}

async fn walk(
    env: &TestEnv,
    ids: &Arc<OrderIds>,
    seed: u64,
    seen: &mut Seen,
) -> Result<(), String> {
    let model = serving();
    let mut rng = Rng::new(seed);
    let mut real = Real::new(env, ids, FIRST_VOUCHER + seed, &model).await?;
    let mut state = model.initial();
    let mut taken = vec![];
    let result = async {
        real.compare(&state).await?;
        for _ in 0..STEPS {
            let mut actions = vec![];
            model.actions(&state, &mut actions);
            // A gate closes while a round has published and moves, where
            // it refuses a move: drawn at any step, the walk's closures
            // went before most rounds had anything to move.
            let moving = matches!(
                state.round,
                Round::Publishing { .. } | Round::Moving { .. } | Round::Evening { .. }
            );
            actions.retain(|a| moving || !matches!(a, Action::Close(..)));
            if actions.is_empty() {
                break;
            }
            // A kind first, then one of its actions: drawn alone, the
            // arrivals (eight at first) would mostly come before the
            // mover's first round.
            let kind = |a: &Action| match a {
                Action::Arrive(_) => 0,
                Action::Release(..) => 1,
                Action::Crash
                | Action::Stop
                | Action::Lapse(_)
                | Action::Close(..)
                | Action::Reopen(_) => 2,
                _ => 3,
            };
            let mut kinds: Vec<u8> = actions.iter().map(kind).collect();
            kinds.dedup();
            kinds.sort_unstable();
            kinds.dedup();
            let chosen = kinds[rng.below(kinds.len())];
            let of_kind: Vec<Action> = actions.into_iter().filter(|a| kind(a) == chosen).collect();
            let action = of_kind[rng.below(of_kind.len())];
            let after = model
                .next_state(&state, action)
                .ok_or("the model refused its own action")?;
            note(&model, &state, action, &after, seen);
            taken.push(action);
            real.take(&model, action, &state, &after).await?;
            real.compare(&after).await?;
            state = after;
        }
        if state.deprived.is_some() || state.evened_lent.is_some() || state.sent_unchecked.is_some()
        {
            return Err(format!(
                "the model's rule broke: {:?} {:?} {:?}",
                state.deprived, state.evened_lent, state.sent_unchecked
            ));
        }
        Ok::<_, String>(())
    }
    .await;
    seen.two_orders_back += real.two_orders_back;
    result.map_err(|e| {
        format!(
            "serving, seed {seed}: {e}\n  after {} steps: {taken:?}",
            taken.len()
        )
    })
}

/// A stream's entries from `start` (an id, `(` an id for after it, or
/// `-`) to its end.
async fn stream_from(
    conn: &mut Redis,
    key: &str,
    start: &str,
) -> Result<Vec<(String, HashMap<String, String>)>, String> {
    redis::cmd("XRANGE")
        .arg(key)
        .arg(start)
        .arg("+")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())
}

/// The id of bucket `keys`' newest event ("0" when none).
async fn last_event(conn: &mut Redis, keys: &VoucherKeys) -> Result<String, String> {
    let newest: Vec<(String, HashMap<String, String>)> = redis::cmd("XREVRANGE")
        .arg(keys.events())
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(newest.into_iter().next().map_or("0".into(), |(id, _)| id))
}

fn note(model: &Serving, before: &State, action: Action, after: &State, seen: &mut Seen) {
    let name = format!("{action:?}");
    let name = name.split('(').next().unwrap_or_default().to_string();
    *seen.actions.entry(name).or_default() += 1;
    if let Action::Arrive(i) = action {
        let (b, wants) = model.arrivals[i as usize];
        let b = b as usize;
        if before.bounds[b].is_some()
            && before.stock[b] >= wants
            && after.lines[b].len() > before.lines[b].len()
        {
            seen.held += 1;
        }
    }
    let at = match action {
        Action::Arrive(i) => Some(model.arrivals[i as usize].0 as usize),
        Action::Release(b, _) => Some(b as usize),
        _ => None,
    };
    if at.is_some_and(|b| before.lent[b] > 0) {
        seen.met_lent += 1;
    }
    if let Action::Release(_, 2) = action {
        seen.two_units_back += 1;
    }
    if after.transit.len() > before.transit.len() {
        seen.undelivered += 1;
    }
    if action == Action::Start {
        seen.completed += before.transit.len() - after.transit.len();
    }
    if action == Action::Publish && planned_again(before, after) {
        seen.second_plans += 1;
    }
    if action == Action::Move
        && matches!(before.round, Round::Evening { .. })
        && model.move_of(before).is_some_and(|(_, _, units)| units > 0)
    {
        seen.evened += 1;
    }
    if let Action::Arrive(i) = action {
        let b = model.arrivals[i as usize].0 as usize;
        if after.lines[b] == before.lines[b] && after.sold[b] == before.sold[b] {
            seen.refused += 1;
        }
    }
    if matches!(action, Action::Release(..) | Action::Serve) {
        for (b, line) in after.lines.iter().enumerate() {
            let Some(bound) = after.bounds[b] else {
                continue;
            };
            if line
                .iter()
                .any(|w| w.queued > bound.up_to && w.wants <= after.stock[b])
            {
                seen.stopped_at_bound += 1;
            }
        }
    }
}

/// Finding S1 (docs/src/concepts/checked-model.md), against the real
/// scripts: the round allots bucket 1's early request for 2 the pool's
/// unit and one of bucket 0's; a unit comes back at bucket 0 before the
/// move from it. Before the lent units were kept, the release served
/// bucket 0's later request for 2 from that unit and the one lent, the
/// move came up short, and the early request waited. Now the release
/// serves from bucket 0's stock less the unit lent: the later request
/// waits, the move takes the unit, and the early request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_that_comes_back_leaves_the_units_its_bucket_lends_elsewhere() {
    use Action::*;
    let model = one_round(1, vec![(0, 1), (1, 2), (0, 2)], 1);
    let script = [
        Arrive(0), // bucket 0 sells a unit: one left there
        Arrive(1), // bucket 1, for 2: waits (queued at 1)
        Arrive(2), // bucket 0, for 2: waits (queued at 2)
        Start,
        Read,
        Read,    // 2 free: the request at 1 gets them, the one at 2 is next
        Publish, // bucket 0 lends its unit
        Publish,
        Move,          // the pool's unit to bucket 1
        Release(0, 1), // bucket 0: 2 units, 1 lent: the request at 2 waits
        Move,          // bucket 0's lent unit to bucket 1
        Move,
        Move,
        Serve,
        Serve, // bucket 1's request at 1 served
    ];
    let end = scenario(&model, FIRST_VOUCHER + 10_000, &script).await;
    assert_eq!(end.deprived, None, "{end:?}");
    assert!(end.lines[1].is_empty(), "{end:?}");
    assert_eq!(end.sold[1], 2, "{end:?}");
    assert_eq!(end.lines[0].len(), 1, "{end:?}");
}

/// The wider form of finding S1: a bucket that only lends (none of its
/// requests allotted, so no bound there) sold its lent units to a
/// newcomer, and the move came up short. Now the newcomer waits ("sold
/// out": the units are an earlier request's), the move takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_at_a_bucket_that_only_lends_does_not_buy_the_lent_units() {
    use Action::*;
    let model = one_round(0, vec![(1, 2), (0, 2)], 0);
    let script = [
        Arrive(0), // bucket 1, for 2: waits (queued at 0)
        Start,
        Read,
        Read,
        Publish,   // bucket 0: no bound, its 2 units lent
        Publish,   // bucket 1: bound at 0
        Arrive(1), // bucket 0, for 2: waits
        Move,      // the pool: none
        Move,      // bucket 0's 2 units to bucket 1
        Move,
        Move,
        Serve,
        Serve, // bucket 1's request served
    ];
    let end = scenario(&model, FIRST_VOUCHER + 10_001, &script).await;
    assert_eq!(end.bounds[0], None, "{end:?}");
    assert_eq!(end.sold, vec![0, 2], "{end:?}");
    assert_eq!(end.lines[0].len(), 1, "{end:?}");
}

/// A scenario's bounds: two units in bucket 0, none in bucket 1, `pool`
/// in the pool, one round, no fault.
fn one_round(pool: u8, arrivals: Vec<(u8, u8)>, releases: u8) -> Serving {
    Serving {
        stock: vec![2, 0],
        pool,
        arrivals,
        releases,
        rounds: 1,
        crashes: 0,
        stops: 0,
        lapses: 0,
        closures: 0,
        fixes: Fixes::CODE,
    }
}

/// `run` on a test environment of its own; the model's state at the end.
async fn scenario(model: &Serving, voucher: u64, script: &[Action]) -> State {
    let env = TestEnv::new().await;
    let ids = OrderIds::lease(&env.cfg, None).await.unwrap();
    let end = run(&env, &ids, model, voucher, script)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    env.cleanup().await;
    end
}

/// Takes `script`'s actions in the model and against the scripts,
/// comparing after each; the model's state at the end.
async fn run(
    env: &TestEnv,
    ids: &Arc<OrderIds>,
    model: &Serving,
    voucher: u64,
    script: &[Action],
) -> Result<State, String> {
    let mut real = Real::new(env, ids, voucher, model).await?;
    let mut state = model.initial();
    real.compare(&state).await?;
    for (n, action) in script.iter().enumerate() {
        let mut offered = vec![];
        model.actions(&state, &mut offered);
        if !offered.contains(action) {
            return Err(format!(
                "step {n}: the model offers no {action:?}: {state:?}"
            ));
        }
        let after = model
            .next_state(&state, *action)
            .ok_or("the model refused its own action")?;
        real.take(model, *action, &state, &after)
            .await
            .map_err(|e| format!("step {n} ({action:?}): {e}"))?;
        real.compare(&after)
            .await
            .map_err(|e| format!("after step {n} ({action:?}): {e}"))?;
        state = after;
    }
    Ok(state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_walks_of_the_serving_model_match_the_scripts() {
    let env = TestEnv::new().await;
    let mut seen = Seen::default();
    let ids = OrderIds::lease(&env.cfg, None).await.unwrap();
    // Renewed while the walks run: all of them outlive one lease.
    let stop = tokio_util::sync::CancellationToken::new();
    let renewing = ids.keep_alive(stop.clone());
    for seed in seeds(WALKS) {
        if let Err(e) = walk(&env, &ids, seed, &mut seen).await {
            panic!("{e}");
        }
    }
    stop.cancel();
    let _ = renewing.await;
    ids.release().await;
    env.cleanup().await;
    let mut table: Vec<_> = seen.actions.iter().collect();
    table.sort();
    eprintln!(
        "serving actions taken over the walks: {table:?}; newcomers held behind a bound: {}; serves stopped at a bound: {}; arrivals and releases where units were lent: {}; releases of two units: {} ({} as two orders of one); refused for not enough stock: {}; moves left in transit: {}; transfers completed: {}; moves evening out: {}; second plans: {}",
        seen.held, seen.stopped_at_bound, seen.met_lent, seen.two_units_back, seen.two_orders_back, seen.refused, seen.undelivered, seen.completed, seen.evened, seen.second_plans
    );
    for name in [
        "Arrive", "Release", "Start", "Read", "Publish", "Move", "Serve", "Crash", "Stop", "Lapse",
        "Close", "Reopen",
    ] {
        assert!(
            seen.actions.get(name).copied().unwrap_or(0) > 0,
            "no walk took {name}: {table:?}"
        );
    }
    assert!(seen.held > 0, "no newcomer was held behind a bound");
    assert!(seen.stopped_at_bound > 0, "no serve stopped at a bound");
    assert!(seen.met_lent > 0, "no arrival or release met lent units");
    assert!(seen.two_units_back > 0, "no release of two units");
    assert!(seen.two_orders_back > 0, "no release of two orders of one");
    assert!(seen.refused > 0, "no arrival refused for not enough stock");
    assert!(seen.undelivered > 0, "no move left in transit");
    assert!(seen.completed > 0, "no transfer completed");
    assert!(seen.evened > 0, "no move evening out");
    assert!(seen.second_plans > 0, "no round planned again");
}
