//! Connections from the router to the shards' Postgres primaries.
//!
//! [`conn`] logs in to a primary and then only moves raw frames; [`pool`] keeps one
//! independent pool of such connections per (host, port, database).

pub mod conn;
pub mod pool;

pub use conn::{BackendConn, BackendError, Endpoint};
pub use pool::{Pools, ShardPool};
