//! SQL-level `PREPARE` / `EXECUTE` / `DEALLOCATE` in a simple query, run on the client's
//! protocol-level named statements (one namespace, as in Postgres; see
//! [`crate::planner::prepared_sql`]).
//!
//! `PREPARE` records the name and checks the statement on a backend with a Parse, so errors come
//! when Postgres would give them. `EXECUTE` becomes Bind + Describe + Execute + Sync of the
//! router-wide statement, prepared on demand on whichever connection serves it; its replies have
//! the simple-query shape (the Bind's and a NoData are hidden). `DEALLOCATE` is answered here.

use super::{Audience, Decision, Kind, Named, Session, SessionError, SqlError, TxStatus};
use crate::errors;
use crate::planner::prepared_sql::{self, PreparedSql};
use crate::protocol::frame::{begin_frame, end_frame, put_frame};
use crate::protocol::frontend;
use crate::protocol::reply;

impl Session {
    pub(super) async fn prepared_sql(&mut self, sql: &str) -> Result<(), SessionError> {
        let command = match prepared_sql::read(sql) {
            Ok(c) => c,
            Err(err) => return self.refuse_simple(err).await,
        };
        match command {
            PreparedSql::Prepare {
                name,
                param_types,
                body,
            } => self.sql_prepare(name, &param_types, &body).await,
            PreparedSql::Execute { name, args } => self.sql_execute(&name, &args).await,
            PreparedSql::Deallocate { name } => {
                if self.tx == TxStatus::Failed {
                    return self.refuse_simple(super::in_failed_transaction()).await;
                }
                let tag = match name {
                    None => {
                        self.named.clear();
                        "DEALLOCATE ALL"
                    }
                    Some(name) => {
                        if self.named.remove(&name).is_none() {
                            return self.refuse_simple(no_such_statement(&name)).await;
                        }
                        "DEALLOCATE"
                    }
                };
                reply::command_complete(&mut self.cout, tag);
                reply::ready_for_query(&mut self.cout, self.tx);
                Ok(())
            }
        }
    }

    async fn sql_prepare(
        &mut self,
        name: String,
        param_types: &[u8],
        body: &str,
    ) -> Result<(), SessionError> {
        if self.named.contains_key(&name) {
            let err = SqlError::new(
                errors::DUPLICATE_PREPARED_STATEMENT,
                format!("prepared statement \"{name}\" already exists"),
            );
            return self.refuse_simple(err).await;
        }
        let planned = self.shared.planner.plan(body, &mut self.nbuf);
        let named = Named {
            stmt: self.shared.statements.intern(body, param_types),
            plan: planned.plan().clone(),
            params_before: planned.params_before(),
            literals: super::stored_literals(&planned),
        };
        drop(planned);
        let stmt = named.stmt.clone();
        // In a transaction the check runs on its connection (an error fails the transaction,
        // as in Postgres); otherwise on any connection, which goes back to the pool after.
        let in_transaction = self.pinned.is_some();
        if let Err(err) = self.attach_conn(None, false).await {
            self.router_error_simple(err);
            return Ok(());
        }
        // The name is taken now and given back below if Postgres refuses the statement.
        self.named.insert(name.clone(), named);
        self.prepare_for_use(&name)?;
        let mut done = Vec::with_capacity(16);
        reply::command_complete(&mut done, "PREPARE");
        self.replies.push_synthetic(done);
        put_frame(&mut self.bout, b'S', &[]);
        if in_transaction {
            self.replies.push(Kind::Sync, Audience::Client);
        } else {
            // Outside the backend's transaction: the client's status is the router's to tell.
            self.replies.push(Kind::Sync, Audience::Silent);
            let mut ready = Vec::with_capacity(6);
            reply::ready_for_query(&mut ready, self.tx);
            self.replies.push_synthetic(ready);
        }
        self.exchange().await?;
        let prepared = self
            .pinned
            .as_mut()
            .is_some_and(|p| p.conn.prepared.contains(&stmt.id));
        if !prepared {
            self.named.remove(&name);
        }
        if in_transaction {
            self.release_if_idle().await;
        } else if self.pinned.is_some() && self.replies.is_empty() {
            self.release();
        }
        Ok(())
    }

