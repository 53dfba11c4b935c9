//! The waiting room of the front door: connections accepted that have not finished logging in.
//!
//! A reconnect storm (every client of a fleet logging in again after a restart) and a slowloris
//! (sockets that connect and say nothing) look the same at accept: many connections that have
//! not logged in. Refusing the newest once a cap is reached turns a storm into failed logins and
//! lets silent sockets lock everyone out, so the door does the opposite: every connection gets
//! in, and once `[limits] max_logins` are waiting one of them is closed to make room: the one
//! that has done least of its login, oldest first. First go those that have **sent nothing**,
//! then those that have only **asked for encryption** (an SSLRequest or GSSENCRequest, answered),
//! then those that **spoke** (sent their StartupMessage, or with TLS their ClientHello). A real
//! client takes each step within a round trip, so to push it out an attacker would have to open
//! `max_logins` connections in that time; what gets closed is what stalled. The middle rank is
//! what lets a TLS client through a churning slowloris: its first step (the SSLRequest) already
//! puts it ahead of every socket that has said nothing, and it needs no more than a plain
//! client's one round trip to get there. With `max_logins_per_address`, an address at its limit
//! makes room from its own connections only, so it cannot push out anybody else's.
//!
//! A rank is what the router has *read*, and a busy router reads late: under a storm, many
//! connections may be accepted before a turn comes to read the one that spoke first. So before
//! closing a connection for having said nothing (or only asked for encryption), the room asks
//! the kernel how many bytes wait unread on its socket (`FIONREAD`, the only system call here,
//! which reads nothing and changes nothing). One whose client has sent something took its
//! step, and goes up a rank at once instead of when the router reads it (what an attacker
//! gains by this it could have had by sending an SSLRequest). At most [`LOOK_AHEAD`] of a rank
//! are looked at each time; when none of them stalled, the oldest left in the lowest rank is
//! closed. Sockets that each send one byte and stall thus cost a few system calls per new
//! connection, and are closed oldest first like the silent.
//!
//! Otherwise free of I/O: a connection holds a [`Ticket`] (its place, given up when dropped)
//! and a [`Closed`], which resolves when the room closed it, saying why; the connection's login
//! then drops its socket. Entering, speaking and leaving each take one short lock (a few times
//! per login, never per statement).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// How many may wait, and from where.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Connections logging in at once; one more closes one of them (the one that did least,
    /// oldest first).
    pub max: usize,
    /// Connections logging in at once from one address (`0`: no limit for this address).
    pub per_address: usize,
}

/// Why a connection was closed to make room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crowded {
    /// `max` connections were logging in.
    Room,
    /// `per_address` connections from its address were logging in.
    Address,
    /// The router ran out of file descriptors and could accept no one.
    Files,
}

impl std::fmt::Display for Crowded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Crowded::Room => "[limits] max_logins newer connections were logging in",
            Crowded::Address => {
                "[limits] max_logins_per_address newer connections from its address were logging in"
            }
            Crowded::Files => "the router ran out of file descriptors (RLIMIT_NOFILE)",
        })
    }
}

/// How many of a rank the room looks at for one that stalled, each time it must close one.
pub const LOOK_AHEAD: usize = 16;

/// Whether the client of socket `fd` has sent bytes that the router has not read.
pub type Unread = fn(RawFd) -> bool;

/// The connections that have not logged in yet.
pub struct Door {
    room: Mutex<Room>,
    /// Connections closed to make room, since the start.
    closed: AtomicU64,
    unread: Unread,
}

impl Default for Door {
    fn default() -> Self {
        Door::new(unread)
    }
}

/// Whether bytes wait unread on socket `fd` (`FIONREAD`: nothing is read, and the socket's
/// pending error, which a `recv` would report and clear, is left alone).
///
/// The room holds descriptors it does not own: one closed just before its ticket was dropped
/// may meanwhile name another socket, and then answers for it. The answer is only wrong for
/// a connection already gone, which at worst goes up a rank while its ticket goes.
fn unread(fd: RawFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one `c_int` into `n`, which outlives the call; on a descriptor
    // that is closed or not a socket it fails and writes nothing.
    let ok = unsafe { libc::ioctl(fd, libc::FIONREAD, &raw mut n) } == 0;
    ok && n > 0
}

