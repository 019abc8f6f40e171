//! The API listener's connections, each bounded in time and all of them in
//! number (`axum::serve` set neither: 500 clients sending a header byte
//! every 10 s held their sockets for good, and 1,100 idle ones under a
//! 1,024-descriptor limit locked well-behaved clients out).
//!
//! - A request's head has `--header-timeout`, a connection between requests
//!   `--idle-timeout` (watched.rs); its body has `--request-timeout` (the
//!   handlers' extractor answers 408).
//! - At most `--max-connections` are open, fewer when the descriptor limit
//!   leaves less room beside the stores (descriptors.rs). A newcomer at the
//!   cap makes room by shedding the connections that have waited longest
//!   for their clients (open_set.rs); only when none can be shed (each is
//!   handling a request, or has waited under 100 ms) is the newcomer
//!   refused (a 503 on plain HTTP). An accept that
//!   fails for want of descriptors sheds the same way and tries again at
//!   once, rather than leaving the backlog to wait.
//! - On stop: no new connection; idle ones close, busy ones after their
//!   answer.

mod counted;
mod descriptors;
mod open_set;
mod watched;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub use counted::ConnectionMetrics;
pub use descriptors::connection_cap;
use open_set::OpenSet;
pub use watched::Timers;
use watched::{Conn, Lapse, Watched};

/// A request's head larger than this is refused (431): it bounds what a
/// slow client makes the process hold (hyper's default is ~400 KiB).
const MAX_HEAD: usize = 16 * 1024;

/// Connections told to close per pass at the cap (one pass over the open
/// set frees room for this many newcomers), and how far a burst may pass
/// the cap while they close (kept back from it in descriptors.rs).
pub const BATCH: usize = 16;

/// Refused newcomers whose 503 is being written at once.
pub const LINGERING: usize = 16;

/// What every connection serves: the router behind the process's limits.
pub trait Routes:
    tower::Service<
        axum::extract::Request,
        Response = axum::response::Response,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<T> Routes for T where
    T: tower::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

/// What a connection may cost, and how many there may be.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub timers: Timers,
    pub cap: usize,
}

impl ConnectionLimits {
    /// How long a connection waits before it may be shed: one just opened
    /// or just answered most likely has a request on the wire, which a
    /// close would reset (a newcomer is better refused 503 meanwhile).
    fn grace(&self) -> Duration {
        Duration::from_millis(100).min(self.timers.header / 4)
    }
}

/// Serves `service` on every connection `listener` accepts until `stop`,
/// then until every connection has closed.
pub async fn serve<S>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    service: S,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    stop: CancellationToken,
) where
    S: Routes,
{
    let open = OpenSet::new();
    let mut cap_log = CapLog::default();
    let lingering = Arc::new(tokio::sync::Semaphore::new(LINGERING));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if out_of_descriptors(&e) => {
                let shed = open.shed_longest_waiting(BATCH, limits.grace());
                cap_log.out_of_descriptors(&e, shed);
                // The shed ones close within a poll; the backlog waits that long.
                open.one_closed(Duration::from_millis(10)).await;
                continue;
            }
            // The client gave up before it was taken.
            Err(e) if client_gone(&e) => {
                tracing::debug!("accept: {e}");
                continue;
            }
            // Anything else (ENOBUFS, ENOMEM, ...) may last: the listener
            // stays ready, so trying again at once would spin.
            Err(e) => {
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if !make_room(&open, &limits, &mut cap_log).await {
            metrics.closed("refused", 1);
            cap_log.at_cap(limits.cap, 0, 1);
            refuse(stream, tls.is_some(), &lingering);
            continue;
        }
        let place = open.admit();
        tokio::spawn(connection(
            stream,
            tls.clone(),
            service.clone(),
            place,
            limits.timers,
            metrics.clone(),
            stop.clone(),
        ));
    }
    drop(listener);
    tracing::info!("stopping: no new connections; finishing the requests in flight");
    open.all_closed().await;
}

/// Room for one more connection: at the cap, the longest waiting ones are
/// told to close, and a newcomer is taken once those told are enough to
/// bring the count back under the cap (a burst may pass it by `BATCH` at
/// most while they close: descriptors.rs keeps that many back). False when
/// nothing can be shed (every connection is handling a request or has
/// waited less than the grace), or those told have not closed in 40 ms
/// (busy ones close after their answer).
async fn make_room(open: &OpenSet, limits: &ConnectionLimits, cap_log: &mut CapLog) -> bool {
    let cap = limits.cap;
    for attempt in 0..5 {
        let count = open.len();
        if count < cap {
            return true;
        }
        if count.saturating_sub(open.closing()) < cap {
            if count < cap + BATCH {
                return true;
            }
            if attempt < 4 {
                open.one_closed(Duration::from_millis(10)).await;
            }
            continue;
        }
        let shed = open.shed_longest_waiting(BATCH, limits.grace());
        if shed == 0 {
            return false;
        }
        cap_log.at_cap(cap, shed, 0);
    }
    false
}

