//! Client TLS (`[tls]`): the server configuration built from the router's certificate and
//! key, checked for a key that belongs to the certificate. Client certificates are not asked
//! for; clients prove who they are with their password, as without TLS.

use std::sync::Arc;

use shardmap::Problem;
use tokio_rustls::TlsAcceptor;

use super::pem;
use crate::config::{Tls, TlsMode};

/// What the router offers clients that send an SSLRequest.
#[derive(Clone)]
pub struct ClientTls {
    /// `Allow` or `Require` (a disabled `[tls]` has no `ClientTls`).
    pub mode: TlsMode,
    pub acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// The ALPN protocol name Postgres 17 and its libpq use; offered so that a client that asks
/// for it gets it (clients of older versions ask for none).
const ALPN_POSTGRESQL: &[u8] = b"postgresql";

pub(super) fn load(tls: &Tls) -> Result<Option<ClientTls>, Vec<Problem>> {
    if tls.mode == TlsMode::Disable {
        return Ok(None);
    }
    let (Some(cert_file), Some(key_file)) = (&tls.cert, &tls.key) else {
        // The config check refuses this; say so rather than run without TLS.
        return Err(vec![Problem {
            line: 0,
            message: "tls.cert and tls.key are required unless tls.mode is \"disable\"".into(),
        }]);
    };
    let certs = pem::certificates(cert_file, "tls.cert");
    let key = pem::private_key(key_file, "tls.key");
    let (certs, key) = match (certs, key) {
        (Ok(certs), Ok(key)) => (certs, key),
        (certs, key) => return Err(certs.err().into_iter().chain(key.err()).collect()),
    };
    let builder = rustls::ServerConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| vec![pem::invalid(cert_file, "tls.cert", e)])?;
    let mut config = builder
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            vec![match e {
                rustls::Error::InconsistentKeys(_) => pem::invalid(
                    key_file,
                    "tls.key",
                    format_args!(
                        "is not the private key of the certificate in {}",
                        cert_file.path.display()
                    ),
                ),
                e => pem::invalid(cert_file, "tls.cert", format_args!("cannot be used: {e}")),
            }]
        })?;
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(Some(ClientTls {
        mode: tls.mode,
        acceptor: TlsAcceptor::from(Arc::new(config)),
    }))
}
