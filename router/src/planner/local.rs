//! Each worker thread's own small plan cache, in front of the shared one ([`super::cache`]).
//!
//! Clients repeat a handful of statement texts (pgbench, an application's queries), and each
//! router worker serves its clients on one thread. A hit here takes no lock and writes no
//! shared memory, so statements on 32 cores do not bounce the shared cache's lock words between
//! them. The shared cache stays the source of truth: this one holds the thread's own copies of
//! its plans (a plan's count is written whenever a session takes or drops it, so one `Arc`
//! shared by every worker would bounce like a lock word), is small and is emptied when full,
//! and is dropped as a whole when the planner it belongs to changes its plans
//! ([`super::Planner::learn_tables`]) or another planner uses the thread (tests build many).
//! The copies cost memory besides the shared cache's bound: at most [`CAPACITY`] plans of
//! texts up to [`MAX_TEXT`] per worker.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::HashMap;

use super::Plan;

/// Plans kept per thread.
const CAPACITY: usize = 256;

/// The longest text a thread keeps: with [`CAPACITY`], at most 2 MiB of texts per thread.
/// Longer statements are still found in the shared cache.
const MAX_TEXT: usize = 8 << 10;

#[derive(Default)]
struct Local {
    /// The planner and its generation these plans came from.
    owner: (u64, u64),
    plans: HashMap<Box<str>, Arc<Plan>>,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
    /// This thread's counter among a [`Hits`]'s stripes.
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);
const STRIPES: usize = 64;

/// One counter on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// Hits in the threads' own caches, counted on one cache line per thread (threads beyond 64
/// share lines), so counting does not bounce a shared line between cores.
pub struct Hits(Box<[Stripe]>);

impl Default for Hits {
    fn default() -> Self {
        Hits((0..STRIPES).map(|_| Stripe::default()).collect())
    }
}

impl Hits {
    fn record(&self) {
        STRIPE.with(|&i| self.0[i].0.fetch_add(1, Ordering::Relaxed));
    }

    pub fn total(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// The plan this thread cached for `text` under planner `owner` (its id and generation); a
/// hit is counted in `hits`.
pub fn get(owner: (u64, u64), text: &str, hits: &Hits) -> Option<Arc<Plan>> {
    let found = LOCAL.with(|l| {
        let l = l.borrow();
        if l.owner != owner {
            return None;
        }
        l.plans.get(text).cloned()
    });
    if found.is_some() {
        hits.record();
    }
    found
}

/// Remembers a copy of `plan` for `text` on this thread; the plan to use from now on (the
/// copy, or `plan` when the text is too long to keep).
pub fn put(owner: (u64, u64), text: &str, plan: &Arc<Plan>) -> Arc<Plan> {
    if text.len() > MAX_TEXT {
        return plan.clone();
    }
    let own = Arc::new(Plan::clone(plan));
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        if l.owner != owner || l.plans.len() >= CAPACITY {
            l.plans.clear();
            l.owner = owner;
        }
        l.plans.insert(text.into(), own.clone());
    });
    own
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_belong_to_one_planner_generation() {
        let (p, hits) = (Plan::empty(), Hits::default());
        let own = put((1, 0), "SELECT $1", &p);
        assert!(!Arc::ptr_eq(&own, &p), "the thread's own copy");
        assert!(Arc::ptr_eq(&get((1, 0), "SELECT $1", &hits).unwrap(), &own));
        assert!(
            get((1, 1), "SELECT $1", &hits).is_none(),
            "a newer generation"
        );
        assert!(get((2, 0), "SELECT $1", &hits).is_none(), "another planner");
        let _ = put((2, 0), "SELECT 2", &p);
        assert!(
            get((1, 0), "SELECT $1", &hits).is_none(),
            "dropped when the owner changed"
        );
        assert_eq!(hits.total(), 1);
    }

    #[test]
    fn stays_bounded() {
        let p = Plan::empty();
        for i in 0..CAPACITY * 3 {
            let _ = put((9, 0), &format!("SELECT {i}"), &p);
        }
        LOCAL.with(|l| assert!(l.borrow().plans.len() <= CAPACITY));
    }
}
