//! What goes to the pinned backend connection next, and what each message will answer. Pure:
//! client messages in, backend bytes and expected replies out; [`super::relay`] does the I/O.
//!
//! Client messages are rewritten only where transaction pooling needs it: a named statement
//! becomes the router-wide `sg_<id>`, prepared on the connection (by a Parse the client does
//! not see) the first time the connection needs it; the client's unnamed statement is parsed
//! again on a connection that does not hold its current version. The router's own errors are
//! raised on the backend with a `DO` block, so that the backend's transaction fails exactly
//! when the client is told it did.

use bytes::BytesMut;

use super::extended::Msg;
use super::replies::{Audience, Kind, Replies};
use super::statements::{ClientStatement, Text};
use crate::backend::prepared::PreparedSet;
use crate::protocol::reply::{self, SqlError};
use crate::protocol::request::{self, Unwritable};

/// Bytes for the pinned backend, and the replies they will produce, in order.
#[derive(Debug, Default)]
pub struct Outbox {
    pub bytes: BytesMut,
    /// A long client message sent after `bytes` ([`Outbox::push_frame`]); nothing is written
    /// after it.
    pub tail: BytesMut,
    pub replies: Replies,
}

/// What the outbox tracks about the pinned connection: the router statements it has prepared,
/// and which version of the client's unnamed statement it holds (0: none).
pub struct ConnStatements<'a> {
    pub prepared: &'a mut PreparedSet,
    pub unnamed: &'a mut u64,
}

impl Outbox {
    /// Queues one client message for the connection.
    pub fn send(
        &mut self,
        conn: &mut ConnStatements<'_>,
        msg: Msg<&[u8]>,
    ) -> Result<(), Unwritable> {
        match msg {
            Msg::Parse(stmt) => self.parse(conn, &stmt, Audience::Client)?,
            Msg::Bind { portal, tail, stmt } => {
                let name = self.ready(conn, &stmt)?;
                request::rebind(&mut self.bytes, portal, name, tail);
                self.replies.push(Kind::Bind, Audience::Client);
            }
            Msg::DescribeStatement(stmt) => {
                let name = self.ready(conn, &stmt)?;
                request::describe_statement(&mut self.bytes, name)?;
                self.replies.push(Kind::DescribeStatement, Audience::Client);
            }
            Msg::Forward { frame, kind, .. } => {
                self.bytes.extend_from_slice(frame);
                self.replies.push(kind, Audience::Client);
            }
            Msg::CloseStatement => self
                .replies
                .push_synthetic(synthetic(reply::close_complete)),
        }
        Ok(())
    }

