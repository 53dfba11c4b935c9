//! The router's clients, as cancel requests and the admin console need them: each client's
//! BackendKeyData, who it is ([`ClientInfo`]), and the backend its current statement runs on.
//!
//! A session publishes where it runs on every checkout of a backend connection, so publishing
//! must be cheap and must not lock: [`ClientSlot`] is a small sequence lock with one writer
//! (the session) and rare readers (cancel requests), which retry while a write is under way.
//! The table of clients is locked only on connect, disconnect and cancel.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// The low bits of a client's BackendKeyData process id number the client; the bits above
/// them are the router's id, so any router of a fleet can tell whose client a cancel is for.
pub const CLIENT_BITS: u32 = 24;

/// The router id a BackendKeyData process id belongs to.
pub fn router_of(pid: i32) -> u8 {
    ((pid >> CLIENT_BITS) & 0x7f) as u8
}

/// Where a client's current statement runs, for forwarding its cancel request: the shard of
/// the routing (generation) its session uses, and the backend's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CancelTarget {
    pub generation: u64,
    pub shard: usize,
    pub pid: i32,
    pub secret: i32,
}

/// Who a client is, set once at login (`SHOW CLIENTS`).
#[derive(Clone, Debug)]
pub struct ClientInfo {
    pub user: String,
    pub database: String,
    pub addr: SocketAddr,
    pub application_name: String,
    pub connected: SystemTime,
    pub tls: bool,
}

/// The part of a client session that other tasks may read.
pub struct ClientSlot {
    pub secret: i32,
    info: OnceLock<ClientInfo>,
    /// Even when stable, odd while the session writes the fields below.
    seq: AtomicU32,
    /// Shard index + 1, or 0 when the client runs nothing.
    shard: AtomicU32,
    /// The routing generation the shard index belongs to.
    generation: AtomicU64,
    /// The backend's pid (high half) and secret (low half).
    key: AtomicU64,
    /// Cancel requests received while no connection of the client's own ran its statement
    /// (it may be on a shared connection), counted, and the session's wake-up for them: its
    /// channel for shared replies, once it has one.
    cancels: AtomicU64,
    cancel_sink: OnceLock<crate::backend::mux::Sink>,
}

impl ClientSlot {
    pub fn new(secret: i32) -> ClientSlot {
        ClientSlot {
            secret,
            info: OnceLock::new(),
            seq: AtomicU32::new(0),
            shard: AtomicU32::new(0),
            generation: AtomicU64::new(0),
            key: AtomicU64::new(0),
            cancels: AtomicU64::new(0),
            cancel_sink: OnceLock::new(),
        }
    }

    /// Asks the session to cancel its statement on a shared connection (it alone knows which
    /// of the connection's statements is its own).
    pub fn ask_cancel(&self) {
        self.cancels.fetch_add(1, Ordering::AcqRel);
        if let Some(sink) = self.cancel_sink.get() {
            sink.cancel_asked();
        }
    }

    /// How many cancels were asked so far ([`ClientSlot::ask_cancel`]).
    pub fn cancels(&self) -> u64 {
        self.cancels.load(Ordering::Acquire)
    }

    /// Where [`ClientSlot::ask_cancel`] wakes the session: the channel its shared requests'
    /// replies come on (set once, when the session makes it). A session that waits there
    /// reads [`ClientSlot::cancels`] after each message, so none is missed.
    pub fn hear_cancels(&self, sink: crate::backend::mux::Sink) {
        let _ = self.cancel_sink.set(sink);
    }

    /// Says who the client is (once, after its login).
    pub fn describe(&self, info: ClientInfo) {
        let _ = self.info.set(info);
    }

    pub fn info(&self) -> Option<&ClientInfo> {
        self.info.get()
    }

