//! The router's own errors, each with the SQLSTATE a Postgres client expects and a message
//! that says what happened and what to do. Every SQLSTATE the router raises is named here;
//! errors from Postgres itself are forwarded untouched and never pass through here.
//! docs/errors.md lists them for users.

use std::time::Duration;

use crate::protocol::reply::SqlError;

pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const CONNECTION_FAILURE: &str = "08006";
pub const CANNOT_CONNECT: &str = "08001";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
pub const INVALID_COLUMN_REFERENCE: &str = "42P10";
pub const INVALID_PASSWORD: &str = "28P01";
pub const INVALID_AUTHORIZATION: &str = "28000";
pub const UNKNOWN_DATABASE: &str = "3D000";
pub const IN_FAILED_TRANSACTION: &str = "25P02";
pub const UNDEFINED_PREPARED_STATEMENT: &str = "26000";
pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
pub const SYNTAX_ERROR: &str = "42601";
pub const INVALID_TEXT_REPRESENTATION: &str = "22P02";
pub const NUMERIC_VALUE_OUT_OF_RANGE: &str = "22003";
pub const INVALID_PARAMETER_VALUE: &str = "22023";
pub const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
pub const QUERY_CANCELED: &str = "57014";
pub const ADMIN_SHUTDOWN: &str = "57P01";
pub const CANNOT_CONNECT_NOW: &str = "57P03";
pub const CONFIG_FILE_ERROR: &str = "F0000";
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
pub const UNDEFINED_OBJECT: &str = "42704";
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
pub const INTERNAL_ERROR: &str = "XX000";
pub const TRANSACTION_ROLLBACK: &str = "40000";
pub const TRANSACTION_RESOLUTION_UNKNOWN: &str = "08007";
pub const NO_ACTIVE_SQL_TRANSACTION: &str = "25P01";
pub const DUPLICATE_CURSOR: &str = "42P03";
pub const INVALID_CURSOR_NAME: &str = "34000";
pub const INVALID_BINARY_REPRESENTATION: &str = "22P03";
pub const SEQUENCE_LIMIT_EXCEEDED: &str = "2200H";

/// A shard's pool had no free connection for the whole checkout timeout.
pub fn pool_exhausted(shard: &str, endpoint: &str, waited: Duration) -> SqlError {
    SqlError::new(
        TOO_MANY_CONNECTIONS,
        format!(
            "no free connection to shard {shard} ({endpoint}) within {} ms",
            waited.as_millis()
        ),
    )
    .with_hint("the shard is overloaded or its pool is too small: raise [pool] max_size, or retry")
}

/// A shard stayed paused (admin `PAUSE`) for the whole pause timeout.
pub fn shard_paused(shard: &str, waited: Duration) -> SqlError {
    SqlError::new(
        CANNOT_CONNECT_NOW,
        format!(
            "shard {shard} is paused and was not resumed within {} ms",
            waited.as_millis()
        ),
    )
    .with_hint("an operator paused the shard (PAUSE in the admin console); retry after RESUME")
}

/// A statement waited for a paused shard, and the shard map changed meanwhile in a way that
/// leaves its shard nowhere (its range was split or removed).
pub fn map_changed_while_paused(shard: &str) -> SqlError {
    SqlError::new(
        CANNOT_CONNECT_NOW,
        format!("the shard map changed while the statement waited for paused shard {shard}"),
    )
    .with_hint("nothing ran; run the statement again to route it with the new shard map")
}

/// A statement waited for a paused shard when the router began to shut down.
pub fn shutting_down_while_paused(shard: &str) -> SqlError {
    SqlError::new(
        ADMIN_SHUTDOWN,
        format!(
            "the router is shutting down; shard {shard} was paused and the statement did not run"
        ),
    )
    .with_hint("connect again (to another router) and run it there")
}

/// A shard's primary could not be reached (`refused`: it refused the router's login).
pub fn shard_unreachable(shard: &str, refused: bool, why: &str) -> SqlError {
    let code = if refused {
        CANNOT_CONNECT
    } else {
        CONNECTION_FAILURE
    };
    SqlError::new(code, format!("shard {shard} is unavailable: {why}"))
        .with_hint("statements for other shards are not affected; retry when the shard is back")
}

/// A shard stayed unreachable for the whole hold window (`[failover] hold_ms`), or too many
/// statements were held for it already.
pub fn shard_unreachable_held(shard: &str, why: &str, held: Result<Duration, usize>) -> SqlError {
    let how = match held {
        Ok(waited) => format!("(waited {} ms for it)", waited.as_millis()),
        Err(max) => {
            format!("({max} statements wait for it already: [failover] hold_max_statements)")
        }
    };
    SqlError::new(
        CONNECTION_FAILURE,
        format!("shard {shard} is unavailable {how}: {why}"),
    )
    .with_hint("statements for other shards are not affected; retry when the shard is back")
}