/// One connection from its accept to its close (its place in the open set
/// and the gauge held as long).
async fn connection<S>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    service: S,
    place: open_set::Place,
    timers: Timers,
    metrics: ConnectionMetrics,
    stop: CancellationToken,
) where
    S: Routes,
{
    let _open = metrics.open();
    // A token of its own: polling the server's shared one at every wake-up
    // of every connection would contend on its lock.
    let stop = stop.child_token();
    let conn = place.conn.clone();
    // Beneath TLS: the handshake's bytes count as the head's.
    let watched = Watched::new(stream, conn.clone());
    let ended = match tls {
        None => serve_one(watched, service, &conn, timers, &stop).await,
        Some(acceptor) => {
            let shaken = tokio::select! {
                biased;
                s = acceptor.accept(watched) => {
                    s.map_err(|e| Ended::Failed(format!("TLS handshake: {e}")))
                }
                _ = conn.shed.notified() => Err(Ended::Shed),
                lapse = conn.lapsed(timers) => Err(Ended::Lapsed(lapse)),
                _ = stop.cancelled() => return,
            };
            match shaken {
                Ok(tls) => serve_one(tls, service, &conn, timers, &stop).await,
                Err(e) => Err(e),
            }
        }
    };
    match ended {
        Err(Ended::Shed) => metrics.closed("shed", 1),
        Err(Ended::Lapsed(Lapse::Header)) => metrics.closed("header_timeout", 1),
        Err(Ended::Lapsed(Lapse::Idle)) => metrics.closed("idle_timeout", 1),
        Err(Ended::Failed(e)) => tracing::debug!("connection: {e}"),
        Ok(()) => {}
    }
}

/// How a connection ended other than by its client or a stop.
enum Ended {
    /// Told to close for a newcomer (after its answer, if it had a request).
    Shed,
    Lapsed(Lapse),
    Failed(String),
}

/// One connection's requests, until it closes, is shed or the server stops.
async fn serve_one<I, S>(
    io: I,
    service: S,
    conn: &Arc<Conn>,
    timers: Timers,
    stop: &CancellationToken,
) -> std::result::Result<(), Ended>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Routes,
{
    let handler = {
        let conn = conn.clone();
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let busy = conn.busy();
            let answer =
                tower::ServiceExt::oneshot(service.clone(), request.map(axum::body::Body::new));
            async move {
                let answer = answer.await;
                drop(busy);
                answer
            }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(io), handler);
    tokio::pin!(connection);
    let (mut closing, mut shed) = (false, false);
    loop {
        // The connection first: a request that has come is read (and the
        // connection marked busy) before a shed or a lapse is looked at,
        // so neither drops a request the socket holds already.
        tokio::select! {
            biased;
            ended = connection.as_mut() => {
                return match ended {
                    _ if shed => Err(Ended::Shed),
                    Ok(()) => Ok(()),
                    Err(e) => Err(Ended::Failed(e.to_string())),
                };
            }
            _ = conn.shed.notified(), if !closing => {
                // Chosen while waiting, it may have taken a request since:
                // that request is answered first.
                if !conn.is_busy() {
                    return Err(Ended::Shed);
                }
                connection.as_mut().graceful_shutdown();
                (closing, shed) = (true, true);
            }
            // Dropping the connection closes it: nothing is being handled.
            lapse = conn.lapsed(timers) => return Err(Ended::Lapsed(lapse)),
            _ = stop.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// The client gave up before its connection was taken.
fn client_gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::Interrupted
    )
}

/// Accept failed for want of a descriptor (the process's or the system's).
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// A newcomer at the cap while nothing can be shed: a 503 on plain HTTP,
/// a close on TLS (an answer would need a handshake). The 503 is written,
/// the write side shut and the client's request read and dropped for up to
/// 100 ms before the close: closing on unread bytes sends a reset, which
/// can destroy the answer before the client reads it. At most `LINGERING`
/// at once; past that the newcomer is closed at once (a reset, its request
/// unread: nothing was done).
fn refuse(stream: TcpStream, tls: bool, lingering: &Arc<tokio::sync::Semaphore>) {
    if tls {
        return;
    }
    let Ok(permit) = lingering.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _permit = permit;
        let mut stream = stream;
        let id = super::request_id::fresh();
        let body = super::problem::problem_body(
            super::problem::Code::TooManyConnections,
            "too many connections; retry in a moment",
            Some(&id),
        )
        .to_string();
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {}\r\nretry-after: 1\r\nx-request-id: {id}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            super::problem::PROBLEM_JSON,
            body.len()
        );
        let linger = async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        };
        let _ = tokio::time::timeout(Duration::from_millis(100), linger).await;
    });
}

/// One WARN when the cap first bites, then at most one per 10 s with what
/// happened since: a flood must not flood the log too.
#[derive(Default)]
struct CapLog {
    last: Option<tokio::time::Instant>,
    shed: usize,
    refused: usize,
}

impl CapLog {
    const EVERY: Duration = Duration::from_secs(10);

    fn due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let due = self
            .last
            .is_none_or(|t| now.duration_since(t) >= Self::EVERY);
        if due {
            self.last = Some(now);
        }
        due
    }

    fn at_cap(&mut self, cap: usize, shed: usize, refused: usize) {
        self.shed += shed;
        self.refused += refused;
        if self.due() {
            tracing::warn!(
                "connections at the cap ({cap}; --max-connections, the descriptor limit): shed {} idle or slow, refused {} while every one was busy",
                std::mem::take(&mut self.shed),
                std::mem::take(&mut self.refused)
            );
        }
    }

    fn out_of_descriptors(&mut self, e: &std::io::Error, shed: usize) {
        self.shed += shed;
        if self.due() {
            tracing::warn!(
                "accept: {e}: shed {} idle or slow connections (raise LimitNOFILE, or lower --max-connections)",
                std::mem::take(&mut self.shed)
            );
        }
    }
}