#[derive(Default)]
struct Room {
    next: u64,
    /// By arrival: the first is the oldest.
    waiting: BTreeMap<u64, Waiter>,
    /// Those of `waiting` that have sent nothing yet: closed first, oldest first.
    silent: BTreeSet<u64>,
    /// Those of `waiting` that have only asked for encryption: closed next.
    asked: BTreeSet<u64>,
    by_address: HashMap<IpAddr, BTreeSet<u64>>,
}

struct Waiter {
    address: IpAddr,
    /// Its socket, to look for bytes not read yet.
    fd: RawFd,
    close: oneshot::Sender<Crowded>,
}

/// A connection's place in the room, given up when it logs in or goes ([`Drop`]).
pub struct Ticket {
    door: Arc<Door>,
    id: u64,
}

/// Tells a connection that the room closed it.
pub struct Closed(oneshot::Receiver<Crowded>);

impl Door {
    /// A door that asks `unread` whether a socket has bytes not read yet.
    pub fn new(unread: Unread) -> Door {
        Door {
            room: Mutex::default(),
            closed: AtomicU64::new(0),
            unread,
        }
    }

    /// Lets a connection from `address` over socket `fd` in; when the room is full under
    /// `rules`, another (of this address, when the address is at its own limit) is closed
    /// first: the one that did least of its login, oldest first.
    pub fn enter(self: &Arc<Self>, address: IpAddr, fd: RawFd, rules: Rules) -> (Ticket, Closed) {
        let (close, closed) = oneshot::channel();
        let mut room = self.room.lock().unwrap_or_else(|p| p.into_inner());
        let (id, made_room) = room.enter(Waiter { address, fd, close }, rules, self.unread);
        drop(room);
        if made_room {
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
        let ticket = Ticket {
            door: self.clone(),
            id,
        };
        (ticket, Closed(closed))
    }

    /// Closes a connection still logging in, chosen as for room, to free its file descriptor
    /// when the router has run out and can accept no one; `false` when no connection is
    /// logging in.
    pub fn make_room(&self) -> bool {
        let mut room = self.room.lock().unwrap_or_else(|p| p.into_inner());
        let Some(oldest) = room.oldest(None, self.unread) else {
            return false;
        };
        if let Some(waiter) = room.leave(oldest) {
            let _ = waiter.close.send(Crowded::Files);
        }
        drop(room);
        self.closed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Connections logging in now.
    pub fn len(&self) -> usize {
        self.room
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .waiting
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections closed to make room since the start.
    pub fn closed_to_make_room(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }
}

impl Room {
    /// Adds a waiter; returns its id and whether another was closed for it.
    fn enter(&mut self, waiter: Waiter, rules: Rules, unread: Unread) -> (u64, bool) {
        let address = waiter.address;
        let own = self.by_address.get(&address).map_or(0, BTreeSet::len);
        let oldest = if rules.per_address > 0 && own >= rules.per_address {
            self.oldest(Some(address), unread)
                .map(|id| (id, Crowded::Address))
        } else if self.waiting.len() >= rules.max.max(1) {
            self.oldest(None, unread).map(|id| (id, Crowded::Room))
        } else {
            None
        };
        if let Some((oldest, why)) = oldest {
            if let Some(waiter) = self.leave(oldest) {
                // The connection may be gone already, its ticket not yet dropped.
                let _ = waiter.close.send(why);
            }
        }
        let id = self.next;
        self.next += 1;
        self.waiting.insert(id, waiter);
        self.silent.insert(id);
        self.by_address.entry(address).or_default().insert(id);
        (id, oldest.is_some())
    }

    /// The one to close first, of those from `among` (else of all): the oldest silent one,
    /// else the oldest that only asked for encryption, else the oldest. Up to [`LOOK_AHEAD`] of
    /// each of the first two ranks are looked at, oldest first; one whose client has sent
    /// bytes not read yet has taken its step, and goes up a rank now rather than when the
    /// router reads them. When none of those looked at stalled, the oldest of the lowest rank
    /// left is closed.
    fn oldest(&mut self, among: Option<IpAddr>, unread: Unread) -> Option<u64> {
        let has_sent = |room: &Room, id: &u64| room.waiting.get(id).is_some_and(|w| unread(w.fd));
        let silent = self.first(true, among, LOOK_AHEAD);
        let sent = silent.iter().take_while(|id| has_sent(self, id)).count();
        let mut found = silent.get(sent).copied();
        // Each goes up one rank, however many steps it took: the silent ones join those that
        // asked only after these were looked at.
        if found.is_none() {
            let asked = self.first(false, among, LOOK_AHEAD);
            let spoke = asked.iter().take_while(|id| has_sent(self, id)).count();
            found = asked.get(spoke).copied();
            for id in &asked[..spoke] {
                self.asked.remove(id);
            }
        }
        for id in &silent[..sent] {
            self.silent.remove(id);
            self.asked.insert(*id);
        }
        let first = |silent| self.first(silent, among, 1).first().copied();
        found
            .or_else(|| first(true))
            .or_else(|| first(false))
            .or_else(|| match among {
                Some(address) => self.by_address.get(&address)?.first().copied(),
                None => self.waiting.keys().next().copied(),
            })
    }

    /// The `n` oldest of the silent (with `silent`) or of those that only asked, of those from
    /// `among` if given.
    fn first(&self, silent: bool, among: Option<IpAddr>, n: usize) -> Vec<u64> {
        let rank = if silent { &self.silent } else { &self.asked };
        match among.and_then(|a| self.by_address.get(&a)) {
            Some(own) => rank.intersection(own).take(n).copied().collect(),
            None if among.is_some() => Vec::new(),
            None => rank.iter().take(n).copied().collect(),
        }
    }

    /// Takes waiter `id` out.
    fn leave(&mut self, id: u64) -> Option<Waiter> {
        let waiter = self.waiting.remove(&id)?;
        self.silent.remove(&id);
        self.asked.remove(&id);
        if let Some(ids) = self.by_address.get_mut(&waiter.address) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_address.remove(&waiter.address);
            }
        }
        Some(waiter)
    }
}

impl Ticket {
    /// The connection asked for encryption (SSLRequest, GSSENCRequest): it is closed to make
    /// room only when no connection that has sent nothing is left to close.
    pub fn asked(&self) {
        let mut room = self.door.room.lock().unwrap_or_else(|p| p.into_inner());
        if room.silent.remove(&self.id) {
            room.asked.insert(self.id);
        }
    }