    async fn sql_execute(
        &mut self,
        name: &str,
        args: &[Option<String>],
    ) -> Result<(), SessionError> {
        let Some(named) = self.named.get(name) else {
            return self.refuse_simple(no_such_statement(name)).await;
        };
        // The statement's parameters: those its text uses, or more if PREPARE declared more.
        let declared = named
            .stmt
            .param_types
            .get(..2)
            .map_or(0, |n| u16::from_be_bytes([n[0], n[1]]) as usize);
        let expected = named.params_before.max(declared);
        if args.len() != expected {
            let err = SqlError::new(
                "42601",
                format!("wrong number of parameters for prepared statement \"{name}\""),
            )
            .with_detail(format!(
                "Expected {expected} parameters but got {}.",
                args.len()
            ));
            return self.refuse_simple(err).await;
        }
        let stmt = named.stmt.clone();
        self.last_sql.clear();
        self.last_sql.push_str(&stmt.sql);
        // The Bind the statement runs with: unnamed portal, text parameters, text results.
        let mut bind = Vec::with_capacity(64);
        let at = begin_frame(&mut bind, b'B');
        bind.push(0);
        bind.extend_from_slice(&stmt.backend_name);
        bind.extend_from_slice(&0u16.to_be_bytes());
        bind.extend_from_slice(&(args.len() as u16).to_be_bytes());
        for a in args {
            match a {
                Some(v) => {
                    bind.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    bind.extend_from_slice(v.as_bytes());
                }
                None => bind.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        bind.extend_from_slice(&0u16.to_be_bytes());
        end_frame(&mut bind, at);
        let decision = {
            let b = frontend::bind(&bind[5..])?;
            crate::frontend::routing::decide(
                &named.plan,
                Some(&b),
                named.params_before,
                &named.literals[..],
                &self.shared.map,
                self.allow_scatter_writes(),
            )
        };
        let wanted = match decision {
            Ok(Decision::Shard(s)) => Some(s),
            Ok(Decision::Any) => None,
            Ok(_) => {
                let err = SqlError::new(
                    errors::FEATURE_NOT_SUPPORTED,
                    format!("prepared statement \"{name}\" does not run on one shard; EXECUTE runs statements of one shard"),
                )
                .with_hint("send the statement itself (it can then run on every shard), or give it a key");
                return self.refuse_simple(err).await;
            }
            Err(err) => return self.refuse_simple(err).await,
        };
        if let Err(err) = self.attach(wanted).await {
            self.router_error_simple(err);
            return Ok(());
        }
        let on = self.pinned.as_ref().map(|p| p.shard);
        if let (Some(on), Some(w)) = (on, wanted.filter(|&w| Some(w) != on)) {
            let err = errors::cross_shard_transaction(&self.shard_name(on), &self.shard_name(w));
            return self.refuse_simple(err).await;
        }
        self.prepare_for_use(name)?;
        self.bout.extend_from_slice(&bind);
        self.replies.push(Kind::Bind, Audience::Router);
        let at = begin_frame(&mut self.bout, b'D');
        self.bout.extend_from_slice(b"P\0");
        end_frame(&mut self.bout, at);
        self.replies.push(Kind::DescribeRows, Audience::Client);
        let at = begin_frame(&mut self.bout, b'E');
        self.bout.extend_from_slice(&[0, 0, 0, 0, 0]);
        end_frame(&mut self.bout, at);
        self.replies.push(Kind::Execute, Audience::Client);
        put_frame(&mut self.bout, b'S', &[]);
        self.replies.push(Kind::Sync, Audience::Client);
        self.exchange().await?;
        self.release_if_idle().await;
        Ok(())
    }
}

fn no_such_statement(name: &str) -> SqlError {
    SqlError::new(
        errors::UNDEFINED_PREPARED_STATEMENT,
        format!("prepared statement \"{name}\" does not exist"),
    )
}
