//! The admin console: the database `shardgate` on the router's own port, for users marked
//! `admin = true` (`psql -h ROUTER -p 6432 -U admin shardgate`). Simple queries only, one
//! command each ([`command`]): `SHOW SHARDS | POOLS | CLIENTS | SERVERS | STATS | CONFIG |
//! VERSION | HELP` ([`show`]), `RELOAD`, `PAUSE [shard]`, `RESUME [shard]`, `SHUTDOWN`.
//!
//! An admin session is a client like any other (it counts toward `max_clients`, it ends with
//! `57P01` in a drain) but never touches a shard.

pub mod command;
pub mod show;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::errors;
use crate::protocol::frontend;
use crate::protocol::reply::{self, SqlError, TxStatus};
use crate::routing::Phase;
use crate::routing::Router;
use crate::session::{ClientIo, SessionError};
use command::{Command, Show};

/// Serves an admin client until it leaves or the router closes.
pub async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    shared: Arc<Router>,
    stream: S,
    rbuf: BytesMut,
) -> Result<(), SessionError> {
    let mut client = ClientIo::new(stream, rbuf);
    let mut phase = shared.lifecycle.subscribe();
    // After an extended-protocol message (refused), everything up to Sync is skipped.
    let mut skipping = false;
    loop {
        while let Some(frame) = client
            .next_frame()
            .map_err(|e| SessionError::Protocol(e.to_string()))?
        {
            match frame[0] {
                b'Q' => {
                    let sql = frontend::query(&frame[5..])?;
                    answer(&shared, sql, &mut client.out).await;
                    reply::ready_for_query(&mut client.out, TxStatus::Idle);
                }
                b'P' | b'B' | b'D' | b'E' | b'C' | b'H' => {
                    if !skipping {
                        SqlError::new(
                            errors::FEATURE_NOT_SUPPORTED,
                            "the admin console takes simple queries only",
                        )
                        .with_hint("use psql, or your driver's simple query call")
                        .write(&mut client.out);
                        skipping = true;
                    }
                }
                b'S' => {
                    skipping = false;
                    reply::ready_for_query(&mut client.out, TxStatus::Idle);
                }
                b'X' => return Ok(()),
                other => {
                    let why = format!("invalid frontend message type {other}");
                    SqlError::fatal(errors::PROTOCOL_VIOLATION, why.clone()).write(&mut client.out);
                    let _ = client.flush().await;
                    return Err(SessionError::Protocol(why));
                }
            }
        }
        client.flush().await.map_err(SessionError::Client)?;
        let closing = |p: &Phase| *p == Phase::Closing;
        let closed = tokio::select! {
            more = client.fill() => {
                if !more.map_err(SessionError::Client)? {
                    return Ok(());
                }
                false
            }
            _ = phase.wait_for(closing) => true,
        };
        if closed {
            SqlError::fatal(
                errors::ADMIN_SHUTDOWN,
                "terminating connection due to administrator command",
            )
            .write(&mut client.out);
            let _ = client.flush().await;
            return Ok(());
        }
    }
}

/// Runs one command and writes its answer (without ReadyForQuery).
async fn answer(shared: &Router, sql: &str, out: &mut Vec<u8>) {
    let command = match command::parse(sql) {
        Ok(c) => c,
        Err(why) => {
            SqlError::new(errors::SYNTAX_ERROR, why)
                .with_hint("SHOW HELP lists the commands")
                .write(out);
            return;
        }
    };
    match command {
        Command::Show(what) => {
            let table = match what {
                Show::Shards => show::shards(shared),
                Show::Pools => show::pools(shared),
                Show::Clients => show::clients(shared),
                Show::Servers => show::servers(shared),
                Show::Stats => show::stats(shared).await,
                Show::Config => show::config(shared),
                Show::Version => show::version(),
                Show::Help => show::help(),
            };
            table.write(out);
        }
        Command::Reload => match shared.reload().await {
            Ok(done) => {
                SqlError::notice(done.summary).write(out);
                reply::command_complete(out, "RELOAD");
            }
            Err(why) => SqlError::new(
                errors::CONFIG_FILE_ERROR,
                format!("reload refused, the running config and shard map stay: {why}"),
            )
            .write(out),
        },
        Command::Pause(shard) => match pause_range(shared, shard.as_deref(), out) {
            Ok(range) => {
                shared.pauses.pause(range.as_deref());
                let left = wait_for_transactions(shared, range.as_deref()).await;
                if left > 0 {
                    SqlError::notice(format!(
                        "{left} connections to the paused shards' primaries are still in use \
                         (transactions, or other shards of the same database); new statements wait"
                    ))
                    .write(out);
                }
                reply::command_complete(out, "PAUSE");
            }
            Err(err) => err.write(out),
        },
        Command::Resume(shard) => {
            let (all, ranges) = shared.pauses.paused();
            // A range paused before a reload removed it can still be resumed by its name.
            let range = match shard.as_deref() {
                Some(r) if ranges.iter().any(|p| p == r) => Ok(Some(r.to_string())),
                named => shard_range(shared, named),
            };
            match range {
                Ok(Some(_)) if all => SqlError::new(
                    errors::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "every shard is paused (PAUSE without a shard); one shard cannot be resumed alone",
                )
                .with_hint("RESUME without a shard resumes them all; then PAUSE the ones to keep paused")
                .write(out),
                Ok(range) => {
                    shared.pauses.resume(range.as_deref());
                    reply::command_complete(out, "RESUME");
                }
                Err(err) => err.write(out),
            }
        }
        Command::Shutdown => {
            tracing::info!("SHUTDOWN from the admin console: draining");
            shared.lifecycle.advance(Phase::Draining);
            reply::command_complete(out, "SHUTDOWN");
        }
        Command::Set => reply::command_complete(out, "SET"),
        Command::Empty => reply::empty_query(out),
    }
}

