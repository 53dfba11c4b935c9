//! One independent pool of backend connections per (host, port, database).
//!
//! Pools are deadpool `managed::Pool`s with our own manager. Each has its own lock, size and
//! wait queue, so a slow or dead host only ever delays the clients whose statements go to it.
//! Shards that share a database endpoint share its pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult, Timeouts};
use shardmap::ShardMap;

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

pub struct Manager {
    endpoint: Endpoint,
}

impl managed::Manager for Manager {
    type Type = BackendConn;
    type Error = BackendError;

    async fn create(&self) -> Result<BackendConn, BackendError> {
        BackendConn::connect(&self.endpoint).await
    }

    async fn recycle(&self, conn: &mut BackendConn, _: &Metrics) -> RecycleResult<BackendError> {
        if conn.is_idle_healthy() {
            Ok(())
        } else {
            Err(RecycleError::message(
                "the connection was closed or left in an unknown state",
            ))
        }
    }
}

pub type PooledConn = Object<Manager>;

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
    Object::metrics(conn).recycled.is_none()
}

/// Closes a connection instead of returning it to its pool: it may hold state another client
/// must not see (an open transaction, a half-read reply), or it broke.
pub fn discard(conn: PooledConn) {
    drop(Object::take(conn));
}

/// The pool of one endpoint.
pub struct ShardPool {
    pub endpoint: Endpoint,
    pool: managed::Pool<Manager>,
    checkout_timeout: Duration,
    min_idle: usize,
    idle_timeout: Option<Duration>,
    /// Made for this routing, not kept through a reload ([`ShardPool::is_new`]).
    new: bool,
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
        let manager = Manager {
            endpoint: endpoint.clone(),
        };
        let pool = managed::Pool::builder(manager)
            .max_size(s.max_size)
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            // Only fails when a timeout is set without a runtime; the runtime is set above.
            .unwrap_or_else(|e| panic!("pool builder: {e}"));
        ShardPool {
            endpoint,
            pool,
            checkout_timeout: s.checkout_timeout,
            min_idle: s.min_idle.min(s.max_size),
            idle_timeout: s.idle_timeout,
            new: true,
        }
    }

    /// Closes connections idle longer than the idle timeout, then opens connections until
    /// `min_idle` are there. Runs in the background, never on a client's path.
    async fn maintain(&self) {
        if let Some(limit) = self.idle_timeout {
            let mut keep = self.min_idle;
            // The first `min_idle` stale connections found are kept open rather than reopened.
            let retained = self.pool.retain(|_, m| {
                if m.last_used() < limit {
                    return true;
                }
                if keep > 0 {
                    keep -= 1;
                    return true;
                }
                false
            });
            if !retained.removed.is_empty() {
                tracing::debug!(endpoint = %self.endpoint.name(), closed = retained.removed.len(), "closed idle connections");
            }
        }
        let status = self.pool.status();
        let missing = self.min_idle.saturating_sub(status.size);
        if missing > 0 {
            let mut opened = Vec::with_capacity(missing);
            for _ in 0..missing {
                match self.pool.get().await {
                    Ok(c) => opened.push(c),
                    Err(e) => {
                        tracing::debug!(endpoint = %self.endpoint.name(), "could not open an idle connection: {e}");
                        break;
                    }
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
    /// for a busy pool). The common case, a free connection at once, reads no clock.
    pub async fn get_timed(&self) -> Result<(PooledConn, Duration), CheckoutError> {
        // Most checkouts find a free connection: try that without arming a timer, and only
        // then wait with the timeout.
        if let Some(conn) = self.get_now().await? {
            // A connection handed out for the first time was opened for this checkout.
            let waited = if opened_for_this(&conn) {
                conn.connect_time
            } else {
                Duration::ZERO
            };
            return Ok((conn, waited));
        }
        let timeouts = Timeouts {
            wait: Some(self.checkout_timeout),
            create: None,
            recycle: None,
        };
        let asked = std::time::Instant::now();
        match self.pool.timeout_get(&timeouts).await {
            Ok(conn) => Ok((conn, asked.elapsed())),
            Err(PoolError::Backend(e)) => Err(CheckoutError::Unreachable(e)),
            Err(PoolError::Timeout(_)) => Err(CheckoutError::Exhausted {
                endpoint: self.endpoint.name(),
                waited: self.checkout_timeout,
            }),
            Err(other) => Err(CheckoutError::Unreachable(BackendError::Protocol {
                endpoint: self.endpoint.name(),
                why: other.to_string(),
            })),
        }
    }

    /// An idle connection, or a new one if the pool has room; `None` at once when every
    /// connection is busy (a zero wait makes deadpool try its semaphore once, no timer).
    pub async fn get_now(&self) -> Result<Option<PooledConn>, CheckoutError> {
        let immediate = Timeouts {
            wait: Some(Duration::ZERO),
            create: None,
            recycle: None,
        };
        match self.pool.timeout_get(&immediate).await {
            Ok(conn) => Ok(Some(conn)),
            Err(PoolError::Timeout(_)) => Ok(None),
            Err(PoolError::Backend(e)) => Err(CheckoutError::Unreachable(e)),
            Err(other) => Err(CheckoutError::Unreachable(BackendError::Protocol {
                endpoint: self.endpoint.name(),
                why: other.to_string(),
            })),
        }
    }

    /// Whether this pool was made for the current routing rather than kept from the one
    /// before a reload (with its connections).
    pub fn is_new(&self) -> bool {
        self.new
    }

    pub fn status(&self) -> deadpool::Status {
        self.pool.status()
    }

    /// The backend pid of each idle connection and how long it has been idle (for the admin
    /// console; takes the pool's lock once).
    pub fn idle(&self) -> Vec<(i32, Duration)> {
        let mut idle = Vec::new();
        self.pool.retain(|conn, m| {
            idle.push((conn.pid, m.last_used()));
            true
        });
        idle
    }

    /// This pool with new sizes and timeouts, keeping its connections (a reload that changes
    /// pool settings but not where or how to log in).
    fn retuned(&self, endpoint: Endpoint, s: &PoolSettings) -> ShardPool {
        self.pool.resize(s.max_size);
        ShardPool {
            endpoint,
            pool: self.pool.clone(),
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
