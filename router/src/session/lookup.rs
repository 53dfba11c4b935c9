//! A statement routed by a lookup column (`Dest::Lookup`): the value's lookup row is read on
//! its shard, over a pooled connection (what is committed now), and the statement then goes
//! to the shard of the keyspace ID it holds (`resolver::lookups::found`, under the
//! transaction's rules), or, with no lookup row, where it would go without the lookup. Inside
//! a transaction that wrote lookup rows, which that read would not see, it goes there too.

use tokio::io::{AsyncRead, AsyncWrite};

use super::execute::Carrier;
use super::{Seen, Session, SessionError};
use crate::resolver::{self, ByLookup, Dest, Reroute};

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    pub(super) async fn by_lookup(
        &mut self,
        by: ByLookup,
        carrier: Carrier<'_>,
    ) -> Result<(), SessionError> {
        let dest = self.looked_up(by).await;
        if let (Carrier::Bind { bind, .. }, Dest::Shard(_)) = (&carrier, &dest) {
            if !bind.portal.is_empty() {
                // A named portal lives on its shard until the transaction ends.
                self.state.anchor(Some(crate::resolver::Anchor::Portal));
            }
        }
        Box::pin(self.execute(dest, carrier)).await
    }

    /// Where the statement goes, once its lookup row is read.
    async fn looked_up(&mut self, by: ByLookup) -> Dest {
        if self.state.in_transaction() && self.state.wrote_lookups() {
            return *by.without;
        }
        let found = self
            .routing
            .lookup_entry(by.shard, &by.sql, &by.lookup_table)
            .await;
        let id = match found {
            Ok(Some(id)) => id,
            Ok(None) => return *by.without,
            Err(e) => return Dest::Refused(e),
        };
        self.reroute = Reroute::Key(id);
        let pinned = self.pinned_shard();
        let seen = Seen {
            user: &self.user,
            settings: &self.settings,
            changes: &self.changes,
            keeps: self.kept.any(),
        };
        let cx = Self::context(&self.routing, seen, &self.state, pinned);
        resolver::lookups::found(self.routing.map.shard_for(id), &cx)
    }
}