    /// The connection has spoken (sent its StartupMessage, or a TLS ClientHello): it is
    /// closed to make room only when no connection that has not is left to close.
    pub fn spoke(&self) {
        let mut room = self.door.room.lock().unwrap_or_else(|p| p.into_inner());
        room.silent.remove(&self.id);
        room.asked.remove(&self.id);
    }
}

impl Closed {
    /// Resolves when the room closed this connection to make room for a newer one.
    pub async fn closed(&mut self) -> Crowded {
        // The sender is dropped unsent only when the ticket is dropped, and with it the
        // connection that listens here.
        (&mut self.0).await.unwrap_or(Crowded::Room)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut room = self.door.room.lock().unwrap_or_else(|p| p.into_inner());
        let _ = room.leave(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    fn rules(max: usize, per_address: usize) -> Rules {
        Rules { max, per_address }
    }

    /// A connection: its ticket and its closing.
    type Conn = (Ticket, Closed);

    thread_local! {
        /// The made-up descriptors whose clients have sent bytes not read yet.
        static UNREAD: std::cell::RefCell<BTreeSet<RawFd>> = const {
            std::cell::RefCell::new(BTreeSet::new())
        };
    }

    fn fake_unread(fd: RawFd) -> bool {
        UNREAD.with(|u| u.borrow().contains(&fd))
    }

    /// A door over made-up descriptors (no socket has unread bytes until [`sent`] says so).
    fn door() -> Arc<Door> {
        Arc::new(Door::new(fake_unread))
    }

    /// The client of `c` has sent bytes the router has not read.
    fn sent(door: &Door, c: &Conn) {
        let room = door.room.lock().expect("room");
        let fd = room.waiting[&c.0.id].fd;
        UNREAD.with(|u| u.borrow_mut().insert(fd));
    }

    fn enter(door: &Arc<Door>, from: &str, max: usize, per_address: usize) -> Conn {
        static NEXT_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1000);
        let fd = NEXT_FD.fetch_add(1, Ordering::Relaxed);
        door.enter(ip(from), fd, rules(max, per_address))
    }

    /// Why the connection was closed, if it was.
    fn closed(c: &mut Conn) -> Option<Crowded> {
        c.1 .0.try_recv().ok()
    }

    #[test]
    fn the_oldest_is_closed_when_the_room_is_full() {
        let door = door();
        let mut first = enter(&door, "10.0.0.1", 2, 0);
        let mut second = enter(&door, "10.0.0.2", 2, 0);
        assert_eq!((closed(&mut first), closed(&mut second)), (None, None));
        let mut third = enter(&door, "10.0.0.3", 2, 0);
        assert_eq!(
            closed(&mut first),
            Some(Crowded::Room),
            "the oldest makes room"
        );
        assert_eq!((closed(&mut second), closed(&mut third)), (None, None));
        assert_eq!(door.len(), 2);
        assert_eq!(door.closed_to_make_room(), 1);
    }

    #[test]
    fn the_silent_are_closed_before_those_that_spoke() {
        let door = door();
        let mut spoke = enter(&door, "10.0.0.1", 3, 0);
        spoke.0.spoke();
        let mut silent = enter(&door, "10.0.0.2", 3, 0);
        let mut also_spoke = enter(&door, "10.0.0.3", 3, 0);
        also_spoke.0.spoke();
        let mut newest = enter(&door, "10.0.0.4", 3, 0);
        assert_eq!(closed(&mut silent), Some(Crowded::Room));
        assert_eq!(closed(&mut spoke), None, "older, but it spoke");
        // Newest is silent now, and goes next; then the oldest of those that spoke.
        let _a = enter(&door, "10.0.0.5", 3, 0);
        assert_eq!(closed(&mut newest), Some(Crowded::Room));
        let mut b = enter(&door, "10.0.0.6", 3, 0);
        assert_eq!(closed(&mut b), None);
        assert_eq!(closed(&mut spoke), None, "the silent _a went first");
        b.0.spoke();
        let _c = enter(&door, "10.0.0.7", 3, 0);
        let _d = enter(&door, "10.0.0.8", 3, 0);
        assert_eq!(
            closed(&mut spoke),
            Some(Crowded::Room),
            "no silent one left"
        );
        assert_eq!(closed(&mut also_spoke), None);
    }

    #[test]
    fn those_that_only_asked_for_encryption_go_after_the_silent_and_before_those_that_spoke() {
        let door = door();
        let mut asked = enter(&door, "10.0.0.1", 3, 0);
        asked.0.asked();
        let mut spoke = enter(&door, "10.0.0.2", 3, 0);
        spoke.0.spoke();
        let mut silent = enter(&door, "10.0.0.3", 3, 0);
        let mut a = enter(&door, "10.0.0.4", 3, 0);
        assert_eq!(
            closed(&mut silent),
            Some(Crowded::Room),
            "newer, but silent"
        );
        assert_eq!((closed(&mut asked), closed(&mut spoke)), (None, None));
        // Asking again, or after speaking, takes nobody back down.
        spoke.0.asked();
        a.0.asked();
        a.0.asked();
        let mut b = enter(&door, "10.0.0.5", 3, 0);
        assert_eq!(
            closed(&mut asked),
            Some(Crowded::Room),
            "the oldest that asked"
        );
        assert_eq!((closed(&mut spoke), closed(&mut b)), (None, None));
        let mut c = enter(&door, "10.0.0.6", 3, 0);
        assert_eq!(closed(&mut b), Some(Crowded::Room), "silent first, again");
        c.0.asked();
        let _d = enter(&door, "10.0.0.7", 3, 0);
        assert_eq!(closed(&mut a), Some(Crowded::Room), "the oldest that asked");
        assert_eq!((closed(&mut spoke), closed(&mut c)), (None, None));
    }

    #[test]
    fn an_address_at_its_limit_closes_its_silent_then_those_that_asked() {
        let door = door();
        let mut spoke = enter(&door, "10.0.0.1", 100, 3);
        spoke.0.spoke();
        let mut asked = enter(&door, "10.0.0.1", 100, 3);
        asked.0.asked();
        let mut silent = enter(&door, "10.0.0.1", 100, 3);
        let mut fourth = enter(&door, "10.0.0.1", 100, 3);
        assert_eq!(closed(&mut silent), Some(Crowded::Address));
        fourth.0.spoke();
        let _fifth = enter(&door, "10.0.0.1", 100, 3);
        assert_eq!(closed(&mut asked), Some(Crowded::Address));
        assert_eq!((closed(&mut spoke), closed(&mut fourth)), (None, None));
    }

    /// Whether `c` is in the silent rank, the rank of those that asked, or neither.
    fn rank(door: &Door, c: &Conn) -> &'static str {
        let room = door.room.lock().expect("room");
        if room.silent.contains(&c.0.id) {
            "silent"
        } else if room.asked.contains(&c.0.id) {
            "asked"
        } else {
            "spoke"
        }
    }

