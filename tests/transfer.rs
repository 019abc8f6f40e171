//! Moving stock between a bucketed voucher's gates (src/gate/transfer.rs):
//! every step is exact on real Redis, safe to run twice, and a transfer cut
//! off at any point is completed without a unit sold twice or lost. The
//! invariant after every step: the voucher's free units, in stock and in
//! transit, add up to what it started with.

mod common;

use common::TestEnv;
use redis::AsyncCommands;
use seckill::gate::buckets::choose_tags;
use seckill::gate::transfer::{self, BoundWord, Given, Landing, Settled, Side, Taken};
use seckill::store::keys::VoucherKeys;
use seckill::store::redis_conn::Redis;
use seckill::store::scripts;
use seckill::store::slot_map::{slot_of, SlotMap};

const V: u64 = 5;

/// Bucket 0 (which holds the pool) and buckets 1 and 2, with `stock` units
/// each and `pool` in the pool, on tags chosen for the env's Redis.
async fn three_buckets(env: &TestEnv, stock: [i64; 3], pool: i64) -> Vec<VoucherKeys> {
    let mut redis = env.redis().await;
    let slots = SlotMap::read(&mut redis).await.expect("slot map");
    let tags = choose_tags(V, 3, slots.as_ref());
    let keys: Vec<VoucherKeys> = tags
        .iter()
        .map(|t| VoucherKeys::of_bucket(&env.prefix, V, t).expect("keys"))
        .collect();
    for (b, k) in keys.iter().enumerate() {
        let _: () = redis.set(k.stock(), stock[b]).await.expect("stock");
        let _: () = redis
            .hset_multiple(
                k.meta(),
                &[
                    ("bucket", b.to_string()),
                    ("buckets", "3".to_string()),
                    // Loaded: transfers refuse a gate without it.
                    ("begin_ms", "0".to_string()),
                ],
            )
            .await
            .expect("meta");
    }
    let _: () = redis.set(keys[0].pool(), pool).await.expect("pool");
    keys
}

async fn number(redis: &mut Redis, key: &str) -> i64 {
    let v: Option<i64> = redis.get(key).await.expect("get");
    v.unwrap_or(0)
}

/// The pool and each bucket's gate.
fn gates(keys: &[VoucherKeys]) -> Vec<Side<'_>> {
    Side::all(keys)
}

/// Units in every stock, the pool and in transit: open records whose
/// transfer has not landed (one that landed is in its receiver's stock).
async fn free_units(redis: &mut Redis, keys: &[VoucherKeys]) -> i64 {
    let mut sum = number(redis, &keys[0].pool()).await;
    for k in keys {
        sum += number(redis, &k.stock()).await;
    }
    let all = gates(keys);
    for giver in all.clone() {
        for t in transfer::open(redis, giver).await.expect("open") {
            let receiver = all.iter().find(|g| g.label() == t.to).expect("receiver");
            let landed = transfer::landed(redis, *receiver, t.id)
                .await
                .expect("landed");
            if landed != Some(Landing::Given) {
                sum += t.units as i64;
            }
        }
    }
    sum
}

#[tokio::test]
async fn tags_put_each_bucket_on_a_master_of_its_own() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let slots = SlotMap::read(&mut redis)
        .await
        .expect("slot map")
        .expect("a cluster has a slot map");
    for voucher in [1, 2, 77, 123_456_789] {
        let tags = choose_tags(voucher, 3, Some(&slots));
        assert_eq!(
            tags[0],
            voucher.to_string(),
            "bucket 0 keeps the voucher's tag"
        );
        let mut masters: Vec<&str> = tags
            .iter()
            .map(|t| {
                slots
                    .master_of(slot_of(&format!("{{{t}}}")))
                    .expect("served")
            })
            .collect();
        // The server's own CLUSTER KEYSLOT agrees with the slot computed here.
        for t in &tags {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(format!("x:{{{t}}}:stock"))
                .query_async(&mut redis)
                .await
                .expect("keyslot");
            assert_eq!(slot, slot_of(&format!("x:{{{t}}}:stock")), "{t}");
        }
        masters.sort();
        masters.dedup();
        assert_eq!(masters.len(), 3, "voucher {voucher}: {tags:?}");
        // Six buckets on three masters: two each.
        let six = choose_tags(voucher, 6, Some(&slots));
        for m in slots.masters() {
            let on = six
                .iter()
                .filter(|t| slots.master_of(slot_of(&format!("{{{t}}}"))) == Some(m))
                .count();
            assert_eq!(on, 2, "voucher {voucher}: {six:?}");
        }
    }
    env.cleanup().await;
}

