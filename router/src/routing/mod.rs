//! What every layer above needs to reach a shard, and nothing of how a client talks.
//!
//! The session, the statements on several shards and the admin console all stand on this
//! layer; the front door (`crate::server`) only starts it and hands it clients. It sits on top
//! of the backend connections (`crate::backend`) and the pure leaves (planner, resolver,
//! shard map), and imports nothing from the layers above it.
//!
//! | module | what |
//! |---|---|
//! | [`router`] | [`Router`]: what every session of one router process shares for its life (the current routing, the statement registry, the clients, the phase, counters, health, pauses), and the reload |
//! | [`generation`] | [`Routing`]: what a reload replaces as one value (config, shard map, planner, TLS material, every worker's pools and the shared connections) |
//! | [`checkout`] | a connection to a shard (paused shards waited for, held through a restart), or to any shard that can give one |
//! | [`hold`] | one statement's wait for a primary it could not reach (`[failover]`) |
//! | [`pause`] | shards paused by the admin console (`PAUSE`/`RESUME`) |
//! | [`health`](crate::backend::health) and [`probe`] | whether each primary answers; the prober that finds out |
//! | [`warm`] | the first connections every worker opens at start and before a reload takes effect |
//! | [`catalog`] | what the router learns from a shard's catalog (key positions, key defaults, collation) |
//! | [`ids`] | new keys for INSERTs that leave the key out: blocks reserved on the default shard, held by shard |
//! | [`clients`] | the table of clients, for cancel requests, the client limit and `SHOW CLIENTS` |
//! | [`door`] | the connections still logging in: the oldest closed first when too many are |
//! | [`phase`] | where the router is in its life: serving, draining, closing |
//! | [`snapshot`] | what `/metrics` and `SHOW` read now |

pub mod catalog;
mod checkout;
pub mod clients;
pub mod door;
mod generation;
mod hold;
pub mod ids;
pub mod lookups;
pub mod pause;
mod phase;
pub mod probe;
mod router;
pub mod snapshot;
pub mod warm;

pub use checkout::Checkout;
pub use generation::{pool_settings, Board, Routing};
pub use phase::{Lifecycle, Phase};
pub use router::{Reloaded, Router};