/// The server ended the session of a statement (FATAL 57P01) while it was still taking logins:
/// the statement was stopped on purpose (`pg_terminate_backend`), not by a shutdown, and is
/// not sent again.
pub fn ended_by_server(shard: &str, why: &str) -> SqlError {
    SqlError::new(
        ADMIN_SHUTDOWN,
        format!("the server of shard {shard} ended the session running this statement: {why}"),
    )
    .with_hint("nothing of it was committed; it was not sent again, since the server is up and ended it on purpose")
}

/// The connection to a shard broke while a statement was running on it.
pub fn shard_lost(shard: &str, endpoint: &str, why: &str) -> SqlError {
    SqlError::new(
        CONNECTION_FAILURE,
        format!("lost the connection to shard {shard} ({endpoint}) during the statement: {why}"),
    )
    .with_hint("the statement may or may not have been applied; check before retrying a write")
}

/// A connection could not be given the client's settings before its statement (see
/// `Settings::is_fragile`): `refused`, the server's error of the `SET` (its SQLSTATE is the
/// client's, as `SET` would have failed on Postgres), or else the connection broke. Either way
/// the statement was not sent.
pub fn settings_not_given(shard: &str, refused: Option<SqlError>, why: &str) -> SqlError {
    match refused {
        Some(mut err) => {
            err.message = format!(
                "{} (giving this session's settings to a connection of shard {shard})",
                err.message
            );
            err.with_hint("the statement did not run: the router gives each connection the session's settings before its statements, and one of them no longer applies; RESET it or SET it again")
        }
        None => SqlError::new(
            CONNECTION_FAILURE,
            format!("lost the connection to shard {shard} while giving it this session's settings: {why}"),
        )
        .with_hint("the statement was not sent; it can be retried"),
    }
}

pub fn cross_shard_transaction(first: &str, second: &str) -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        format!("this transaction started on shard {first} and this statement needs shard {second}"),
    )
    .with_hint("a transaction must stay on one shard: keep the keys of one transaction on one shard, or commit before touching the other shard")
}

pub fn savepoint_across_shards() -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        "savepoints are not supported in a transaction that spans shards",
    )
    .with_hint("keep a transaction that uses savepoints on one shard")
}

/// A transaction with a savepoint (or an open portal) on its shard cannot go on to another.
pub fn held_to_its_shard(savepoint: bool) -> SqlError {
    let what = if savepoint {
        "a savepoint"
    } else {
        "an open portal (cursor)"
    };
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        format!("this transaction has {what} on its shard, so it cannot go on to another shard"),
    )
    .with_hint("keep a transaction that uses savepoints or cursors on one shard")
}

pub fn in_failed_transaction() -> SqlError {
    SqlError::new(
        IN_FAILED_TRANSACTION,
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

pub fn scatter_in_transaction() -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        "a read across all shards cannot run inside a transaction, which stays on one shard",
    )
    .with_hint("run it outside BEGIN ... COMMIT, or add the sharding key to read one shard")
}

pub fn ddl_in_transaction() -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        "DDL that goes to every shard cannot run inside a transaction",
    )
    .with_hint(
        "run it on its own, outside BEGIN ... COMMIT; each shard applies it in its own transaction",
    )
}

/// A merged read whose text the router could not rewrite for the shards.
pub fn cannot_rewrite(why: &str) -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        format!("this read across shards cannot be rewritten for the shards: {why}"),
    )
}

pub fn undefined_statement(name: &str) -> SqlError {
    if name.is_empty() {
        return SqlError::new(
            UNDEFINED_PREPARED_STATEMENT,
            "unnamed prepared statement does not exist",
        );
    }
    SqlError::new(
        UNDEFINED_PREPARED_STATEMENT,
        format!("prepared statement \"{name}\" does not exist"),
    )
}

pub fn duplicate_statement(name: &str) -> SqlError {
    SqlError::new(
        DUPLICATE_PREPARED_STATEMENT,
        format!("prepared statement \"{name}\" already exists"),
    )
}

/// `54000`: a session's prepared statements would hold more than `[limits] max_prepared_bytes`.
pub fn too_many_prepared_bytes(limit: usize, held: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("this session's prepared statements would hold more than {limit} bytes (limits.max_prepared_bytes); they hold {held} now"),
    )
    .with_hint("close the prepared statements the session no longer needs (Close, DEALLOCATE), or raise [limits] max_prepared_bytes in the router config")
}

/// The router's own invariant broke; the client's statement is refused rather than guessed.
pub fn internal(what: impl std::fmt::Display) -> SqlError {
    SqlError::new(INTERNAL_ERROR, format!("internal: {what}"))
}

