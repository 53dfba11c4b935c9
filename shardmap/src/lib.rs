//! Shard maps for shardgate: which primary owns which part of the keyspace.
//!
//! A row's place is decided by its sharding key: the key hashes (with Postgres's own hash
//! functions, [`hash`]) to a 64-bit keyspace ID ([`keyspace`]), and the shard whose range
//! ([`range`]) holds that ID owns the row ([`map`]). Maps are read from `shardmap.toml`
//! ([`load`]), generated ([`split`]) and audited in SQL ([`predicate`]). Nothing here does
//! network I/O.

pub mod error;
pub mod hash;
pub mod keyspace;
pub mod load;
pub mod map;
pub mod predicate;
pub mod primary;
pub mod range;
pub mod split;
pub mod sql;

pub use error::{MapError, Problem};
pub use keyspace::{Key, KeyError, KeyType, KeyspaceId, KEYSPACE_SEED};
pub use load::{load, parse};
pub use map::{Lookup, Reference, Shard, ShardMap, Table, ROUTER_SCHEMA};
pub use primary::Primary;
pub use range::{KeyRange, RangeError};
