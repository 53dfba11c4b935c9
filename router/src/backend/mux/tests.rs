//! Unit tests of the mux's room accounting: each worker's share of the lanes, and a lane
//! given back to a worker left without one.

use super::*;
use crate::backend::worker::set_worker;

fn mux(limit: usize, workers: usize) -> ShardMux {
    let endpoint = Endpoint {
        host: "127.0.0.1".into(),
        port: 1,
        database: "db".into(),
        user: "u".into(),
        password: None,
        application_name: "test".into(),
        connect_timeout: Duration::from_secs(1),
        tls: crate::tls::BackendTls::disabled(),
    };
    ShardMux::new(endpoint, limit, workers, Default::default())
}

/// Takes room for a lane as worker `w` would.
fn take_as(mux: &ShardMux, w: usize) -> bool {
    set_worker(w);
    mux.take_slot(false)
}

#[test]
fn a_worker_opens_at_most_its_share_of_the_lanes() {
    let two = mux(2, 2);
    assert!(take_as(&two, 0));
    assert!(!take_as(&two, 0), "the other lane is worker 1's");
    assert!(!two.may_open(0) && two.may_open(1));
    assert!(take_as(&two, 1));
    assert!(!take_as(&two, 1) && !two.may_open(1), "the limit");
    two.give_slot(0);
    assert!(!take_as(&two, 1), "worker 0's room, given back");
    assert!(take_as(&two, 0));

    // Fewer lanes than workers: each opened by a different worker, the first to ask.
    let one = mux(1, 4);
    assert!(take_as(&one, 2));
    assert!(!take_as(&one, 3) && !take_as(&one, 2));

    // More lanes than workers: the share rounded up, the limit in all.
    let five = mux(5, 2);
    assert_eq!(five.share(), 3);
    assert!((0..3).all(|_| take_as(&five, 0)));
    assert!(!take_as(&five, 0));
    assert!(take_as(&five, 1) && take_as(&five, 1));
    assert!(!take_as(&five, 1), "five in all");
    set_worker(0);
    assert!(!five.take_slot(true), "not past the limit either");
}

#[test]
fn a_worker_past_its_share_gives_a_lane_back_to_one_without() {
    let two = mux(2, 2);
    // Worker 0's lane was slow: it went past its share.
    assert!(take_as(&two, 0));
    assert!(!two.take_slot(false) && two.take_slot(true));
    let (a, b) = (Arc::new(Lane::new(1, 1)), Arc::new(Lane::new(2, 2)));
    b.load.store(3, Ordering::Relaxed);
    two.lanes
        .store(Arc::new(vec![(0, a.clone()), (0, b.clone())]));
    set_worker(1);
    let (lane, usable) = two.pick(0);
    assert!(usable, "meanwhile another worker's lane takes the request");
    assert!(lane.is_some_and(|l| Arc::ptr_eq(&l, &b)));
    assert!(
        a.closed.load(Ordering::Relaxed) && !b.closed.load(Ordering::Relaxed),
        "the least loaded one is given back"
    );
    let _ = two.pick(0);
    assert!(!b.closed.load(Ordering::Relaxed), "one only");
    assert!(!two.may_open(1));
    two.remove(&a);
    assert!(
        two.may_open(1),
        "once it has closed, worker 1 opens its own"
    );
    assert!(take_as(&two, 1));

    // A worker whose other lane is slow keeps the one that takes requests: the slow one is
    // given back (once its statement ends), and meanwhile the other takes the request.
    let two = mux(2, 2);
    assert!(take_as(&two, 0) && two.take_slot(true));
    let (slow, fit) = (Arc::new(Lane::new(3, 3)), Arc::new(Lane::new(4, 4)));
    slow.front_since
        .store(now_us().saturating_sub(1_000_000), Ordering::Relaxed);
    // The less loaded one is the one that takes requests: it is kept all the same.
    slow.load.store(9, Ordering::Relaxed);
    fit.load.store(1, Ordering::Relaxed);
    two.lanes
        .store(Arc::new(vec![(0, slow.clone()), (0, fit.clone())]));
    set_worker(1);
    let (lane, usable) = two.pick(0);
    assert!(usable && lane.is_some_and(|l| Arc::ptr_eq(&l, &fit)));
    assert!(slow.closed.load(Ordering::Relaxed) && !fit.closed.load(Ordering::Relaxed));
    set_worker(0);
}
