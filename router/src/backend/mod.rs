//! Connections from the router to the shards' Postgres primaries, and what the router keeps
//! about them.
//!
//! | module | what |
//! |---|---|
//! | [`conn`] | one connection: login, then raw frames; the request/reply helper |
//! | [`settings`] | a client's session settings, and the SQL that gives a connection exactly those (sans-IO) |
//! | [`stream`] | its byte stream, plain TCP or TLS, and the write-while-reading step |
//! | [`pool`] | one independent pool of connections per (host, port, database) |
//! | [`mux`] | shared connections: many clients' autocommit statements pipelined on a few (`lane`: one connection's state; `driver`: its task; `sink`: the replies' channel) |
//! | [`pipeline`] | which request of a shared connection a reply answers (sans-IO) |
//! | [`prepared`] | which router statements one connection has prepared (bounded, LRU) |
//! | [`registry`] | the router-wide registry of prepared statement texts (`sg_<id>`) |
//! | [`health`] | whether each primary answers (up, down, last error) |
//! | [`cancel`] | cancel requests to a backend or to another router |
//! | [`worker`] | which worker thread this is (connections never cross threads) |

pub mod cancel;
pub mod conn;
pub mod health;
pub mod mux;
pub mod pipeline;
pub mod pool;
pub mod prepared;
pub mod registry;
pub mod settings;
pub mod stream;
pub mod worker;

pub use conn::{BackendConn, BackendError, Endpoint};
pub use pool::{Pools, ShardPool};