#[tokio::test]
async fn a_transfer_moves_units_once_and_every_step_replayed_changes_nothing() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [10, 0, 0], 0).await;
    let (giver, receiver) = (Side::Bucket(0, &keys[0]), Side::Bucket(1, &keys[1]));

    for _ in 0..2 {
        let taken = transfer::take(&mut redis, giver, receiver, 1000, 4, 1, 1).await;
        assert_eq!(taken.expect("take"), Taken::Units(4));
        assert_eq!(number(&mut redis, &keys[0].stock()).await, 6);
        assert_eq!(free_units(&mut redis, &keys).await, 10);
    }
    let open = transfer::open(&mut redis, giver).await.expect("open");
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].id, open[0].to.as_str(), open[0].units),
        (1000, "1", 4)
    );

    let given = transfer::give(&mut redis, receiver, 1000, 4, 1, &[]).await;
    assert_eq!(given.expect("give"), Given::Landed { promoted: 0 });
    let again = transfer::give(&mut redis, receiver, 1000, 4, 1, &[]).await;
    assert_eq!(again.expect("give"), Given::AlreadyGiven);
    assert_eq!(number(&mut redis, &keys[1].stock()).await, 4);
    // Between give and settle the units are in the receiver's stock and in
    // the giver's record: the record is not in transit any more.
    let settled = transfer::settle(&mut redis, giver, 1000, Landing::Given).await;
    assert_eq!(settled.expect("settle"), Settled::Done { units_back: 0 });
    let again = transfer::settle(&mut redis, giver, 1000, Landing::Given).await;
    assert_eq!(again.expect("settle"), Settled::NoRecord);
    assert_eq!(free_units(&mut redis, &keys).await, 10);
    assert_eq!(number(&mut redis, &keys[0].stock()).await, 6);

    // Settled, the id is spent: a late resend of the take takes nothing.
    let late = transfer::take(&mut redis, giver, receiver, 1000, 4, 1, 1).await;
    assert_eq!(late.expect("take"), Taken::StaleId);
    let older = transfer::take(&mut redis, giver, receiver, 999, 4, 1, 1).await;
    assert_eq!(older.expect("take"), Taken::StaleId);
    assert_eq!(free_units(&mut redis, &keys).await, 10);
    env.cleanup().await;
}

#[tokio::test]
async fn a_transfer_cut_off_before_it_lands_goes_back_once_and_a_late_give_lands_nothing() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [0, 0, 0], 9).await;
    let (pool, receiver) = (Side::Pool(&keys[0]), Side::Bucket(2, &keys[2]));

    let taken = transfer::take(&mut redis, pool, receiver, 2000, 5, 5, 1).await;
    assert_eq!(taken.expect("take"), Taken::Units(5));
    // The mover stops here. Whoever completes the transfer asks the
    // receiver first; it never landed, so it is called off and comes back.
    for round in 0..2 {
        let (landing, settled) = transfer::complete(&mut redis, pool, receiver, 2000)
            .await
            .expect("complete");
        assert_eq!(landing, Landing::Void);
        let expected = if round == 0 {
            Settled::Done { units_back: 5 }
        } else {
            Settled::NoRecord
        };
        assert_eq!(settled, expected, "round {round}");
        assert_eq!(number(&mut redis, &keys[0].pool()).await, 9);
    }
    // The stalled mover wakes up and gives: nothing lands.
    let late = transfer::give(&mut redis, receiver, 2000, 5, 1, &[]).await;
    assert_eq!(late.expect("give"), Given::Void);
    assert_eq!(number(&mut redis, &keys[2].stock()).await, 0);
    assert_eq!(free_units(&mut redis, &keys).await, 9);
    env.cleanup().await;
}

