//! The router-wide statements prepared on one backend connection: which ones it has, bounded,
//! with the least recently used closed first when it holds too many.

use hashbrown::HashMap;

/// How many router statements one backend connection keeps prepared. Postgres keeps every
/// prepared statement in the backend's memory until the connection ends; a client that
/// prepares many distinct texts must not grow every backend without bound.
pub const MAX_PREPARED_PER_CONNECTION: usize = 1000;

/// The statements prepared on one connection, with the least recently used evicted first.
#[derive(Default, Debug)]
pub struct PreparedSet {
    last_use: HashMap<u64, u64>,
    tick: u64,
    /// Says every statement is prepared ([`PreparedSet::everything`]).
    everything: bool,
}

impl PreparedSet {
    /// A set that holds every statement: what a request written for a shared connection
    /// assumes, since the connection it goes to is chosen only when it is complete; the
    /// preparation it needs there is added then (`backend::mux`).
    pub fn everything() -> PreparedSet {
        PreparedSet {
            everything: true,
            ..PreparedSet::default()
        }
    }

    /// Whether this is [`PreparedSet::everything`].
    pub fn is_everything(&self) -> bool {
        self.everything
    }

    /// Whether statement `id` is prepared; marks it used.
    pub fn contains(&mut self, id: &u64) -> bool {
        if self.everything {
            return true;
        }
        self.tick += 1;
        match self.last_use.get_mut(id) {
            Some(t) => {
                *t = self.tick;
                true
            }
            None => false,
        }
    }

    /// Records statement `id` as prepared; returns the statement to close first when the set is
    /// full (the least recently used).
    pub fn insert(&mut self, id: u64) -> Option<u64> {
        if self.everything {
            return None;
        }
        self.tick += 1;
        let evict = if self.last_use.len() >= MAX_PREPARED_PER_CONNECTION
            && !self.last_use.contains_key(&id)
        {
            let oldest = self
                .last_use
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(id, _)| *id);
            if let Some(old) = oldest {
                self.last_use.remove(&old);
            }
            oldest
        } else {
            None
        };
        self.last_use.insert(id, self.tick);
        evict
    }

    pub fn remove(&mut self, id: &u64) {
        self.last_use.remove(id);
    }

    pub fn clear(&mut self) {
        self.last_use.clear();
    }

    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut set = PreparedSet::default();
        for id in 0..MAX_PREPARED_PER_CONNECTION as u64 {
            assert_eq!(set.insert(id), None);
        }
        assert!(set.contains(&0));
        assert_eq!(
            set.insert(5000),
            Some(1),
            "0 was used again, 1 is the oldest"
        );
        assert!(!set.contains(&1));
        assert_eq!(set.len(), MAX_PREPARED_PER_CONNECTION);
        assert_eq!(set.insert(5000), None, "already there");
    }
}
