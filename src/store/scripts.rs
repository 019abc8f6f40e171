//! The Lua scripts of `lua/`, embedded in the binary. `Script::invoke_async`
//! sends EVALSHA and, on NOSCRIPT (a restarted or flushed server), loads the
//! script and retries.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::Script;

/// Layer 1 admission; KEYS/ARGV/returns are documented in the file.
pub const ADMISSION_SOURCE: &str = include_str!("../../lua/seckill.lua");
pub static ADMISSION: LazyLock<Script> = LazyLock::new(|| Script::new(ADMISSION_SOURCE));

// Redis scripts cannot call one another: what several share lives in
// lua/lib/ and is prepended here.

/// A library of lua/lib/: its file name and its source.
struct Lib {
    /// Read by the tests, which match it against the libraries' headers.
    #[cfg_attr(not(test), allow(dead_code))]
    file: &'static str,
    source: &'static str,
}

/// The library `lua/lib/<file>`.
macro_rules! lib {
    ($file:literal) => {
        Lib {
            file: $file,
            source: include_str!(concat!("../../lua/lib/", $file)),
        }
    };
}

const LEASE_LIB: Lib = lib!("lease.lua");
const VALID_ID_LIB: Lib = lib!("valid_id.lua");
const HOLDS_LIB: Lib = lib!("holds.lua");
const WAITLIST_LIB: Lib = lib!("waitlist.lua");
const DIGEST_LIB: Lib = lib!("digest.lua");
const SERVER_CHECKED_LIB: Lib = lib!("server_checked.lua");
const MOVER_EPOCH_LIB: Lib = lib!("mover_epoch.lua");

/// The one declaration of which libraries the binary prepends to which
/// script of lua/, in the order prepended; a script not listed gets none.
/// Each library's header names its users in a `-- Used by:` line, which
/// must agree (the tests check it).
const PREPENDED: &[(&str, &[Lib])] = &[
    ("preload.lua", &[HOLDS_LIB, SERVER_CHECKED_LIB]),
    ("lock_acquire.lua", &[LEASE_LIB]),
    ("lock_renew.lua", &[LEASE_LIB]),
    ("lock_release.lua", &[LEASE_LIB]),
    ("finish.lua", &[LEASE_LIB, DIGEST_LIB]),
    ("timeouts.lua", &[DIGEST_LIB]),
    (
        "transfer_take.lua",
        &[VALID_ID_LIB, SERVER_CHECKED_LIB, MOVER_EPOCH_LIB],
    ),
    (
        "transfer_give.lua",
        &[
            VALID_ID_LIB,
            DIGEST_LIB,
            WAITLIST_LIB,
            SERVER_CHECKED_LIB,
            MOVER_EPOCH_LIB,
        ],
    ),
    ("transfer_void.lua", &[VALID_ID_LIB]),
    ("transfer_settle.lua", &[VALID_ID_LIB]),
    ("serve_up_to.lua", &[SERVER_CHECKED_LIB, MOVER_EPOCH_LIB]),
    ("requeue.lua", &[VALID_ID_LIB, DIGEST_LIB, WAITLIST_LIB]),
    ("release.lua", &[HOLDS_LIB, DIGEST_LIB, WAITLIST_LIB]),
    ("reconcile.lua", &[HOLDS_LIB, DIGEST_LIB, WAITLIST_LIB]),
    ("pause.lua", &[HOLDS_LIB]),
];

/// The libraries `PREPENDED` lists for the script `file` of lua/.
fn libs_of(file: &str) -> &'static [Lib] {
    PREPENDED
        .iter()
        .find(|(script, _)| *script == file)
        .map(|&(_, libs)| libs)
        .unwrap_or_default()
}

/// The script `file` of lua/, whose source is `body`, after the libraries
/// it uses.
fn with_libs_of(file: &str, body: &str) -> Script {
    let libs = libs_of(file);
    if libs.is_empty() {
        return Script::new(body);
    }
    let sources: Vec<&str> = libs.iter().map(|lib| lib.source).collect();
    Script::new(&format!("{}\n{body}", sources.join("\n")))
}

