//! The Lua scripts of `lua/`, embedded in the binary. `Script::invoke_async`
//! sends EVALSHA and, on NOSCRIPT (a restarted or flushed server), loads the
//! script and retries.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::Script;

/// Layer 1 admission; KEYS/ARGV/returns are documented in the file.
pub const ADMISSION_SOURCE: &str = include_str!("../../lua/seckill.lua");
pub static ADMISSION: LazyLock<Script> = LazyLock::new(|| Script::new(ADMISSION_SOURCE));

/// Publishes a voucher's gate state in one step (used by `seckill preload`).
pub static PRELOAD: LazyLock<Script> = LazyLock::new(|| {
    with_libs(
        &[HOLDS_LIB, SERVER_CHECKED_LIB],
        include_str!("../../lua/preload.lua"),
    )
});

// Redis scripts cannot call one another: what several share lives in
// lua/lib/ and is prepended here.
const LEASE_LIB: &str = include_str!("../../lua/lib/lease.lua");
const VALID_ID_LIB: &str = include_str!("../../lua/lib/valid_id.lua");
const HOLDS_LIB: &str = include_str!("../../lua/lib/holds.lua");
const WAITLIST_LIB: &str = include_str!("../../lua/lib/waitlist.lua");
const DIGEST_LIB: &str = include_str!("../../lua/lib/digest.lua");
const SERVER_CHECKED_LIB: &str = include_str!("../../lua/lib/server_checked.lua");

fn with_lib(lib: &str, body: &str) -> Script {
    with_libs(&[lib], body)
}

fn with_libs(libs: &[&str], body: &str) -> Script {
    Script::new(&format!("{}\n{body}", libs.join("\n")))
}

/// Layer 3: take a batch's lease locks (by owner token; taking one again sets it, not adds).
pub static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| with_lib(LEASE_LIB, include_str!("../../lua/lock_acquire.lua")));
/// Layer 3 watchdog: extend the leases still held.
pub static LOCK_RENEW: LazyLock<Script> =
    LazyLock::new(|| with_lib(LEASE_LIB, include_str!("../../lua/lock_renew.lua")));
/// Layer 3: release by owner token.
pub static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| with_lib(LEASE_LIB, include_str!("../../lua/lock_release.lua")));

/// Layers 2/4: deadlines, dead letters, then XACK, after a batch committed.
pub static FINISH: LazyLock<Script> = LazyLock::new(|| {
    with_libs(
        &[LEASE_LIB, DIGEST_LIB],
        include_str!("../../lua/finish.lua"),
    )
});

/// Layer 5: add or drop payment deadlines with the timeouts digest.
pub static TIMEOUTS: LazyLock<Script> =
    LazyLock::new(|| with_lib(DIGEST_LIB, include_str!("../../lua/timeouts.lua")));

/// Reconciliation: a meta digest set to its set's, if it did not move.
pub static DIGEST_SYNC: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/digest_sync.lua")));

/// Buckets (design/buckets.md): take units from a giver into a transfer record.
pub static TRANSFER_TAKE: LazyLock<Script> = LazyLock::new(|| {
    with_libs(
        &[VALID_ID_LIB, SERVER_CHECKED_LIB],
        include_str!("../../lua/transfer_take.lua"),
    )
});
/// Buckets: land a transfer's units in the receiver (its waitlist first), once.
pub static TRANSFER_GIVE: LazyLock<Script> = LazyLock::new(|| {
    with_libs(
        &[VALID_ID_LIB, DIGEST_LIB, WAITLIST_LIB, SERVER_CHECKED_LIB],
        include_str!("../../lua/transfer_give.lua"),
    )
});
/// Buckets: ask the receiver whether a transfer landed, calling it off if not.
pub static TRANSFER_VOID: LazyLock<Script> =
    LazyLock::new(|| with_lib(VALID_ID_LIB, include_str!("../../lua/transfer_void.lua")));
/// Buckets: drop a giver's record, its units back if the transfer was void.
pub static TRANSFER_SETTLE: LazyLock<Script> =
    LazyLock::new(|| with_lib(VALID_ID_LIB, include_str!("../../lua/transfer_settle.lua")));

/// Buckets: the mover's bound on a bucket's own serving (first come,
/// first served across buckets).
pub static SERVE_UP_TO: LazyLock<Script> = LazyLock::new(|| {
    with_lib(
        SERVER_CHECKED_LIB,
        include_str!("../../lua/serve_up_to.lua"),
    )
});

/// Buckets: the lease of a voucher's one mover, with its fencing epoch.
pub static MOVER_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/mover_lease.lua")));

/// Buckets: the pool into bucket 0's stock while the guard rebuilds it.
pub static POOL_FOLD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/pool_fold.lua")));

/// Dead letters back into the order stream (`seckill pending --requeue`).
pub static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
    with_libs(
        &[VALID_ID_LIB, DIGEST_LIB, WAITLIST_LIB],
        include_str!("../../lua/requeue.lua"),
    )
});

