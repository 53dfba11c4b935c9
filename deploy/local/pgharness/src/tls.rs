//! Certificates for tests and the local cluster: a throw-away certificate authority
//! ([`TestCa`]) and the server certificates it signs ([`Issued`]), made with rcgen, written as
//! PEM files. A server certificate names host names and IP addresses (an IP address becomes an
//! IP address SAN, which is what a client checking `127.0.0.1` needs).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

use crate::error::{Error, Result};

fn cert_error(e: rcgen::Error) -> Error {
    Error::Certificate(e.to_string())
}

/// A certificate authority that exists for one test or one local cluster.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate and its private key, as PEM text.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new self-signed authority with common name `name`.
    pub fn new(name: &str) -> Result<TestCa> {
        let key = KeyPair::generate().map_err(cert_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(cert_error)?;
        Ok(TestCa { cert, key })
    }

    /// The authority's certificate, for a client's trust store (`sslrootcert`, `[backend] ca`).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `names` (host names and IP addresses), signed by this authority.
    pub fn issue(&self, names: &[&str]) -> Result<Issued> {
        let key = KeyPair::generate().map_err(cert_error)?;
        let sans: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(sans).map_err(cert_error)?;
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, *first);
        }
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(cert_error)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes the authority's certificate to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.cert_pem())
            .map_err(|e| Error::io("writing a CA certificate", path, e))
    }
}

impl Issued {
    /// Writes the certificate to `cert` and the key to `key`, readable by its owner only (the
    /// mode Postgres and careful operators insist on).
    pub fn write(&self, cert: &Path, key: &Path) -> Result<()> {
        std::fs::write(cert, &self.cert_pem)
            .map_err(|e| Error::io("writing a certificate", cert, e))?;
        write_private(key, self.key_pem.as_bytes())
    }
}

/// Writes `bytes` to `path` with mode 0600, replacing what was there.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io("writing a private key", path, e))?;
    f.write_all(bytes)
        .map_err(|e| Error::io("writing a private key", path, e))
}
