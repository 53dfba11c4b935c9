//! The router's own errors, each with the SQLSTATE a Postgres client expects and a message
//! that says what happened and what to do. Errors from Postgres itself are forwarded untouched
//! and never pass through here.

use std::time::Duration;

use crate::backend::conn::BackendError;
use crate::protocol::reply::SqlError;

pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const CONNECTION_FAILURE: &str = "08006";
pub const CANNOT_CONNECT: &str = "08001";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
pub const INVALID_PASSWORD: &str = "28P01";
pub const INVALID_AUTHORIZATION: &str = "28000";
pub const UNKNOWN_DATABASE: &str = "3D000";
pub const IN_FAILED_TRANSACTION: &str = "25P02";
pub const UNDEFINED_PREPARED_STATEMENT: &str = "26000";
pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
pub const INVALID_TEXT_REPRESENTATION: &str = "22P02";
pub const INVALID_PARAMETER_VALUE: &str = "22023";
pub const ADMIN_SHUTDOWN: &str = "57P01";

/// A shard's pool had no free connection for the whole checkout timeout.
pub fn pool_exhausted(shard: &str, endpoint: &str, waited: Duration) -> SqlError {
    SqlError::new(
        TOO_MANY_CONNECTIONS,
        format!(
            "no free connection to shard {shard} ({endpoint}) within {} ms",
            waited.as_millis()
        ),
    )
    .with_hint("the shard is overloaded or its pool is too small: raise [pool] max_size, or retry")
}

/// A shard's primary could not be reached or refused the router's login.
pub fn shard_unreachable(shard: &str, err: &BackendError) -> SqlError {
    let code = match err {
        BackendError::Refused { .. } | BackendError::NoPassword { .. } => CANNOT_CONNECT,
        _ => CONNECTION_FAILURE,
    };
    SqlError::new(code, format!("shard {shard} is unavailable: {err}"))
        .with_hint("statements for other shards are not affected; retry when the shard is back")
}

/// The connection to a shard broke while a statement was running on it.
pub fn shard_lost(shard: &str, endpoint: &str, why: &str) -> SqlError {
    SqlError::new(
        CONNECTION_FAILURE,
        format!("lost the connection to shard {shard} ({endpoint}) during the statement: {why}"),
    )
    .with_hint("the statement may or may not have been applied; check before retrying a write")
}

pub fn cross_shard_transaction(first: &str, second: &str) -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        format!("this transaction started on shard {first} and this statement needs shard {second}"),
    )
    .with_hint("a transaction must stay on one shard: keep the keys of one transaction on one shard, or commit before touching the other shard")
}