#[tokio::test]
async fn a_transfer_that_landed_before_its_mover_stopped_is_completed_as_given() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [0, 7, 0], 0).await;
    let (giver, receiver) = (Side::Bucket(1, &keys[1]), Side::Pool(&keys[0]));

    let taken = transfer::take(&mut redis, giver, receiver, 3000, 10, 1, 1).await;
    assert_eq!(taken.expect("take"), Taken::Units(7), "all it had");
    let given = transfer::give(&mut redis, receiver, 3000, 7, 1, &[]).await;
    assert_eq!(given.expect("give"), Given::Landed { promoted: 0 });
    // The mover stops before settling.
    let (landing, settled) = transfer::complete(&mut redis, giver, receiver, 3000)
        .await
        .expect("complete");
    assert_eq!(
        (landing, settled),
        (Landing::Given, Settled::Done { units_back: 0 })
    );
    assert_eq!(number(&mut redis, &keys[0].pool()).await, 7);
    assert_eq!(number(&mut redis, &keys[1].stock()).await, 0);
    assert_eq!(free_units(&mut redis, &keys).await, 7);
    env.cleanup().await;
}

#[tokio::test]
async fn units_given_to_a_bucket_serve_its_waitlist_first_in_order_whole_requests_only() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [0, 0, 0], 3).await;
    let b1 = &keys[1];
    // Three waiting requests: 11 wants 1, 12 wants 3, 13 wants 1.
    for (user, at) in [(11u64, 100u64), (12, 200), (13, 300)] {
        let _: () = redis.zadd(b1.waitlist(), user, at).await.expect("zadd");
    }
    let _: () = redis
        .hset(b1.waitlist_quantity(), 12u64, 3u64)
        .await
        .expect("hset");
    let (pool, receiver) = (Side::Pool(&keys[0]), Side::Bucket(1, b1));

    let taken = transfer::take(&mut redis, pool, receiver, 4000, 3, 1, 1).await;
    assert_eq!(taken.expect("take"), Taken::Units(3));
    let fresh = [9001, 9002, 9003, 9004];
    let given = transfer::give(&mut redis, receiver, 4000, 3, 1, &fresh).await;
    // 11 takes one; 12 wants 3 of the 2 left and keeps its place; 13 takes one.
    assert_eq!(given.expect("give"), Given::Landed { promoted: 2 });
    let again = transfer::give(&mut redis, receiver, 4000, 3, 1, &fresh).await;
    assert_eq!(again.expect("give"), Given::AlreadyGiven);
    let mut buyers: Vec<u64> = redis.smembers(b1.buyers()).await.expect("smembers");
    buyers.sort();
    assert_eq!(buyers, vec![11, 13]);
    let waiting: Vec<u64> = redis.zrange(b1.waitlist(), 0, -1).await.expect("zrange");
    assert_eq!(waiting, vec![12]);
    assert_eq!(number(&mut redis, &b1.stock()).await, 1);
    let entries: redis::streams::StreamRangeReply =
        redis.xrange_all(b1.orders()).await.expect("xrange");
    let orders: Vec<(String, String, String)> = entries
        .ids
        .iter()
        .map(|e| {
            let field = |f: &str| e.get::<String>(f).unwrap_or_default();
            (field("user"), field("order"), field("kind"))
        })
        .collect();
    assert_eq!(
        orders,
        vec![
            ("11".into(), "9001".into(), "promote".into()),
            ("13".into(), "9002".into(), "promote".into())
        ]
    );
    let events: redis::streams::StreamRangeReply =
        redis.xrange_all(b1.events()).await.expect("xrange");
    assert_eq!(events.ids.len(), 2);
    assert_eq!(
        events.ids[0].get::<String>("released_order").as_deref(),
        Some("0"),
        "units that came by transfer name no released order"
    );
    // One unit left in stock, the 12's request still waits: 1 + 0 + 0
    // free, two sold.
    assert_eq!(free_units(&mut redis, &keys).await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_mover_of_an_older_epoch_is_fenced_and_a_paused_gate_moves_nothing() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [6, 0, 0], 0).await;
    let (b0, b1) = (Side::Bucket(0, &keys[0]), Side::Bucket(1, &keys[1]));

    // A mover of epoch 2 took over.
    let taken = transfer::take(&mut redis, b0, b1, 5000, 2, 1, 2).await;
    assert_eq!(taken.expect("take"), Taken::Units(2));
    let given = transfer::give(&mut redis, b1, 5000, 2, 2, &[]).await;
    assert_eq!(given.expect("give"), Given::Landed { promoted: 0 });
    let settled = transfer::settle(&mut redis, b0, 5000, Landing::Given).await;
    assert_eq!(settled.expect("settle"), Settled::Done { units_back: 0 });
    // The one of epoch 1 that lost its lease is refused on both sides.
    let stale = transfer::take(&mut redis, b0, b1, 5001, 2, 1, 1).await;
    assert_eq!(stale.expect("take"), Taken::Fenced(2));
    let stale = transfer::give(&mut redis, b1, 4999, 2, 1, &[]).await;
    assert_eq!(stale.expect("give"), Given::Fenced(2));

    // A gate not loaded (not preloaded yet, or lost whole) neither gives
    // nor receives: units moved there would be sold by nobody.
    let _: () = redis
        .hdel(keys[2].meta(), "begin_ms")
        .await
        .expect("unload");
    let unloaded = transfer::take(&mut redis, Side::Bucket(2, &keys[2]), b1, 6000, 1, 1, 2).await;
    assert_eq!(unloaded.expect("take"), Taken::NotLoaded);
    let taken = transfer::take(&mut redis, b0, Side::Bucket(2, &keys[2]), 5001, 1, 1, 2).await;
    assert_eq!(taken.expect("take"), Taken::Units(1));
    let unloaded = transfer::give(&mut redis, Side::Bucket(2, &keys[2]), 5001, 1, 2, &[]).await;
    assert_eq!(unloaded.expect("give"), Given::NotLoaded);
    let (landing, settled) = transfer::complete(&mut redis, b0, Side::Bucket(2, &keys[2]), 5001)
        .await
        .expect("complete");
    assert_eq!(
        (landing, settled),
        (Landing::Void, Settled::Done { units_back: 1 })
    );

    // A paused giver gives nothing; a paused receiver lands nothing; a void
    // transfer's units do not go back into a gate being rebuilt.
    let taken = transfer::take(&mut redis, b0, b1, 5002, 1, 1, 2).await;
    assert_eq!(taken.expect("take"), Taken::Units(1));
    for k in [&keys[0], &keys[1]] {
        let _: () = redis.hset(k.meta(), "paused", 1).await.expect("pause");
    }
    let paused = transfer::take(&mut redis, b0, b1, 5003, 1, 1, 2).await;
    assert_eq!(paused.expect("take"), Taken::Paused);
    let paused = transfer::give(&mut redis, b1, 5002, 1, 2, &[]).await;
    assert_eq!(paused.expect("give"), Given::Paused);
    let (landing, settled) = transfer::complete(&mut redis, b0, b1, 5002)
        .await
        .expect("complete");
    assert_eq!((landing, settled), (Landing::Void, Settled::Paused));
    assert_eq!(transfer::open(&mut redis, b0).await.expect("open").len(), 1);
    assert_eq!(free_units(&mut redis, &keys).await, 6);
    // Reopened, the void transfer goes back.
    let _: () = redis.hdel(keys[0].meta(), "paused").await.expect("reopen");
    let (_, settled) = transfer::complete(&mut redis, b0, b1, 5002)
        .await
        .expect("complete");
    assert_eq!(settled, Settled::Done { units_back: 1 });
    assert_eq!(number(&mut redis, &keys[0].stock()).await, 4);
    assert_eq!(free_units(&mut redis, &keys).await, 6);
    env.cleanup().await;
}

