//! A multi-row INSERT whose rows belong to several shards: each shard gets an INSERT of its own
//! rows (cut from the client's text by the resolver; with bound parameters, renumbered and sent
//! the client's values for them), run as the parts of one write ([`super::commit`]): one shard
//! after another in shard order, committed only when every shard's INSERT succeeded, rolled
//! back everywhere otherwise. So a failing row (a duplicate key, a bad value) leaves no row
//! anywhere, as with one Postgres. Inside a transaction the parts run on the transaction's
//! connections instead, and commit with it.
//!
//! The client gets one answer ([`combine`]): one command tag with the total, and RETURNING rows
//! given back in VALUES order; in the extended protocol also the descriptions its batch asked
//! for ([`descriptions`]), put together from the parts'.

use bytes::BytesMut;

use super::commit::Parts;
use crate::backend::settings::Settings;
use crate::errors;
use crate::protocol::frame::{frames, put_frame};
use crate::protocol::frontend::Bind;
use crate::protocol::reply::SqlError;
use crate::protocol::request;
use crate::resolver::SplitInsert;
use crate::routing::Routing;

/// What each part sends its shard, in the order of `split.parts`: a Query of its INSERT, or,
/// with the client's Bind (and its statement's parameter types), Parse, Bind of the part's
/// parameters with the client's formats, Describe of the portal and of the statement, Execute
/// and Sync.
pub fn requests(
    split: &SplitInsert,
    bound: Option<(&Bind<'_>, &[u8])>,
) -> Result<Vec<(usize, Vec<u8>)>, SqlError> {
    requests_as(split, bound, false)
}

/// [`requests`], with every result column in text (`text_results`) rather than in the
/// client's formats: for rows the router reads itself.
pub fn requests_as(
    split: &SplitInsert,
    bound: Option<(&Bind<'_>, &[u8])>,
    text_results: bool,
) -> Result<Vec<(usize, Vec<u8>)>, SqlError> {
    let mut out = Vec::with_capacity(split.parts.len());
    for (p, (shard, sql)) in split.parts.iter().enumerate() {
        let mut buf = BytesMut::with_capacity(sql.len() + 64);
        // A part that writes only lookup rows has no parameters and answers nothing the
        // client sees: a Query is the least to send and to read.
        let lookup_only = split.lookup_only.get(p).copied().unwrap_or(false);
        match bound {
            None => request::query(&mut buf, sql).map_err(errors::internal)?,
            Some(_) if lookup_only => request::query(&mut buf, sql).map_err(errors::internal)?,
            Some((bind, param_types)) => {
                let picked = split.params.get(p).map_or(&[][..], Vec::as_slice);
                let values = split.values.get(p).map_or(&[][..], Vec::as_slice);
                let part = Extended {
                    picked,
                    values,
                    text_results,
                };
                extended_part(&mut buf, sql, &part, bind, param_types)?;
            }
        }
        out.push((*shard, buf.to_vec()));
    }
    Ok(out)
}

/// What one part binds: the client's parameters it uses (`picked`), values of its own for
/// some of them, and whether its results come back in text.
struct Extended<'a> {
    picked: &'a [usize],
    values: &'a [(usize, Vec<u8>)],
    text_results: bool,
}

fn extended_part(
    buf: &mut BytesMut,
    sql: &str,
    part: &Extended<'_>,
    bind: &Bind<'_>,
    param_types: &[u8],
) -> Result<(), SqlError> {
    let (picked, values_of) = (part.picked, part.values);
    let oid = |i: usize| -> [u8; 4] {
        param_types
            .get(2 + 4 * i..6 + 4 * i)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; 4])
    };
    let mut types = Vec::with_capacity(2 + 4 * picked.len());
    types.extend_from_slice(&(picked.len() as i16).to_be_bytes());
    for &i in picked {
        types.extend_from_slice(&oid(i));
    }
    request::parse(buf, "", sql, &types).map_err(errors::internal)?;
    let mut body = Vec::with_capacity(64);
    body.extend_from_slice(b"\0\0");
    body.extend_from_slice(&(picked.len() as i16).to_be_bytes());
    let mut values = Vec::new();
    for &i in picked {
        let Some((format, value)) = bind.param(i) else {
            return Err(errors::internal("a split INSERT's parameter is missing"));
        };
        let value = match values_of.iter().find(|(j, _)| *j == i) {
            Some((_, own)) => Some(&own[..]),
            None => value,
        };
        let code: i16 = if format == crate::protocol::frontend::Format::Binary {
            1
        } else {
            0
        };
        body.extend_from_slice(&code.to_be_bytes());
        match value {
            Some(v) => {
                values.extend_from_slice(&(v.len() as i32).to_be_bytes());
                values.extend_from_slice(v);
            }
            None => values.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    body.extend_from_slice(&(picked.len() as i16).to_be_bytes());
    body.extend_from_slice(&values);
    if part.text_results {
        body.extend_from_slice(&0i16.to_be_bytes());
    } else {
        body.extend_from_slice(bind.result_formats());
    }
    put_frame(buf, b'B', &body);
    request::describe_portal(buf);
    request::describe_statement(buf, "").map_err(errors::internal)?;
    request::execute(buf);
    request::sync(buf);
    Ok(())
}

/// How the whole INSERT ended.
pub enum Outcome {
    /// Every part committed: each part's reply frames (RowDescription, DataRows,
    /// CommandComplete), in the order of `parts`.
    Committed(Vec<Vec<u8>>),
    /// A part failed and nothing was committed: Postgres's ErrorResponse frame, to forward.
    RolledBack(Vec<u8>),
    /// Nothing (or, when the COMMITs failed midway, not everything) was committed, for a reason
    /// the router found.
    Failed(SqlError),
    /// It did not run, and the client has been told why already.
    Answered,
}

/// Runs the parts' `requests` (from [`requests`]), in shard order, as the module doc says.
pub async fn run(routing: &Routing, requests: &[(usize, Vec<u8>)], settings: &Settings) -> Outcome {
    run_then(
        routing,
        requests,
        settings,
        "the INSERT",
        |_| Ok(Vec::new()),
    )
    .await
}

/// [`run`], and then, in the same write, the parts that `then` makes from every part's reply
/// frames (their own replies are not returned): what a write does after it has seen what it
/// wrote (the lookup rows of the values a DELETE removed). `what` names the write in errors.
pub async fn run_then(
    routing: &Routing,
    requests: &[(usize, Vec<u8>)],
    settings: &Settings,
    what: &'static str,
    then: impl FnOnce(&[Vec<u8>]) -> Result<Vec<(usize, Vec<u8>)>, SqlError>,
) -> Outcome {
    let mut open = Parts::new(routing, settings, what);
    let mut replies = Vec::with_capacity(requests.len());
    if let Err(failed) = run_parts(&mut open, requests, &mut replies).await {
        open.rollback().await;
        return failed;
    }
    let more = match then(&replies) {
        Ok(more) => more,
        Err(e) => {
            open.rollback().await;
            return Outcome::Failed(e);
        }
    };
    if let Err(failed) = run_parts(&mut open, &more, &mut Vec::new()).await {
        open.rollback().await;
        return failed;
    }
    match open.commit().await {
        Ok(()) => Outcome::Committed(replies),
        Err(e) => Outcome::Failed(e),
    }
}

/// Begins each of `requests` as a part of `open` and reads its replies into `replies`; the
/// outcome to report (after rolling back) when one fails.
async fn run_parts(
    open: &mut Parts<'_>,
    requests: &[(usize, Vec<u8>)],
    replies: &mut Vec<Vec<u8>>,
) -> Result<(), Outcome> {
    for (shard, request) in requests {
        open.begin(*shard, request).await.map_err(Outcome::Failed)?;
        let mut frames = Vec::new();
        let mut error = None;
        let mut lost = None;
        if let Some(mut part) = open.replies() {
            loop {
                match part.next().await {
                    Ok(Some(frame)) => match frame[0] {
                        b'E' if error.is_none() => error = Some(frame.to_vec()),
                        b'T' | b'D' | b'C' | b't' | b'n' => frames.extend_from_slice(frame),
                        _ => {}
                    },
                    Ok(None) => break,
                    Err(e) => {
                        lost = Some(e);
                        break;
                    }
                }
            }
        }
        if let Some(e) = lost {
            let err = open.lost(*shard, &e);
            open.drop_last();
            return Err(Outcome::Failed(err));
        }
        if let Some(frame) = error {
            // Postgres refused the rows; every part is rolled back.
            return Err(Outcome::RolledBack(frame));
        }
        replies.push(frames);
    }
    Ok(())
}

/// The client's answer from every part's reply frames (without ReadyForQuery): the first
/// RowDescription (`with_description`: a simple query's; in the extended protocol it answers
/// the Describe instead), RETURNING rows in VALUES order (`part_of_row[i]` is the part that
/// inserted row i; each part returns its rows in its own order) and `INSERT 0 <total>`. Parts
/// that write only lookup rows (`lookup_only`) add nothing.
pub fn combine(
    replies: &[Vec<u8>],
    part_of_row: &[usize],
    lookup_only: &[bool],
    with_description: bool,
    out: &mut Vec<u8>,
) {
    let mut description: Option<&[u8]> = None;
    let mut rows: Vec<std::collections::VecDeque<&[u8]>> = vec![Default::default(); replies.len()];
    let mut total = 0;
    for (p, reply) in replies.iter().enumerate() {
        if lookup_only.get(p).copied().unwrap_or(false) {
            continue;
        }
        for frame in frames(reply).map_while(Result::ok) {
            match frame[0] {
                b'T' => {
                    description.get_or_insert(frame);
                }
                b'D' => rows[p].push_back(frame),
                b'C' => total += crate::protocol::backend::rows_in_tag(&frame[5..]),
                _ => {}
            }
        }
    }
    if let (true, Some(d)) = (with_description, description) {
        out.extend_from_slice(d);
    }
    for &p in part_of_row {
        if let Some(row) = rows.get_mut(p).and_then(|q| q.pop_front()) {
            out.extend_from_slice(row);
        }
    }
    crate::protocol::reply::command_complete(out, &format!("INSERT 0 {total}"));
}

/// The descriptions of the client's statement and portal from the parts' extended replies:
/// (ParameterDescription of every client parameter, each typed as the part that uses it was,
/// followed by the statement's RowDescription or NoData; the portal's RowDescription or NoData).
pub fn descriptions(
    replies: &[Vec<u8>],
    split: &SplitInsert,
    client_params: usize,
) -> (Vec<u8>, Vec<u8>) {
    let mut oids = vec![[0u8; 4]; client_params];
    let mut portal: Option<&[u8]> = None;
    let mut statement_rows: Option<&[u8]> = None;
    for (p, reply) in replies.iter().enumerate() {
        if split.lookup_only.get(p).copied().unwrap_or(false) {
            continue;
        }
        let mut after_params = false;
        for frame in frames(reply).map_while(Result::ok) {
            match frame[0] {
                b'T' | b'n' if !after_params => {
                    portal.get_or_insert(frame);
                }
                b'T' | b'n' => {
                    statement_rows.get_or_insert(frame);
                }
                b't' => {
                    after_params = true;
                    let picked = split.params.get(p).map_or(&[][..], Vec::as_slice);
                    for (j, &old) in picked.iter().enumerate() {
                        if let (Some(slot), Some(oid)) =
                            (oids.get_mut(old), frame.get(7 + 4 * j..11 + 4 * j))
                        {
                            slot.copy_from_slice(oid);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let no_data = || {
        let mut n = Vec::new();
        put_frame(&mut n, b'n', &[]);
        n
    };
    let mut statement = Vec::new();
    let mut body = (client_params as i16).to_be_bytes().to_vec();
    for oid in &oids {
        body.extend_from_slice(oid);
    }
    put_frame(&mut statement, b't', &body);
    statement.extend_from_slice(&statement_rows.map_or_else(no_data, <[u8]>::to_vec));
    (statement, portal.map_or_else(no_data, <[u8]>::to_vec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::put_frame;

    #[test]
    fn returning_rows_come_back_in_values_order() {
        let part = |ids: &[&str]| {
            let mut v = Vec::new();
            put_frame(&mut v, b'T', b"desc");
            for id in ids {
                put_frame(&mut v, b'D', id.as_bytes());
            }
            crate::protocol::reply::command_complete(&mut v, &format!("INSERT 0 {}", ids.len()));
            v
        };
        // Rows 0, 2, 3 went to part 0 and rows 1, 4 to part 1.
        let replies = [part(&["r0", "r2", "r3"]), part(&["r1", "r4"])];
        let mut out = Vec::new();
        combine(&replies, &[0, 1, 0, 0, 1], &[], true, &mut out);
        let got: Vec<(u8, &[u8])> = crate::protocol::frame::frames(&out)
            .map_while(Result::ok)
            .map(|f| (f[0], &f[5..]))
            .collect();
        assert_eq!(
            got,
            [
                (b'T', &b"desc"[..]),
                (b'D', b"r0"),
                (b'D', b"r1"),
                (b'D', b"r2"),
                (b'D', b"r3"),
                (b'D', b"r4"),
                (b'C', b"INSERT 0 5\0"),
            ]
        );
    }
}
