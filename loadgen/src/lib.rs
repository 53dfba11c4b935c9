//! loadgen: the load generator of shardgate.
//!
//! `prepare` loads every shard with the same number of rows ([`prepare`]), `run` drives
//! open-loop (or closed-loop) load through routers or straight at the shards ([`run`]; how
//! it is split over connections in [`plan`], one connection's loop in [`lane`], its timer in
//! [`pacer`]) and
//! reports throughput and coordinated-omission-corrected latency per shard ([`report`],
//! [`chart`]), `merge` combines the JSON reports of several loadgen hosts exactly
//! ([`merge`]), and `compare` sets two reports side by side ([`compare`]). `storm` measures
//! logins instead of queries: a reconnect storm and a slowloris with a bystander ([`storm`],
//! TLS in [`tls`]). `chaos` drives a mix of reads and writes through a fleet of routers
//! while a schedule of faults is applied and checks the invariants at the end ([`chaos`]);
//! `proxy` is the delay and fault proxy it uses. The command line is in [`cli`]; `docs/loadgen.md` is the manual.

pub mod chaos;
pub mod chart;
pub mod cli;
pub mod compare;
pub mod cpu;
pub mod keys;
pub mod lane;
pub mod merge;
pub mod pacer;
pub mod plan;
pub mod prepare;
pub mod progress;
pub mod proxy;
pub mod report;
pub mod run;
pub mod schedule;
pub mod stats;
pub mod storm;
pub mod table;
pub mod target;
pub mod tls;
pub mod workload;

/// The workload's table, as in `deploy/local/schema.sql`.
pub const SCHEMA_SQL: &str =
    "CREATE TABLE IF NOT EXISTS kv (id bigint PRIMARY KEY, v text NOT NULL)";

/// Keys at or above this are made up by `--mix insert=..`; `prepare` loads keys below it and
/// counts only those, so inserts of earlier runs do not spoil its checks.
pub const INSERT_KEY_BASE: i64 = 1 << 40;

/// A failure with a sentence for the operator.
pub type Error = String;
