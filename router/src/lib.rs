//! shardgate: a sharded query router for PostgreSQL.
//!
//! The path of one statement, folder by folder:
//!
//! ```text
//!  client ──▶ server      accept, TLS (negotiate), login (handshake), one task per client
//!             session     the client's loop: reads a message, keeps its state, executes targets
//!               │  text ──▶ planner    text → Plan (pure, cached; one parse per statement shape)
//!               │  plan ──▶ resolver   Plan + values + shard map + transaction → Target (pure)
//!               ▼
//!             one shard:      session::outbox (rewrite) ─▶ backend (pools, raw frames) ─▶ session::relay
//!             several shards: multishard (broadcast, fan-out reads, merges, ordered writes, COPY)
//! ```
//!
//! | module | job |
//! |---|---|
//! | [`protocol`] | the wire protocol, sans-IO: framing, messages read and written |
//! | [`planner`] | statement text → [`planner::Plan`]: which keys, which tables, how answers merge |
//! | [`resolver`] | plan + parameters + shard map + transaction → [`resolver::Target`] |
//! | [`session`] | one client after login: state, extended protocol, pinned connection, relay |
//! | [`multishard`] | statements on several shards: DDL, merged reads, split writes, COPY |
//! | [`merge`] | exact merges of shard answers (sorting, grouping, aggregates), sans-IO |
//! | [`backend`] | connections to the shards' primaries, pools, prepared statements, catalog |
//! | [`server`] | listening, TLS negotiation, login, what all sessions share, the client table |
//! | [`tls`] | certificates and keys read from the config's PEM files: client acceptor, shard connector |
//! | [`admin`] | the admin console (`SHOW ...`, `RELOAD`, `PAUSE`, `SHUTDOWN`) |
//! | [`stats`] | what the router counts, recorded per worker without locks; `/metrics` text |
//! | [`auth`] | SCRAM-SHA-256 server side, sans-IO |
//! | [`config`] | `router.toml`: model, file form, checks |
//! | [`errors`] | every SQLSTATE the router raises, and its own error messages |
//! | [`cli`] | the `shardgate` command line: the router and the shard-map tools |
//! | [`reshard`] | `shardgate reshard`: a shard split online (logical replication, cut-over) |
//!
//! Only `server`, `session` (its `relay`, `pin` and `client` parts), `multishard` and `backend`
//! do I/O; everything they decide with is pure and unit tested without sockets.

pub mod admin;
pub mod auth;
pub mod backend;
pub mod cli;
pub mod config;
pub mod errors;
pub mod merge;
pub mod multishard;
pub mod planner;
pub mod protocol;
pub mod resolver;
pub mod routing;
pub mod server;
pub mod session;
pub mod stats;
pub mod tls;
