//! TLS for MySQL: the options of each `--mysql-ssl-mode`, and what
//! `verify-ca` needs that the driver lacks.
//!
//! `verify-ca` checks a server certificate's chain against the CA but not
//! its host name. mysql_async with rustls cannot skip the name check (its
//! switch for that matches an error text rustls no longer produces), so
//! `verify-ca` does a TLS handshake of its own first — the MySQL greeting,
//! an SSL request, then rustls with a verifier that checks the chain and
//! notes the names the certificate is valid for — and then connects with
//! the driver's full check against one of those names. A certificate the
//! CA did not sign fails either way; one it signed for another host is
//! accepted, which is what verify-ca means.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::{ClientIdentity, SslOpts};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::store::config::{SslMode, TlsFiles};

/// The driver's TLS options for `mode` (None: plaintext), for a server at
/// `host:port`. Errors are one line for the operator.
pub async fn ssl_opts(
    mode: SslMode,
    files: &TlsFiles,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Option<SslOpts>, String> {
    let verifies = matches!(mode, SslMode::VerifyCa | SslMode::VerifyIdentity);
    if verifies && files.ca_cert.is_none() {
        return Err(format!(
            "--mysql-ssl-mode {} needs --mysql-ca-cert (the CA to check the server's certificate against)",
            mode_name(mode)
        ));
    }
    if mode == SslMode::Disabled {
        return Ok(None);
    }
    let mut opts = SslOpts::default();
    if let (Some(cert), Some(key)) = (&files.client_cert, &files.client_key) {
        opts = opts.with_client_identity(Some(ClientIdentity::new(
            cert.clone().into(),
            key.clone().into(),
        )));
    }
    if !verifies {
        if files.ca_cert.is_some() {
            return Err(format!(
                "--mysql-ca-cert is used by verify-ca and verify-identity only; --mysql-ssl-mode {} checks no certificate",
                mode_name(mode)
            ));
        }
        // preferred and required encrypt without checking who answers.
        return Ok(Some(opts.with_danger_accept_invalid_certs(true)));
    }
    let ca = files.ca_cert.clone().unwrap_or_default();
    opts = opts
        .with_root_certs(vec![ca.clone().into()])
        .with_disable_built_in_roots(true);
    if mode == SslMode::VerifyIdentity {
        return Ok(Some(opts));
    }
    let names = certified_names(host, port, &ca, timeout).await?;
    // The driver checks the chain and this name: one the certificate was
    // issued for (the host itself when it is valid for it: no names noted).
    let name = match names {
        Certified::ForHost => host.to_string(),
        Certified::ForNames(names) => match names.into_iter().next() {
            Some(name) => name,
            None => {
                return Err(
                    "verify-ca: the server's certificate names no host in its subjectAltName (rustls ignores the CN); it needs one, for any host"
                        .into(),
                )
            }
        },
    };
    Ok(Some(opts.with_danger_tls_hostname_override(Some(name))))
}

pub fn mode_name(mode: SslMode) -> &'static str {
    match mode {
        SslMode::Disabled => "disabled",
        SslMode::Preferred => "preferred",
        SslMode::Required => "required",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyIdentity => "verify-identity",
    }
}

/// MySQL capability flags of the SSL request.
const CLIENT_LONG_PASSWORD: u32 = 0x1;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_SSL: u32 = 0x800;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const UTF8MB4_GENERAL_CI: u8 = 45;

/// What a certificate whose chain checked out is valid for.
enum Certified {
    /// The host we connected to.
    ForHost,
    /// Other names (none: its subjectAltName names no host).
    ForNames(Vec<String>),
}

/// The names the server's certificate is valid for, after its chain was
/// checked against `ca` in a handshake of our own.
async fn certified_names(
    host: &str,
    port: u16,
    ca: &std::path::Path,
    timeout: Duration,
) -> Result<Certified, String> {
    let work = async {
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca)
            .map_err(|e| format!("--mysql-ca-cert {}: {e}", ca.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("--mysql-ca-cert {}: {e}", ca.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("--mysql-ca-cert {}: {e}", ca.display()))?;
        }
        let inner = WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .map_err(|e| format!("--mysql-ca-cert {}: {e}", ca.display()))?;
        let verifier = Arc::new(ChainOnly {
            inner,
            names: Mutex::new(None),
        });
        let config = rustls::ClientConfig::builder()
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        let mut tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("{host}:{port}: {e}"))?;
        request_tls(&mut tcp).await?;
        let server_name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host} is not a host name for TLS: {e}"))?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let names = verifier.names.lock().ok().and_then(|n| n.clone());
        Ok(match names {
            Some(names) => Certified::ForNames(names),
            None => Certified::ForHost,
        })
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        format!(
            "no TLS handshake within {}",
            humantime::format_duration(timeout)
        )
    })?
}

