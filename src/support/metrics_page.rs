//! A `--metrics-addr` listener (the worker's and serve's): bound at start,
//! so a busy port fails the command at once with its flag named, then
//! serving its page until stopped.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// Binds `addr`, then serves `page` there until `stop`. Returns the
/// address bound: port 0 asks the system for a free one.
pub async fn start(
    addr: SocketAddr,
    page: axum::Router,
    stop: CancellationToken,
) -> Result<(tokio::task::JoinHandle<()>, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::InvalidInput(format!("--metrics-addr {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::InvalidInput(format!("--metrics-addr {addr}: {e}")))?;
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, page)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!("metrics endpoint stopped: {e}");
        }
    });
    Ok((task, bound))
}
