//! A statement on several shards as data: what runs ([`Spread`]), how it ended ([`Ran`]), and
//! an extended batch that waits for its Execute to run one ([`ScatterBatch`]). Made by the
//! executor (`super::execute`), kept by the batch state (`super::state`), run by
//! `super::several`.

use crate::protocol::reply::SqlError;
use crate::resolver::{ChangesLookups, Read, SplitInsert, Write};

/// A statement on several shards, as it runs.
#[derive(Debug)]
pub(super) enum Spread {
    /// DDL that every shard runs, each in its own transaction.
    Broadcast { sql: String },
    /// A read whose answers are merged; in the extended protocol inside a transaction, with the
    /// portal the client bound, so that an Execute with a row limit runs it step by step.
    Read(Read, Option<Box<Portal>>),
    /// An UPDATE or DELETE on several shards, or a write of a reference table on all.
    Write(Write),
    /// `DECLARE` of a cursor the router serves: merged step by step from a cursor on each
    /// shard of `read` (`stepwise`), or its read run now and its answer kept.
    Declare {
        read: Read,
        name: String,
        hold: bool,
        stepwise: bool,
    },
    /// A multi-row INSERT split by shard, with each part's request (in the extended protocol,
    /// made at the Bind, with the client's parameter count).
    Split {
        split: SplitInsert,
        requests: Result<Vec<(usize, Vec<u8>)>, SqlError>,
        params: Option<usize>,
    },
    /// A DELETE from a table with lookup columns, with its request for each shard (made at the
    /// Bind in the extended protocol, with the client's parameter count).
    ChangesLookups {
        delete: ChangesLookups,
        requests: Result<Vec<(usize, Vec<u8>)>, SqlError>,
        params: Option<usize>,
    },
    /// COPY FROM STDIN of `sql` into a sharded or reference table (simple protocol).
    CopyIn {
        sql: String,
        rows: crate::planner::CopyRows,
    },
}

/// A read's portal as the client bound it, for running it with a row limit on every shard.
#[derive(Debug)]
pub(super) struct Portal {
    pub name: String,
    pub sql: String,
    pub param_types: Vec<u8>,
    /// The client's Bind after the statement name (parameters, formats).
    pub bind_tail: Vec<u8>,
    /// How many parameters the Bind gives, and where in `bind_tail` they end (the result
    /// formats follow).
    pub param_count: usize,
    pub params_end: usize,
}

/// How a statement on several shards ended.
pub(super) enum Ran {
    /// The client has its answer.
    Done,
    /// The client has the error that ended it (from a shard or from the router).
    Failed,
    /// The router refused it before it ran: the caller raises this where the transaction is.
    Refused(SqlError),
}

/// A statement on several shards in an extended batch, run at its Execute.
#[derive(Debug)]
pub struct ScatterBatch {
    /// Parse + Describe + Bind + Describe + Execute + Sync of the statement, for every shard.
    pub request: Vec<u8>,
    pub run: Spread,
    /// The client's messages of the batch so far, to answer in order: `P` Parse, `S` Describe
    /// statement, `B` Bind, `D` Describe portal, `C` Close.
    pub asked: Vec<u8>,
    /// Its Execute has run.
    pub executed: bool,
}
