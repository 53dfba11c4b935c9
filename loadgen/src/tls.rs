//! TLS logins for `loadgen storm --tls-ca FILE`: libpq's `sslmode=require` plus a check of the
//! server's certificate against the CAs of one PEM file (the name checked is the host of the
//! URL), over tokio-rustls with the ring provider.
//!
//! loadgen sends the SSLRequest and reads the answer itself, does the handshake, and hands the
//! encrypted stream to tokio-postgres (`Config::connect_raw`) for the startup and the password.
//! A tokio-postgres TLS connector (`MakeTlsConnect`) would be shorter, but tokio-postgres reads
//! only one byte of the answer: a server that refuses the connection at the door with an
//! ErrorResponse (`E`, as shardgate did with `53300` before 2026-12-03 when too many clients
//! were logging in)
//! would be reported as "server does not support TLS". Here it is a refusal with its SQLSTATE,
//! as in plain TCP.
//!
//! No channel binding is offered, so against a Postgres that offers SCRAM-SHA-256-PLUS the
//! login is plain SCRAM-SHA-256 (as libpq's `channel_binding=prefer` without binding data).

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The longest ErrorResponse read in answer to an SSLRequest.
const MAX_ERROR_BYTES: usize = 64 * 1024;

const CONNECTING: &str = "error connecting to server";
const TALKING: &str = "error communicating with the server";
const HANDSHAKE: &str = "error performing TLS handshake";

/// How asking for TLS failed.
#[derive(Debug)]
pub enum TlsError {
    /// The server answered the SSLRequest with an ErrorResponse: (severity, SQLSTATE, message).
    Refused(crate::storm::ServerError),
    /// It answered `N`: no TLS there.
    NotOffered,
    /// It answered something else than `S`, `N` or `E`.
    Unexpected(u8),
    /// An I/O error and when it happened (connecting, talking, the handshake: a certificate
    /// that does not check out is an `InvalidData` error of the handshake), in tokio-postgres's
    /// words: "error connecting to server", "error communicating with the server", "error
    /// performing TLS handshake".
    Io(&'static str, io::Error),
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsError::Refused(e) => write!(f, "{} {}: {}", e.severity, e.code, e.message),
            TlsError::NotOffered => {
                f.write_str("server does not support TLS (it answered N to the SSLRequest)")
            }
            TlsError::Unexpected(b) => {
                write!(f, "server answered the SSLRequest with byte 0x{b:02x}")
            }
            TlsError::Io(stage, e) => write!(f, "{stage}: {e}"),
        }
    }
}

/// TLS settings: the CAs to trust (cheap to clone: one shared rustls configuration).
#[derive(Clone)]
pub struct Rustls(Arc<rustls::ClientConfig>);

impl Rustls {
    /// Trusts only the certificates in the PEM file `ca`.
    pub fn trusting(ca: &Path) -> Result<Rustls, crate::Error> {
        let pem = std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("{}: not a PEM certificate: {e}", ca.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
        }
        if roots.is_empty() {
            return Err(format!(
                "{}: holds no certificate (expected PEM, -----BEGIN CERTIFICATE-----)",
                ca.display()
            ));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Rustls(Arc::new(config)))
    }

    /// Connects to `addr`, asks for TLS and does the handshake; the certificate must name
    /// `host` (a DNS name, or an IP address written as one).
    pub async fn connect(
        &self,
        addr: SocketAddr,
        host: &str,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| TlsError::Io(HANDSHAKE, io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let mut tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| TlsError::Io(CONNECTING, e))?;
        let talk = |e| TlsError::Io(TALKING, e);
        tcp.set_nodelay(true).map_err(talk)?;
        tcp.write_all(&SSL_REQUEST).await.map_err(talk)?;
        match tcp.read_u8().await.map_err(talk)? {
            b'S' => {}
            b'N' => return Err(TlsError::NotOffered),
            b'E' => return Err(read_refusal(&mut tcp).await),
            other => return Err(TlsError::Unexpected(other)),
        }
        tokio_rustls::TlsConnector::from(self.0.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| TlsError::Io(HANDSHAKE, e))
    }
}