/// `[limits] max_clients` clients were logged in when this one sent its startup message.
pub fn too_many_clients() -> SqlError {
    SqlError::fatal(TOO_MANY_CONNECTIONS, "sorry, too many clients already")
        .with_hint("raise [limits] max_clients in the router config, or use fewer connections")
}

/// `54000`: a merged read across shards would hold more than `limit` bytes in the router;
/// `setting` names the limit (`limits.max_merge_bytes` for one read,
/// `limits.merge_memory_bytes` for all reads together).
pub fn merge_memory(setting: &str, limit: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("this read across shards needs more than {limit} bytes of router memory to combine ({setting})"),
    )
    .with_hint("narrow the read (fewer or shorter groups, a LIMIT the shards can apply), or group by the shard key so that each group lives on one shard")
}

/// `54000`: a client message longer than `limits.max_message_bytes`.
pub fn message_too_long(len: usize, limit: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("a message of {len} bytes is longer than the router allows ({limit} bytes, limits.max_message_bytes); the connection is closed"),
    )
    .with_hint("send less in one message, e.g. split a long statement or use COPY for bulk data")
}

/// `54000`: a statement text (literals taken out) longer than `limits.max_plan_bytes`, which
/// the router does not parse.
pub fn too_long_to_plan(limit: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("this statement is longer without its literals than the router parses to route it ({limit} bytes, limits.max_plan_bytes)"),
    )
    .with_hint("pass long lists as one array parameter (WHERE id = ANY($1)), load bulk data with COPY, or split the statement")
}

/// `0A000`: a statement on several shards (or a cursor the router holds) after other statements
/// of its extended batch.
pub fn not_alone_in_batch() -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        "a statement on several shards must be the only statement of its batch",
    )
    .with_hint("send a Sync before and after it")
}

/// `0A000`: SQL `EXECUTE` of a prepared statement that does not run on one shard.
pub fn execute_on_several_shards(name: &str) -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        format!("prepared statement \"{name}\" does not run on one shard; EXECUTE runs statements of one shard"),
    )
    .with_hint("send the statement itself (it can then run on every shard), or give it a key")
}

/// `0A000`: FETCH, MOVE or CLOSE of a cursor the router holds, in the extended protocol.
pub fn held_cursor_in_extended() -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        "the router holds this cursor (its query reads several shards, or it is WITH HOLD), and serves its commands in the simple query protocol only",
    )
    .with_hint("send FETCH, MOVE and CLOSE as simple queries (psycopg does for cursors with text results)")
}

/// `54000`: the rows of a cursor the router holds (its query read several shards, or it is
/// `WITH HOLD`) passed `limits.max_merge_bytes`, counted over all such cursors of the session.
pub fn cursor_too_big(limit: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("the rows of this cursor do not fit in what the router holds for a session's cursors ({limit} bytes, limits.max_merge_bytes)"),
    )
    .with_hint("give the cursor's query a key (its cursor then lives on the key's shard), a LIMIT, or fewer columns; or close other cursors")
}

/// `54000`: the first stage of a read the router finishes on one shard
/// (`crate::planner::staged`) gave more than it holds.
pub fn staged_too_big(limit: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("this read needs every shard's rows of its first part in the router to finish it on one shard, and they are more than {limit} bytes (limits.max_merge_bytes)"),
    )
    .with_hint("narrow the read with a WHERE, read fewer columns, or give it a key (a read of one shard runs whole there)")
}

/// `0A000`: a read the router finishes on one shard, where columns have collations of their
/// own (which the rows carried in a VALUES list would lose).
pub fn staged_collations() -> SqlError {
    SqlError::new(
        FEATURE_NOT_SUPPORTED,
        "this read across shards would be finished on one shard over the rows of its first part, but some columns of the shards' tables have a collation of their own, which those rows would not keep (or the router has not read the catalog yet)",
    )
    .with_hint("give the read a key, or simplify it so that the router merges it itself")
}

/// `54000`: the extended-protocol messages held for one batch (until a Bind names a shard)
/// passed `limits.max_message_bytes`.
pub fn held_too_long(limit: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("the messages of this batch held before its Sync are more than {limit} bytes (limits.max_message_bytes)"),
    )
    .with_hint("send a Sync more often")
}

/// `54000`: a COPY row (split by key across shards) longer than `limits.max_message_bytes`;
/// the COPY fails on every shard and the session goes on.
pub fn copy_row_too_long(limit: usize) -> SqlError {
    SqlError::new(
        PROGRAM_LIMIT_EXCEEDED,
        format!("a COPY row is longer than the router holds ({limit} bytes, limits.max_message_bytes); nothing was copied"),
    )
}
