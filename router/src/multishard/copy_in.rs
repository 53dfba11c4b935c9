//! COPY FROM STDIN into a sharded table, split by key: the client's rows are cut out of its
//! CopyData ([`crate::protocol::copy`]), each row's bytes go unchanged to the shard that owns
//! its key, and each shard runs the client's COPY statement in its own transaction. The client
//! gets one answer with the summed row count.
//!
//! A key that cannot be read fails the whole COPY: every shard's COPY is failed on purpose and
//! nothing is committed. A shard that refuses its rows (a duplicate key) is named; the other
//! shards keep theirs.

use bytes::BytesMut;

use super::broadcast::{self, Combined, Outcome};
use super::client::{Client, ClientError};
use crate::backend::pool::{discard, PooledConn};
use crate::backend::settings::Settings;
use crate::errors;
use crate::protocol::backend::{error_fields, rows_in_tag};
use crate::protocol::copy::{key_of, Format, Rows};
use crate::protocol::frame::put_frame;
use crate::protocol::reply::{self, SqlError};
use crate::protocol::request;
use crate::routing::Routing;

/// Rows are sent to a shard in CopyData messages of about this size.
const BATCH: usize = 64 * 1024;

/// Why a COPY ended the session: the client left, or broke the protocol.
#[derive(Debug)]
pub enum ClientFailed {
    Io(std::io::Error),
    Protocol(String),
    /// A message longer than `limits.max_message_bytes`.
    TooLong {
        len: usize,
        limit: usize,
    },
}

/// Runs the client's COPY FROM STDIN statement `sql` split by key, and writes the client's
/// answer without ReadyForQuery.
pub async fn run<C: Client>(
    routing: &Routing,
    settings: &Settings,
    client: &mut C,
    sql: &str,
    key_type: shardmap::KeyType,
    format: Format,
) -> Result<(), ClientFailed> {
    copy_in_response(client, &format)
        .await
        .map_err(ClientFailed::Io)?;
    let mut split = Split {
        routing,
        settings,
        sql,
        key_type,
        targets: (0..routing.map.shards().len()).map(|_| None).collect(),
        rows: Rows::new(format),
        format,
        header: None,
        failure: None,
        batch: Vec::new(),
    };
    let client_failed = match split.read(client).await {
        Ok(failed) => failed,
        Err(why) => {
            // The client leaving or breaking the protocol mid-COPY commits nothing anywhere:
            // every shard's COPY is abandoned with its connection (Postgres rolls it back).
            for t in split.targets.iter_mut().flatten() {
                t.abandon();
            }
            return Err(why);
        }
    };
    split.finish(client_failed, client.out()).await;
    Ok(())
}

/// The client's next message during COPY; its leaving or breaking the protocol ends it.
pub(super) async fn next_frame<C: Client>(client: &mut C) -> Result<BytesMut, ClientFailed> {
    match client.read_frame().await {
        Ok(Some(frame)) => Ok(frame),
        Ok(None) => Err(ClientFailed::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the client left during COPY",
        ))),
        Err(ClientError::Io(e)) => Err(ClientFailed::Io(e)),
        Err(ClientError::Protocol(e)) => Err(ClientFailed::Protocol(e.to_string())),
        Err(ClientError::TooLong { len, limit }) => Err(ClientFailed::TooLong { len, limit }),
    }
}

/// The client's reason in its CopyFail `frame`.
pub(super) fn copy_fail_message(frame: &[u8]) -> String {
    let body = frame.get(5..).unwrap_or_default();
    let why = body.strip_suffix(b"\0").unwrap_or(body);
    String::from_utf8_lossy(why).into_owned()
}

/// A message a client may not send during COPY FROM STDIN.
pub(super) fn unexpected(tag: u8) -> ClientFailed {
    ClientFailed::Protocol(format!(
        "unexpected message type {} during COPY from stdin",
        tag as char
    ))
}