/// The rest of an ErrorResponse whose `E` has been read.
async fn read_refusal(tcp: &mut TcpStream) -> TlsError {
    let len = match tcp.read_u32().await {
        Ok(len) => len as usize,
        Err(e) => return TlsError::Io(TALKING, e),
    };
    if !(4..=MAX_ERROR_BYTES).contains(&len) {
        return TlsError::Unexpected(b'E');
    }
    let mut msg = vec![0u8; 1 + len];
    msg[0] = b'E';
    msg[1..5].copy_from_slice(&(len as u32).to_be_bytes());
    if let Err(e) = tcp.read_exact(&mut msg[5..]).await {
        return TlsError::Io(TALKING, e);
    }
    match crate::storm::error_response(&msg) {
        Some(e) => TlsError::Refused(e),
        None => TlsError::Unexpected(b'E'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("loadgen-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("empty.pem");
        std::fs::write(&path, "not a certificate\n").expect("write");
        let err = Rustls::trusting(&path).err().expect("refused");
        assert!(err.contains("holds no certificate"), "{err}");
        let missing = Rustls::trusting(&dir.join("missing.pem"))
            .err()
            .expect("refused");
        assert!(missing.contains("cannot read"), "{missing}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// A server that reads the SSLRequest and answers `answer`.
    async fn answering(answer: Vec<u8>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            if let Ok((mut s, _)) = listener.accept().await {
                let mut request = [0u8; 8];
                if s.read_exact(&mut request).await.is_ok() && request == SSL_REQUEST {
                    let _ = s.write_all(&answer).await;
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_refusal_at_the_door_keeps_its_sqlstate() {
        let dir = std::env::temp_dir().join(format!("loadgen-tls-door-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // Any certificate will do: the handshake is never reached.
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, TEST_CA).expect("write");
        let tls = Rustls::trusting(&ca).expect("CA");
        std::fs::remove_dir_all(&dir).expect("clean up");

        let body =
            b"SFATAL\0VFATAL\0C53300\0Msorry, too many connections are logging in already\0\0";
        let mut refusal = vec![b'E'];
        refusal.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
        refusal.extend_from_slice(body);
        let addr = answering(refusal).await;
        match tls.connect(addr, "127.0.0.1").await {
            Err(TlsError::Refused(e)) => {
                assert_eq!(e.code, "53300");
                assert_eq!(e.severity, "FATAL");
                assert!(e.message.starts_with("sorry, too many"), "{e:?}");
            }
            Err(other) => panic!("expected a refusal, got {other}"),
            Ok(_) => panic!("expected a refusal, got a TLS connection"),
        }
        let addr = answering(b"N".to_vec()).await;
        assert!(matches!(
            tls.connect(addr, "127.0.0.1").await,
            Err(TlsError::NotOffered)
        ));
    }

    /// A self-signed CA certificate (openssl, P-256), only parsed here.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBjDCCATGgAwIBAgIUCdSmZrP0f0G/n0jTuPXm2+0vK3YwCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPbG9hZGdlbiB0ZXN0IENBMCAXDTI2MTIwMzE1MDkzM1oYDzIx
MjYxMTA5MTUwOTMzWjAaMRgwFgYDVQQDDA9sb2FkZ2VuIHRlc3QgQ0EwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAAStsKp+JQXiArd3Y46NYqU/l7PumnwhStB2Z5So
I2KcWnvxZuS5Pcl9aAg6JvTtc0hEhf89nqKh/W3Vrt8KV6T4o1MwUTAdBgNVHQ4E
FgQUYKjE+VtXUTN1wd6671nzkNNv9TUwHwYDVR0jBBgwFoAUYKjE+VtXUTN1wd66
71nzkNNv9TUwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEAm1iz
4yWAEsQcOW2NL/bS+tf3AFFj94zQ3/hKkpAM7E4CIQDskEd+qYeTJIzPfbnV4U9/
D6Eq4OOD95h5JGlpoNQSnA==
-----END CERTIFICATE-----
";
}
