//! Reads across shards that the merge engine combines ([`crate::merge`]): sorted streams merged
//! row by row as they arrive, or groups (and rows of aggregates) combined once every shard has
//! answered, then sorted, skipped and limited as the client asked.
//!
//! The descriptions the client sees come from shard 0, rewritten where the answer's columns
//! differ from the shards' (an `avg` asked of the shards as `sum` and `count`). Whatever the
//! engine cannot merge exactly is an error before any row, never a wrong answer.

use std::collections::VecDeque;

use tokio::sync::mpsc;

use super::budget::Budget;
use super::client::Client;
use super::fanout::Chunk;
use super::gather::answer_asked;
use crate::errors;
use crate::merge::{self, GroupMerge, MergeError};
use crate::planner::MergePlan;
use crate::protocol::frame::{frames, put_frame};
use crate::protocol::reply::{self, SqlError};

/// Why a merged read stopped early: a shard's own ErrorResponse, the router's error, or the
/// client going away.
enum Failure {
    Frame(Vec<u8>),
    Router(SqlError),
    Client(std::io::Error),
}

impl From<MergeError> for Failure {
    fn from(e: MergeError) -> Failure {
        // Arithmetic limits are data errors, as Postgres reports them; the rest is a shape or a
        // type the router cannot merge exactly.
        let code = if e.message().contains("out of range") {
            errors::NUMERIC_VALUE_OUT_OF_RANGE
        } else {
            errors::FEATURE_NOT_SUPPORTED
        };
        Failure::Router(SqlError::new(
            code,
            format!("cannot merge the shards' answers: {}", e.message()),
        ))
    }
}

/// What shard 0 described: for the extended protocol its answers to Describe statement (`t`,
/// then `T` or `n`) and Describe portal; for a simple query its RowDescription.
#[derive(Default)]
struct Descriptions {
    statement: Vec<u8>,
    portal: Vec<u8>,
    simple: Vec<u8>,
    seen: usize,
}

/// One shard's rows as they arrive.
struct Stream {
    rx: mpsc::Receiver<Chunk>,
    rows: VecDeque<Vec<u8>>,
    /// The bytes of `rows`.
    held: usize,
    done: bool,
}

impl Stream {
    fn pop(&mut self) -> Option<Vec<u8>> {
        let row = self.rows.pop_front()?;
        self.held -= row.len();
        Some(row)
    }
}

/// The bytes every stream holds, as the budget sees them.
fn held(streams: &[Stream]) -> usize {
    streams.iter().map(|s| s.held).sum()
}