/// Takes a gap of lost commits off a gate's witness, once (see the file).
pub static FORGET_COMMITS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/forget_commits.lua")));

/// Sets a gate's witness of commits back up to what MySQL holds, less
/// what is in flight (see the file).
pub static RAISE_COMMITS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/raise_commits.lua")));

/// Deletes a consumer from the group only while it has nothing pending.
pub static FORGET_CONSUMER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/forget_consumer.lua")));

/// Layer 5: claim due payment deadlines with a lease.
pub static CLAIM_DUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/claim_due.lua")));
/// Layer 5: give back cancelled orders' units (to the waitlist or the gate), once.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    with_libs(
        &[HOLDS_LIB, DIGEST_LIB, WAITLIST_LIB],
        include_str!("../../lua/release.lua"),
    )
});

/// Reconciliation: a repair applied only if the voucher did not move.
pub static RECONCILE: LazyLock<Script> = LazyLock::new(|| {
    with_libs(
        &[HOLDS_LIB, DIGEST_LIB, WAITLIST_LIB],
        include_str!("../../lua/reconcile.lua"),
    )
});

/// Leases a snowflake node id (public: application servers take part).
pub static NODE_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/node_lease.lua")));

/// Publishes a voucher's admission policy at its gate.
pub static POLICY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/policy.lua")));

/// Stores a user's admission token (public: application servers call it).
pub static TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/token.lua")));

/// Who holds a voucher's MySQL row lock, under a lease (the worker).
pub static FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/fence.lua")));

/// Pauses or reopens a gate (the worker's gate guard).
pub static PAUSE: LazyLock<Script> =
    LazyLock::new(|| with_lib(HOLDS_LIB, include_str!("../../lua/pause.lua")));

/// The run id of the server holding a voucher (the worker's gate guard).
/// (Also sent as plain EVAL inside the guard's look pipeline.)
pub const RUN_ID_SOURCE: &str = include_str!("../../lua/run_id.lua");
/// The same script, recording a run id the guard has dealt with.
pub static RUN_ID: LazyLock<Script> = LazyLock::new(|| Script::new(RUN_ID_SOURCE));

/// Which commands the caller may run, asked of the ACL (`seckill doctor`).
pub static ACL_CHECK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/acl_check.lua")));

/// Every script the binary runs, by file name, for `seckill doctor` to
/// load.
pub fn all() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("seckill.lua", &ADMISSION),
        ("preload.lua", &PRELOAD),
        ("lock_acquire.lua", &LOCK_ACQUIRE),
        ("lock_renew.lua", &LOCK_RENEW),
        ("lock_release.lua", &LOCK_RELEASE),
        ("finish.lua", &FINISH),
        ("timeouts.lua", &TIMEOUTS),
        ("digest_sync.lua", &DIGEST_SYNC),
        ("requeue.lua", &REQUEUE),
        ("forget_consumer.lua", &FORGET_CONSUMER),
        ("forget_commits.lua", &FORGET_COMMITS),
        ("raise_commits.lua", &RAISE_COMMITS),
        ("claim_due.lua", &CLAIM_DUE),
        ("release.lua", &RELEASE),
        ("transfer_take.lua", &TRANSFER_TAKE),
        ("transfer_give.lua", &TRANSFER_GIVE),
        ("transfer_void.lua", &TRANSFER_VOID),
        ("transfer_settle.lua", &TRANSFER_SETTLE),
        ("serve_up_to.lua", &SERVE_UP_TO),
        ("mover_lease.lua", &MOVER_LEASE),
        ("pool_fold.lua", &POOL_FOLD),
        ("reconcile.lua", &RECONCILE),
        ("node_lease.lua", &NODE_LEASE),
        ("policy.lua", &POLICY),
        ("token.lua", &TOKEN),
        ("fence.lua", &FENCE),
        ("pause.lua", &PAUSE),
        ("run_id.lua", &RUN_ID),
        ("acl_check.lua", &ACL_CHECK),
    ]
}

/// Whether `stem` names one of the scripts (`seckill`, `fence`): their
/// refusals begin `ERR <stem>: ` or `ERR <stem>.lua: `, which is how a
/// refusal is told from another server error.
pub fn is_script(stem: &str) -> bool {
    all()
        .iter()
        .any(|(file, _)| file.strip_suffix(".lua") == Some(stem))
}

/// The file stem of the script whose SHA1 this is (`preload`), for the
/// test fault that resends a script call.
pub fn stem_of(hash: &str) -> Option<&'static str> {
    static BY_HASH: LazyLock<HashMap<String, &'static str>> = LazyLock::new(|| {
        all()
            .into_iter()
            .map(|(file, script)| (script.get_hash().to_string(), file.trim_end_matches(".lua")))
            .collect()
    });
    BY_HASH.get(hash).copied()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_of_lua_is_in_the_list_doctor_loads() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.ends_with(".lua"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        let mut listed: Vec<String> = super::all().iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(listed, files);
    }
}