/// CopyInResponse: text format, one text column per listed column.
async fn copy_in_response<C: Client>(client: &mut C, format: &Format) -> std::io::Result<()> {
    let mut g = Vec::with_capacity(8 + 2 * format.columns);
    g.push(0);
    g.extend_from_slice(&(format.columns as i16).to_be_bytes());
    for _ in 0..format.columns {
        g.extend_from_slice(&0i16.to_be_bytes());
    }
    put_frame(client.out(), b'G', &g);
    client.flush().await
}

/// A COPY under way: the client's rows cut out of its CopyData and sent to their shards.
struct Split<'r> {
    routing: &'r Routing,
    settings: &'r Settings,
    sql: &'r str,
    key_type: shardmap::KeyType,
    format: Format,
    /// Each shard's COPY, once a row went to it.
    targets: Vec<Option<CopyTarget>>,
    rows: Rows,
    /// The header line (`HEADER`), sent in front of every shard's rows.
    header: Option<Vec<u8>>,
    /// The router's error that fails the whole COPY (a key it cannot read, a shard it cannot
    /// reach, a row too long): rows after it are dropped.
    failure: Option<SqlError>,
    /// Rows cut out of the last message, not yet sent.
    batch: Vec<Vec<u8>>,
}

impl Split<'_> {
    /// Reads the client's COPY messages to its CopyDone (`Ok(None)`) or CopyFail
    /// (`Ok(Some(its message))`), sending each row to its shard on the way.
    async fn read<C: Client>(&mut self, client: &mut C) -> Result<Option<String>, ClientFailed> {
        loop {
            let frame = next_frame(client).await?;
            let tag = frame[0];
            let batch = &mut self.batch;
            match tag {
                b'd' => {
                    self.rows.feed(&frame[5..], |row| batch.push(row.to_vec()));
                    // A row that never ends would grow without bound: it is bounded like a
                    // message.
                    if self.rows.pending_len() > client.max_message() {
                        self.rows.abandon();
                        let limit = client.max_message();
                        self.failure
                            .get_or_insert_with(|| errors::copy_row_too_long(limit));
                    }
                }
                b'c' => self.rows.finish(|row| batch.push(row.to_vec())),
                b'f' => return Ok(Some(copy_fail_message(&frame))),
                b'H' | b'S' => {}
                other => return Err(unexpected(other)),
            }
            self.route_rows().await;
            if tag == b'c' {
                return Ok(None);
            }
        }
    }

    /// Sends the rows of the batch to the shards of their keys, opening a shard's COPY at its
    /// first row.
    async fn route_rows(&mut self) {
        let map = &self.routing.map;
        // Taken out while rows go (a shard's COPY is opened on the way), and given back empty
        // with its room.
        let mut batch = std::mem::take(&mut self.batch);
        for row in batch.drain(..) {
            if self.failure.is_some() {
                continue;
            }
            if self.format.header && self.header.is_none() {
                self.header = Some(row);
                continue;
            }
            let shard = match key_of(&row, &self.format) {
                // A NULL key is refused by Postgres itself (it is the primary key); let the
                // default shard say so.
                None => map.default_shard(),
                Some(text) => match self.key_type.parse_key(&text) {
                    Ok(key) => map.shard_for_key(&key),
                    Err(e) => {
                        self.failure = Some(SqlError::new(
                            errors::INVALID_TEXT_REPRESENTATION,
                            e.to_string(),
                        ));
                        continue;
                    }
                },
            };
            if self.targets[shard].is_none() {
                let header = self.header.as_deref();
                match CopyTarget::open(self.routing, shard, self.sql, self.settings, header, None)
                    .await
                {
                    Ok(t) => self.targets[shard] = Some(t),
                    Err(e) => {
                        self.failure = Some(e);
                        continue;
                    }
                }
            }
            if let Some(t) = self.targets[shard].as_mut() {
                t.push(&row).await;
            }
        }
        self.batch = batch;
    }

    /// Ends every shard's COPY (committed, or failed on purpose when the client or the router
    /// failed it) and writes the client's one answer into `out`.
    async fn finish(self, client_failed: Option<String>, out: &mut Vec<u8>) {
        let mut outcomes = Vec::new();
        let mut names = Vec::new();
        let why_fail = client_failed
            .as_deref()
            .or(self.failure.as_ref().map(|_| "rejected by the router"));
        for (shard, t) in self.targets.into_iter().enumerate() {
            if let Some(t) = t {
                // Autocommit: the connection goes back to its pool.
                outcomes.push(t.finish(why_fail).await.0);
                names.push(self.routing.map.shards()[shard].range.to_string());
            }
        }
        if let Some(msg) = client_failed {
            SqlError::new(
                errors::QUERY_CANCELED,
                format!("COPY from stdin failed: {msg}"),
            )
            .write(out);
            return;
        }
        if let Some(err) = self.failure {
            // Nothing was committed: every shard's COPY was failed on purpose.
            err.write(out);
            return;
        }
        match broadcast::combine(&outcomes, &names) {
            Combined::Done(_) => {
                let rows: u64 = outcomes
                    .iter()
                    .map(|o| match o {
                        Outcome::Done(tags) => rows_in_tag(tags.get(5..).unwrap_or_default()),
                        _ => 0,
                    })
                    .sum();
                reply::command_complete(out, &format!("COPY {rows}"));
            }
            Combined::PostgresError(frame) => out.extend_from_slice(&frame),
            Combined::Error(e) => e.write(out),
        }
    }
}

