//! Buyers are interchangeable: nothing the scripts, the SQL or the
//! worker do depends on which user a request is from, only on the order
//! things happened in (the stream, the waitlist, MySQL's rows). A state
//! with its users renamed is the same sale, so the checker need visit only
//! one of each class (stateright's symmetry reduction, on its depth-first
//! search): the class's least state under every renaming of the users.
//!
//! Only users are renamed. Order ids are not: they are handed out in
//! admission order and a renaming keeps which user holds which order.
//! Vectors the model keeps sorted (sets of users) are sorted again after
//! a renaming, so that the renamed state is the very state the renamed
//! actions reach; sequences (the stream, the waitlist, a batch) keep
//! their order.

use stateright::Representative;

use crate::sale::{Batch, GateView, Guard, Mysql, Redis, State};

impl Representative for State {
    fn representative(&self) -> Self {
        let users = self.told.len();
        permutations(users)
            .iter()
            .map(|to| self.renamed(to))
            .min()
            .unwrap_or_else(|| self.clone())
    }
}

impl State {
    /// This state with user `u` called `to[u]`.
    pub fn renamed(&self, to: &[u8]) -> State {
        let mut s = self.clone();
        rename_redis(&mut s.redis, to);
        if let Some(r) = s.snapshot.as_mut() {
            rename_redis(r, to);
        }
        rename_mysql(&mut s.mysql, to);
        if let Some(m) = s.mysql_snapshot.as_mut() {
            rename_mysql(m, to);
        }
        for w in s.workers.iter_mut() {
            rename_pairs(&mut w.denied, to);
            match &mut w.batch {
                Batch::Idle => {}
                Batch::Read(b) | Batch::Locked(b) => rename_pairs(b, to),
                Batch::InTx {
                    batch, inserted, ..
                } => {
                    rename_pairs(batch, to);
                    rename_pairs(inserted, to);
                }
                Batch::Committed { batch, dead, .. } => {
                    rename_pairs(batch, to);
                    rename_seq(dead, to);
                }
            }
        }
        match &mut s.guard {
            Guard::Idle | Guard::Repaired(..) => {}
            Guard::ReadGate(view) => rename_view(view, to),
            Guard::Viewed(view, m) => {
                rename_view(view, to);
                rename_mysql(m, to);
            }
        }
        s.told = permuted(&self.told, to);
        s.presses = permuted(&self.presses, to);
        s
    }
}

/// Every ordering of `n` users (n! of them: 6 at 3 buyers).
fn permutations(n: usize) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut current: Vec<u8> = (0..n as u8).collect();
    heap(n, &mut current, &mut out);
    out
}

/// Heap's algorithm: each swap makes the next ordering.
fn heap(k: usize, current: &mut Vec<u8>, out: &mut Vec<Vec<u8>>) {
    if k <= 1 {
        out.push(current.clone());
        return;
    }
    for i in 0..k - 1 {
        heap(k - 1, current, out);
        if k.is_multiple_of(2) {
            current.swap(i, k - 1);
        } else {
            current.swap(0, k - 1);
        }
    }
    heap(k - 1, current, out);
}

/// Per-user vectors: what user `u` had, user `to[u]` has.
fn permuted<T: Clone>(by_user: &[T], to: &[u8]) -> Vec<T> {
    let mut out = by_user.to_vec();
    for (u, item) in by_user.iter().enumerate() {
        out[to[u] as usize] = item.clone();
    }
    out
}

fn rename_seq(users: &mut [u8], to: &[u8]) {
    for u in users.iter_mut() {
        *u = to[*u as usize];
    }
}

fn rename_set(users: &mut [u8], to: &[u8]) {
    rename_seq(users, to);
    users.sort_unstable();
}

fn rename_pairs(pairs: &mut [(u8, u8)], to: &[u8]) {
    for (_, u) in pairs.iter_mut() {
        *u = to[*u as usize];
    }
}

fn rename_redis(r: &mut Redis, to: &[u8]) {
    rename_set(&mut r.buyers, to);
    rename_seq(&mut r.waitlist, to);
    for e in r.entries.iter_mut() {
        e.user = to[e.user as usize];
    }
    rename_set(&mut r.dead, to);
    rename_pairs(&mut r.locks, to);
    r.locks.sort_unstable();
}

fn rename_mysql(m: &mut Mysql, to: &[u8]) {
    for o in m.orders.iter_mut() {
        o.user = to[o.user as usize];
    }
}

fn rename_view(v: &mut GateView, to: &[u8]) {
    rename_set(&mut v.buyers, to);
    rename_pairs(&mut v.in_flight, to);
    rename_pairs(&mut v.acked, to);
    rename_set(&mut v.dead, to);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_users_have_six_orderings_each_once() {
        let mut all = permutations(3);
        assert_eq!(all.len(), 6);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 6);
    }
}
