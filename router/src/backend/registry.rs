//! The router-wide registry of named prepared statements.
//!
//! Under transaction pooling a client's named statement must exist on whichever backend
//! connection serves its next Bind. Each distinct (text, parameter types) gets one router-wide
//! id and backend name `sg_<id>`; a backend connection remembers which ids it has prepared, and
//! the session prepares the others on demand. Two clients using one name for different texts
//! get different ids, so they never see each other's statements.
//!
//! The registry is split into independently locked parts, so interning (once per client per
//! statement, never per execution) does not serialise on one lock.
//!
//! It holds its statements weakly: a statement lives as long as some client's name is for it,
//! so texts that clients prepared once and closed (or left with) do not pile up over a long
//! run. Dead entries are swept when a part has doubled since its last sweep. A text prepared
//! again after it was forgotten gets a new id, and so one more Parse on each connection.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

const PARTS: usize = 16;

/// A statement text with its parameter types, as the router prepares it on backends.
#[derive(Debug)]
pub struct Statement {
    pub id: u64,
    pub sql: Box<str>,
    /// The Parse message's parameter type section (count + OIDs), re-sent unchanged.
    pub param_types: Box<[u8]>,
    /// `sg_<id>`: its name on every backend connection that has it.
    pub backend_name: Box<str>,
}

type Key = (Box<str>, Box<[u8]>);

#[derive(Default)]
struct PartMap {
    map: HashMap<Key, Weak<Statement>>,
    /// Entries left after the last sweep of dead ones.
    swept_to: usize,
}

type Part = RwLock<PartMap>;

pub struct Registry {
    parts: Vec<Part>,
    hasher: std::collections::hash_map::RandomState,
    next_id: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            parts: (0..PARTS).map(|_| RwLock::default()).collect(),
            hasher: Default::default(),
            next_id: AtomicU64::new(1),
        }
    }
}

impl Registry {
    /// The statement for this text and these parameter types, created on first use.
    pub fn intern(&self, sql: &str, param_types: &[u8]) -> Arc<Statement> {
        let mut h = self.hasher.build_hasher();
        sql.hash(&mut h);
        param_types.hash(&mut h);
        let part = &self.parts[(h.finish() as usize) % PARTS];
        let key = (Box::<str>::from(sql), Box::<[u8]>::from(param_types));
        let live = |p: &PartMap| p.map.get(&key).and_then(Weak::upgrade);
        if let Some(s) = live(&part.read().unwrap_or_else(|p| p.into_inner())) {
            return s;
        }
        let mut part = part.write().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = live(&part) {
            return s;
        }
        if part.map.len() >= (2 * part.swept_to).max(64) {
            part.map.retain(|_, s| s.strong_count() > 0);
            part.swept_to = part.map.len();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let statement = Arc::new(Statement {
            id,
            sql: sql.into(),
            param_types: param_types.into(),
            backend_name: format!("sg_{id}").into(),
        });
        part.map.insert(key, Arc::downgrade(&statement));
        statement
    }

    /// Number of distinct statements some client holds.
    pub fn len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| {
                let part = p.read().unwrap_or_else(|p| p.into_inner());
                part.map.values().filter(|s| s.strong_count() > 0).count()
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_and_types_share_an_id() {
        let r = Registry::default();
        let a = r.intern("SELECT $1", b"\0\0");
        let b = r.intern("SELECT $1", b"\0\0");
        let c = r.intern("SELECT $1", b"\0\x01\0\0\0\x14");
        let d = r.intern("SELECT $2", b"\0\0");
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_ne!(a.id, d.id);
        assert_eq!(&*a.backend_name, format!("sg_{}", a.id));
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn statements_no_client_holds_are_forgotten() {
        let r = Registry::default();
        let kept = r.intern("SELECT 1", b"\0\0");
        for i in 0..10_000 {
            drop(r.intern(&format!("SELECT {i} + 1"), b"\0\0"));
        }
        assert_eq!(r.len(), 1);
        let stored: usize = r
            .parts
            .iter()
            .map(|p| p.read().expect("part").map.len())
            .sum();
        assert!(
            stored < 16 * 200,
            "{stored} entries stored for 1 live statement"
        );
        assert_eq!(
            r.intern("SELECT 1", b"\0\0").id,
            kept.id,
            "a held one keeps its id"
        );
        let again = r.intern("SELECT 5 + 1", b"\0\0");
        assert!(
            again.id > kept.id + 10_000,
            "a forgotten text gets a new id"
        );
    }
}