/// What `PAUSE` pauses: a shard of the map, or every shard, or a range no shard has yet.
/// The last is how a split keeps its new shards paused through the reload that creates them
/// (`shardgate reshard cutover`): pauses are kept by range, so the reload finds it paused.
fn pause_range(
    shared: &Router,
    named: Option<&str>,
    out: &mut Vec<u8>,
) -> Result<Option<String>, SqlError> {
    let in_map = shard_range(shared, named);
    match (named, &in_map) {
        (Some(named), Err(_)) if named.parse::<usize>().is_err() => {
            match named.parse::<shardmap::KeyRange>() {
                // Only a part of a shard's range: what a split of that shard would bring.
                Ok(range)
                    if shared.routing().map.shards().iter().any(|s| {
                        s.range.start <= range.start && range.end_u128() <= s.range.end_u128()
                    }) =>
                {
                    SqlError::notice(format!(
                        "no shard has the range {range} in the current shard map; it is paused \
                         for when a reload brings a shard with that range"
                    ))
                    .write(out);
                    Ok(Some(range.to_string()))
                }
                _ => in_map,
            }
        }
        _ => in_map,
    }
}

/// The range of the shard an admin named (by range or by number); `None` for every shard.
fn shard_range(shared: &Router, named: Option<&str>) -> Result<Option<String>, SqlError> {
    let Some(named) = named else {
        return Ok(None);
    };
    let routing = shared.routing();
    let shards = routing.map.shards();
    let found = match named.parse::<usize>() {
        Ok(i) => shards.get(i),
        Err(_) => named
            .parse::<shardmap::KeyRange>()
            .ok()
            .and_then(|r| shards.iter().find(|s| s.range == r)),
    };
    match found {
        Some(s) => Ok(Some(s.range.to_string())),
        None => {
            let ranges: Vec<String> = shards.iter().map(|s| s.range.to_string()).collect();
            Err(SqlError::new(
                errors::UNDEFINED_OBJECT,
                format!("no shard {named:?} in the shard map"),
            )
            .with_hint(format!(
                "name a shard by its range ({}) or its number (0 to {})",
                ranges.join(", "),
                shards.len().saturating_sub(1)
            )))
        }
    }
}

/// Waits (up to the pause timeout) until no connection to the primaries of the paused shards
/// is in use (transactions, statements on several shards, checkouts under way); returns how
/// many still are. Counted per pool, so other shards in the same database count too.
async fn wait_for_transactions(shared: &Router, range: Option<&str>) -> u64 {
    let deadline = tokio::time::Instant::now() + shared.routing().config.pool.pause_timeout;
    loop {
        let routing = shared.routing();
        let primaries: Vec<String> = routing
            .map
            .shards()
            .iter()
            .filter(|s| range.is_none_or(|r| s.range.to_string() == r))
            .map(|s| s.primary.endpoint())
            .collect();
        let in_use: u64 = crate::routing::snapshot::pool_gauges(&routing)
            .iter()
            .filter(|p| primaries.contains(&p.primary))
            .map(|p| p.in_use)
            .sum();
        if in_use == 0 || tokio::time::Instant::now() >= deadline {
            return in_use;
        }
        drop(routing);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
