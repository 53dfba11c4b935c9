//! The session's side of statements that run on several shards (`crate::multishard` does the
//! work): DDL on every shard, reads merged from several shards, writes on several shards,
//! split INSERTs and COPY. They answer without ReadyForQuery (the caller adds it). Outside a
//! transaction each runs in transactions of its own; reads and writes inside a transaction
//! (`[transactions] cross_shard = "multi"`) run on the transaction's connections, each shard
//! joining it as it is first touched ([`super::participants`]).
//!
//! What runs is a [`Spread`], made by the executor (`super::execute`) from the statement's
//! destination: a simple Query runs it at once; in the extended protocol it must be the only
//! statement of its batch (`super::extended::spread`): from its Bind to its Sync the router
//! answers the batch's messages itself, and its Execute runs it. Either way [`Session::run_spread`]
//! is the one place that runs it.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use super::participants::Requests;
use super::spread::{Portal, Ran, Spread};
use super::{Session, SessionError};
use crate::errors;
use crate::multishard::fanout::{self, Returned};
use crate::multishard::{self, broadcast, copy_in, split_insert};
use crate::protocol::reply::{self, SqlError};
use crate::protocol::request;
use crate::resolver::{Read, SplitInsert, Write};
use crate::stats::{RouteKind, NO_SHARD};

