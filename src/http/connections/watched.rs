//! One connection's phase (waiting for a request's head, idle between
//! requests, or handling one) and the deadline that phase sets. The
//! connection's task races its connection against `Conn::lapsed`, a timer
//! of its own: hyper does not read again after an answer until the socket
//! wakes it, so a deadline checked only inside reads never fires for a
//! client that sends nothing (seen: an idle connection outlived its 2 s).
//! The stream beneath (`Watched`) only tells when bytes come.
//!
//! The two timers are Go's `ReadHeaderTimeout` and `IdleTimeout`: a head
//! has `--header-timeout` from the connection's opening, or from its first
//! byte after an answer; between requests a connection may wait
//! `--idle-timeout` for that byte. A request being handled has no deadline
//! here: `--request-timeout` bounds its body and its answer.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a connection may take over its head, and wait between requests.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    pub header: Duration,
    pub idle: Duration,
}

const HEAD: u8 = 0;
const IDLE: u8 = 1;
const BUSY: u8 = 2;

/// Why a connection's deadline closed it (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    Header,
    Idle,
}

/// Microseconds from `epoch` to `ago` before now: how the phases' starts
/// are kept and compared.
pub fn micros_since(epoch: Instant, ago: Duration) -> u64 {
    Instant::now()
        .saturating_duration_since(epoch)
        .saturating_sub(ago)
        .as_micros() as u64
}

/// What the accept loop and the connection's own task share of it.
#[derive(Debug)]
pub struct Conn {
    pub id: u64,
    epoch: Instant,
    phase: AtomicU8,
    /// Microseconds from `epoch` to the start of the phase.
    since: AtomicU64,
    /// An answer produced and not yet flushed to the socket: the
    /// connection is still busy for a shed (its deadline is the idle one,
    /// so a client that reads nothing is still closed in time).
    answering: AtomicBool,
    /// Chosen to make room for a newcomer (at most once).
    shed_chosen: AtomicBool,
    pub shed: Notify,
}

impl Conn {
    /// A connection just accepted: its head's time runs from now.
    pub fn opened(id: u64, epoch: Instant) -> Conn {
        let conn = Conn {
            id,
            epoch,
            phase: AtomicU8::new(HEAD),
            since: AtomicU64::new(0),
            answering: AtomicBool::new(false),
            shed_chosen: AtomicBool::new(false),
            shed: Notify::new(),
        };
        conn.enter(HEAD);
        conn
    }

    fn enter(&self, phase: u8) {
        self.since
            .store(micros_since(self.epoch, Duration::ZERO), Ordering::Relaxed);
        self.phase.store(phase, Ordering::Release);
    }

    /// A request is being handled until the guard is dropped (also when
    /// its future is dropped midway); then the connection is idle.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.enter(BUSY);
        Busy(self.clone())
    }

    /// Handling a request, or writing its answer.
    pub fn is_busy(&self) -> bool {
        self.phase.load(Ordering::Acquire) == BUSY || self.answering.load(Ordering::Acquire)
    }

    /// Since when the connection has been waiting for its client (idle
    /// or reading a head); none while a request is handled, or once it
    /// was chosen to be shed.
    pub fn waiting_since(&self) -> Option<u64> {
        (!self.is_busy() && !self.shed_chosen.load(Ordering::Acquire))
            .then(|| self.since.load(Ordering::Relaxed))
    }

    pub fn chosen_to_shed(&self) -> bool {
        self.shed_chosen.load(Ordering::Acquire)
    }

    /// Marks it to be shed; false if it was already.
    pub fn choose_to_shed(&self) -> bool {
        !self.shed_chosen.swap(true, Ordering::AcqRel)
    }

    fn saw_bytes(&self) {
        if self.phase.load(Ordering::Acquire) == IDLE {
            self.enter(HEAD);
        }
    }

    fn deadline(&self, timers: Timers) -> Option<(Instant, Lapse)> {
        let (limit, lapse) = match self.phase.load(Ordering::Acquire) {
            HEAD => (timers.header, Lapse::Header),
            IDLE => (timers.idle, Lapse::Idle),
            _ => return None,
        };
        let since = self.epoch + Duration::from_micros(self.since.load(Ordering::Relaxed));
        Some((since + limit, lapse))
    }

    /// Resolves when the connection's phase has outlived its time: never
    /// while a request is handled. Nothing wakes it per request (a wake-up
    /// and a timer at each change of phase cost serve a fifth more CPU per
    /// request in scripts/bench-serve.sh): it looks again at least every
    /// min(header, idle), soon enough for any deadline a change since can
    /// set, as each lies at least that far from its change.
    pub async fn lapsed(&self, timers: Timers) -> Lapse {
        let look_every = timers.header.min(timers.idle);
        loop {
            let now = Instant::now();
            let next = match self.deadline(timers) {
                Some((deadline, lapse)) if now >= deadline => return lapse,
                Some((deadline, _)) => deadline.min(now + look_every),
                None => now + look_every,
            };
            tokio::time::sleep_until(next).await;
        }
    }
}

pub struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.answering.store(true, Ordering::Release);
        self.0.enter(IDLE);
    }
}

/// A connection's stream, telling its `Conn` when bytes come.
pub struct Watched<S> {
    inner: S,
    conn: Arc<Conn>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, conn: Arc<Conn>) -> Watched<S> {
        Watched { inner, conn }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.saw_bytes();
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        // hyper flushes once an answer's bytes are all written.
        if matches!(flushed, Poll::Ready(Ok(()))) {
            self.conn.answering.store(false, Ordering::Release);
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
