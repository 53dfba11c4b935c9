//! One independent pool of backend connections per (host, port, database).
//!
//! Each pool has its own lock, size and waiters, so a slow or dead host only ever delays the
//! clients whose statements go to it; shards that share a database endpoint share its pool.
//! Every worker thread has pools of its own, so a pool's lock is in practice only ever taken by
//! one thread (and by the metrics reader now and then): taking it is two uncontended atomic
//! operations. A checkout that finds an idle connection reads no clock, allocates nothing and
//! moves a pointer: connections live in boxes, handed out and given back whole.
//!
//! (deadpool's managed pool did this job before; per statement it cost more than the rest of
//! the checkout: a semaphore and a lock, hooks, a clock read for its metrics, and the
//! connection moved by value through several layers. docs/architecture.md says more.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shardmap::ShardMap;
use tokio::sync::Notify;

use super::conn::{BackendConn, BackendError, Endpoint};

/// How the pools of a router are sized and timed.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub max_size: usize,
    /// Idle connections kept open per pool (opened in the background).
    pub min_idle: usize,
    /// Idle connections beyond `min_idle` unused this long are closed.
    pub idle_timeout: Option<Duration>,
    pub checkout_timeout: Duration,
    pub connect_timeout: Duration,
    pub user: String,
    pub password: Option<String>,
    pub application_name: String,
    /// `[backend] sslmode` and its certificate authorities.
    pub tls: crate::tls::BackendTls,
}

impl Endpoint {
    /// How the router logs in to `primary`: as the user and with the password of its URL, else
    /// those of `[backend]`.
    pub fn for_primary(primary: &shardmap::Primary, settings: &PoolSettings) -> Endpoint {
        Endpoint {
            host: primary.host.clone(),
            port: primary.port,
            database: primary.database.clone(),
            user: primary
                .user
                .clone()
                .unwrap_or_else(|| settings.user.clone()),
            password: primary
                .password
                .clone()
                .or_else(|| settings.password.clone()),
            application_name: settings.application_name.clone(),
            connect_timeout: settings.connect_timeout,
            tls: settings.tls.clone(),
        }
    }
}

/// Whether a connection just checked out was opened for this checkout (never used before).
pub fn opened_for_this(conn: &PooledConn) -> bool {
    conn.opened
}

/// Closes a connection instead of returning it to its pool: it may hold state another client
/// must not see (an open transaction, a half-read reply), or it broke.
pub fn discard(mut conn: PooledConn) {
    conn.conn = None;
}

/// The pool of one endpoint.
pub struct ShardPool {
    pub endpoint: Endpoint,
    /// Its connections, shared with a pool that kept them through a reload.
    slots: Arc<Slots>,
    checkout_timeout: Duration,
    min_idle: usize,
    idle_timeout: Option<Duration>,
    /// Made for this routing, not kept through a reload ([`ShardPool::is_new`]).
    new: bool,
}

/// The connections of one pool, and who waits for one.
struct Slots {
    state: Mutex<State>,
    /// Woken when a connection comes back or a slot frees up.
    freed: Notify,
}

struct State {
    /// Connections at rest, the most recently used last (handed out first: its socket and
    /// its server process are warm).
    idle: Vec<Idle>,
    /// Connections open or being opened, idle ones included.
    size: usize,
    max_size: usize,
    /// Checkouts waiting for a connection.
    waiting: usize,
}

struct Idle {
    conn: Box<BackendConn>,
    /// When the pool's maintenance first saw it idle (not read per statement: a checkout and
    /// a return read no clock); `None` until then.
    seen_idle: Option<Instant>,
}

/// How a pool stands (`SHOW POOLS`, `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub max_size: usize,
    /// Connections open (idle or in use) or being opened.
    pub size: usize,
    /// Idle connections.
    pub available: usize,
    /// Checkouts waiting for a connection.
    pub waiting: usize,
}

/// A connection checked out of its pool; it goes back when dropped, unless it is broken, left
/// in an unknown state, or taken out with [`discard`].
pub struct PooledConn {
    conn: Option<Box<BackendConn>>,
    slots: Arc<Slots>,
    /// Opened for this checkout (never used before).
    opened: bool,
}

impl std::ops::Deref for PooledConn {
    type Target = BackendConn;
    fn deref(&self) -> &BackendConn {
        // Only `discard` and `drop` take the connection out, and both consume the guard.
        self.conn.as_deref().unwrap_or_else(|| unreachable!())
    }
}

