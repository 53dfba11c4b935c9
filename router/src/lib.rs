//! shardgate: a sharded query router for PostgreSQL.
//!
//! Each folder is a layer and imports only the layers below it (`tests/layers.rs` checks this):
//!
//! ```text
//!  server       the front door: listening, TLS negotiation, login (one task per worker), a task
//!               per session; signals, reloads and the drain of the process
//!  session      one client after login: decodes Query and extended messages, plans and
//!  admin        resolves each statement, runs its Target in one executor (session::execute);
//!               the admin console beside it
//!  multishard   statements on several shards: DDL everywhere, fan-out reads, merges, ordered
//!               writes, two-phase commit, COPY; it reaches its client through a small trait
//!  routing      what every layer above needs to reach a shard: the Router (what sessions
//!               share), the current Routing (config, shard map, planner, pools), checkout with
//!               pause and failover holding, health, warm-up, the catalog, the client table
//!  backend      connections to the primaries: login, raw frames, pools per host, shared
//!               (pipelined) connections, prepared statements, the client's settings on them
//!  leaves       tls, stats, config, auth, resolver (Plan + values → Target), planner
//!               (text → Plan), merge, protocol, errors: no I/O (tls reads its files)
//! ```
//!
//! The path of one statement: `server::accept` → `session` (`simple` or `extended`: decode,
//! `planner` plans, `resolver` resolves) → `session::execute` runs the [`resolver::Target`]:
//! one shard over `session::attach`/`outbox`/`relay` and a `backend` connection from a
//! `routing` checkout, or several shards over `session::several` and `multishard`.
//!
//! | module | job |
//! |---|---|
//! | [`protocol`] | the wire protocol, sans-IO: framing, messages read and written |
//! | [`planner`] | statement text → [`planner::Plan`]: which keys, which tables, how answers merge |
//! | [`resolver`] | plan + parameters + shard map + transaction → [`resolver::Target`] |
//! | [`merge`] | exact merges of shard answers (sorting, grouping, aggregates), sans-IO |
//! | [`backend`] | connections to the shards' primaries, pools, shared connections, prepared statements, the client's settings |
//! | [`routing`] | the router's shared state and the way to a shard: routing generations, checkout, hold, pause, health prober, warm-up, catalog, clients, phase |
//! | [`multishard`] | statements on several shards: DDL, merged reads, split writes, two-phase commit, COPY |
//! | [`session`] | one client after login: state, the two protocols, the executor, the pinned connection, the relay |
//! | [`admin`] | the admin console (`SHOW ...`, `RELOAD`, `PAUSE`, `SHUTDOWN`) |
//! | [`server`] | listening, TLS negotiation, login, the process's life (signals, reload, drain), the HTTP side port |
//! | [`tls`] | certificates and keys read from the config's PEM files: client acceptor, shard connector |
//! | [`stats`] | what the router counts, recorded per worker without locks; `/metrics` text |
//! | [`auth`] | SCRAM-SHA-256 server side, sans-IO |
//! | [`config`] | `router.toml`: model, file form, checks |
//! | [`errors`] | every SQLSTATE the router raises, and its own error messages |
//! | [`cli`] | the `shardgate` command line: the router, the shard-map tools, and `shardgate reshard` (its own crate, `router/reshard`, which the request path never imports) |
//!
//! Only `server`, `session` (its `relay`, `attach`, `shared` and `client` parts), `multishard`,
//! `routing` and `backend` do I/O; everything they decide with is pure and unit tested without
//! sockets.

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