/// Movers of the same epoch cut off at random points, from every gate to
/// every other, all at once; then every open transfer completed.
#[tokio::test]
async fn many_transfers_cut_off_anywhere_lose_and_double_nothing() {
    let env = TestEnv::on_cluster().await;
    let keys = three_buckets(&env, [100, 100, 100], 700).await;
    let mut tasks = Vec::new();
    for mover in 0..8u64 {
        let keys = keys.clone();
        let mut redis = env.new_redis_connection().await;
        tasks.push(tokio::spawn(async move {
            for i in 0..60u64 {
                let id = 10_000 + mover * 1000 + i;
                let all = gates(&keys);
                let from = all[((id * 7) % 4) as usize];
                let to = all[((id * 7 + 1 + id % 3) % 4) as usize];
                let taken = transfer::take(&mut redis, from, to, id, 1 + id % 9, 1, 1)
                    .await
                    .expect("take");
                let Taken::Units(units) = taken else { continue };
                // Cut off after the take, after the give, or not at all.
                match id % 3 {
                    0 => continue,
                    1 => {
                        transfer::give(&mut redis, to, id, units, 1, &[])
                            .await
                            .expect("give");
                    }
                    _ => {
                        transfer::give(&mut redis, to, id, units, 1, &[])
                            .await
                            .expect("give");
                        transfer::settle(&mut redis, from, id, Landing::Given)
                            .await
                            .expect("settle");
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("mover task");
    }
    let mut redis = env.redis().await;
    assert_eq!(
        free_units(&mut redis, &keys).await,
        1000,
        "before completing"
    );
    let all = gates(&keys);
    let mut completed = 0;
    for from in all.clone() {
        for t in transfer::open(&mut redis, from).await.expect("open") {
            let to = all
                .iter()
                .copied()
                .find(|g| g.label() == t.to)
                .expect("a known receiver");
            transfer::complete(&mut redis, from, to, t.id)
                .await
                .expect("complete");
            completed += 1;
        }
    }
    assert!(completed > 0, "some transfers were cut off");
    for from in all.clone() {
        assert!(transfer::open(&mut redis, from)
            .await
            .expect("open")
            .is_empty());
    }
    // Every unit is in one stock or the pool now: exactly the 1,000.
    let mut stocks = number(&mut redis, &keys[0].pool()).await;
    for k in &keys {
        let units = number(&mut redis, &k.stock()).await;
        assert!(units >= 0, "{}: {units}", k.stock());
        stocks += units;
    }
    assert_eq!(stocks, 1000);
    env.cleanup().await;
}

/// The mover's lease: one holder at a time, renewed by its holder at the
/// same epoch (a resent take changes nothing), taken over only once it ran
/// out or was released, each takeover with a higher epoch.
#[tokio::test]
async fn the_mover_lease_has_one_holder_and_each_takeover_raises_the_epoch() {
    let env = TestEnv::on_cluster().await;
    let redis = env.redis().await;
    let keys = VoucherKeys::new(&env.prefix, V).expect("keys");
    let lease = |owner: &'static str, ms: u64| {
        let meta = keys.meta();
        let mut redis = redis.clone();
        async move {
            let epoch: u64 = scripts::MOVER_LEASE
                .key(meta)
                .arg("take")
                .arg(owner)
                .arg(ms)
                .invoke_async(&mut redis)
                .await
                .expect("lease");
            epoch
        }
    };
    assert_eq!(lease("a", 60_000).await, 1);
    assert_eq!(
        lease("a", 60_000).await,
        1,
        "renewed (or resent): the same epoch"
    );
    assert_eq!(lease("b", 60_000).await, 0, "held by a");
    let released: i64 = scripts::MOVER_LEASE
        .key(keys.meta())
        .arg("release")
        .arg("a")
        .invoke_async(&mut redis.clone())
        .await
        .expect("release");
    assert_eq!(released, 1);
    assert_eq!(lease("b", 200).await, 2, "taken over");
    assert_eq!(lease("a", 60_000).await, 0, "held by b");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(lease("a", 60_000).await, 3, "b's ran out");
    // Fenced by a gate that saw epoch 6 (bucket 0's meta lost takeovers):
    // the holder takes the lease again above it.
    let raised: u64 = scripts::MOVER_LEASE
        .key(keys.meta())
        .arg("take")
        .arg("a")
        .arg(60_000)
        .arg(7)
        .invoke_async(&mut redis.clone())
        .await
        .expect("lease");
    assert_eq!(raised, 7);
    assert_eq!(lease("a", 60_000).await, 7, "kept");
    env.cleanup().await;
}

/// A hold on the mover (the guard's rebuild, reconcile): one holder at a
/// time, resent without harm; while it is live no mover takes or renews
/// the lease; its fence reaches every loaded gate and above any epoch a
/// mover holds, and writes nothing into a gate that is gone.
#[tokio::test]
async fn a_hold_on_the_mover_keeps_it_still_fences_every_gate_and_is_safe_to_resend() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [10, 10, 10], 5).await;
    let movers = redis.clone();
    let take = |owner: &'static str| {
        let (meta, holds) = (keys[0].meta(), keys[0].mover_holds());
        let mut redis = movers.clone();
        async move {
            let epoch: u64 = scripts::MOVER_LEASE
                .key(meta)
                .key(holds)
                .arg("take")
                .arg(owner)
                .arg(60_000)
                .invoke_async(&mut redis)
                .await
                .expect("lease");
            epoch
        }
    };
    let mover = take("mover").await;
    assert_eq!(mover, 1);
    let gone = VoucherKeys::of_bucket(&env.prefix, V, &format!("{V}.9.0")).expect("keys");
    let mut with_gone = keys.clone();
    with_gone.push(gone.clone());
    let held = seckill::gate::mover_lease::seize(
        &mut redis,
        &with_gone,
        "guard",
        std::time::Duration::from_secs(60),
    )
    .await
    .expect("seize")
    .expect("held");
    assert!(held > mover + 1_000_000, "far above any epoch: {held}");
    let again = seckill::gate::mover_lease::seize(
        &mut redis,
        &keys,
        "guard",
        std::time::Duration::from_secs(60),
    )
    .await
    .expect("seize again")
    .expect("still held");
    assert!(again > held, "resent: the same holder, a harder fence");
    let other = seckill::gate::mover_lease::seize(
        &mut redis,
        &keys,
        "reconcile",
        std::time::Duration::from_secs(60),
    )
    .await
    .expect("seize");
    assert_eq!(other, None, "one hold at a time");
    for k in &keys {
        let epoch: Option<u64> = redis.hget(k.meta(), "mover_epoch").await.expect("epoch");
        assert!(epoch >= Some(held), "{} fenced", k.meta());
    }
    let exists: bool = redis.exists(gone.meta()).await.expect("exists");
    assert!(!exists, "no meta made for a gate that is gone");
    assert_eq!(take("mover").await, 0, "held still: not renewed");
    // The mover's old epoch is refused everywhere.
    let refused = transfer::take(
        &mut redis,
        Side::Bucket(1, &keys[1]),
        Side::Pool(&keys[0]),
        7,
        1,
        1,
        mover,
    )
    .await
    .expect("take");
    assert!(matches!(refused, Taken::Fenced(_)), "{refused:?}");
    seckill::gate::mover_lease::unseize(&mut redis, &keys[0], "guard")
        .await
        .expect("release");
    seckill::gate::mover_lease::unseize(&mut redis, &keys[0], "guard")
        .await
        .expect("release again");
    assert!(
        take("mover").await >= again,
        "moves again once the hold is gone"
    );
    env.cleanup().await;
}

/// The pool folded into bucket 0 for its rebuild: only while bucket 0 is
/// paused, once.
#[tokio::test]
async fn the_pool_folds_into_a_paused_bucket_0_once() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [10, 10, 10], 5).await;
    let fold = |redis: &mut Redis| {
        let mut redis = redis.clone();
        let k = keys[0].clone();
        async move {
            let folded: i64 = scripts::POOL_FOLD
                .key(k.meta())
                .key(k.pool())
                .key(k.stock())
                .arg(5)
                .invoke_async(&mut redis)
                .await
                .expect("fold");
            folded
        }
    };
    assert_eq!(fold(&mut redis).await, -1, "not paused: nothing written");
    assert_eq!(number(&mut redis, &keys[0].pool()).await, 5);
    let _: () = redis
        .hset(keys[0].meta(), "paused", "1")
        .await
        .expect("pause");
    assert_eq!(fold(&mut redis).await, 1);
    assert_eq!(fold(&mut redis).await, 0, "resent: nothing written");
    assert_eq!(number(&mut redis, &keys[0].pool()).await, 0);
    assert_eq!(number(&mut redis, &keys[0].stock()).await, 15);
    env.cleanup().await;
}