type Receiver = tokio::sync::mpsc::Receiver<fanout::Chunk>;
type Handle = tokio::task::JoinHandle<Returned>;

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// Runs a statement on several shards and writes the client's answer, without
    /// ReadyForQuery. `request` is what each shard runs (the same for all, when the statement
    /// has one), `asked` the messages of its extended batch to answer first, and `max_rows` the
    /// row limit of its Execute (0 for none).
    pub(super) async fn run_spread(
        &mut self,
        spread: Spread,
        request: Vec<u8>,
        asked: &[u8],
        max_rows: u64,
    ) -> Result<Ran, SessionError> {
        let failed = match spread {
            Spread::Broadcast { sql } => self.run_broadcast(&sql).await,
            Spread::Read(read, portal) if read.staged.is_some() => {
                self.run_staged(read, portal, asked).await?
            }
            Spread::Read(read, Some(portal)) if max_rows > 0 => {
                self.portal_run_in_steps(read, *portal, max_rows, asked)
                    .await?
            }
            Spread::Read(read, _) => self.run_read(read, request, asked).await?,
            Spread::Write(write) => self.run_write(write, request, asked).await?,
            Spread::Split {
                split,
                requests,
                params,
            } => {
                self.run_split_insert(&split, requests, params, asked)
                    .await?
            }
            Spread::ChangesLookups {
                delete,
                requests,
                params,
            } => {
                self.run_lookup_delete(&delete, requests, params, asked)
                    .await?
            }
            Spread::CopyIn { sql, rows } => {
                self.run_copy_in(&sql, rows).await?;
                false
            }
            Spread::Declare {
                read,
                name,
                hold,
                stepwise,
            } => {
                let asked = (!asked.is_empty()).then_some(asked);
                let declared = if stepwise {
                    self.declare_stepwise(name, read, request, asked).await?
                } else {
                    self.declare_held(name, hold, read, request, asked).await?
                };
                match declared {
                    super::cursors::Declared::Done => false,
                    super::cursors::Declared::Failed => true,
                    super::cursors::Declared::Refused(err) => return Ok(Ran::Refused(err)),
                }
            }
        };
        Ok(if failed { Ran::Failed } else { Ran::Done })
    }

    /// Runs DDL on every shard and writes the client's answer; `true` when it failed.
    async fn run_broadcast(&mut self, sql: &str) -> bool {
        self.client.meter.route(RouteKind::Broadcast, NO_SHARD);
        let started = std::time::Instant::now();
        let outcomes = broadcast::run(&self.routing, sql, &self.settings).await;
        let names: Vec<String> = self
            .routing
            .map
            .shards()
            .iter()
            .map(|s| s.range.to_string())
            .collect();
        let mut out = Vec::new();
        match broadcast::combine(&outcomes, &names) {
            broadcast::Combined::Done(tags) => {
                // The DDL may have changed a sharded table's columns.
                crate::routing::catalog::learn(&self.routing).await;
                out = tags;
            }
            broadcast::Combined::PostgresError(frame) => out = frame,
            broadcast::Combined::Error(e) => {
                tracing::warn!(statement = %super::relay::truncate(sql, 300), "DDL failed on some shards: {}", e.message);
                e.write(&mut out);
            }
        }
        tracing::info!(shards = names.len(), elapsed_ms = started.elapsed().as_secs_f64() * 1e3, statement = %super::relay::truncate(sql, 300), "DDL broadcast");
        self.client.out.extend_from_slice(&out);
        out.first() == Some(&b'E')
    }

    /// A read on several shards; `Ok(true)` when it ended with an error.
    async fn run_read(
        &mut self,
        read: Read,
        request: Vec<u8>,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        self.client.meter.route(RouteKind::Scatter, NO_SHARD);
        let Some((receivers, members)) = self.fan_out(&read.shards, request, false).await? else {
            return Ok(true);
        };
        let floats = self.floats_exact();
        let failed = answer_read(
            &self.routing,
            &mut self.client,
            &read,
            receivers,
            asked,
            floats,
        )
        .await;
        self.fanned_in(members, &failed).await;
        failed.map_err(SessionError::Client)
    }

    /// A read in two stages (`crate::planner::staged`): the first on its shards, its rows kept
    /// in binary; then the rest on the first of them over those rows, bound as arrays after
    /// the client's own parameters (`multishard::staged`). Answered as a Query, or for an
    /// extended batch with the client's Bind (`portal`). `Ok(true)` when it ended with an error.
    async fn run_staged(
        &mut self,
        read: Read,
        portal: Option<Box<Portal>>,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        let Some(texts) = read.staged.clone() else {
            return Err(SessionError::Protocol(
                "internal: not a read in two stages".into(),
            ));
        };
        if !self.routing.plain_collations() {
            return Ok(self.staged_refused(asked, &errors::staged_collations()));
        }
        let shard = read.shards.first().copied().unwrap_or_default();
        // The client's parameters go to both stages, each Parse declaring every parameter's
        // type, since a stage need not use them all.
        const NONE: &[u8] = &[0, 0, 0, 0];
        let (types, params, n) = match &portal {
            Some(p) if p.param_count > 0 => match self.parameter_types(shard, p, asked).await? {
                Some(t) => (t, &p.bind_tail[..p.params_end], p.param_count),
                None => return Ok(true),
            },
            _ => (vec![0, 0], NONE, 0),
        };
        // The first stage's rows in binary: the shards' own values, whatever the settings.
        let first_sql = read.shard_sql.as_deref().unwrap_or(&texts.first);
        let binary_results = [0, 1, 0, 1];
        let tail = request::bind_tail(params, &[], &binary_results)?;
        let first = request::bound_portal(first_sql, &types, &tail)?;
        let limit = self.routing.config.limits.max_merge_bytes;
        let answer = match self.read_kept(&read, first, &[], limit).await? {
            Err(None) => return Ok(true),
            Err(Some(_)) => return Ok(self.staged_refused(asked, &errors::staged_too_big(limit))),
            Ok(answer) => answer,
        };
        if let Some(error) = crate::protocol::backend::error_frame(&answer) {
            answer_until_description(asked, &mut self.client.out);
            self.client.out.extend_from_slice(error);
            return Ok(true);
        }
        // The rows count against what all merged reads may hold until the second stage has
        // them (their copies in arrays and in the request live as long).
        let router_wide = self.routing.config.limits.merge_memory_bytes;
        let mut budget = multishard::budget::Budget::new(limit, router_wide);
        if let Err(err) = budget.hold(answer.len()) {
            return Ok(self.staged_refused(asked, &err));
        }
        let second = match multishard::staged::second_stage(&texts, &answer, n) {
            Ok(second) => second,
            Err(err) => return Ok(self.staged_refused(asked, &err)),
        };
        drop(answer);
        let request = match second_request(&second, portal.as_deref(), &types, params)? {
            Ok(request) => request,
            Err(err) => return Ok(self.staged_refused(asked, &err)),
        };
        drop(second);
        let Some((receivers, members)) = self.fan_out(&[shard], request, false).await? else {
            return Ok(true);
        };
        drop(budget);
        let gather = multishard::gather::Concat::new(asked, None).showing_params(n);
        let failed = multishard::read::concatenated(&mut self.client, receivers, gather).await;
        self.fanned_in(members, &failed).await;
        failed.map_err(SessionError::Client)
    }

    /// A read in two stages that the router refuses once it knows its rows: what the batch
    /// asked so far, the error, and the client's transaction failed (as by any error).
    /// Always `true`: it ended with an error.
    fn staged_refused(&mut self, asked: &[u8], err: &SqlError) -> bool {
        answer_until_description(asked, &mut self.client.out);
        self.refuse_here(err);
        true
    }

    /// The types of the parameters of `portal`'s statement as Postgres infers them (a Parse
    /// message's count and OIDs): the client's when it gave them all, else shard `shard`'s
    /// description of the client's text. `None` when that failed (the client has the error).
    async fn parameter_types(
        &mut self,
        shard: usize,
        portal: &Portal,
        asked: &[u8],
    ) -> Result<Option<Vec<u8>>, SessionError> {
        let given = &portal.param_types;
        let all_given = given.len() == 2 + 4 * portal.param_count
            && given[2..].chunks_exact(4).all(|oid| oid != [0; 4]);
        if all_given {
            return Ok(Some(given.clone()));
        }
        let mut describe = bytes::BytesMut::new();
        request::parse(&mut describe, "", &portal.sql, given)?;
        request::describe_statement(&mut describe, "")?;
        request::sync(&mut describe);
        let Some(answers) = self.ask_in_transaction(&[shard], describe.to_vec()).await? else {
            return Ok(None);
        };
        let answer = answers.concat();
        for frame in crate::protocol::frame::frames(&answer).map_while(Result::ok) {
            match frame[0] {
                b't' => return Ok(Some(frame[5..].to_vec())),
                b'E' => {
                    answer_until_description(asked, &mut self.client.out);
                    self.client.out.extend_from_slice(frame);
                    return Ok(None);
                }
                _ => {}
            }
        }
        errors::internal("a shard described no parameters").write(&mut self.client.out);
        Ok(None)
    }

    /// Sends `request` (a Query, or extended messages ending in Sync) to each of `shards`
    /// inside the client's transaction (each shard joins it, as for a read): each shard's
    /// answer, whole; `None` when it could not run (the client has the error). An error on a
    /// shard fails the transaction. For small answers only (a cursor's rows of one FETCH).
    pub(super) async fn ask_in_transaction(
        &mut self,
        shards: &[usize],
        request: Vec<u8>,
    ) -> Result<Option<Vec<Vec<u8>>>, SessionError> {
        // Cursor commands take no locks: every shard at once.
        let Some((receivers, members)) = self.fan_out(shards, request, false).await? else {
            return Ok(None);
        };
        let mut answers = Vec::with_capacity(receivers.len());
        for mut rx in receivers {
            let mut answer = Vec::new();
            while let Some(chunk) = rx.recv().await {
                match chunk {
                    Ok(bytes) => {
                        answer.extend_from_slice(&bytes);
                        if crate::protocol::frame::frames(&bytes)
                            .map_while(Result::ok)
                            .any(|f| f[0] == b'Z')
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        e.write(&mut answer);
                        break;
                    }
                }
            }
            answers.push(answer);
        }
        let failed = answers
            .iter()
            .any(|a| crate::protocol::backend::error_frame(a).is_some());
        self.fanned_in(members, &Ok(failed)).await;
        Ok(Some(answers))
    }

    /// A read across shards whose answer the router keeps instead of sending it (a cursor it
    /// holds), at most `limit` bytes of it: `Ok(answer)` when it ran (the answer may end in
    /// the shards' error), `Err(None)` when the client has been told why it did not run,
    /// `Err(Some(e))` when the answer was longer than `limit` (the transaction failed).
    pub(super) async fn read_kept(
        &mut self,
        read: &Read,
        request: Vec<u8>,
        asked: &[u8],
        limit: usize,
    ) -> Result<Result<Vec<u8>, Option<SqlError>>, SessionError> {
        self.client.meter.route(RouteKind::Scatter, NO_SHARD);
        let Some((receivers, members)) = self.fan_out(&read.shards, request, false).await? else {
            return Ok(Err(None));
        };
        let mut kept =
            super::client::ClientIo::new(super::cursors::Keep::new(limit), bytes::BytesMut::new());
        let floats = self.floats_exact();
        let failed = answer_read(&self.routing, &mut kept, read, receivers, asked, floats).await;
        let failed = match failed {
            Ok(failed) => kept.flush().await.map(|()| failed),
            Err(e) => Err(e),
        };
        self.fanned_in(members, &failed).await;
        Ok(match failed {
            Ok(_) => Ok(kept.into_stream().into_bytes()),
            Err(_) => Err(Some(errors::cursor_too_big(limit))),
        })
    }

    /// Sends `request` to each of `shards`: in the client's transaction when one is open (the
    /// handles give its connections back), else each on a pooled connection of its own.
    /// `None` when it cannot run: the client has the error.
    async fn fan_out(
        &mut self,
        shards: &[usize],
        request: Vec<u8>,
        ordered: bool,
    ) -> Result<Option<(Vec<Receiver>, Vec<Handle>)>, SessionError> {
        if !self.state.in_transaction() {
            let receivers = fanout::start(&self.routing, shards, request, &self.settings);
            return Ok(Some((receivers, Vec::new())));
        }
        match self.lend(shards, Requests::Same(Arc::new(request))).await? {
            Some(members) => Ok(Some(fanout::start_in_transaction(
                &self.routing,
                members,
                &self.settings,
                ordered,
            ))),
            None => Ok(None),
        }
    }

    /// The transaction's part on each of `shards` ([`Session::enlist`]), once what was sent on
    /// the pinned connection has its answers; `None` when something failed (the client has the
    /// error, and the transaction failed).
    async fn lend(
        &mut self,
        shards: &[usize],
        requests: Requests,
    ) -> Result<Option<Vec<fanout::Member>>, SessionError> {
        if !self.bring_in_step().await? {
            return Ok(None);
        }
        match self.enlist(shards, requests) {
            Ok(members) => Ok(Some(members)),
            Err(err) => {
                err.write(&mut self.client.out);
                self.state.refused();
                Ok(None)
            }
        }
    }

    /// The transaction's connections back from [`Session::fan_out`]; a statement that failed,
    /// or a connection that broke, fails the transaction, as an error does on Postgres.
    async fn fanned_in(&mut self, members: Vec<Handle>, failed: &std::io::Result<bool>) {
        if members.is_empty() {
            return;
        }
        let all_back = self.rejoin(members).await;
        if !all_back || !matches!(failed, Ok(false)) {
            self.state.refused();
        }
    }

    /// A write on several shards; `Ok(true)` when it ended with an error.
    async fn run_write(
        &mut self,
        write: Write,
        request: Vec<u8>,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        self.client
            .meter
            .route(RouteKind::MultiShardWrite, NO_SHARD);
        let Write {
            shards, replicas, ..
        } = write;
        if self.state.in_transaction() {
            // Inside the client's transaction, which commits or rolls back as a whole.
            let Some((receivers, members)) = self.fan_out(&shards, request, true).await? else {
                return Ok(true);
            };
            let mut gather = multishard::gather::Concat::new(asked, None);
            if replicas {
                gather = gather.replicas();
            }
            let failed = multishard::read::concatenated(&mut self.client, receivers, gather).await;
            self.fanned_in(members, &failed).await;
            return failed.map_err(SessionError::Client);
        }
        multishard::write::run(
            &self.routing,
            &self.settings,
            &mut self.client,
            &shards,
            &request,
            asked,
            replicas,
        )
        .await
        .map_err(SessionError::Client)
    }

    /// A multi-row INSERT split by shard, its parts' `requests` from
    /// [`split_insert::requests`]; `Ok(true)` when it failed. In the extended protocol
    /// (`extended`: the client's parameter count) the batch's `asked` messages are answered.
    async fn run_split_insert(
        &mut self,
        split: &SplitInsert,
        requests: Result<Vec<(usize, Vec<u8>)>, SqlError>,
        extended: Option<usize>,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        self.client
            .meter
            .route(RouteKind::MultiShardWrite, NO_SHARD);
        let outcome = match requests {
            Err(err) => split_insert::Outcome::Failed(err),
            Ok(requests) if self.state.in_transaction() => {
                if split.writes_lookups {
                    self.state.writes_lookups();
                }
                self.split_in_transaction(requests).await?
            }
            Ok(requests) => split_insert::run(&self.routing, &requests, &self.settings).await,
        };
        let out = &mut self.client.out;
        let answered_to = |out: &mut Vec<u8>| answer_until_description(asked, out);
        match outcome {
            split_insert::Outcome::Committed(replies) => {
                if let Some(params) = extended {
                    let (statement, portal) = split_insert::descriptions(&replies, split, params);
                    multishard::gather::answer_asked(out, asked, &statement, &portal);
                }
                split_insert::combine(
                    &replies,
                    &split.part_of_row,
                    &split.lookup_only,
                    extended.is_none(),
                    out,
                );
                Ok(false)
            }
            split_insert::Outcome::RolledBack(frame) => {
                answered_to(out);
                out.extend_from_slice(&frame);
                Ok(true)
            }
            split_insert::Outcome::Failed(err) => {
                answered_to(out);
                err.write(out);
                Ok(true)
            }
            split_insert::Outcome::Answered => Ok(true),
        }
    }

    /// The parts of a split INSERT inside the client's transaction, on its connections: each
    /// part's reply frames, or the first error (which fails the transaction).
    pub(super) async fn split_in_transaction(
        &mut self,
        requests: Vec<(usize, Vec<u8>)>,
    ) -> Result<split_insert::Outcome, SessionError> {
        let shards: Vec<usize> = requests.iter().map(|(s, _)| *s).collect();
        let each = requests.into_iter().map(|(_, r)| Arc::new(r)).collect();
        let Some(members) = self.lend(&shards, Requests::Each(each)).await? else {
            return Ok(split_insert::Outcome::Answered);
        };
        let (receivers, handles) =
            fanout::start_in_transaction(&self.routing, members, &self.settings, true);
        let mut replies = Vec::with_capacity(receivers.len());
        let mut failed: Option<split_insert::Outcome> = None;
        for mut rx in receivers {
            let mut frames_of_part = Vec::new();
            'part: while let Some(chunk) = rx.recv().await {
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(err) => {
                        failed.get_or_insert(split_insert::Outcome::Failed(err));
                        break;
                    }
                };
                for frame in crate::protocol::frame::frames(&chunk).map_while(Result::ok) {
                    match frame[0] {
                        b'E' => {
                            failed.get_or_insert(split_insert::Outcome::RolledBack(frame.to_vec()));
                        }
                        b'T' | b'D' | b'C' | b't' | b'n' => frames_of_part.extend_from_slice(frame),
                        b'Z' => break 'part,
                        _ => {}
                    }
                }
            }
            replies.push(frames_of_part);
        }
        let outcome = failed.unwrap_or(split_insert::Outcome::Committed(replies));
        let ok = matches!(outcome, split_insert::Outcome::Committed(_));
        self.fanned_in(handles, &Ok(!ok)).await;
        Ok(outcome)
    }

    async fn run_copy_in(
        &mut self,
        sql: &str,
        rows: crate::planner::CopyRows,
    ) -> Result<(), SessionError> {
        self.client
            .meter
            .route(RouteKind::MultiShardWrite, NO_SHARD);
        let (routing, settings, client) = (&self.routing, &self.settings, &mut self.client);
        match rows {
            crate::planner::CopyRows::ByKey { key_type, format } => {
                copy_in::run(routing, settings, client, sql, key_type, format).await
            }
            crate::planner::CopyRows::ToEveryShard => {
                crate::multishard::copy_reference::run(routing, settings, client, sql).await
            }
        }
        .map_err(|e| match e {
            copy_in::ClientFailed::Io(e) => SessionError::Client(e),
            copy_in::ClientFailed::Protocol(why) => SessionError::Protocol(why),
            copy_in::ClientFailed::TooLong { len, limit } => SessionError::TooLong { len, limit },
        })
    }
}

