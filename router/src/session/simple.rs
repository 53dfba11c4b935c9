//! A simple-protocol Query: planned and resolved as a whole (every statement in it must agree
//! on one shard), then handed to the executor (`super::execute`), which answers it, runs it on
//! the pinned connection, or runs it on several shards.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::execute::Carrier;
use super::{Session, SessionError};
use crate::protocol::reply::{self, SqlError};
use crate::protocol::{frontend, LONG};
use crate::resolver::{self, Reroute};

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    pub(super) async fn query(&mut self, frame: BytesMut) -> Result<(), SessionError> {
        let sql = frontend::query(&frame[5..])?;
        // A Query ends what came before it, as a Sync does.
        self.out.replies.take_error();
        // Kept for the settings a statement changes and for the logs; a long text only as its
        // start, unless it may change settings (below).
        self.sql.clear();
        self.sql.push_str(prefix(sql));
        if self.pin.is_some() && self.state.only_prepared() {
            // A Query in the middle of an extended batch that only prepared statements: finish
            // that there, so the Query is routed on its own.
            self.finish_preparation().await?;
        }
        let pinned = self.pinned_shard();
        let (shareable, keeps);
        let dest = {
            let planned = self.routing.planner.plan(sql, &mut self.nbuf);
            shareable = planned.shareable;
            keeps = planned.keeps_connection;
            let stmt = resolver::Statement::from_text(sql, &planned);
            let seen = super::Seen {
                user: &self.user,
                settings: &self.settings,
                changes: &self.changes,
                keeps: self.kept.any(),
            };
            let target = Self::resolve(&self.routing, seen, &self.state, pinned, &stmt);
            // Several statements may hold several keys of the shard: after a split they could
            // need both halves, so only a single statement's key re-routes a held Query.
            self.reroute = if planned.statements.len() == 1 {
                target.reroute()
            } else {
                Reroute::No
            };
            self.state
                .anchor(super::state::anchor_of(&planned, &target.dest, false));
            target.dest
        };
        // A text the normalizer gave up on (too long to plan) may still be routed by hand
        // (`/* shard: .. */`): keep it whole, as its words are unknown.
        if self.sql.len() < sql.len()
            && (self.nbuf.too_long() || may_change_settings(self.nbuf.normalized()))
        {
            self.sql.clear();
            self.sql.push_str(sql);
        }
        let dest = self.keep_connection(keeps, dest);
        self.cursors_at(&dest);
        self.in_query = true;
        let done = self
            .execute(dest, Carrier::Query { frame, shareable })
            .await;
        self.in_query = false;
        done
    }

    /// The router's error for a simple query. With a connection pinned it is raised there, so
    /// that the backend's transaction fails exactly as the client is told.
    pub(super) async fn refuse_query(&mut self, err: &SqlError) -> Result<(), SessionError> {
        if self.pin.is_some() {
            self.out.raise_query(err)?;
            self.exchange().await?;
            self.release_if_idle();
            return Ok(());
        }
        self.refuse_here(err);
        self.ready();
        Ok(())
    }

    /// A ReadyForQuery with the client's transaction status, answered by the router.
    pub(super) fn ready(&mut self) {
        reply::ready_for_query(&mut self.client.out, self.state.status());
    }
}

/// `sql`, or its first [`LONG`] bytes (at a character boundary) when it is longer.
fn prefix(sql: &str) -> &str {
    if sql.len() <= LONG {
        return sql;
    }
    let mut end = LONG;
    while !sql.is_char_boundary(end) {
        end -= 1;
    }
    &sql[..end]
}

/// Whether a statement whose normalized text is `normalized` may complete as `SET`, `RESET` or
/// `DISCARD` (what the session's settings tracking reads the text for): only statements that
/// begin with those words do, and normalization keeps every word outside literals and
/// comments. A word inside a quoted identifier counts too, which only costs a copy.
fn may_change_settings(normalized: &str) -> bool {
    normalized
        .split(|c: char| !c.is_ascii_alphabetic())
        .any(|w| {
            w.eq_ignore_ascii_case("set")
                || w.eq_ignore_ascii_case("reset")
                || w.eq_ignore_ascii_case("discard")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_kept_whole_only_when_it_may_change_settings() {
        let long = format!("SELECT 1 /* {} */", "é".repeat(LONG));
        assert!(prefix(&long).len() <= LONG && long.starts_with(prefix(&long)));
        assert_eq!(prefix("SELECT 1"), "SELECT 1");
        assert!(may_change_settings("SET search_path = $1"));
        assert!(may_change_settings("select $1; reset all"));
        assert!(may_change_settings("DISCARD ALL"));
        assert!(!may_change_settings("SELECT v FROM kv WHERE id = $1  "));
        assert!(!may_change_settings("SELECT settings FROM offset_t"));
    }
}
