//! Reading the PEM files of the config: a certificate chain, a private key, certificate
//! authorities. Each failure is a [`Problem`] at the line of the setting that named the file,
//! in words an operator can act on.

use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use shardmap::Problem;

use crate::config::FileSetting;

fn problem(f: &FileSetting, name: &str, what: impl std::fmt::Display) -> Problem {
    Problem {
        line: f.line,
        message: format!("{name} {}: {what}", f.path.display()),
    }
}

fn read(f: &FileSetting, name: &str) -> Result<Vec<u8>, Problem> {
    std::fs::read(&f.path).map_err(|e| problem(f, name, format_args!("cannot read it: {e}")))
}

/// Every certificate in the file, in order; at least one.
pub(super) fn certificates(
    f: &FileSetting,
    name: &str,
) -> Result<Vec<CertificateDer<'static>>, Problem> {
    let bytes = read(f, name)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(f, name, format_args!("is not a valid PEM file: {e}")))?;
    if certs.is_empty() {
        return Err(problem(
            f,
            name,
            "holds no certificate (no -----BEGIN CERTIFICATE----- block)",
        ));
    }
    Ok(certs)
}

/// The first private key in the file (PKCS#8, PKCS#1 or SEC1).
pub(super) fn private_key(f: &FileSetting, name: &str) -> Result<PrivateKeyDer<'static>, Problem> {
    let bytes = read(f, name)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => problem(
            f,
            name,
            "holds no private key (no -----BEGIN PRIVATE KEY----- block, nor an RSA or EC one)",
        ),
        e => problem(f, name, format_args!("is not a valid PEM file: {e}")),
    })
}

/// Problems at the line of `f`, for what rustls says of its contents.
pub(super) fn invalid(f: &FileSetting, name: &str, why: impl std::fmt::Display) -> Problem {
    problem(f, name, why)
}
