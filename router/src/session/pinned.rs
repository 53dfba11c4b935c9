//! The backend connection a client holds (transaction pooling): a pooled connection of its
//! own, or the shard's shared connections for one request. Data only; `super::attach` checks
//! connections out and gives them back.

use std::sync::Arc;

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
        /// The routing (`Routing::generation`) whose mux for the shard it goes to: a request
        /// pinned under another routing does not go to this one's.
        generation: u64,
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

/// The connections a session keeps from one transaction to the next because they hold
/// temporary objects of its own (`crate::planner::temporary`), as a session pooler would:
/// [`super::Session::attach`] takes the one of a shard the statement needs, and releasing it
/// puts it back here. Each is marked `broken`, so that it is closed, never pooled, however
/// it is let go (the client leaves, its transaction is abandoned).
#[derive(Default)]
pub struct Kept {
    /// The shards whose connection the session keeps.
    shards: Vec<usize>,
    /// Those connections, while not pinned.
    idle: Vec<Pinned>,
    /// One of them was lost, and with it the client's temporary objects: the session ends.
    pub lost: bool,
}

impl Kept {
    /// Whether the session keeps a connection (of any shard).
    pub fn any(&self) -> bool {
        !self.shards.is_empty()
    }

    pub fn keeps(&self, shard: usize) -> bool {
        self.shards.contains(&shard)
    }

    /// From now on the session keeps its connection to `shard`.
    pub fn keep(&mut self, shard: usize) {
        if !self.keeps(shard) {
            self.shards.push(shard);
        }
    }

    /// The kept connection a statement for `wanted` (`None`: any shard) runs on, if any.
    pub fn take(&mut self, wanted: Option<usize>) -> Option<Pinned> {
        let i = match wanted {
            Some(shard) => self.idle.iter().position(|p| p.shard == shard)?,
            None if self.idle.is_empty() => return None,
            None => 0,
        };
        Some(self.idle.swap_remove(i))
    }

    /// A reload replaced `old` by `new`: each kept shard is found again by its range and
    /// primary (its index may change). `false` when one is gone or moved: its connection (and
    /// the client's objects there) cannot follow, and every kept connection is let go.
    pub fn follow(&mut self, old: &shardmap::ShardMap, new: &shardmap::ShardMap) -> bool {
        let find = |i: usize| {
            let was = old.shards().get(i)?;
            new.shards().iter().position(|s| {
                s.range == was.range && s.primary.endpoint() == was.primary.endpoint()
            })
        };
        let moved: Option<Vec<usize>> = self.shards.iter().map(|&i| find(i)).collect();
        let Some(moved) = moved else {
            self.shards.clear();
            self.idle.clear();
            self.lost = true;
            return false;
        };
        for pin in &mut self.idle {
            if let Some(at) = self.shards.iter().position(|&s| s == pin.shard) {
                pin.shard = moved[at];
            }
        }
        self.shards = moved;
        true
    }

    /// `pin`, released by the session: kept when it is the connection of a kept shard, else
    /// given back (returned to its pool when dropped).
    pub fn put_back(&mut self, mut pin: Pinned) -> Option<Pinned> {
        if !self.keeps(pin.shard) {
            return Some(pin);
        }
        match pin.conn.own() {
            Some(conn) => {
                conn.broken = true;
                self.idle.push(pin);
                None
            }
            None => Some(pin),
        }
    }
}