impl Stream {
    /// Receives until a row is buffered or the shard is done; shard 0 also fills `desc`.
    /// `true` when something was received (the bytes held may have grown).
    async fn fill(
        &mut self,
        desc: Option<&mut Descriptions>,
        extended: bool,
    ) -> Result<bool, Failure> {
        let mut desc = desc;
        let mut received = false;
        while self.rows.is_empty() && !self.done {
            let chunk = match self.rx.recv().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => return Err(Failure::Router(e)),
                None => {
                    return Err(Failure::Router(SqlError::new(
                        errors::CONNECTION_FAILURE,
                        "internal: a shard's read ended early",
                    )))
                }
            };
            received = true;
            for frame in frames(&chunk).map_while(Result::ok) {
                match frame[0] {
                    b'D' => {
                        self.held += frame.len();
                        self.rows.push_back(frame.to_vec());
                    }
                    b'E' => return Err(Failure::Frame(frame.to_vec())),
                    b'Z' => self.done = true,
                    b't' | b'T' | b'n' => {
                        if let Some(d) = desc.as_deref_mut() {
                            if !extended {
                                d.simple.extend_from_slice(frame);
                            } else if frame[0] == b't' || d.seen == 0 {
                                d.statement.extend_from_slice(frame);
                                d.seen += usize::from(frame[0] != b't');
                            } else {
                                d.portal.extend_from_slice(frame);
                                d.seen += 1;
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(received)
    }
}

/// What a merge needs to know besides the shards' answers.
pub struct Merging<'a> {
    pub plan: &'a MergePlan,
    pub limit: Option<u64>,
    pub offset: u64,
    /// The extended batch's messages to answer (empty for a simple query).
    pub asked: &'a [u8],
    /// Text compares by bytes on the shards (their collation is C).
    pub text_bytewise: bool,
    /// The session's `extra_float_digits` is above 0, so the floats the shards print are their
    /// exact values and sums of them can be merged.
    pub floats_exact: bool,
    /// The most groups the router may hold while it combines them.
    pub max_groups: usize,
    /// The most bytes this read may hold (`limits.max_merge_bytes`).
    pub max_bytes: usize,
    /// The most bytes all merged reads may hold (`limits.merge_memory_bytes`).
    pub router_bytes: usize,
}

/// Runs a merged read (see the module doc) over the shards' answers and writes the client's
/// answer without ReadyForQuery; `Ok(true)` when it ended with an error.
pub async fn run<C: Client>(
    client: &mut C,
    receivers: Vec<mpsc::Receiver<Chunk>>,
    m: &Merging<'_>,
) -> std::io::Result<bool> {
    let mut streams: Vec<Stream> = receivers
        .into_iter()
        .map(|rx| Stream {
            rx,
            rows: VecDeque::new(),
            held: 0,
            done: false,
        })
        .collect();
    let extended = !m.asked.is_empty();
    let mut budget = Budget::new(m.max_bytes, m.router_bytes);
    let result = match start_streams(&mut streams, extended).await {
        Err(e) => Err(e),
        Ok(desc) => {
            let shards = Shards {
                streams: &mut streams,
                budget: &mut budget,
                desc,
                m,
            };
            if m.plan.group.is_some() {
                grouped(client, shards).await
            } else {
                sorted(client, shards).await
            }
        }
    };
    // The read's bytes go back to the router-wide budget before the client is answered.
    drop(budget);
    drop(streams);
    match result {
        Ok(()) => Ok(false),
        Err(Failure::Frame(frame)) => {
            client.out().extend_from_slice(&frame);
            Ok(true)
        }
        Err(Failure::Router(err)) => {
            err.write(client.out());
            Ok(true)
        }
        Err(Failure::Client(e)) => Err(e),
    }
}

/// The first answer of every shard, with shard 0's descriptions.
async fn start_streams(streams: &mut [Stream], extended: bool) -> Result<Descriptions, Failure> {
    let mut desc = Descriptions::default();
    for (i, s) in streams.iter_mut().enumerate() {
        s.fill((i == 0).then_some(&mut desc), extended).await?;
    }
    Ok(desc)
}

/// What a merge runs over: the shards' streams of rows, the bytes they hold, shard 0's
/// descriptions, and how to merge.
struct Shards<'r> {
    streams: &'r mut [Stream],
    budget: &'r mut Budget,
    desc: Descriptions,
    m: &'r Merging<'r>,
}

async fn flush_if_full<C: Client>(client: &mut C) -> Result<(), Failure> {
    client.flush_if_full().await.map_err(Failure::Client)
}

/// Sorted streams merged: the shards' rows in the read's order, past its offset, up to its
/// limit.
async fn sorted<C: Client>(client: &mut C, shards: Shards<'_>) -> Result<(), Failure> {
    let (streams, budget, desc, m) = (shards.streams, shards.budget, shards.desc, shards.m);
    let (plan, limit, offset, asked) = (m.plan, m.limit, m.offset, m.asked);
    let extended = !asked.is_empty();
    let row_description = if extended { &desc.portal } else { &desc.simple };
    let columns = match row_description.first() {
        Some(b'T') => merge::columns(&row_description[5..])?,
        _ => Vec::new(),
    };
    let order = sort_keys(plan, &columns, m.text_bytewise).map_err(Failure::Router)?;
    // Every shard's first rows are buffered now.
    budget.hold(held(streams)).map_err(Failure::Router)?;
    if extended {
        answer_asked(client.out(), asked, &desc.statement, &desc.portal);
    } else {
        client.out().extend_from_slice(&desc.simple);
    }
    let (mut skipped, mut sent) = (0u64, 0u64);
    while limit.is_none_or(|l| sent < l) {
        // The stream whose next row comes first (the lowest shard among equals, so rows of
        // equal keys keep shard order).
        let mut best: Option<usize> = None;
        for (i, s) in streams.iter().enumerate() {
            let Some(row) = s.rows.front() else { continue };
            let better = match best.and_then(|b| streams[b].rows.front()) {
                None => true,
                Some(current) => {
                    merge::compare_rows(&row[5..], &current[5..], &order, &columns)?.is_lt()
                }
            };
            if better {
                best = Some(i);
            }
        }
        let Some(i) = best else { break };
        if let Some(row) = streams[i].pop() {
            if skipped < offset {
                skipped += 1;
            } else {
                client.out().extend_from_slice(&row);
                sent += 1;
            }
        }
        if streams[i].fill(None, extended).await? {
            // Once per chunk a shard sent, not per row.
            budget.hold(held(streams)).map_err(Failure::Router)?;
        }
        flush_if_full(client).await?;
    }
    reply::command_complete(client.out(), &format!("SELECT {sent}"));
    Ok(())
}

/// The `ORDER BY` keys of a sorted read in the answer's columns (keys known by name found
/// there), once checked to be sortable by the router.
pub fn sort_keys(
    plan: &MergePlan,
    columns: &[merge::Column],
    text_bytewise: bool,
) -> Result<Vec<merge::SortKey>, SqlError> {
    let mut order = plan.order.clone();
    for (i, name) in &plan.order_names {
        let mut named = columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.name == name.as_bytes());
        match (named.next(), named.next(), order.get_mut(*i)) {
            (Some((column, _)), None, Some(key)) => key.column = column,
            _ => {
                return Err(SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    format!(
                    "ORDER BY {name} across shards: the answer has no single column of that name"
                ),
                ))
            }
        }
    }
    merge::check_sortable(&order, columns, text_bytewise).map_err(|e| match Failure::from(e) {
        Failure::Router(e) => e,
        _ => errors::internal("a merge error that is not the router's"),
    })?;
    Ok(order)
}

/// Groups combined: every shard's partial groups folded into one answer, then sorted, cut
/// and sent.
async fn grouped<C: Client>(client: &mut C, shards: Shards<'_>) -> Result<(), Failure> {
    let (streams, budget, desc, m) = (shards.streams, shards.budget, shards.desc, shards.m);
    let (plan, limit, offset, asked) = (m.plan, m.limit, m.offset, m.asked);
    let extended = !asked.is_empty();
    let out = plan.group.clone().unwrap_or_default();
    let bytewise = m.text_bytewise;
    let avg_names: Vec<&[u8]> = plan.avg_names.iter().map(|n| n.as_bytes()).collect();
    // The client's RowDescription for one of shard 0's.
    let rewrite = |frame: &[u8]| -> Result<Vec<u8>, Failure> {
        let cols = merge::columns(&frame[5..])?;
        let body = GroupMerge::new(out.clone(), cols, bytewise)?.row_description(&avg_names)?;
        let mut v = Vec::with_capacity(body.len() + 5);
        put_frame(&mut v, b'T', &body);
        Ok(v)
    };
    let rewrite_all = |described: &[u8]| -> Result<Vec<u8>, Failure> {
        let mut v = Vec::with_capacity(described.len());
        for frame in frames(described).map_while(Result::ok) {
            if frame[0] == b'T' {
                v.extend_from_slice(&rewrite(frame)?);
            } else {
                v.extend_from_slice(frame);
            }
        }
        Ok(v)
    };
    let row_description = if extended { &desc.portal } else { &desc.simple };
    if row_description.first() != Some(&b'T') {
        return Err(Failure::Router(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "internal: the shards did not describe their rows",
        )));
    }
    let mut groups = GroupMerge::new(
        out.clone(),
        merge::columns(&row_description[5..])?,
        bytewise,
    )?;
    if !m.floats_exact && groups.sums_floats() {
        return Err(Failure::Router(SqlError::new(
            errors::FEATURE_NOT_SUPPORTED,
            "sum() or avg() of float values across shards needs extra_float_digits above 0 (the default, 1): with less the shards print rounded values; SET extra_float_digits = 1",
        )));
    }
    let (statement, portal, simple) = (
        rewrite_all(&desc.statement)?,
        rewrite_all(&desc.portal)?,
        rewrite_all(&desc.simple)?,
    );
    for s in streams.iter_mut() {
        loop {
            while let Some(row) = s.pop() {
                groups.fold(&row[5..])?;
            }
            // Checked once per chunk of a shard's answer, not per row.
            budget.hold(groups.held_bytes()).map_err(Failure::Router)?;
            let max = m.max_groups;
            if groups.groups() > max {
                return Err(Failure::Router(
                        SqlError::new(
                            errors::PROGRAM_LIMIT_EXCEEDED,
                            format!("this read across shards has more than {max} groups to combine (limits.max_merge_groups)"),
                        )
                        .with_hint("narrow the read, or group by the shard key so that each group lives on one shard and can be read shard by shard"),
                    ));
            }
            if s.done {
                break;
            }
            s.fill(None, extended).await?;
        }
    }
    let rows = groups.finish_rows(&plan.order)?;
    if extended {
        answer_asked(client.out(), asked, &statement, &portal);
    } else {
        client.out().extend_from_slice(&simple);
    }
    let mut sent = 0u64;
    // Each row is freed once it is written, so the answer is not held twice.
    for row in rows
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX)))
    {
        crate::merge::write_data_row_frame(&row, client.out());
        sent += 1;
        flush_if_full(client).await?;
    }
    reply::command_complete(client.out(), &format!("SELECT {sent}"));
    Ok(())
}