    #[test]
    fn a_connection_whose_bytes_are_not_read_yet_goes_up_a_rank_instead() {
        let door = door();
        let mut unread = enter(&door, "10.0.0.1", 3, 0);
        sent(&door, &unread);
        let mut silent = enter(&door, "10.0.0.2", 3, 0);
        let mut asked_unread = enter(&door, "10.0.0.3", 3, 0);
        asked_unread.0.asked();
        sent(&door, &asked_unread);
        let mut a = enter(&door, "10.0.0.4", 3, 0);
        assert_eq!(
            closed(&mut silent),
            Some(Crowded::Room),
            "the one that said nothing"
        );
        assert_eq!(
            (closed(&mut unread), closed(&mut asked_unread)),
            (None, None)
        );
        assert_eq!(rank(&door, &unread), "asked", "it sent its first packet");
        assert_eq!(
            rank(&door, &asked_unread),
            "asked",
            "not looked at: a silent one went"
        );
        // No silent one left that stalled: the rank above is looked at, and each goes up one.
        sent(&door, &a);
        let _b = enter(&door, "10.0.0.5", 3, 0);
        assert_eq!(rank(&door, &unread), "spoke");
        assert_eq!(rank(&door, &asked_unread), "spoke");
        assert_eq!(
            closed(&mut a),
            Some(Crowded::Room),
            "the oldest of the lowest rank left"
        );
        assert_eq!(
            (closed(&mut unread), closed(&mut asked_unread)),
            (None, None)
        );
        assert_eq!(door.len(), 3);
    }