    /// Makes sure the connection holds `stmt` (parsing it there unseen when it does not) and
    /// returns its name on the connection.
    pub fn ready<'s>(
        &mut self,
        conn: &mut ConnStatements<'_>,
        stmt: &'s ClientStatement,
    ) -> Result<&'s str, Unwritable> {
        match &stmt.text {
            Text::Named(s) => {
                if !conn.prepared.contains(&s.id) {
                    self.parse(conn, stmt, Audience::Router)?;
                }
                Ok(&s.backend_name)
            }
            Text::Unnamed { version, .. } => {
                if *conn.unnamed != *version {
                    self.parse(conn, stmt, Audience::Router)?;
                }
                Ok("")
            }
        }
    }

    /// A Parse of `stmt` on the connection. A named statement the connection already has is
    /// answered by the router; one that does not fit closes the least recently used first.
    fn parse(
        &mut self,
        conn: &mut ConnStatements<'_>,
        stmt: &ClientStatement,
        audience: Audience,
    ) -> Result<(), Unwritable> {
        match &stmt.text {
            Text::Unnamed {
                sql,
                param_types,
                version,
            } => {
                request::parse(&mut self.bytes, "", sql, param_types)?;
                self.replies.push(Kind::Parse, audience);
                *conn.unnamed = *version;
            }
            Text::Named(s) => {
                // (For a shared connection the Parse is sent: its answer is the client's, and the
                // connection it lands on closes its own copy first, `replay::preparation`.)
                if audience == Audience::Client
                    && !conn.prepared.is_everything()
                    && conn.prepared.contains(&s.id)
                {
                    self.replies
                        .push_synthetic(synthetic(reply::parse_complete));
                    return Ok(());
                }
                if let Some(old) = conn.prepared.insert(s.id) {
                    request::close_statement(&mut self.bytes, &format!("sg_{old}"))?;
                    self.replies.push(Kind::Close, Audience::Silent);
                }
                request::parse(&mut self.bytes, &s.backend_name, &s.sql, &s.param_types)?;
                self.replies.push_parse(s.id, audience);
            }
        }
        Ok(())
    }

    /// Appends a client's own message as it came. A long one that starts the request is moved
    /// in rather than copied, so a long Query is held once, not twice, while it runs.
    /// It must be the last thing the request writes: it may go to [`Outbox::tail`].
    pub fn push_frame(&mut self, frame: BytesMut) {
        // A short one is copied: it shares the allocation of the session's read buffer, which
        // it would keep from being reused.
        if frame.len() <= crate::protocol::LONG {
            self.bytes.extend_from_slice(&frame);
        } else if self.bytes.is_empty() {
            self.bytes = frame;
        } else {
            // Behind what the request already holds (the client's settings, a BEGIN).
            self.tail = frame;
        }
    }

    /// A simple-protocol Query the router sends (settings, a pending BEGIN, ...).
    pub fn query(&mut self, sql: &str, audience: Audience) -> Result<(), Unwritable> {
        request::query(&mut self.bytes, sql)?;
        self.replies.push(Kind::Query, audience);
        Ok(())
    }

    /// A Flush of the router's: the backend answers what was sent so far, and nothing more is
    /// owed for the Flush itself.
    pub fn flush(&mut self) {
        self.bytes.extend_from_slice(&[b'H', 0, 0, 0, 4]);
    }

    /// The client's Sync.
    pub fn sync(&mut self, audience: Audience) {
        request::sync(&mut self.bytes);
        self.replies.push(Kind::Sync, audience);
    }

    /// The router's error for a simple Query, raised on the backend: the client gets the error
    /// and a ReadyForQuery that says the transaction failed.
    pub fn raise_query(&mut self, err: &SqlError) -> Result<(), Unwritable> {
        request::query(&mut self.bytes, &raise_sql(err))?;
        self.replies.push_raised(Kind::Query, Audience::Client);
        Ok(())
    }

    /// The router's error in an extended batch, raised on the backend: the backend then skips
    /// to the client's Sync, as the client does. The raise replaces the connection's unnamed
    /// statement.
    pub fn raise_extended(
        &mut self,
        conn: &mut ConnStatements<'_>,
        err: &SqlError,
    ) -> Result<(), Unwritable> {
        request::parse(&mut self.bytes, "", &raise_sql(err), &[0, 0])?;
        self.replies.push(Kind::Parse, Audience::Silent);
        request::bind_text(&mut self.bytes, "", &[])?;
        self.replies.push(Kind::Bind, Audience::Silent);
        request::execute(&mut self.bytes);
        self.replies.push_raised(Kind::Execute, Audience::Router);
        *conn.unnamed = 0;
        Ok(())
    }

    /// Forgets everything queued (the connection is gone).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.tail = BytesMut::new();
        self.replies = Replies::default();
    }
}

/// A reply the router makes up, as bytes.
pub fn synthetic(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = Vec::with_capacity(8);
    write(&mut v);
    v
}