/// The script `lua/<file>` after the libraries `PREPENDED` lists for it.
macro_rules! prepended {
    ($file:literal) => {
        LazyLock::new(|| with_libs_of($file, include_str!(concat!("../../lua/", $file))))
    };
}

/// Publishes a voucher's gate state in one step (used by `seckill preload`).
pub static PRELOAD: LazyLock<Script> = prepended!("preload.lua");

/// Layer 3: take a batch's lease locks (by owner token; taking one again sets it, not adds).
pub static LOCK_ACQUIRE: LazyLock<Script> = prepended!("lock_acquire.lua");
/// Layer 3 watchdog: extend the leases still held.
pub static LOCK_RENEW: LazyLock<Script> = prepended!("lock_renew.lua");
/// Layer 3: release by owner token.
pub static LOCK_RELEASE: LazyLock<Script> = prepended!("lock_release.lua");

/// Layers 2/4: deadlines, dead letters, then XACK, after a batch committed.
pub static FINISH: LazyLock<Script> = prepended!("finish.lua");

/// Layer 5: add or drop payment deadlines with the timeouts digest.
pub static TIMEOUTS: LazyLock<Script> = prepended!("timeouts.lua");

/// Reconciliation: a meta digest set to its set's, if it did not move.
pub static DIGEST_SYNC: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/digest_sync.lua")));

/// Buckets (design/buckets.md): take units from a giver into a transfer record.
pub static TRANSFER_TAKE: LazyLock<Script> = prepended!("transfer_take.lua");
/// Buckets: land a transfer's units in the receiver (its waitlist first), once.
pub static TRANSFER_GIVE: LazyLock<Script> = prepended!("transfer_give.lua");
/// Buckets: ask the receiver whether a transfer landed, calling it off if not.
pub static TRANSFER_VOID: LazyLock<Script> = prepended!("transfer_void.lua");
/// Buckets: drop a giver's record, its units back if the transfer was void.
pub static TRANSFER_SETTLE: LazyLock<Script> = prepended!("transfer_settle.lua");

/// Buckets: the mover's bound on a bucket's own serving (first come,
/// first served across buckets).
pub static SERVE_UP_TO: LazyLock<Script> = prepended!("serve_up_to.lua");

/// Buckets: the lease of a voucher's one mover, with its fencing epoch.
pub static MOVER_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/mover_lease.lua")));

/// Buckets: the pool into bucket 0's stock while the guard rebuilds it.
pub static POOL_FOLD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/pool_fold.lua")));

/// Dead letters back into the order stream (`seckill pending --requeue`).
pub static REQUEUE: LazyLock<Script> = prepended!("requeue.lua");

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
pub static RELEASE: LazyLock<Script> = prepended!("release.lua");

/// Reconciliation: a repair applied only if the voucher did not move.
pub static RECONCILE: LazyLock<Script> = prepended!("reconcile.lua");

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
pub static PAUSE: LazyLock<Script> = prepended!("pause.lua");

/// The run id of the server holding a voucher (the worker's gate guard).
/// (Also sent as plain EVAL inside the guard's look pipeline.)
pub const RUN_ID_SOURCE: &str = include_str!("../../lua/run_id.lua");
/// The same script, recording a run id the guard has dealt with.
pub static RUN_ID: LazyLock<Script> = LazyLock::new(|| Script::new(RUN_ID_SOURCE));

/// Which commands the caller may run, asked of the ACL (`seckill doctor`).
pub static ACL_CHECK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/acl_check.lua")));

