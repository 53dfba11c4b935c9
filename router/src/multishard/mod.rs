//! Statements that run on several shards, in transactions of their own or inside the client's
//! transaction, and the end of a transaction that spans shards. The session resolves them
//! (`crate::resolver`) and hands them here; each path writes one answer for the client.
//!
//! | module | what |
//! |---|---|
//! | [`client`] | what such a statement needs of its client (a trait the session's socket implements) |
//! | [`broadcast`] | DDL on every shard in parallel, one answer (or the shards it failed on) |
//! | [`fanout`] | a read sent to several shards at once, answers streamed back per shard |
//! | [`gather`] | concatenating shard answers into one (sans-IO) |
//! | [`read`] | a read whose rows are concatenated in shard order |
//! | [`merged`] | a read merged by `crate::merge`: sorted streams, combined groups |
//! | [`stepwise`] | a cursor across shards merged a few rows at a time, as FETCHes ask (sans-IO) |
//! | [`commit`] | the one ordered multi-shard write: parts begun in shard order, committed together; the end of a transaction on several shards |
//! | [`two_phase`] | two-phase commit of a transaction on several shards, and recovery of those left in doubt |
//! | [`write`] | UPDATE/DELETE on several shards, through [`commit`] |
//! | [`split_insert`] | a multi-row INSERT split by key, through [`commit`] |
//! | [`copy_in`] | COPY FROM STDIN split by key |
//! | [`copy_reference`] | COPY FROM STDIN into a reference table: every row to every shard, all or nothing |
//! | [`staged`] | the second stage of a read in two stages: the first stage's rows as a typed VALUES list (sans-IO) |

pub mod broadcast;
pub mod budget;
pub mod client;
pub mod commit;
pub mod copy_in;
pub mod copy_reference;
pub mod fanout;
pub mod gather;
pub mod merged;
pub mod read;
pub mod split_insert;
pub mod staged;
pub mod stepwise;
pub mod two_phase;
pub mod write;
