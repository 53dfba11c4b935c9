//! Protocol-level portals that read several shards, executed with a row limit inside a
//! transaction (pgjdbc with a fetch size, asyncpg cursors): bound on each shard and merged step
//! by step like a cursor ([`super`]), each Execute getting at most its rows.

use tokio::io::{AsyncRead, AsyncWrite};

use super::table::{portal_key, Place, Steps};
use super::{stepwise_merge, Session, SessionError};
use crate::protocol::frame::frames;
use crate::protocol::reply;
use crate::resolver::Read;

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// The first Execute, with a row limit, of a portal that reads several shards inside a
    /// transaction (pgjdbc with a fetch size): the portal is bound on each shard (`request`:
    /// Parse, Describe, Bind of `shard_portal`, Describe of it, Sync) and merged step by step;
    /// this Execute gets `max_rows` rows, then PortalSuspended, or its CommandComplete when no
    /// row is left. `asked`: the batch's messages to answer first. `Ok(true)` when it failed.
    pub(in crate::session) async fn portal_in_steps(
        &mut self,
        portal: &str,
        shard_portal: String,
        read: Read,
        request: Vec<u8>,
        max_rows: u64,
        asked: &[u8],
    ) -> Result<bool, SessionError> {
        let Some(answers) = self.ask_in_transaction(&read.shards, request).await? else {
            return Ok(true);
        };
        if let Some(error) = answers
            .iter()
            .find_map(|a| crate::protocol::backend::error_frame(a))
        {
            self.client.out.extend_from_slice(error);
            return Ok(true);
        }
        // Shard 0's descriptions: `t` and the statement's `T`/`n` (what Describe of the
        // statement answers), then the portal's `T`/`n`.
        let (mut statement, mut portal_desc) = (Vec::new(), Vec::new());
        let mut descriptions = 0;
        for f in frames(answers.first().map_or(&[][..], |a| &a[..])).map_while(Result::ok) {
            match f[0] {
                b't' => statement.extend_from_slice(f),
                b'T' | b'n' if descriptions == 0 => {
                    statement.extend_from_slice(f);
                    descriptions += 1;
                }
                b'T' | b'n' => portal_desc = f.to_vec(),
                _ => {}
            }
        }
        let merge = match stepwise_merge(&read, &portal_desc, self.routing.text_bytewise()) {
            Ok(merge) => merge,
            Err(e) => {
                e.write(&mut self.client.out);
                return Ok(true);
            }
        };
        let key = portal_key(portal);
        self.cursors.places.insert(
            key.clone(),
            Place::Steps(Box::new(Steps {
                shards: read.shards,
                merge,
                description: portal_desc.clone(),
                portal: Some(shard_portal),
            })),
        );
        crate::multishard::gather::answer_asked(
            &mut self.client.out,
            asked,
            &statement,
            &portal_desc,
        );
        self.execute_portal(&key, max_rows).await
    }

    /// An Execute of a portal merged step by step: up to `max_rows` rows (0: all), then
    /// PortalSuspended or CommandComplete. `Ok(true)` when it failed.
    pub(in crate::session) async fn execute_portal(
        &mut self,
        key: &str,
        max_rows: u64,
    ) -> Result<bool, SessionError> {
        let want = if max_rows == 0 { u64::MAX } else { max_rows };
        let mut out = Vec::new();
        match self.pull(key, want, true, &mut out, max_rows > 0).await? {
            Ok(Some((n, more))) => {
                self.client.out.append(&mut out);
                if more {
                    crate::protocol::frame::put_frame(&mut self.client.out, b's', &[]);
                } else {
                    reply::command_complete(&mut self.client.out, &format!("SELECT {n}"));
                }
                Ok(false)
            }
            Ok(None) => Ok(true),
            Err(e) => {
                e.write(&mut self.client.out);
                Ok(true)
            }
        }
    }

    /// Whether `portal` is a client's portal merged step by step.
    pub(in crate::session) fn is_portal_in_steps(&self, portal: &str) -> bool {
        !portal.is_empty() && self.cursors.places.contains_key(&portal_key(portal))
    }

    /// Close of a portal merged step by step: closed on its shards too.
    pub(in crate::session) async fn close_portal(
        &mut self,
        portal: &str,
    ) -> Result<(), SessionError> {
        let key = portal_key(portal);
        if let Some(Place::Steps(steps)) = self.cursors.places.remove(&key) {
            if let Some(shard_portal) = &steps.portal {
                let mut request = bytes::BytesMut::new();
                crate::protocol::request::close_portal(&mut request, shard_portal)?;
                crate::protocol::request::sync(&mut request);
                self.ask_in_transaction(&steps.shards, request.to_vec())
                    .await?;
            }
        }
        reply::close_complete(&mut self.client.out);
        Ok(())
    }
}
