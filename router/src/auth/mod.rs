//! Client authentication: the router checks a client's password itself, before any shard is
//! involved, so a client that cannot log in never costs a backend connection.
//!
//! Everything here is sans-IO. The connection code owns the socket and the Postgres message
//! framing; it looks the startup user up in the config ([`crate::config::Config::user`]),
//! runs a [`ScramServer`] over the SASL message bodies and maps an [`AuthError`] to an
//! ErrorResponse with [`AuthError::sqlstate`]. For an unknown user it runs the same exchange
//! against [`ScramVerifier::mock`], so the reply is the same as for a wrong password.
//!
//! - [`secret`]: what is stored per user ([`Secret`], [`ScramVerifier`]); a plain password's
//!   verifier comes from `postgres-protocol`.
//! - [`scram`]: the SCRAM-SHA-256 exchange ([`ScramServer`]).

pub mod scram;
pub mod secret;

#[cfg(test)]
mod tests;

use std::fmt;

pub use scram::ScramServer;
#[cfg(test)]
pub use secret::scram_verifier;
pub use secret::{ScramVerifier, Secret};

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The proof did not match: send SQLSTATE `28P01`,
    /// `password authentication failed for user "NAME"`. Deliberately carries no detail, so
    /// that a wrong password and an unknown user look the same to the client.
    WrongPassword,
    /// The client broke the SASL/SCRAM protocol: send SQLSTATE `08P01` with this sentence.
    Protocol(String),
}

impl AuthError {
    /// The SQLSTATE of the ErrorResponse to send.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            AuthError::WrongPassword => crate::errors::INVALID_PASSWORD,
            AuthError::Protocol(_) => crate::errors::PROTOCOL_VIOLATION,
        }
    }

    /// The ErrorResponse message for a login as `user`.
    pub fn client_message(&self, user: &str) -> String {
        match self {
            AuthError::WrongPassword => {
                format!("password authentication failed for user \"{user}\"")
            }
            AuthError::Protocol(m) => m.clone(),
        }
    }
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::WrongPassword => f.write_str("password authentication failed"),
            AuthError::Protocol(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for AuthError {}