/// First come, first served across buckets (lua/serve_up_to.lua): while the
/// mover's bound is live, a bucket serves none of its own requests queued
/// after it and admits no newcomer ahead of the requests waiting there
/// (those units are for an earlier request elsewhere); a bucket nobody
/// waits at still sells. Lapsed or lifted, a bucket serves its own line
/// again. A serve (a give of no units) runs once; a bound from an older
/// mover, or for a gate that is not loaded, writes nothing.
#[tokio::test]
async fn a_bound_keeps_a_bucket_s_units_for_earlier_requests_and_lapses_by_itself() {
    use seckill::gate::admission::{admit, Admission};
    use seckill::gate::buckets::bucket_of;
    use seckill::gate::transfer::Bounded;

    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    let keys = three_buckets(&env, [0, 2, 1], 0).await;
    for k in &keys {
        let _: () = redis
            .hset(k.meta(), "end_ms", i64::MAX / 2)
            .await
            .expect("end_ms");
    }
    let (b1, b2) = (&keys[1], &keys[2]);
    let users_of = |b: u32| (1000u64..).filter(move |u| bucket_of(*u, 3) == b);
    let (line, newcomer): (Vec<u64>, u64) = {
        let mut of1 = users_of(1);
        (
            vec![of1.next().unwrap(), of1.next().unwrap()],
            of1.next().unwrap(),
        )
    };
    // Two requests wait at bucket 1, at 200 and 300 µs; it holds 2 units
    // (as after a release there).
    for (user, at) in [(line[0], 200u64), (line[1], 300)] {
        let _: () = redis.zadd(b1.waitlist(), user, at).await.expect("zadd");
    }
    let set = transfer::set_bound(&mut redis, b1, 1, &BoundWord::bound(Some(100), 60_000)).await;
    assert_eq!(set.expect("bound"), Bounded::Set);
    let set = transfer::set_bound(&mut redis, b2, 1, &BoundWord::bound(Some(100), 60_000)).await;
    assert_eq!(set.expect("bound"), Bounded::Set);

    // An earlier request waits elsewhere (at 100): nobody here is served.
    let bucket1 = Side::Bucket(1, b1);
    let served = transfer::promote_waiting(&mut redis, bucket1, 7000, 1, &[9001, 9002]).await;
    assert_eq!(served.expect("serve"), Given::Landed { promoted: 0 });
    assert_eq!(number(&mut redis, &b1.stock()).await, 2);
    // A newcomer queues behind the line instead of taking its units.
    let came = admit(&mut redis, b1, V, newcomer, 8001, None).await;
    assert_eq!(
        came.expect("admit"),
        Admission::SoldOut {
            waitlist_position: 3
        }
    );
    assert_eq!(number(&mut redis, &b1.stock()).await, 2);
    // Bucket 2 has units and nobody waiting: it sells.
    let other = users_of(2).next().unwrap();
    let sold = admit(&mut redis, b2, V, other, 8002, None).await;
    assert_eq!(sold.expect("admit"), Admission::Admitted { order_id: 8002 });

    // The bound moves up to 200: the first request is served, once.
    let set = transfer::set_bound(&mut redis, b1, 2, &BoundWord::bound(Some(200), 60_000)).await;
    assert_eq!(set.expect("bound"), Bounded::Set);
    let served = transfer::promote_waiting(&mut redis, bucket1, 7001, 2, &[9003, 9004]).await;
    assert_eq!(served.expect("serve"), Given::Landed { promoted: 1 });
    let again = transfer::promote_waiting(&mut redis, bucket1, 7001, 2, &[9003, 9004]).await;
    assert_eq!(again.expect("serve"), Given::AlreadyGiven);
    // An older serve, resent late, serves nothing either.
    let late = transfer::promote_waiting(&mut redis, bucket1, 7000, 2, &[9001, 9002]).await;
    assert_eq!(late.expect("serve"), Given::AlreadyGiven);
    let served: Option<String> = redis.hget(b1.meta(), "served_last").await.expect("hget");
    assert_eq!(served.as_deref(), Some("2 7001"));
    let record: Option<String> = redis.hget(b1.received(), 7001u64).await.expect("hget");
    assert_eq!(record, None, "a serve leaves no field per serve");
    let buyers: Vec<u64> = redis.smembers(b1.buyers()).await.expect("smembers");
    assert_eq!(buyers, vec![line[0]]);
    assert_eq!(number(&mut redis, &b1.stock()).await, 1);

    // The mover of epoch 1 lost its lease: its bound is refused.
    let stale = transfer::set_bound(&mut redis, b1, 1, &BoundWord::bound(None, 60_000)).await;
    assert_eq!(stale.expect("bound"), Bounded::Fenced(2));
    // Once the bound lapses, the bucket serves its own line again.
    let set = transfer::set_bound(&mut redis, b1, 2, &BoundWord::bound(Some(200), 1)).await;
    assert_eq!(set.expect("bound"), Bounded::Set);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let served = transfer::promote_waiting(&mut redis, bucket1, 7002, 2, &[9005, 9006]).await;
    assert_eq!(served.expect("serve"), Given::Landed { promoted: 1 });
    let waiting: Vec<u64> = redis.zrange(b1.waitlist(), 0, -1).await.expect("zrange");
    assert_eq!(waiting, vec![newcomer], "the second request had the unit");
    // A mover that took the lease over (epoch 3) on a host whose clock
    // lags mints a lower id: its serve still runs.
    let lagging = transfer::promote_waiting(&mut redis, bucket1, 6000, 3, &[9007]).await;
    assert_eq!(lagging.expect("serve"), Given::Landed { promoted: 0 });
    let served: Option<String> = redis.hget(b1.meta(), "served_last").await.expect("hget");
    assert_eq!(served.as_deref(), Some("3 6000"));
    // Lifted: the fields are gone.
    let lifted = transfer::set_bound(&mut redis, b1, 3, &BoundWord::bound(None, 60_000)).await;
    assert_eq!(lifted.expect("bound"), Bounded::Set);
    let fields: Vec<Option<String>> = redis
        .hmget(b1.meta(), &["serve_up_to", "serve_up_to_until"])
        .await
        .expect("hmget");
    assert_eq!(fields, vec![None, None]);

    // A gate that is not loaded gets no bound (nor a meta made for it).
    let lost = VoucherKeys::new(&env.prefix, V + 1).expect("keys");
    let set = transfer::set_bound(&mut redis, &lost, 3, &BoundWord::bound(Some(1), 60_000)).await;
    assert_eq!(set.expect("bound"), Bounded::NotLoaded);
    let made: bool = redis.exists(lost.meta()).await.expect("exists");
    assert!(!made);
    // A give of no units is for a bucket only.
    let pool = transfer::give(&mut redis, Side::Pool(&keys[0]), 7003, 0, 3, &[]).await;
    assert!(pool.is_err(), "{pool:?}");
    env.cleanup().await;
}
