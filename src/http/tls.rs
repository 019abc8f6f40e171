//! HTTPS for `seckill serve` (`--tls-cert`, `--tls-key`): rustls, as for
//! Redis and MySQL. Handshakes run concurrently off the accept loop, so a
//! client that stalls in its handshake holds up nobody, and one that fails
//! it is dropped with a debug line; their number is capped, and the loop
//! ends with the server.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

/// A handshake not done within this is given up (short: each one under way
/// holds one of the HANDSHAKES places).
const HANDSHAKE: Duration = Duration::from_secs(5);
/// Handshaken connections waiting for the server to take them.
const QUEUE: usize = 1024;
/// Handshakes under way at once.
const HANDSHAKES: usize = 1024;

/// The server's certificate chain and key, from PEM files.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor> {
    let bad = |what: &str, path: &Path, e: String| {
        Error::InvalidInput(format!("{what} {}: {e}", path.display()))
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad("cannot read the certificate", cert, e.to_string()))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| bad("cannot read the certificate", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(bad("no certificate in", cert, "empty".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| bad("cannot read the private key", key, e.to_string()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::InvalidInput(format!("TLS: {e}")))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| Error::InvalidInput(format!("the certificate and key do not go together: {e}")))?;
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener that hands the server only connections whose handshake is done.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(QUEUE);
        let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                // The server dropping its end (shutdown) ends the loop at
                // once, not at the next connection.
                let accepted = tokio::select! {
                    a = tcp.accept() => a,
                    _ = tx.closed() => return,
                };
                let (stream, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Past the cap a connection is closed at once: handshakes
                // cost CPU, and a flood of them must not queue unbounded.
                let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                    tracing::debug!(
                        "TLS handshake with {peer}: {HANDSHAKES} under way already, closed"
                    );
                    continue;
                };
                let (acceptor, handed) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = handed.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake with {peer}: {e}"),
                        Err(_) => tracing::debug!("TLS handshake with {peer}: timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop ends only with the listener: wait for shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
