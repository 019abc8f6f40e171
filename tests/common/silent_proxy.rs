//! A TCP proxy that can go silent: it forwards both ways until told to
//! stop, then reads and writes nothing more while keeping every socket
//! open, as a half-open connection or a frozen middlebox does. A client
//! behind it waits for answers that never come; the server sees an idle
//! client. Connections accepted after that are held the same way.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub struct SilentProxy {
    pub port: u16,
    silent: watch::Sender<bool>,
    tasks: tokio::task::JoinHandle<()>,
}

impl SilentProxy {
    /// Listens on a free local port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> SilentProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (silent, watching) = watch::channel(false);
        let tasks = tokio::spawn(async move {
            let mut pipes = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                pipes.spawn(pipe(cr, sw, watching.clone()));
                pipes.spawn(pipe(sr, cw, watching.clone()));
            }
        });
        SilentProxy {
            port,
            silent,
            tasks,
        }
    }

    /// From now on nothing more is forwarded either way.
    pub fn silence(&self) {
        let _ = self.silent.send(true);
    }
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts the pipes
        // and closes their sockets.
        self.tasks.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut silent: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = silent.wait_for(|s| *s) => break,
        };
        if *silent.borrow() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Silent: hold both sockets open, forward nothing, until aborted.
    std::future::pending::<()>().await;
    drop((from, to));
}
