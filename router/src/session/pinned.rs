//! The backend connection a client holds (transaction pooling): a pooled connection of its
//! own, or the shard's shared connections for one request. Data only; `super::attach` checks
//! connections out and gives them back.

use std::sync::Arc;

use crate::backend::mux::ShardMux;
use crate::backend::pool::PooledConn;
use crate::backend::prepared::PreparedSet;

/// The backend connection a client holds.
pub struct Pinned {
    pub shard: usize,
    pub conn: Link,
    /// Which version of the client's unnamed statement the connection holds (0: none).
    pub unnamed: u64,
    /// Nothing has been exchanged on it since it was pinned: its first request may be sent
    /// again elsewhere when the server aborts it at a shutdown ([`super::replay`]).
    pub fresh: bool,
}

/// What a pinned request goes to.
pub enum Link {
    /// A pooled connection of the client's own, for as long as it is pinned.
    Own(PooledConn),
    /// The shard's shared connections (`backend::mux`): the request is written as if for a
    /// connection that has every router statement, and goes to one of them once complete,
    /// with the preparation that connection needs in front.
    Shared {
        mux: Arc<ShardMux>,
        assumed: PreparedSet,
        /// The statement needs no particular shard: if the request cannot go to these shared
        /// connections, any shard's connection will do.
        any: bool,
        /// The router statements the request binds or describes, as they were when it was
        /// written: the lane it goes to may need to prepare them.
        bound: Vec<Arc<crate::backend::registry::Statement>>,
    },
}

impl Link {
    /// The connection of the client's own, if it is one.
    pub fn own(&mut self) -> Option<&mut crate::backend::BackendConn> {
        match self {
            Link::Own(conn) => Some(conn),
            Link::Shared { .. } => None,
        }
    }

    pub fn into_own(self) -> Option<PooledConn> {
        match self {
            Link::Own(conn) => Some(conn),
            Link::Shared { .. } => None,
        }
    }

    /// The router statements the request may use as prepared.
    pub fn prepared(&mut self) -> &mut PreparedSet {
        match self {
            Link::Own(conn) => &mut conn.prepared,
            Link::Shared { assumed, .. } => assumed,
        }
    }

    /// Keeps `stmt` for the request, when shared (see `Link::Shared::bound`).
    pub fn note_bound(&mut self, stmt: &super::statements::ClientStatement) {
        if let (Link::Shared { bound, .. }, super::statements::Text::Named(s)) = (self, &stmt.text)
        {
            if !bound.iter().any(|b| b.id == s.id) {
                bound.push(s.clone());
            }
        }
    }

    pub fn is_shared(&self) -> bool {
        matches!(self, Link::Shared { .. })
    }
}
