//! A TCP proxy between one process and one store that can make the faults
//! a network makes: delay every chunk, black-hole the connection (nothing
//! forwarded either way, every socket held open: a half-open connection or
//! a frozen middlebox), or reset every connection. Healing forwards new
//! connections again; a black-holed one stays as it is, as a half-open
//! connection does, until its client gives up on it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinSet;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    Forward,
    Delay(Duration),
    BlackHole,
}

pub struct FaultProxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    /// The pipes of every connection so far: a reset drops them all.
    pipes: std::sync::Arc<Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free local port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (mode, watching) = watch::channel(Mode::Forward);
        let pipes = std::sync::Arc::new(Mutex::new(JoinSet::new()));
        let held = pipes.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                // RST, not FIN, when a reset drops it. (Deprecated for the
                // wait a non-zero linger makes a drop do; zero waits for
                // nothing.)
                #[allow(deprecated)]
                client.set_linger(Some(Duration::ZERO)).ok();
                let watching = watching.clone();
                let mut pipes = held.lock().await;
                // Finished pipes are let go of as new ones come.
                while pipes.try_join_next().is_some() {}
                pipes.spawn(connection(client, upstream, watching));
            }
        });
        FaultProxy {
            port,
            mode,
            pipes,
            accept,
        }
    }

    pub fn set(&self, mode: Mode) {
        let _ = self.mode.send(mode);
    }

    /// Every connection so far closed with a reset; new ones forwarded.
    pub async fn reset(&self) {
        self.set(Mode::Forward);
        self.pipes.lock().await.abort_all();
    }

    /// New connections forwarded again (black-holed ones stay so).
    pub fn heal(&self) {
        self.set(Mode::Forward);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut pipes) = self.pipes.try_lock() {
            pipes.abort_all();
        }
    }
}

async fn connection(client: TcpStream, upstream: SocketAddr, mode: watch::Receiver<Mode>) {
    if *mode.borrow() == Mode::BlackHole {
        // Accepted and never answered.
        std::future::pending::<()>().await;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    #[allow(deprecated)]
    server.set_linger(Some(Duration::ZERO)).ok();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Both directions in this task: aborting it drops all four halves.
    tokio::join!(pipe(cr, sw, mode.clone()), pipe(sr, cw, mode));
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = mode.wait_for(|m| *m == Mode::BlackHole) => break,
        };
        let now = *mode.borrow();
        match now {
            Mode::BlackHole => break,
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Forward => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    if *mode.borrow() == Mode::BlackHole {
        // Black-holed: hold both sockets open, forward nothing, for good.
        std::future::pending::<()>().await;
    }
    // The other side closed: pass the close on.
    to.shutdown().await.ok();
}