/// The second stage's request: its text, parsed with the statement's parameter types (`types`,
/// a Parse's count and OIDs) and then the arrays', bound with the client's parameters
/// (`params`) and the arrays, answered in the client's result formats (`portal`'s; text for a
/// Query). `Err` inside when the parameters are more than a Bind takes.
fn second_request(
    second: &multishard::staged::SecondStage,
    portal: Option<&Portal>,
    types: &[u8],
    params: &[u8],
) -> Result<Result<Vec<u8>, SqlError>, SessionError> {
    let n = portal.map_or(0, |p| p.param_count);
    let Ok(count) = i16::try_from(n + second.types.len()) else {
        return Ok(Err(SqlError::new(
            errors::PROGRAM_LIMIT_EXCEEDED,
            "a read finished on one shard needs a parameter per column of its first part after the statement's own, and they are more than 32767",
        )));
    };
    let mut all_types = Vec::with_capacity(types.len() + 4 * second.types.len());
    all_types.extend_from_slice(&count.to_be_bytes());
    all_types.extend_from_slice(types.get(2..).unwrap_or_default());
    for oid in &second.types {
        all_types.extend_from_slice(&oid.to_be_bytes());
    }
    Ok(Ok(match portal {
        Some(p) => {
            let tail = request::bind_tail(params, &second.arrays, &p.bind_tail[p.params_end..])?;
            request::bound(&second.sql, &all_types, &tail)?
        }
        None => {
            let tail = request::bind_tail(params, &second.arrays, &[0, 0])?;
            request::bound_portal(&second.sql, &all_types, &tail)?
        }
    }))
}

