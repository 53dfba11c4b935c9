//! SQL-level `PREPARE` / `EXECUTE` / `DEALLOCATE` in a simple query, run on the client's
//! protocol-level named statements (one namespace, as in Postgres; see
//! [`crate::planner::prepared_sql`]).
//!
//! `PREPARE` records the name and checks the statement on a backend with a Parse, so errors come
//! when Postgres would give them. `EXECUTE` becomes Bind + Describe + Execute + Sync of the
//! router-wide statement, prepared on demand on whichever connection serves it; its replies have
//! the simple-query shape (the Bind's and a NoData are hidden). `DEALLOCATE` is answered here.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::execute::Carrier;
use super::outbox::{synthetic, ConnStatements};
use super::replies::{Audience, Kind};
use super::state::Tx;
use super::statements::{ClientStatement, Text};
use super::{Session, SessionError};
use crate::errors;
use crate::planner::prepared_sql::{self, PreparedSql};
use crate::protocol::frontend;
use crate::protocol::reply::{self, SqlError};
use crate::protocol::request;

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    pub(super) async fn prepared_sql(&mut self, sql: &str) -> Result<(), SessionError> {
        let command = match prepared_sql::read(sql) {
            Ok(c) => c,
            Err(err) => return self.refuse_query(&err).await,
        };
        match command {
            PreparedSql::Prepare {
                name,
                param_types,
                body,
            } => self.sql_prepare(&name, &param_types, &body).await,
            PreparedSql::Execute { name, args } => self.sql_execute(&name, &args).await,
            PreparedSql::Deallocate { name } => {
                if self.state.tx == Tx::Failed {
                    return self.refuse_query(&errors::in_failed_transaction()).await;
                }
                let tag = match name {
                    None => {
                        self.statements.clear();
                        "DEALLOCATE ALL"
                    }
                    Some(name) => {
                        if !self.statements.close(&name) {
                            return self.refuse_query(&errors::undefined_statement(&name)).await;
                        }
                        "DEALLOCATE"
                    }
                };
                reply::command_complete(&mut self.client.out, tag);
                self.ready();
                Ok(())
            }
        }
    }

    async fn sql_prepare(
        &mut self,
        name: &str,
        param_types: &[u8],
        body: &str,
    ) -> Result<(), SessionError> {
        if self.statements.contains(name) {
            return self.refuse_query(&errors::duplicate_statement(name)).await;
        }
        // In a transaction the check runs on its connection (an error fails the transaction,
        // as in Postgres); otherwise on any connection, which goes back to the pool after.
        let in_transaction = self.pin.is_some();
        if let Err(err) = self.attach(None, false).await {
            self.refuse_here(&err);
            self.ready();
            return Ok(());
        }
        // The name is taken now and given back below if Postgres refuses the statement.
        let parsed = {
            let planned = self.routing.planner.plan(body, &mut self.nbuf);
            self.statements.parse(
                name,
                body,
                param_types,
                &planned,
                self.routing.planner.epoch(),
                &self.shared.statements,
                self.routing.config.limits.max_prepared_bytes,
            )
        };
        let stmt = match parsed {
            Ok(stmt) => stmt,
            Err(err) => return self.refuse_query(&err).await,
        };
        let Some(pin) = self.pin.as_mut() else {
            return Err(SessionError::Protocol(
                "internal: PREPARE without a connection".into(),
            ));
        };
        let mut conn = ConnStatements {
            prepared: pin.conn.prepared(),
            unnamed: &mut pin.unnamed,
        };
        self.out.ready(&mut conn, &stmt)?;
        self.out
            .replies
            .push_synthetic(synthetic(|o| reply::command_complete(o, "PREPARE")));
        if in_transaction {
            self.out.sync(Audience::Client);
        } else {
            // Outside the backend's transaction: the client's status is the router's to tell.
            self.out.sync(Audience::Silent);
            let status = self.state.status();
            self.out
                .replies
                .push_synthetic(synthetic(|o| reply::ready_for_query(o, status)));
        }
        self.exchange().await?;
        let prepared = match (&stmt.text, self.pin.as_mut()) {
            (Text::Named(s), Some(pin)) => pin.conn.prepared().contains(&s.id),
            _ => false,
        };
        if !prepared {
            self.statements.close(name);
        }
        if in_transaction {
            self.release_if_idle();
        } else if self.pin.is_some() && self.out.replies.is_empty() {
            self.release();
        }
        Ok(())
    }

    async fn sql_execute(
        &mut self,
        name: &str,
        args: &[Option<String>],
    ) -> Result<(), SessionError> {
        let Some(stmt) = self.statements.get(name).cloned() else {
            return self.refuse_query(&errors::undefined_statement(name)).await;
        };
        // The statement's parameters: those its text uses, or more if PREPARE declared more.
        let declared = stmt
            .param_types()
            .get(..2)
            .map_or(0, |n| u16::from_be_bytes([n[0], n[1]]) as usize);
        let expected = stmt.params_before.max(declared);
        if args.len() != expected {
            let err = SqlError::new(
                errors::SYNTAX_ERROR,
                format!("wrong number of parameters for prepared statement \"{name}\""),
            )
            .with_detail(format!(
                "Expected {expected} parameters but got {}.",
                args.len()
            ));
            return self.refuse_query(&err).await;
        }
        self.sql.clear();
        self.sql.push_str(stmt.sql());
        // The Bind the statement runs with: unnamed portal, text parameters, text results.
        let backend_name = match &stmt.text {
            Text::Named(s) => &s.backend_name,
            Text::Unnamed { .. } => "",
        };
        let mut bind = BytesMut::with_capacity(64);
        request::bind_text(&mut bind, backend_name, args)?;
        let dest = {
            let b = frontend::bind(&bind[5..])?;
            self.resolve_bound(&stmt, &b)
        };
        let dest = self.keep_connection(stmt.plan.keeps_connection, dest);
        // Boxed: the executor runs this very `EXECUTE` (`Dest::PreparedSql`).
        Box::pin(self.execute(dest, Carrier::SqlExecute { name, stmt, bind })).await
    }

    /// `EXECUTE` of `stmt` with `bind` (its arguments as text parameters) for the pinned
    /// connection: Bind, Describe of the portal, Execute and Sync, with the replies of a simple
    /// query (the Bind's and a NoData hidden).
    pub(super) fn write_sql_execute(
        &mut self,
        stmt: &ClientStatement,
        bind: &[u8],
    ) -> Result<(), SessionError> {
        let Some(pin) = self.pin.as_mut() else {
            return Err(SessionError::Protocol(
                "internal: EXECUTE without a connection".into(),
            ));
        };
        let mut conn = ConnStatements {
            prepared: pin.conn.prepared(),
            unnamed: &mut pin.unnamed,
        };
        self.out.ready(&mut conn, stmt)?;
        self.out.bytes.extend_from_slice(bind);
        self.out.replies.push(Kind::Bind, Audience::Router);
        request::describe_portal(&mut self.out.bytes);
        self.out.replies.push(Kind::DescribeRows, Audience::Client);
        request::execute(&mut self.out.bytes);
        self.out.replies.push(Kind::Execute, Audience::Client);
        self.out.sync(Audience::Client);
        Ok(())
    }
}
