//! Every fault point of the code (`support::fault::point` and `pause`,
//! between two durable writes: src/support/fault.rs) is named here, as the
//! model's action it sits beside, or as a protocol the model does not
//! hold yet. A point added to the code without a line here fails this
//! test, so the model cannot silently fall behind the code's steps.

use std::path::Path;

/// (fault point, where the model has it). `Some(action)`: the model's
/// step that ends at the point (docs/src/concepts/checked-model.md's table); `None`: the
/// protocol is not modelled yet, the text says which.
const POINTS: &[(&str, Result<&str, &str>)] = &[
    ("after_lock", Ok("Lock")),
    (
        "before_commit",
        Ok("Transact (a crash there: the transaction rolled back)"),
    ),
    ("after_commit", Ok("Commit")),
    (
        "after_fence_left",
        Ok("Commit (the fence entry left, the keep-alive told first)"),
    ),
    ("after_ack", Ok("Finish")),
    (
        "before_cancel_commit",
        Ok("Claim .. Cancel (a crash there: nothing cancelled)"),
    ),
    ("after_cancel", Ok("Cancel (then Release)")),
    ("gate_paused", Ok("GuardCheck (then GuardReadGate)")),
    (
        "between_gate_and_mysql_reads",
        Ok("GuardReadGate (then GuardReadMysql)"),
    ),
    ("before_repair", Ok("GuardReadMysql (then GuardRepair)")),
    (
        "serve_after_admit",
        Ok("Admit (the answer lost: the buyer presses again)"),
    ),
    (
        "between_snapshot_reads",
        Err("preload and the voucher's row: not modelled yet"),
    ),
    (
        "before_forget",
        Ok("GuardRepair (MySQL's lost commits: a gap nothing kept names taken off the witness)"),
    ),
    (
        "before_raise",
        Ok("GuardCheck (the pass's raise) and GuardRepair (the rebuild's)"),
    ),
    (
        "before_publish",
        Err("voucher update's policy: not modelled yet"),
    ),
    (
        "after_bounds_published",
        Ok("Publish (then Move), the serving model (model/src/serving.rs)"),
    ),
    (
        "before_publishing_again",
        Ok("Publish (the last of a pass, then a second pass), the serving model"),
    ),
    (
        "between_take_and_give",
        Ok("Move (then Give), the mover's model (model/src/mover.rs)"),
    ),
    ("after_pay", Ok("Pay (then Forget)")),
    (
        "mend_round",
        Err("serve's Redis connections: no protocol state"),
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names in `fault::point("…")` and `fault::pause("…")` calls.
fn points_in_the_code() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    let mut names = vec![];
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        for call in ["fault::point(\"", "fault::pause(\""] {
            for (at, _) in text.match_indices(call) {
                let rest = &text[at + call.len()..];
                let end = rest.find('"').expect("a closing quote");
                names.push(rest[..end].to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_fault_point_of_the_code_is_named_by_the_model() {
    let found = points_in_the_code();
    assert!(
        found.len() >= 10,
        "the scan found too few points: {found:?}"
    );
    let unnamed: Vec<&String> = found
        .iter()
        .filter(|p| !POINTS.iter().any(|(name, _)| name == p))
        .collect();
    assert!(
        unnamed.is_empty(),
        "fault points with no action in the model (model/tests/points.rs, docs/src/concepts/checked-model.md): {unnamed:?}"
    );
    let gone: Vec<&str> = POINTS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !found.iter().any(|p| p == name))
        .collect();
    assert!(gone.is_empty(), "points no longer in the code: {gone:?}");
    let pending: Vec<&str> = POINTS
        .iter()
        .filter(|(_, at)| at.is_err())
        .map(|(name, _)| *name)
        .collect();
    eprintln!(
        "modelled: {} of {}; not yet: {pending:?}",
        POINTS.len() - pending.len(),
        POINTS.len()
    );
}
