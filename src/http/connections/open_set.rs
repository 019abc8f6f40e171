//! The connections open now, so the accept loop can count them and, at the
//! cap, choose which to shed: the one that has waited longest for its
//! client (idle between requests, or still sending its head), never one
//! whose request is being handled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::watched::{micros_since, Conn};

#[derive(Debug)]
pub struct OpenSet {
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Told to close and not closed yet.
    closing: AtomicUsize,
    /// Signalled each time a connection closes.
    closed: Notify,
}

/// Holds a connection's place until dropped (its task ending in any way).
pub struct Place {
    set: Arc<OpenSet>,
    pub conn: Arc<Conn>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.set.lock().remove(&self.conn.id);
        if self.conn.chosen_to_shed() {
            self.set.closing.fetch_sub(1, Ordering::AcqRel);
        }
        self.set.closed.notify_waiters();
    }
}

impl OpenSet {
    pub fn new() -> Arc<OpenSet> {
        Arc::new(OpenSet {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            closing: AtomicUsize::new(0),
            closed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        // A panic while holding it cannot leave the map half-changed.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Told to close, and still open.
    pub fn closing(&self) -> usize {
        self.closing.load(Ordering::Acquire)
    }

    pub fn admit(self: &Arc<Self>) -> Place {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::opened(id, self.epoch));
        self.lock().insert(id, conn.clone());
        Place {
            set: self.clone(),
            conn,
        }
    }

    /// Tells up to `n` of the connections that have waited longest for
    /// their client (at least `grace`) to close; how many it told (none when every one is
    /// handling a request or was told already). One pass over the set,
    /// however many are told: at the cap, a flood of newcomers sheds in
    /// batches rather than scanning every connection for each.
    pub fn shed_longest_waiting(&self, n: usize, grace: std::time::Duration) -> usize {
        let waited_since = micros_since(self.epoch, grace);
        let chosen: Vec<Arc<Conn>> = {
            let open = self.lock();
            let mut waiting: Vec<(u64, &Arc<Conn>)> = open
                .values()
                .filter_map(|c| c.waiting_since().map(|since| (since, c)))
                .filter(|(since, _)| *since <= waited_since)
                .collect();
            if n < waiting.len() {
                waiting.select_nth_unstable_by_key(n, |(since, _)| *since);
                waiting.truncate(n);
            }
            let chosen: Vec<Arc<Conn>> = waiting
                .into_iter()
                .map(|(_, c)| c)
                .filter(|c| c.choose_to_shed())
                .cloned()
                .collect();
            // Under the lock: a place dropped meanwhile takes it to leave
            // the set, so it counts itself out only after this counted it in.
            self.closing.fetch_add(chosen.len(), Ordering::AcqRel);
            chosen
        };
        for conn in &chosen {
            // notify_one keeps the wake-up for a task not waiting yet.
            conn.shed.notify_one();
        }
        chosen.len()
    }

    /// Waits until no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let closed = self.closed.notified();
            if self.len() == 0 {
                return;
            }
            closed.await;
        }
    }

    /// Waits until some connection closes, at most `limit`.
    pub async fn one_closed(&self, limit: std::time::Duration) {
        let _ = tokio::time::timeout(limit, self.closed.notified()).await;
    }
}