    /// Publishes where the client's statements run now (`None`: nowhere). Only the client's
    /// own session calls this.
    pub fn set_running(&self, target: Option<CancelTarget>) {
        let (shard, key, generation) = match target {
            Some(t) => (
                u32::try_from(t.shard + 1).unwrap_or(0),
                (u64::from(t.pid as u32) << 32) | u64::from(t.secret as u32),
                t.generation,
            ),
            None => (0, 0, 0),
        };
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        self.shard.store(shard, Ordering::Relaxed);
        self.key.store(key, Ordering::Relaxed);
        self.generation.store(generation, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Where the client's statements run, as last published.
    pub fn running(&self) -> Option<CancelTarget> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let shard = self.shard.load(Ordering::Relaxed);
            let key = self.key.load(Ordering::Relaxed);
            let generation = self.generation.load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != before {
                continue;
            }
            return (shard > 0).then(|| CancelTarget {
                generation,
                shard: shard as usize - 1,
                pid: (key >> 32) as u32 as i32,
                secret: key as u32 as i32,
            });
        }
    }
}

/// Every client of this router, by the process id of its BackendKeyData.
pub struct Clients {
    router_id: u8,
    slots: Mutex<HashMap<i32, Arc<ClientSlot>>>,
    next: AtomicI32,
}

impl Clients {
    pub fn new(router_id: u8) -> Clients {
        Clients {
            router_id,
            slots: Mutex::new(HashMap::new()),
            next: AtomicI32::new(1),
        }
    }

    /// Registers a new client; its id is the pid in the BackendKeyData it is given.
    pub fn add(&self) -> (i32, Arc<ClientSlot>) {
        let slot = Arc::new(ClientSlot::new(rand::random::<i32>()));
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let router = i32::from(self.router_id) << CLIENT_BITS;
        loop {
            let seq = self.next.fetch_add(1, Ordering::Relaxed) & ((1 << CLIENT_BITS) - 1);
            let id = router | seq;
            if seq != 0 && !slots.contains_key(&id) {
                slots.insert(id, slot.clone());
                return (id, slot);
            }
        }
    }

    pub fn remove(&self, id: i32) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// Every client, by id.
    pub fn list(&self) -> Vec<(i32, Arc<ClientSlot>)> {
        let mut all: Vec<(i32, Arc<ClientSlot>)> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, slot)| (*id, slot.clone()))
            .collect();
        all.sort_by_key(|(id, _)| *id);
        all
    }

    pub fn count(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The backend running client `pid`'s statement, if the secret matches.
    pub fn cancel_target(&self, pid: i32, secret: i32) -> Option<CancelTarget> {
        self.slot(pid, secret)?.running()
    }

    /// Client `pid`'s slot, if the secret matches.
    pub fn slot(&self, pid: i32, secret: i32) -> Option<Arc<ClientSlot>> {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pid)
            .cloned()?;
        (slot.secret == secret).then_some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_publishes_whole_targets() {
        let slot = ClientSlot::new(5);
        assert_eq!(slot.running(), None);
        let t = CancelTarget {
            generation: 9,
            shard: 3,
            pid: -7,
            secret: i32::MIN,
        };
        slot.set_running(Some(t));
        assert_eq!(slot.running(), Some(t));
        slot.set_running(None);
        assert_eq!(slot.running(), None);
    }

    #[test]
    fn readers_never_see_half_a_write() {
        let slot = Arc::new(ClientSlot::new(1));
        let writer = {
            let slot = slot.clone();
            std::thread::spawn(move || {
                for i in 0..200_000i32 {
                    slot.set_running(Some(CancelTarget {
                        generation: i as u64,
                        shard: i as usize % 7,
                        pid: i,
                        secret: i,
                    }));
                }
            })
        };
        for _ in 0..200_000 {
            if let Some(t) = slot.running() {
                assert_eq!(t.pid, t.secret, "a torn read: {t:?}");
                assert_eq!(t.shard, t.pid as usize % 7, "a torn read: {t:?}");
                assert_eq!(t.generation, t.pid as u64, "a torn read: {t:?}");
            }
        }
        writer.join().unwrap();
    }

    #[test]
    fn ids_carry_the_router_id() {
        let clients = Clients::new(5);
        let (id, _) = clients.add();
        assert_eq!(router_of(id), 5);
        assert_eq!(clients.count(), 1);
        clients.remove(id);
        assert_eq!(clients.count(), 0);
    }
}