    #[test]
    fn one_that_stalled_goes_before_those_with_unread_bytes() {
        let door = door();
        let others: Vec<Conn> = (0..10)
            .map(|_| {
                let c = enter(&door, "10.0.0.1", 100, 0);
                sent(&door, &c);
                c
            })
            .collect();
        let mut stalled = enter(&door, "10.0.0.2", 100, 0);
        stalled.0.asked();
        let _new = enter(&door, "10.0.0.3", 11, 0);
        assert_eq!(closed(&mut stalled), Some(Crowded::Room));
        assert!(
            others.iter().all(|c| rank(&door, c) == "asked"),
            "one rank up, not two"
        );
    }

    #[test]
    fn past_the_look_ahead_the_oldest_of_the_lowest_rank_goes() {
        let door = door();
        let mut all: Vec<Conn> = (0..3 * LOOK_AHEAD)
            .map(|_| {
                let c = enter(&door, "10.0.0.1", 1000, 0);
                sent(&door, &c);
                c
            })
            .collect();
        let _new = enter(&door, "10.0.0.2", 3 * LOOK_AHEAD, 0);
        let gone: Vec<usize> = (0..all.len())
            .filter(|&i| closed(&mut all[i]).is_some())
            .collect();
        assert_eq!(gone, vec![LOOK_AHEAD], "the oldest still silent");
        assert_eq!(rank(&door, &all[0]), "asked");
        assert_eq!(rank(&door, &all[LOOK_AHEAD - 1]), "asked");
        assert_eq!(rank(&door, &all[LOOK_AHEAD + 1]), "silent");
    }

