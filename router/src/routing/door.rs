//! The waiting room of the front door: connections accepted that have not finished logging in.
//!
//! A reconnect storm (every client of a fleet logging in again after a restart) and a slowloris
//! (sockets that connect and say nothing) look the same at accept: many connections that have
//! not logged in. Refusing the newest once a cap is reached turns a storm into failed logins and
//! lets silent sockets lock everyone out, so the door does the opposite: every connection gets
//! in, and once `[limits] max_logins` are waiting one of them is closed to make room: the
//! oldest of those that have **not spoken yet** (sent no StartupMessage, or with TLS no
//! ClientHello), else the oldest of all. A real client speaks within its first round trip, so
//! to push it out an attacker would have to open `max_logins` connections in that time; what
//! gets closed is what stalled. With `max_logins_per_address`, an address at its limit makes
//! room from its own connections only, so it cannot push out anybody else's.
//!
//! Kept free of I/O: a connection holds a [`Ticket`] (its place, given up when dropped) and a
//! [`Closed`], which resolves when the room closed it, saying why; the connection's task then
//! drops its socket. Entering, speaking and leaving each take one short lock (a few times per
//! login, never per statement).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// How many may wait, and from where.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Connections logging in at once; one more closes the oldest.
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

/// The connections that have not logged in yet.
#[derive(Default)]
pub struct Door {
    room: Mutex<Room>,
    /// Connections closed to make room, since the start.
    closed: AtomicU64,
}

#[derive(Default)]
struct Room {
    next: u64,
    /// By arrival: the first is the oldest.
    waiting: BTreeMap<u64, Waiter>,
    /// Those of `waiting` that have not spoken yet.
    silent: BTreeSet<u64>,
    by_address: HashMap<IpAddr, BTreeSet<u64>>,
}

struct Waiter {
    address: IpAddr,
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
    /// Lets a connection from `address` in; when the room is full under `rules`, the oldest
    /// connection (of this address, when the address is at its own limit) is closed first.
    pub fn enter(self: &Arc<Self>, address: IpAddr, rules: Rules) -> (Ticket, Closed) {
        let (close, closed) = oneshot::channel();
        let mut room = self.room.lock().unwrap_or_else(|p| p.into_inner());
        let (id, made_room) = room.enter(address, rules, close);
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

    /// Closes the oldest connection still logging in (a silent one first) to free its file
    /// descriptor, when the router has run out and can accept no one; `false` when no
    /// connection is logging in.
    pub fn make_room(&self) -> bool {
        let mut room = self.room.lock().unwrap_or_else(|p| p.into_inner());
        let Some(oldest) = room.oldest() else {
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
    fn enter(
        &mut self,
        address: IpAddr,
        rules: Rules,
        close: oneshot::Sender<Crowded>,
    ) -> (u64, bool) {
        let own = self.by_address.get(&address);
        let oldest = match own {
            Some(own) if rules.per_address > 0 && own.len() >= rules.per_address => {
                let silent = own.iter().find(|id| self.silent.contains(id));
                silent.or(own.first()).map(|&id| (id, Crowded::Address))
            }
            _ if self.waiting.len() >= rules.max.max(1) => {
                self.oldest().map(|id| (id, Crowded::Room))
            }
            _ => None,
        };
        if let Some((oldest, why)) = oldest {
            if let Some(waiter) = self.leave(oldest) {
                // The connection may be gone already, its ticket not yet dropped.
                let _ = waiter.close.send(why);
            }
        }
        let id = self.next;
        self.next += 1;
        self.waiting.insert(id, Waiter { address, close });
        self.silent.insert(id);
        self.by_address.entry(address).or_default().insert(id);
        (id, oldest.is_some())
    }

    /// The one to close first: the oldest silent one, else the oldest.
    fn oldest(&self) -> Option<u64> {
        self.silent.first().or(self.waiting.keys().next()).copied()
    }

    /// Takes waiter `id` out.
    fn leave(&mut self, id: u64) -> Option<Waiter> {
        let waiter = self.waiting.remove(&id)?;
        self.silent.remove(&id);
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
    /// The connection has spoken (sent its StartupMessage, or a TLS ClientHello): it is
    /// closed to make room only when no silent connection is left to close.
    pub fn spoke(&self) {
        let mut room = self.door.room.lock().unwrap_or_else(|p| p.into_inner());
        room.silent.remove(&self.id);
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

    fn enter(door: &Arc<Door>, from: &str, max: usize, per_address: usize) -> Conn {
        door.enter(ip(from), rules(max, per_address))
    }

    /// Why the connection was closed, if it was.
    fn closed(c: &mut Conn) -> Option<Crowded> {
        c.1 .0.try_recv().ok()
    }

    #[test]
    fn the_oldest_is_closed_when_the_room_is_full() {
        let door = Arc::new(Door::default());
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
        let door = Arc::new(Door::default());
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
    fn leaving_frees_a_place_without_closing_anyone() {
        let door = Arc::new(Door::default());
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
        assert!(room.silent.is_empty() && room.by_address.is_empty());
    }

    #[test]
    fn an_address_at_its_limit_makes_room_from_its_own_connections() {
        let door = Arc::new(Door::default());
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
        let door = Arc::new(Door::default());
        let conns: Vec<Conn> = (0..50).map(|_| enter(&door, "127.0.0.1", 100, 0)).collect();
        assert_eq!(door.len(), 50);
        assert_eq!(door.closed_to_make_room(), 0);
        drop(conns);
        assert!(door.is_empty());
    }

    #[test]
    fn out_of_files_the_oldest_silent_connection_is_closed() {
        let door = Arc::new(Door::default());
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
        let door = Arc::new(Door::default());
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