/// One shard's end of a COPY FROM STDIN (split, or to every shard: `super::copy_reference`).
pub(super) struct CopyTarget {
    conn: PooledConn,
    /// The body of the shard's CopyInResponse (empty when its COPY did not start).
    pub response: Vec<u8>,
    /// Rows not sent yet.
    buf: Vec<u8>,
    /// The shard refused the COPY (its ErrorResponse); its rows are dropped.
    error: Option<Vec<u8>>,
    /// The connection broke.
    lost: Option<SqlError>,
    /// The shard already answered with ReadyForQuery (its COPY failed at the start).
    ended: bool,
}

fn lost_during_copy(e: impl std::fmt::Display) -> SqlError {
    SqlError::new(
        errors::CONNECTION_FAILURE,
        format!("lost the shard during COPY: {e}"),
    )
}

impl CopyTarget {
    /// Starts the client's COPY statement on `shard` and waits for its CopyInResponse; with
    /// `begin` (its `BEGIN ...`), inside a transaction that its caller ends.
    pub(super) async fn open(
        routing: &Routing,
        shard: usize,
        sql: &str,
        settings: &Settings,
        header: Option<&[u8]>,
        begin: Option<&str>,
    ) -> Result<CopyTarget, SqlError> {
        let mut conn = routing.checkout_for(shard, settings).await?;
        let lost = |e: std::io::Error| {
            errors::shard_lost(
                &routing.map.shards()[shard].range.to_string(),
                &routing.pools().for_shard(shard).endpoint.name(),
                &e.to_string(),
            )
        };
        let mut out = BytesMut::new();
        let settings_sent = settings
            .write_apply(conn.settings_fp, &mut out)
            .map_err(errors::internal)?;
        if let Some(begin) = begin {
            request::query(&mut out, begin).map_err(errors::internal)?;
        }
        request::query(&mut out, sql).map_err(errors::internal)?;
        conn.settings_fp = settings.fingerprint();
        let prelude = settings_sent + usize::from(begin.is_some());
        let (mut error, mut started, mut ended) = (None, false, false);
        let mut response = Vec::new();
        {
            // Up to the CopyInResponse, or to the ReadyForQuery of a COPY that failed at once.
            let mut replies = conn.request(&out, 1 + prelude).await.map_err(lost)?;
            // The settings query's replies are the router's business.
            replies.skip_prelude(prelude, |_| {}).await.map_err(lost)?;
            while let Some(frame) = replies.next().await.map_err(lost)? {
                match frame[0] {
                    b'G' => {
                        started = true;
                        response = frame[5..].to_vec();
                        break;
                    }
                    b'E' => error = Some(frame.to_vec()),
                    b'Z' => ended = true,
                    _ => {}
                }
            }
        }
        let mut target = CopyTarget {
            conn,
            response,
            buf: Vec::with_capacity(BATCH),
            error,
            lost: None,
            ended,
        };
        if started {
            if let Some(header) = header {
                target.buf.extend_from_slice(header);
            }
        }
        Ok(target)
    }

