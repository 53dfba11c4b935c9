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

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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

type Part = RwLock<HashMap<(Box<str>, Box<[u8]>), Arc<Statement>>>;

pub struct Registry {
    parts: Vec<Part>,
    hasher: std::collections::hash_map::RandomState,
    next_id: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            parts: (0..PARTS).map(|_| RwLock::new(HashMap::new())).collect(),
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
        if let Some(s) = part.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return s.clone();
        }
        let mut map = part.write().unwrap_or_else(|p| p.into_inner());
        map.entry(key)
            .or_insert_with(|| {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                Arc::new(Statement {
                    id,
                    sql: sql.into(),
                    param_types: param_types.into(),
                    backend_name: format!("sg_{id}").into(),
                })
            })
            .clone()
    }

    /// Number of distinct statements seen.
    pub fn len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| p.read().unwrap_or_else(|p| p.into_inner()).len())
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
}