/// Before an error, what an extended batch asked that needs no description (`asked`, as
/// [`ScatterBatch`](super::spread::ScatterBatch) keeps it): its ParseComplete and BindComplete.
pub(super) fn answer_until_description(asked: &[u8], out: &mut Vec<u8>) {
    for &k in asked {
        match k {
            b'P' => reply::parse_complete(out),
            b'B' => reply::bind_complete(out),
            _ => break,
        }
    }
}

/// Sends `client` the answer of a read across shards, from the shards' `receivers`: merged as
/// `read.merge` says, or concatenated. `Ok(true)` when it ended with an error.
async fn answer_read<C: AsyncRead + AsyncWrite + Unpin>(
    routing: &crate::routing::Routing,
    client: &mut super::client::ClientIo<C>,
    read: &Read,
    receivers: Vec<Receiver>,
    asked: &[u8],
    floats_exact: bool,
) -> std::io::Result<bool> {
    match &read.merge {
        Some(plan) => {
            let m = multishard::merged::Merging {
                plan,
                limit: read.limit,
                offset: read.offset,
                asked,
                text_bytewise: routing.text_bytewise(),
                floats_exact,
                max_groups: routing.config.limits.max_merge_groups,
                max_bytes: routing.config.limits.max_merge_bytes,
                router_bytes: routing.config.limits.merge_memory_bytes,
            };
            multishard::merged::run(client, receivers, &m).await
        }
        None => {
            let labels: Option<Vec<String>> = read.labels.then(|| {
                read.shards
                    .iter()
                    .map(|&s| {
                        let shard = &routing.map.shards()[s];
                        format!("shard {} ({})", shard.range, shard.primary.endpoint())
                    })
                    .collect()
            });
            let mut gather = multishard::gather::Concat::new(asked, read.limit);
            if let Some(labels) = &labels {
                gather = gather.with_labels(labels);
            }
            multishard::read::concatenated(client, receivers, gather).await
        }
    }
}