    /// Whether the shard's COPY started (else [`CopyTarget::finish`] gives its error).
    pub(super) fn started(&self) -> bool {
        !self.ended && self.error.is_none()
    }

    /// The shard's error when its COPY did not start.
    pub(super) fn refusal(&self) -> Vec<u8> {
        self.error.clone().unwrap_or_default()
    }

    pub(super) async fn push(&mut self, row: &[u8]) {
        if self.error.is_some() || self.lost.is_some() || self.ended {
            return;
        }
        self.buf.extend_from_slice(row);
        if self.buf.len() >= BATCH {
            self.send_buffered().await;
        }
    }

    async fn send_buffered(&mut self) {
        if self.buf.is_empty() || self.lost.is_some() {
            return;
        }
        let mut frame = BytesMut::with_capacity(self.buf.len() + 5);
        if let Err(e) = request::copy_data(&mut frame, &self.buf) {
            self.lost = Some(lost_during_copy(e));
            return;
        }
        self.buf.clear();
        if let Err(e) = self.conn.stream.send(&frame).await {
            self.lost = Some(lost_during_copy(e));
        }
    }

    /// Ends this shard's COPY: CopyDone, or CopyFail with `fail` (so nothing is committed);
    /// the connection too when it is still good (inside its transaction, for `open`'s
    /// `in_transaction`).
    pub(super) async fn finish(mut self, fail: Option<&str>) -> (Outcome, Option<PooledConn>) {
        let failed = |frame: Vec<u8>| {
            let (code, message) = error_fields(&frame);
            Outcome::Failed {
                frame,
                code,
                message,
            }
        };
        if self.ended {
            return (
                failed(self.error.take().unwrap_or_default()),
                Some(self.conn),
            );
        }
        let mut end = BytesMut::new();
        if self.error.is_none() && self.lost.is_none() {
            match fail {
                None => {
                    self.send_buffered().await;
                    request::copy_done(&mut end);
                }
                Some(why) => {
                    if let Err(e) = request::copy_fail(&mut end, why) {
                        self.lost = Some(lost_during_copy(e));
                    }
                }
            }
        }
        if let Some(e) = self.lost.take() {
            discard(self.conn);
            return (Outcome::Unavailable(e), None);
        }
        let mut tags = Vec::new();
        let mut error = self.error.take();
        let result = self
            .conn
            .round_trip(&end, 1, |frame| match frame[0] {
                b'C' => tags.extend_from_slice(frame),
                b'E' if error.is_none() => error = Some(frame.to_vec()),
                _ => {}
            })
            .await;
        if result.is_err() {
            discard(self.conn);
            let lost = SqlError::new(
                errors::CONNECTION_FAILURE,
                "lost the shard at the end of COPY",
            );
            return (Outcome::Unavailable(lost), None);
        }
        let outcome = match error {
            None => Outcome::Done(tags),
            Some(frame) => failed(frame),
        };
        (outcome, Some(self.conn))
    }

    /// Drops the connection mid-COPY: Postgres rolls the shard's COPY back.
    pub(super) fn abandon(&mut self) {
        self.lost
            .get_or_insert_with(|| SqlError::new(errors::CONNECTION_FAILURE, "abandoned"));
        self.conn.broken = true;
    }
}