impl std::ops::DerefMut for PooledConn {
    fn deref_mut(&mut self) -> &mut BackendConn {
        self.conn.as_deref_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        // Whether it is still good is checked when it is next checked out (a server may close
        // it meanwhile anyway); one known to be broken is closed now.
        let back = self.conn.take().filter(|c| !c.broken);
        let mut state = self.slots.lock();
        match back {
            Some(conn) if state.size <= state.max_size => state.idle.push(Idle {
                conn,
                seen_idle: None,
            }),
            // Closed (dropped here), and its slot is free: a pool shrunk by a reload closes
            // connections beyond its new size as they come back.
            _ => state.size -= 1,
        }
        let waiters = state.waiting > 0;
        drop(state);
        if waiters {
            self.slots.freed.notify_one();
        }
    }
}

impl Slots {
    fn new(max_size: usize) -> Slots {
        Slots {
            state: Mutex::new(State {
                idle: Vec::new(),
                size: 0,
                max_size,
                waiting: 0,
            }),
            freed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding it leaves counts that are still true: go on with them.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A checkout counted among the pool's waiters for as long as it lives.
struct Waiting<'s>(&'s Slots);

impl<'s> Waiting<'s> {
    fn new(slots: &'s Slots) -> Waiting<'s> {
        slots.lock().waiting += 1;
        Waiting(slots)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().waiting -= 1;
    }
}

/// What a checkout found.
enum Found {
    Idle(Box<BackendConn>),
    /// A free slot, reserved: the caller opens the connection.
    Room,
    Full,
}

impl Endpoint {
    /// Whether connections to `self` can serve `other`: the same server, database and login
    /// (and the same connect timeout, which the pool's connection factory keeps), encrypted the
    /// same way (a plain connection must not serve a config that asks for TLS, nor one checked
    /// against certificate authorities that were since replaced).
    pub fn same_login(&self, other: &Endpoint) -> bool {
        self.tls == other.tls
            && (
                &self.host,
                self.port,
                &self.database,
                &self.user,
                &self.password,
                &self.application_name,
                self.connect_timeout,
            ) == (
                &other.host,
                other.port,
                &other.database,
                &other.user,
                &other.password,
                &other.application_name,
                other.connect_timeout,
            )
    }
}

/// Why no connection could be had; the session turns these into SQLSTATEs.
#[derive(Debug)]
pub enum CheckoutError {
    /// All connections busy for the whole checkout timeout (53300).
    Exhausted { endpoint: String, waited: Duration },
    /// Could not connect or log in (08006 / 08001).
    Unreachable(BackendError),
}

impl ShardPool {
    fn new(endpoint: Endpoint, s: &PoolSettings) -> ShardPool {
        ShardPool {
            endpoint,
            slots: Arc::new(Slots::new(s.max_size)),
            checkout_timeout: s.checkout_timeout,
            min_idle: s.min_idle.min(s.max_size),
            idle_timeout: s.idle_timeout,
            new: true,
        }
    }

    /// [`ShardPool::find`], unless checkouts are waiting already: they come first, in turn.
    fn find_unless_queued(&self) -> Found {
        let mut state = self.slots.lock();
        if state.waiting > 0 {
            return Found::Full;
        }
        Self::found(&mut state)
    }

    /// An idle connection that is still good (a broken one is closed and the next tried), or
    /// room to open one.
    fn find(&self) -> Found {
        Self::found(&mut self.slots.lock())
    }

    fn found(state: &mut State) -> Found {
        while let Some(idle) = state.idle.pop() {
            if idle.conn.is_idle_healthy() {
                return Found::Idle(idle.conn);
            }
            // The server closed it while it was idle (a restart, an idle timeout of its own).
            state.size -= 1;
        }
        if state.size < state.max_size {
            state.size += 1;
            return Found::Room;
        }
        Found::Full
    }

    fn checked_out(&self, conn: Box<BackendConn>, opened: bool) -> PooledConn {
        PooledConn {
            conn: Some(conn),
            slots: self.slots.clone(),
            opened,
        }
    }

    /// Opens a connection in a slot [`ShardPool::find`] reserved; the slot is freed again when
    /// it fails.
    async fn open(&self) -> Result<PooledConn, CheckoutError> {
        match BackendConn::connect(&self.endpoint).await {
            Ok(conn) => Ok(self.checked_out(Box::new(conn), true)),
            Err(e) => {
                let waiters = {
                    let mut state = self.slots.lock();
                    state.size -= 1;
                    state.waiting > 0
                };
                if waiters {
                    self.slots.freed.notify_one();
                }
                Err(CheckoutError::Unreachable(e))
            }
        }
    }

    /// Closes connections idle longer than the idle timeout, then opens connections until
    /// `min_idle` are there. Runs in the background, never on a client's path.
    async fn maintain(&self) {
        let now = Instant::now();
        let closed = {
            let mut state = self.slots.lock();
            for idle in &mut state.idle {
                idle.seen_idle.get_or_insert(now);
            }
            let mut closed = Vec::new();
            if let Some(limit) = self.idle_timeout {
                // The least recently used are first; `min_idle` connections stay open anyway.
                let stale = state
                    .idle
                    .iter()
                    .take_while(|i| i.seen_idle.is_some_and(|t| now - t >= limit))
                    .count();
                let keep = self.min_idle.saturating_sub(state.size - stale);
                let close = stale.saturating_sub(keep);
                closed.extend(state.idle.drain(..close));
                state.size -= close;
            }
            closed
        };
        if !closed.is_empty() {
            tracing::debug!(endpoint = %self.endpoint.name(), closed = closed.len(), "closed idle connections");
            self.slots.freed.notify_one();
        }
        let missing = self.min_idle.saturating_sub(self.status().size);
        let mut opened = Vec::with_capacity(missing);
        for _ in 0..missing {
            match self.get_now().await {
                Ok(Some(c)) => opened.push(c),
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(endpoint = %self.endpoint.name(), "could not open an idle connection: {e:?}");
                    break;
                }
            }
        }
    }

    /// A connection, waiting at most the checkout timeout for a free one; a new connection
    /// is bounded by the connect timeout instead, so a dead host fails fast.
    pub async fn get(&self) -> Result<PooledConn, CheckoutError> {
        self.get_timed().await.map(|(conn, _)| conn)
    }

    /// [`ShardPool::get`], and how long the caller waited for the connection (to open it, or
    /// for a busy pool). The common case, an idle connection at once, reads no clock.
    pub async fn get_timed(&self) -> Result<(PooledConn, Duration), CheckoutError> {
        match self.find_unless_queued() {
            Found::Idle(conn) => return Ok((self.checked_out(conn, false), Duration::ZERO)),
            Found::Room => {
                let conn = self.open().await?;
                let waited = conn.connect_time;
                return Ok((conn, waited));
            }
            Found::Full => {}
        }
        let asked = Instant::now();
        let deadline = tokio::time::Instant::from_std(asked + self.checkout_timeout);
        let got = {
            // Counted as waiting until this ends, also if the checkout is given up midway.
            let _waiting = Waiting::new(&self.slots);
            self.wait_until(deadline).await
        };
        match got {
            Some(Found::Idle(conn)) => Ok((self.checked_out(conn, false), asked.elapsed())),
            Some(Found::Room) => self.open().await.map(|conn| (conn, asked.elapsed())),
            Some(Found::Full) | None => Err(CheckoutError::Exhausted {
                endpoint: self.endpoint.name(),
                waited: self.checkout_timeout,
            }),
        }
    }

    /// Waits for a connection or a free slot, until `deadline`.
    async fn wait_until(&self, deadline: tokio::time::Instant) -> Option<Found> {
        loop {
            // Registered before looking, so a connection given back in between is not missed.
            let freed = self.slots.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.find() {
                Found::Full => {}
                found => return Some(found),
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return None;
            }
        }
    }

    /// An idle connection, or a new one if the pool has room; `None` at once when every
    /// connection is busy.
    pub async fn get_now(&self) -> Result<Option<PooledConn>, CheckoutError> {
        match self.find_unless_queued() {
            Found::Idle(conn) => Ok(Some(self.checked_out(conn, false))),
            Found::Room => self.open().await.map(Some),
            Found::Full => Ok(None),
        }
    }

    /// Whether this pool was made for the current routing rather than kept from the one
    /// before a reload (with its connections).
    pub fn is_new(&self) -> bool {
        self.new
    }

    pub fn status(&self) -> Status {
        let state = self.slots.lock();
        Status {
            max_size: state.max_size,
            size: state.size,
            available: state.idle.len(),
            waiting: state.waiting,
        }
    }

    /// The backend pid of each idle connection and how long it has been idle, as far as the
    /// pool's maintenance has seen (for the admin console).
    pub fn idle(&self) -> Vec<(i32, Duration)> {
        let state = self.slots.lock();
        state
            .idle
            .iter()
            .map(|i| {
                (
                    i.conn.pid,
                    i.seen_idle.map_or(Duration::ZERO, |t| t.elapsed()),
                )
            })
            .collect()
    }

    /// This pool with new sizes and timeouts, keeping its connections (a reload that changes
    /// pool settings but not where or how to log in).
    fn retuned(&self, endpoint: Endpoint, s: &PoolSettings) -> ShardPool {
        {
            let mut state = self.slots.lock();
            state.max_size = s.max_size;
            // Idle connections beyond the new size close now; those in use as they come back.
            while state.size > state.max_size && !state.idle.is_empty() {
                state.idle.remove(0);
                state.size -= 1;
            }
        }
        self.slots.freed.notify_waiters();
        ShardPool {
            endpoint,
            slots: self.slots.clone(),
            checkout_timeout: s.checkout_timeout,
            min_idle: s.min_idle.min(s.max_size),
            idle_timeout: s.idle_timeout,
            new: false,
        }
    }
}

/// The pools of every shard of a map: `for_shard(i)` is shard i's pool.
pub struct Pools {
    by_shard: Vec<Arc<ShardPool>>,
}

impl Pools {
    /// The pools of `map`'s shards. With `previous` (a reload), the pool of an endpoint that
    /// did not change how to log in is kept with its connections, only its sizes and timeouts
    /// changed; the others are new (and the old ones close when nothing uses them any more).
    pub fn new(map: &ShardMap, settings: &PoolSettings, previous: Option<&Pools>) -> Pools {
        let mut by_endpoint: HashMap<String, Arc<ShardPool>> = HashMap::new();
        let old: HashMap<String, &Arc<ShardPool>> = previous
            .map(|p| {
                p.by_shard
                    .iter()
                    .map(|pool| (pool.endpoint.name(), pool))
                    .collect()
            })
            .unwrap_or_default();
        let by_shard = map
            .shards()
            .iter()
            .map(|shard| {
                let endpoint = Endpoint::for_primary(&shard.primary, settings);
                by_endpoint
                    .entry(endpoint.name())
                    .or_insert_with(|| {
                        Arc::new(match old.get(&endpoint.name()) {
                            Some(kept) if kept.endpoint.same_login(&endpoint) => {
                                kept.retuned(endpoint, settings)
                            }
                            _ => ShardPool::new(endpoint, settings),
                        })
                    })
                    .clone()
            })
            .collect();
        Pools { by_shard }
    }

    /// Each endpoint's pool once (shards of one database share it).
    pub fn distinct(&self) -> Vec<&Arc<ShardPool>> {
        let mut seen = std::collections::HashSet::new();
        self.by_shard
            .iter()
            .filter(|p| seen.insert(p.endpoint.name()))
            .collect()
    }

    /// Keeps every pool within its idle limits, once (the worker calls it every few seconds).
    pub async fn maintain(&self) {
        for pool in self.distinct() {
            pool.maintain().await;
        }
    }

    pub fn for_shard(&self, shard: usize) -> &Arc<ShardPool> {
        &self.by_shard[shard]
    }

    pub fn len(&self) -> usize {
        self.by_shard.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_shard.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_login_prefers_the_primary_url() {
        let settings = PoolSettings {
            max_size: 1,
            min_idle: 0,
            idle_timeout: None,
            checkout_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            user: "router".into(),
            password: Some("pw".into()),
            application_name: "shardgate".into(),
            tls: crate::tls::BackendTls::disabled(),
        };
        let with = shardmap::Primary::parse("postgres://owner:secret@db1:5432/app").unwrap();
        let without = shardmap::Primary::parse("postgres://db2:5432/app").unwrap();
        let e = Endpoint::for_primary(&with, &settings);
        assert_eq!(
            (e.user.as_str(), e.password.as_deref()),
            ("owner", Some("secret"))
        );
        assert_eq!(e.name(), "db1:5432/app");
        let e = Endpoint::for_primary(&without, &settings);
        assert_eq!(
            (e.user.as_str(), e.password.as_deref()),
            ("router", Some("pw"))
        );
    }
}