/// Reads the server's greeting and asks for TLS, as a MySQL client does
/// before its handshake.
async fn request_tls(tcp: &mut tokio::net::TcpStream) -> Result<(), String> {
    let mut header = [0u8; 4];
    tcp.read_exact(&mut header)
        .await
        .map_err(|e| format!("reading the server's greeting: {e}"))?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    let mut greeting = vec![0u8; len];
    tcp.read_exact(&mut greeting)
        .await
        .map_err(|e| format!("reading the server's greeting: {e}"))?;
    if greeting.first() == Some(&0xff) {
        let text = String::from_utf8_lossy(greeting.get(3..).unwrap_or_default());
        return Err(format!("the server refused the connection: {text}"));
    }
    // protocol 10: version, NUL, connection id (4), auth data (8), filler
    // (1), then the low two bytes of its capabilities.
    let caps_at = greeting
        .iter()
        .skip(1)
        .position(|b| *b == 0)
        .map(|nul| 1 + nul + 1 + 4 + 8 + 1)
        .ok_or("the server's greeting is not MySQL's")?;
    let caps = greeting
        .get(caps_at..caps_at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .ok_or("the server's greeting is not MySQL's")?;
    if greeting.first() != Some(&10) {
        return Err("the server's greeting is not MySQL protocol 10".into());
    }
    if caps & CLIENT_SSL == 0 {
        return Err("the server does not offer TLS".into());
    }
    let flags = CLIENT_LONG_PASSWORD | CLIENT_PROTOCOL_41 | CLIENT_SSL | CLIENT_SECURE_CONNECTION;
    let mut request = Vec::with_capacity(36);
    request.extend_from_slice(&[32, 0, 0, 1]);
    request.extend_from_slice(&flags.to_le_bytes());
    request.extend_from_slice(&(16u32 << 20).to_le_bytes());
    request.push(UTF8MB4_GENERAL_CI);
    request.extend_from_slice(&[0u8; 23]);
    tcp.write_all(&request)
        .await
        .map_err(|e| format!("asking the server for TLS: {e}"))
}

/// Checks a certificate's chain and signatures, not its host name, and
/// notes the names it is valid for.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
    /// Set when the name check failed: the names the certificate is for.
    names: Mutex<Option<Vec<String>>>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(ok) => Ok(ok),
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            })) => {
                if let Ok(mut names) = self.names.lock() {
                    *names = Some(presented.iter().filter_map(|p| usable_name(p)).collect());
                }
                Ok(ServerCertVerified::assertion())
            }
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A name rustls reports a certificate valid for (`DnsName("db.internal")`,
/// `IpAddress(10.0.0.5)`), as a host name the driver can check it against;
/// a wildcard stands for any one label.
fn usable_name(presented: &str) -> Option<String> {
    if let Some(dns) = presented
        .strip_prefix("DnsName(\"")
        .and_then(|r| r.strip_suffix("\")"))
    {
        return Some(match dns.strip_prefix("*.") {
            Some(rest) => format!("verify-ca.{rest}"),
            None => dns.to_string(),
        });
    }
    let ip = presented.strip_prefix("IpAddress(")?.strip_suffix(')')?;
    ip.parse::<std::net::IpAddr>().ok().map(|ip| ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_rustls_reports_become_host_names() {
        assert_eq!(
            usable_name("DnsName(\"db.internal\")").as_deref(),
            Some("db.internal")
        );
        assert_eq!(
            usable_name("DnsName(\"*.db.internal\")").as_deref(),
            Some("verify-ca.db.internal")
        );
        assert_eq!(
            usable_name("IpAddress(10.0.0.5)").as_deref(),
            Some("10.0.0.5")
        );
        assert_eq!(usable_name("DirectoryName"), None);
    }
}