/// A statement that fails on the backend with the router's error, so that the backend's
/// transaction is aborted exactly when the client is told it is.
pub fn raise_sql(err: &SqlError) -> String {
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''").replace("$sg$", "$ sg$"));
    let mut sql = format!(
        "DO $sg$BEGIN RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = {}",
        lit(&err.code),
        lit(&err.message)
    );
    if let Some(h) = &err.hint {
        sql.push_str(&format!(", HINT = {}", lit(h)));
    }
    sql.push_str("; END$sg$");
    sql
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::registry::Registry;
    use crate::planner::Plan;
    use crate::protocol::frame::frames;

    fn named(registry: &Registry, sql: &str) -> Arc<ClientStatement> {
        Arc::new(ClientStatement {
            text: Text::Named(registry.intern(sql, &[0, 0])),
            plan: Plan::empty(),
            params_before: 0,
            literals: Vec::new(),
        })
    }

    fn unnamed(sql: &str, version: u64) -> Arc<ClientStatement> {
        Arc::new(ClientStatement {
            text: Text::Unnamed {
                sql: sql.into(),
                param_types: vec![0, 0],
                version,
            },
            plan: Plan::empty(),
            params_before: 0,
            literals: Vec::new(),
        })
    }

    /// The backend messages queued, as (tag, statement name for P/B/D/C).
    fn sent(out: &Outbox) -> Vec<String> {
        frames(&out.bytes)
            .map(|f| {
                let f = f.unwrap();
                let body = &f[5..];
                let name = |b: &[u8]| {
                    String::from_utf8_lossy(&b[..b.iter().position(|&c| c == 0).unwrap_or(0)])
                        .into_owned()
                };
                match f[0] {
                    b'P' => format!("P {}", name(body)),
                    b'B' => format!(
                        "B {}",
                        name(&body[body.iter().position(|&c| c == 0).unwrap() + 1..])
                    ),
                    b'D' | b'C' => format!("{} {}", f[0] as char, name(&body[1..])),
                    t => (t as char).to_string(),
                }
            })
            .collect()
    }

    #[test]
    fn a_named_statement_is_prepared_once_per_connection() {
        let registry = Registry::default();
        let s = named(&registry, "SELECT 1");
        let backend = format!(
            "sg_{}",
            match &s.text {
                Text::Named(r) => r.id,
                _ => 0,
            }
        );
        let (mut prepared, mut version) = (PreparedSet::default(), 0);
        let mut conn = ConnStatements {
            prepared: &mut prepared,
            unnamed: &mut version,
        };
        let mut out = Outbox::default();
        // The client's Parse, then Describe and Bind: prepared once, under the router's name.
        out.send(&mut conn, Msg::Parse(s.clone())).unwrap();
        out.send(&mut conn, Msg::DescribeStatement(s.clone()))
            .unwrap();
        out.send(
            &mut conn,
            Msg::Bind {
                portal: b"",
                tail: b"\0\0\0\0\0\0",
                stmt: s.clone(),
            },
        )
        .unwrap();
        assert_eq!(
            sent(&out),
            [
                format!("P {backend}"),
                format!("D {backend}"),
                format!("B {backend}")
            ]
        );
        // Another Parse of the same text on this connection is answered by the router.
        let mut again = Outbox::default();
        again.send(&mut conn, Msg::Parse(s.clone())).unwrap();
        assert!(again.bytes.is_empty());
        assert!(!again.replies.awaits_backend());
        // A Bind on a connection without it injects the Parse, unseen by the client.
        let (mut fresh, mut v2) = (PreparedSet::default(), 0);
        let mut other = ConnStatements {
            prepared: &mut fresh,
            unnamed: &mut v2,
        };
        let mut out = Outbox::default();
        out.send(
            &mut other,
            Msg::Bind {
                portal: b"p1",
                tail: b"\0\0\0\0\0\0",
                stmt: s,
            },
        )
        .unwrap();
        assert_eq!(sent(&out), [format!("P {backend}"), format!("B {backend}")]);
    }

    #[test]
    fn the_unnamed_statement_is_parsed_again_where_it_is_missing() {
        let (mut prepared, mut version) = (PreparedSet::default(), 0);
        let mut conn = ConnStatements {
            prepared: &mut prepared,
            unnamed: &mut version,
        };
        let v1 = unnamed("SELECT 1", 1);
        let mut out = Outbox::default();
        out.send(&mut conn, Msg::Parse(v1.clone())).unwrap();
        let bind = |s: &Arc<ClientStatement>| Msg::Bind {
            portal: &b""[..],
            tail: &b"\0\0\0\0\0\0"[..],
            stmt: s.clone(),
        };
        out.send(&mut conn, bind(&v1)).unwrap();
        assert_eq!(sent(&out), ["P ", "B "]);
        // A newer version of the unnamed statement was parsed elsewhere: parse it here first.
        let v2 = unnamed("SELECT 2", 2);
        let mut out = Outbox::default();
        out.send(&mut conn, bind(&v2)).unwrap();
        assert_eq!(sent(&out), ["P ", "B "]);
        let mut out = Outbox::default();
        out.send(&mut conn, bind(&v2)).unwrap();
        assert_eq!(sent(&out), ["B "], "the connection holds version 2 now");
        // A raised error replaces the unnamed statement on the connection.
        out.raise_extended(&mut conn, &SqlError::new("0A000", "no"))
            .unwrap();
        let mut out = Outbox::default();
        out.send(&mut conn, bind(&v2)).unwrap();
        assert_eq!(sent(&out), ["P ", "B "]);
    }

    #[test]
    fn raise_sql_quotes_everything() {
        let err = SqlError::new("0A000", "it's $sg$ bad").with_hint("don't");
        assert_eq!(
            raise_sql(&err),
            "DO $sg$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000', MESSAGE = 'it''s $ sg$ bad', HINT = 'don''t'; END$sg$"
        );
    }
}
