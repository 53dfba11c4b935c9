//! TLS material, read from the PEM files the config names: the acceptor for clients
//! (`[tls]`, [`acceptor`]) and the connector for the shards (`[backend] sslmode`,
//! [`connector`]). Both are built when the router starts and again at every reload, before the
//! new routing is made, so a bad or missing file refuses the start or the reload with
//! `FILE:LINE: reason` (the config file and the line of the setting) and the running
//! certificates keep serving.
//!
//! rustls with the `ring` provider does the cryptography; nothing here is on the statement
//! path (a session only reads and writes through the stream it was given at login).

mod acceptor;
mod connector;
mod pem;

#[cfg(test)]
mod tests;

use shardmap::Problem;

pub use acceptor::ClientTls;
pub use connector::BackendTls;

use crate::config::{Config, ConfigError, SslMode, TlsMode};

/// The TLS side of one config: what the router offers clients and how it reaches the shards.
#[derive(Clone, Debug)]
pub struct Material {
    /// `None` with `[tls] mode = "disable"`.
    pub clients: Option<ClientTls>,
    pub backend: BackendTls,
}

impl Material {
    /// What is on, for the log of a reload (`None` when TLS is off both ways).
    pub fn summary(&self) -> Option<String> {
        let clients = self.clients.as_ref().map(|c| match c.mode {
            TlsMode::Require => "require",
            _ => "allow",
        });
        let shards = match self.backend.mode {
            SslMode::Disable => None,
            SslMode::Require => Some("require"),
            SslMode::VerifyFull => Some("verify-full"),
        };
        if clients.is_none() && shards.is_none() {
            return None;
        }
        Some(format!(
            "TLS files read again (clients: {}, shards: {})",
            clients.unwrap_or("disable"),
            shards.unwrap_or("disable")
        ))
    }

    /// No TLS either way (a config without `[tls]` and with `[backend] sslmode = "disable"`).
    pub fn none() -> Material {
        Material {
            clients: None,
            backend: BackendTls::disabled(),
        }
    }
}

/// Reads every file `config` names for TLS. Every problem is reported, each at the line of its
/// setting in the config file.
pub fn load(config: &Config) -> Result<Material, ConfigError> {
    let mut problems: Vec<Problem> = Vec::new();
    let clients = acceptor::load(&config.tls).unwrap_or_else(|p| {
        problems.extend(p);
        None
    });
    let backend = connector::load(&config.backend).unwrap_or_else(|p| {
        problems.extend(p);
        BackendTls::disabled()
    });
    if problems.is_empty() {
        return Ok(Material { clients, backend });
    }
    problems.sort_by_key(|p| p.line);
    Err(ConfigError {
        origin: config.source.display().to_string(),
        problems,
    })
}

/// The files `config` reads for TLS, for the file watcher of `[reload] watch`.
pub fn files(config: &Config) -> Vec<&std::path::Path> {
    [&config.tls.cert, &config.tls.key, &config.backend.ca]
        .into_iter()
        .flatten()
        .map(|f| f.path.as_path())
        .collect()
}

/// The ring provider, for both directions (never aws-lc-rs: see router/Cargo.toml).
fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
