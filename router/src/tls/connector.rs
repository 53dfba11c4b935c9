//! Shard TLS (`[backend] sslmode`, `ca`): the client configuration the router connects to the
//! shards with. `verify-full` checks the certificate chain against `ca` and the host name (or
//! IP address) of the shard's URL; `require` encrypts without checking who answers, as libpq's
//! `sslmode=require` does.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use shardmap::Problem;

use super::pem;
use crate::config::{Backend, SslMode};

/// How the router's connections to the shards are encrypted; part of a pool's login identity
/// (a reload that changes it opens new connections).
#[derive(Clone)]
pub struct BackendTls {
    pub mode: SslMode,
    /// `None` with `sslmode = "disable"`.
    config: Option<Arc<ClientConfig>>,
    /// The certificate authorities, to tell whether a reload changed them.
    ca: Arc<[CertificateDer<'static>]>,
}

impl PartialEq for BackendTls {
    fn eq(&self, other: &Self) -> bool {
        self.mode == other.mode && self.ca == other.ca
    }
}

impl std::fmt::Debug for BackendTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendTls")
            .field("mode", &self.mode)
            .field("ca_certificates", &self.ca.len())
            .finish()
    }
}

impl BackendTls {
    /// Plain TCP to the shards.
    pub fn disabled() -> BackendTls {
        BackendTls {
            mode: SslMode::Disable,
            config: None,
            ca: Arc::from(Vec::new()),
        }
    }

    /// The configuration to connect with; `None` for plain TCP.
    pub fn client_config(&self) -> Option<&Arc<ClientConfig>> {
        self.config.as_ref()
    }
}

pub(super) fn load(backend: &Backend) -> Result<BackendTls, Vec<Problem>> {
    let provider = super::provider();
    let builder = || {
        ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| {
                vec![Problem {
                    line: 0,
                    message: format!("TLS toward the shards cannot be set up: {e}"),
                }]
            })
    };
    match backend.sslmode {
        SslMode::Disable => Ok(BackendTls::disabled()),
        SslMode::Require => {
            let config = builder()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider.clone())))
                .with_no_client_auth();
            Ok(BackendTls {
                mode: SslMode::Require,
                config: Some(Arc::new(config)),
                ca: Arc::from(Vec::new()),
            })
        }
        SslMode::VerifyFull => {
            let Some(file) = &backend.ca else {
                // The config check refuses this; never connect unverified instead.
                return Err(vec![Problem {
                    line: 0,
                    message: "backend.sslmode is \"verify-full\" but backend.ca is not set".into(),
                }]);
            };
            let ca = pem::certificates(file, "backend.ca").map_err(|p| vec![p])?;
            let mut roots = RootCertStore::empty();
            for cert in &ca {
                roots.add(cert.clone()).map_err(|e| {
                    vec![pem::invalid(
                        file,
                        "backend.ca",
                        format_args!(
                            "holds a certificate that cannot be a certificate authority: {e}"
                        ),
                    )]
                })?;
            }
            let config = builder()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(BackendTls {
                mode: SslMode::VerifyFull,
                config: Some(Arc::new(config)),
                ca: Arc::from(ca),
            })
        }
    }
}

/// `sslmode = "require"`: any certificate is accepted, but the handshake's signatures are still
/// checked (the session keys belong to whoever holds the certificate's key).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