/// Idempotency keys: find or take a key's reservation (src/idempotency.rs).
pub static IDEM_RESERVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/idem_reserve.lua")));
/// Idempotency keys: record a request's answer, or open its reservation.
pub static IDEM_SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/idem_settle.lua")));

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
        ("idem_reserve.lua", &IDEM_RESERVE),
        ("idem_settle.lua", &IDEM_SETTLE),
    ]
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
    /// Every refusal a script of lua/ answers (`redis.error_reply('ERR
    /// <name>: ...')`) names a script and is told as a script's refusal.
    #[test]
    fn every_refusal_of_a_script_is_told_as_one() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let mut seen = 0;
        for (file, _) in super::all() {
            let source = std::fs::read_to_string(format!("{dir}/{file}")).expect("a script");
            for refusal in source.split("error_reply(").skip(1) {
                let text = refusal.trim_start_matches(['\'', '"']);
                let detail = text.strip_prefix("ERR ").unwrap_or_else(|| {
                    panic!("{file}: a refusal that is not an ERR reply: {text:.60}")
                });
                let name = detail.split(':').next().unwrap_or_default();
                let stem = name.strip_suffix(".lua").unwrap_or(name);
                assert!(
                    super::all()
                        .iter()
                        .any(|(f, _)| f.strip_suffix(".lua") == Some(stem)),
                    "{file}: a refusal naming no script: {detail:.60}"
                );
                assert!(
                    crate::error::is_script_refusal(detail),
                    "{file}: not told as a script's refusal: {detail:.60}"
                );
                seen += 1;
            }
        }
        assert!(seen > 50, "only {seen} refusals found");
    }

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

    /// The line of a library's header that names its users: the scripts of
    /// lua/ it is prepended to, by file name, separated by commas.
    const USED_BY: &str = "-- Used by:";

    #[test]
    fn every_lib_header_names_the_scripts_the_binary_prepends_it_to() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib");
        let mut libs: Vec<String> = std::fs::read_dir(dir)
            .expect("lua/lib/ is readable")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".lua"))
            .collect();
        libs.sort();
        assert!(!libs.is_empty(), "no library in {dir}");
        for lib in &libs {
            let path = format!("{dir}/{lib}");
            let source = std::fs::read_to_string(&path).expect("a library is readable");
            let lines: Vec<&str> = source
                .lines()
                .take_while(|l| l.starts_with("--"))
                .filter_map(|l| l.strip_prefix(USED_BY))
                .collect();
            let [users] = lines.as_slice() else {
                panic!("{path}: its header needs one `{USED_BY} a.lua, b.lua` line");
            };
            let mut named: Vec<&str> = users
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            named.sort_unstable();
            let mut prepended: Vec<&str> = super::PREPENDED
                .iter()
                .filter(|(_, with)| with.iter().any(|l| l.file == lib.as_str()))
                .map(|&(script, _)| script)
                .collect();
            prepended.sort_unstable();
            assert_eq!(
                named, prepended,
                "{path}: the scripts its `{USED_BY}` line names (left) are not those \
                 src/store/scripts.rs prepends it to (right)"
            );
        }
        // And every library the table prepends is a file of lua/lib/.
        for (script, with) in super::PREPENDED {
            for l in *with {
                assert!(
                    libs.iter().any(|n| n == l.file),
                    "{script}: no lua/lib/{}",
                    l.file
                );
            }
        }
    }

    /// Every script the binary runs is its file after the libraries
    /// `PREPENDED` lists for it (none if it lists none), and the table
    /// names only those scripts, each once.
    #[test]
    fn every_script_is_its_file_after_the_libs_the_table_lists() {
        let all = super::all();
        for (i, (script, _)) in super::PREPENDED.iter().enumerate() {
            assert!(
                all.iter().any(|(file, _)| file == script),
                "{script} is no script of all()"
            );
            assert!(
                !super::PREPENDED[..i].iter().any(|(s, _)| s == script),
                "{script} is listed twice"
            );
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        for (file, script) in &all {
            let body =
                std::fs::read_to_string(format!("{dir}/{file}")).expect("a script is readable");
            let libs = super::libs_of(file);
            let expected = if libs.is_empty() {
                body
            } else {
                let sources: Vec<&str> = libs.iter().map(|l| l.source).collect();
                format!("{}\n{body}", sources.join("\n"))
            };
            assert_eq!(
                script.get_hash(),
                redis::Script::new(&expected).get_hash(),
                "{file} is not lua/{file} after the libraries PREPENDED lists for it"
            );
        }
    }
}
