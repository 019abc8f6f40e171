//! HTTPS for `seckill serve` (`--tls-cert`, `--tls-key`): rustls, as for
//! Redis and MySQL. Each handshake runs in its connection's own task (a
//! client that stalls in it holds up nobody), held to `--header-timeout`
//! and counted against the connection cap like any connection
//! (connections/mod.rs); one that fails is dropped with a debug line.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

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
