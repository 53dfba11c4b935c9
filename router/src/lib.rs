//! shardgate: a sharded query router for PostgreSQL.
//!
//! A client's statements arrive at [`frontend`] (startup, authentication, the per-client
//! session loop), are routed by [`planner`] to a shard of the shard map, and run on a
//! connection from that shard's pool ([`backend`]), with replies streamed back as raw
//! frames. [`protocol`] is the sans-IO wire protocol, [`shared`] what all sessions share,
//! [`server`] starts it all from a [`config`]; [`cli`] holds the operator commands.

pub mod auth;
pub mod backend;
pub mod cli;
pub mod config;
pub mod errors;
pub mod frontend;
pub mod merge;
pub mod planner;
pub mod protocol;
pub mod server;
pub mod shared;
pub mod statements;