    #[test]
    fn leaving_frees_a_place_without_closing_anyone() {
        let door = door();
        let mut first = enter(&door, "10.0.0.1", 2, 0);
        let second = enter(&door, "10.0.0.2", 2, 0);
        drop(second);
        let mut third = enter(&door, "10.0.0.3", 2, 0);
        assert_eq!((closed(&mut first), closed(&mut third)), (None, None));
        assert_eq!(door.len(), 2);
        assert_eq!(door.closed_to_make_room(), 0);
        drop((first, third));
        assert!(door.is_empty());
        let room = door.room.lock().expect("room");
        assert!(room.silent.is_empty() && room.asked.is_empty() && room.by_address.is_empty());
    }

    #[test]
    fn an_address_at_its_limit_makes_room_from_its_own_connections() {
        let door = door();
        let mut bystander = enter(&door, "10.0.0.9", 100, 2);
        let mut a1 = enter(&door, "10.0.0.1", 100, 2);
        a1.0.spoke();
        let mut a2 = enter(&door, "10.0.0.1", 100, 2);
        let mut a3 = enter(&door, "10.0.0.1", 100, 2);
        assert_eq!(
            closed(&mut a2),
            Some(Crowded::Address),
            "its own silent one goes"
        );
        assert_eq!(closed(&mut bystander), None, "the oldest of all stays");
        assert_eq!((closed(&mut a1), closed(&mut a3)), (None, None));
        let _a4 = enter(&door, "10.0.0.1", 100, 2);
        assert_eq!(closed(&mut a3), Some(Crowded::Address));
        assert_eq!(door.len(), 3);
    }

    #[test]
    fn without_a_limit_per_address_one_address_may_fill_the_room() {
        let door = door();
        let conns: Vec<Conn> = (0..50).map(|_| enter(&door, "127.0.0.1", 100, 0)).collect();
        assert_eq!(door.len(), 50);
        assert_eq!(door.closed_to_make_room(), 0);
        drop(conns);
        assert!(door.is_empty());
    }

    #[test]
    fn out_of_files_the_oldest_silent_connection_is_closed() {
        let door = door();
        assert!(!door.make_room(), "nobody to close");
        let mut spoke = enter(&door, "10.0.0.1", 100, 0);
        spoke.0.spoke();
        let mut silent = enter(&door, "10.0.0.2", 100, 0);
        assert!(door.make_room());
        assert_eq!(closed(&mut silent), Some(Crowded::Files));
        assert!(door.make_room());
        assert_eq!(closed(&mut spoke), Some(Crowded::Files));
        assert!(door.is_empty());
    }

    #[tokio::test]
    async fn a_closed_connection_is_woken() {
        let door = door();
        let (_ticket, mut first) = enter(&door, "10.0.0.1", 1, 0);
        let waiting = tokio::spawn(async move { first.closed().await });
        let _second = enter(&door, "10.0.0.2", 1, 0);
        let why = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("woken")
            .expect("joined");
        assert_eq!(why, Crowded::Room);
    }
}
