//! `EXPLAIN (ROUTE) statement`, answered by the router: where the statement would run and why
//! ([`crate::resolver::explain`]), in rows, without running it. The statement is resolved as it
//! would be now, in the client's transaction and with its settings.

use tokio::io::{AsyncRead, AsyncWrite};

use super::{Session, SessionError};
use crate::errors;
use crate::planner;
use crate::protocol::reply::{self, SqlError};
use crate::resolver::{self, explain};

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    pub(super) async fn explain_route(&mut self, sql: &str) -> Result<(), SessionError> {
        let Some(inner) = planner::explain_route_inner(sql) else {
            let err = SqlError::new(
                errors::SYNTAX_ERROR,
                "EXPLAIN (ROUTE) needs a statement after its options",
            );
            return self.refuse_query(&err).await;
        };
        let pinned = self.pinned_shard();
        let (rows, cache) = {
            let planned = self.routing.planner.plan(inner, &mut self.nbuf);
            let stmt = resolver::Statement::from_text(inner, &planned);
            let seen = super::Seen {
                user: &self.user,
                settings: &self.settings,
                changes: &self.changes,
                keeps: self.kept.any(),
            };
            let target = Self::resolve(&self.routing, seen, &self.state, pinned, &stmt);
            let cache = if planned.cached { "hit" } else { "miss" };
            (explain::rows(&target, inner), cache)
        };
        let out = &mut self.client.out;
        reply::text_row_description(out, &explain::COLUMNS);
        for row in &rows {
            reply::text_data_row(out, &row.values(cache));
        }
        reply::command_complete(out, "EXPLAIN");
        self.ready();
        Ok(())
    }
}
