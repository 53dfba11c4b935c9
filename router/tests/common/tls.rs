//! TLS for the integration tests: a CA made for the test and the router's certificate signed by
//! it ([`Certs`]), and tokio-postgres over tokio-rustls trusting only that CA ([`Rustls`]), so
//! the tests need no other TLS stack.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pgharness::tls::TestCa;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::{Client, Socket};

use super::{Router, DATABASE, PASSWORD, USER};

/// A directory with a CA (`ca.pem`) and the router's certificate for `localhost` and
/// `127.0.0.1` signed by it (`router.pem`, `router.key`).
pub struct Certs {
    dir: PathBuf,
}

/// Gives every CA of the process its own name: OpenSSL looks an issuer up by name.
pub static CA_SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Certs {
    pub fn new(name: &str) -> Certs {
        let dir =
            std::env::temp_dir().join(format!("shardgate-tls-it-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("certificate dir");
        let certs = Certs { dir };
        certs.issue_router_cert("ca.pem");
        certs
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A new CA written to `ca_file`, and a router certificate signed by it in place of the
    /// old one.
    pub fn issue_router_cert(&self, ca_file: &str) -> TestCa {
        let n = CA_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ca = TestCa::new(&format!("shardgate test CA {n}")).expect("CA");
        ca.write(&self.path(ca_file)).expect("write the CA");
        ca.issue(&["localhost", "127.0.0.1"])
            .expect("issue")
            .write(&self.path("router.pem"), &self.path("router.key"))
            .expect("write the router certificate");
        ca
    }

    /// The `[tls]` section for `mode`.
    pub fn section(&self, mode: &str) -> String {
        format!(
            "[tls]\nmode = \"{mode}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            self.path("router.pem").display(),
            self.path("router.key").display()
        )
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS client configuration that trusts only `ca`.
pub fn trusting(ca: &Path) -> Arc<rustls::ClientConfig> {
    let pem = std::fs::read(ca).expect("read the CA");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.expect("CA PEM")).expect("a CA");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    Arc::new(config)
}

/// tokio-postgres over TLS, trusting only `ca` (a tokio-postgres TLS connector over
/// tokio-rustls, so the test needs no other TLS stack).
pub async fn connect_tls(router: &Router, ca: &Path) -> Result<Client, tokio_postgres::Error> {
    connect_tls_to(router.port, ca).await
}

/// [`connect_tls`] to the router on `port`.
pub async fn connect_tls_to(port: u16, ca: &Path) -> Result<Client, tokio_postgres::Error> {
    let url = format!("postgres://{USER}:{PASSWORD}@localhost:{port}/{DATABASE}?sslmode=require");
    let (client, conn) = tokio_postgres::connect(&url, Rustls(trusting(ca))).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

pub struct Rustls(pub Arc<rustls::ClientConfig>);

pub struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: rustls_pki_types::ServerName<'static>,
}

pub struct RustlsStream(tokio_rustls::client::TlsStream<Socket>);

impl MakeTlsConnect<Socket> for Rustls {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name =
            rustls_pki_types::ServerName::try_from(domain.to_string()).map_err(io::Error::other)?;
        Ok(RustlsConnect {
            config: self.0.clone(),
            name,
        })
    }
}

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(RustlsStream(tls))
        })
    }
}

impl TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
