//! An INSERT that leaves out its table's sharding key, which the router gives
//! (`Dest::NewKeys`): keys for its rows are taken from the router's blocks
//! (`crate::routing::ids`), all of one shard (the pinned connection's, when there is one, so a
//! transaction stays where it is), written into the text (`planner::new_keys`), and that
//! INSERT runs as if the client had sent it. A Query becomes a Query of the new text; a Bind
//! becomes a Bind of the new text, which the backend parses as its unnamed statement.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::execute::Carrier;
use super::{Session, SessionError};
use crate::errors;
use crate::planner::new_keys::with_keys;
use crate::planner::Route;
use crate::protocol::reply::SqlError;
use crate::protocol::request;
use crate::resolver::NewKeys;

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    pub(super) async fn with_new_keys(
        &mut self,
        new: NewKeys,
        carrier: Carrier<'_>,
    ) -> Result<(), SessionError> {
        if let Carrier::SqlExecute { name, .. } = carrier {
            let err = SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                format!("EXECUTE {name}: an INSERT that leaves out the sharding key {} of {} cannot run from SQL PREPARE", new.key, new.table),
            )
            .with_hint("send the INSERT itself, or use the driver's prepared statements");
            return self.refuse(&err, &carrier).await;
        }
        if self.writing_keys {
            return self.refuse(&still_without_key(), &carrier).await;
        }
        let shard = new.shard.or(self.pinned_shard());
        let keys = match self.routing.new_keys(&new.table, shard, new.rows).await {
            Ok((_, keys)) => keys,
            Err(err) => return self.refuse(&err, &carrier).await,
        };
        let Some(sql) = with_keys(carrier.sql(), &new.key, new.key_type, &keys, new.always) else {
            let err = SqlError::new(
                errors::FEATURE_NOT_SUPPORTED,
                format!(
                    "the router could not write the keys of {}.{} into this INSERT",
                    new.table, new.key
                ),
            )
            .with_hint(format!("give {} in the INSERT's column list", new.key));
            return self.refuse(&err, &carrier).await;
        };
        match carrier {
            Carrier::Bind { bind, stmt } => {
                let planned = self.routing.planner.plan(&sql, &mut self.nbuf);
                if planned
                    .statements
                    .iter()
                    .any(|r| matches!(r, Route::NewKeys { .. }))
                {
                    drop(planned);
                    return self
                        .refuse(&still_without_key(), &Carrier::Bind { bind, stmt })
                        .await;
                }
                let own = self
                    .statements
                    .routers_own(sql, stmt.param_types(), &planned);
                Box::pin(self.bind_statement(bind, own)).await
            }
            _ => {
                let mut frame = BytesMut::with_capacity(sql.len() + 6);
                request::query(&mut frame, &sql).map_err(|e| {
                    SessionError::Protocol(format!("internal: the INSERT with new keys: {e}"))
                })?;
                // The Query is planned once, there; a text that still left its key out would
                // come back here, and is refused then rather than given keys again.
                self.writing_keys = true;
                let done = Box::pin(self.query(frame)).await;
                self.writing_keys = false;
                done
            }
        }
    }
}

/// The text with the router's keys written in must route by them.
fn still_without_key() -> SqlError {
    errors::internal("an INSERT with the router's keys still lacks its key")
}
