//! A multi-row INSERT whose rows belong to several shards: each shard gets an INSERT of its own
//! rows (cut from the client's text by the resolver), run as the parts of one write
//! ([`super::commit`]): one shard after another in shard order, committed only when every
//! shard's INSERT succeeded, rolled back everywhere otherwise. So a failing row (a duplicate
//! key, a bad value) leaves no row anywhere, as with one Postgres.
//!
//! The client gets one answer ([`combine`]): one command tag with the total, and RETURNING rows
//! given back in VALUES order.

use bytes::BytesMut;

use super::commit::Parts;
use crate::errors;
use crate::protocol::reply::SqlError;
use crate::protocol::request;
use crate::server::Routing;
use crate::session::Settings;

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
}

/// Runs `parts` (shard, INSERT text), in shard order, as the module doc says.
pub async fn run(routing: &Routing, parts: &[(usize, String)], settings: &Settings) -> Outcome {
    let mut open = Parts::new(routing, settings, "the INSERT");
    let mut replies = Vec::with_capacity(parts.len());
    for (shard, sql) in parts {
        let mut request = BytesMut::with_capacity(sql.len() + 6);
        if let Err(e) = request::query(&mut request, sql) {
            open.rollback().await;
            return Outcome::Failed(errors::internal(e));
        }
        if let Err(e) = open.begin(*shard, &request).await {
            open.rollback().await;
            return Outcome::Failed(e);
        }
        let mut frames = Vec::new();
        let mut error = None;
        let mut lost = None;
        if let Some(mut part) = open.replies() {
            loop {
                match part.next().await {
                    Ok(Some(frame)) => match frame[0] {
                        b'E' if error.is_none() => error = Some(frame.to_vec()),
                        b'T' | b'D' | b'C' => frames.extend_from_slice(frame),
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
            open.rollback().await;
            return Outcome::Failed(err);
        }
        if let Some(frame) = error {
            // Postgres refused the rows; every part is rolled back.
            open.rollback().await;
            return Outcome::RolledBack(frame);
        }
        replies.push(frames);
    }
    match open.commit().await {
        Ok(()) => Outcome::Committed(replies),
        Err(e) => Outcome::Failed(e),
    }
}

/// The client's answer from every part's reply frames (without ReadyForQuery): the first
/// RowDescription, RETURNING rows in VALUES order (`part_of_row[i]` is the part that inserted
/// row i; each part returns its rows in its own order) and `INSERT 0 <total>`.
pub fn combine(replies: &[Vec<u8>], part_of_row: &[usize], out: &mut Vec<u8>) {
    use crate::protocol::frame::frames;
    let mut description: Option<&[u8]> = None;
    let mut rows: Vec<std::collections::VecDeque<&[u8]>> = vec![Default::default(); replies.len()];
    let mut total = 0;
    for (p, reply) in replies.iter().enumerate() {
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
    if let Some(d) = description {
        out.extend_from_slice(d);
    }
    for &p in part_of_row {
        if let Some(row) = rows.get_mut(p).and_then(|q| q.pop_front()) {
            out.extend_from_slice(row);
        }
    }
    crate::protocol::reply::command_complete(out, &format!("INSERT 0 {total}"));
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
        combine(&replies, &[0, 1, 0, 0, 1], &mut out);
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
