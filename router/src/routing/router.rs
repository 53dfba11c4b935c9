//! What all client sessions of one router share for the life of the process: the current
//! [`Routing`] (config, shard map, planner, pools; swapped whole by a reload), the router-wide
//! prepared-statement registry, the table of clients for cancel requests, and what was learned
//! from a real server at login.
//!
//! Nothing here is locked per statement: the routing is read with an atomic load, pools lock
//! per host, the planner cache per part (behind a lock-free per-thread cache), the statement
//! registry per part, and the client table only on connect, disconnect and cancel.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use arc_swap::ArcSwap;
use shardmap::ShardMap;

use super::clients::Clients;
use super::generation::{Board, Routing};
use crate::backend::health::HealthBoard;
use crate::backend::registry::Registry;
use crate::config::Config;
use crate::stats::Stats;
use crate::tls::Material;

pub struct Router {
    routing: ArcSwap<Routing>,
    /// The current routing's generation, read by sessions on every statement (one atomic load).
    generation: AtomicU64,
    /// Routings still in use by some session, by generation (cancel requests look a client's
    /// backend up in the routing its session used).
    routings: Mutex<Vec<Weak<Routing>>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    pub statements: Registry,
    /// ParameterStatus values of a real backend, reported to clients at startup.
    pub server_params: RwLock<Vec<(String, String)>>,
    params_learned: AtomicBool,
    /// Every client, for cancel requests and the client limit.
    pub clients: Clients,
    /// Salts the fake SCRAM verifiers of unknown users, stable for this process.
    pub mock_key: [u8; 32],
    next_any: AtomicUsize,
    workers: usize,
    /// Serving, draining, closing.
    pub lifecycle: super::Lifecycle,
    /// What the router counts (`/metrics`, `SHOW STATS`).
    pub stats: Stats,
    /// Whether each primary answers.
    pub health: HealthBoard,
    /// Shards paused by the admin console.
    pub pauses: Arc<super::pause::Pauses>,
    /// Every shard of the map has answered once since the start (`/ready`).
    ready: AtomicBool,
    /// The start's warming of the pools is over ([`super::warm`]).
    warmed: AtomicBool,
    /// The channel to every worker for warming pools.
    pub warmer: super::warm::Warmer,
    /// Connections accepted that have not finished logging in (`[limits] max_logins`).
    pub door: Arc<super::door::Door>,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    pub generation: u64,
    /// One sentence for the operator, with any setting that needs a restart.
    pub summary: String,
}

impl Router {
    /// `tls` is what [`crate::tls::load`] read for `config`.
    pub fn new(config: Config, map: ShardMap, tls: Material, workers: usize) -> Router {
        let router_id = config.router_id;
        let (stats, health) = (Stats::default(), HealthBoard::default());
        let pauses = Arc::new(super::pause::Pauses::default());
        pauses.set_generation(1);
        let board = Board {
            stats: &stats,
            health: &health,
            pauses: &pauses,
        };
        let routing = Arc::new(Routing::new(config, map, tls, workers, 1, None, board));
        Router {
            routings: Mutex::new(vec![Arc::downgrade(&routing)]),
            routing: ArcSwap::new(routing),
            generation: AtomicU64::new(1),
            reloading: tokio::sync::Mutex::new(()),
            statements: Registry::default(),
            server_params: RwLock::new(default_server_params()),
            params_learned: AtomicBool::new(false),
            clients: Clients::new(router_id),
            mock_key: rand::random(),
            next_any: AtomicUsize::new(0),
            workers: workers.max(1),
            lifecycle: Default::default(),
            stats,
            health,
            pauses,
            ready: AtomicBool::new(false),
            warmed: AtomicBool::new(false),
            warmer: super::warm::Warmer::new(workers.max(1)),
            door: Arc::default(),
        }
    }

    /// Whether `/ready` says yes: serving (not draining), and every shard's primary has
    /// answered at least once since the start.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && self.lifecycle.phase() == super::Phase::Serving
    }

    /// The start's warming is over (every worker opened its connections, or the warm timeout
    /// passed): readiness may follow.
    pub fn set_warmed(&self) {
        self.warmed.store(true, Ordering::Relaxed);
    }

    /// Whether the start's warming is over.
    pub fn is_warmed(&self) -> bool {
        self.warmed.load(Ordering::Relaxed)
    }

    /// Every shard of the current map has answered once: the router is ready (for good; a
    /// shard that goes down later fails its own statements, not the whole router).
    pub fn set_ready(&self) {
        if !self.ready.swap(true, Ordering::Relaxed) {
            tracing::info!("every shard has answered: ready");
        }
    }

    /// The current routing.
    pub fn routing(&self) -> Arc<Routing> {
        self.routing.load_full()
    }

    /// The current routing's generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The routing of `generation`, while some session still uses it.
    pub fn routing_of(&self, generation: u64) -> Option<Arc<Routing>> {
        let current = self.routing();
        if current.generation == generation {
            return Some(current);
        }
        let routings = self.routings.lock().unwrap_or_else(|p| p.into_inner());
        routings
            .iter()
            .filter_map(Weak::upgrade)
            .find(|r| r.generation == generation)
    }

    /// Number of worker threads (and sets of pools).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Re-reads the config file, the shard map and the TLS certificates and keys it names, and
    /// makes them current for new statements (and new clients, for certificates). An invalid
    /// file is refused with its problems (`FILE:LINE: reason`) and the current ones keep
    /// serving. Settings that cannot change while running (the listen address,
    /// the router id) keep their running values and are named in the summary.
    pub async fn reload(&self) -> Result<Reloaded, String> {
        let reloaded = self.reload_files().await;
        let counter = match reloaded {
            Ok(_) => &self.stats.reloads,
            Err(_) => &self.stats.reloads_refused,
        };
        Stats::count(counter);
        reloaded
    }

    async fn reload_files(&self) -> Result<Reloaded, String> {
        let _one = self.reloading.lock().await;
        let current = self.routing();
        let mut config = crate::config::load(&current.config.source).map_err(|e| e.to_string())?;
        let map = shardmap::load(&config.shardmap).map_err(|e| e.to_string())?;
        let tls = crate::tls::load(&config).map_err(|e| e.to_string())?;
        let mut restart = Vec::new();
        let running = &current.config;
        let shown = |a: &std::net::SocketAddr| a.to_string();
        keep_running(
            &mut restart,
            "listen",
            &mut config.listen,
            &running.listen,
            shown,
        );
        keep_running(
            &mut restart,
            "router_id",
            &mut config.router_id,
            &running.router_id,
            |id| id.to_string(),
        );
        keep_running(
            &mut restart,
            "http.listen",
            &mut config.http,
            &running.http,
            |a| a.map_or("off".to_string(), |a| a.to_string()),
        );
        keep_running(
            &mut restart,
            "reuse_port",
            &mut config.reuse_port,
            &running.reuse_port,
            |r| r.to_string(),
        );
        let generation = current.generation + 1;
        let (old_version, shards) = (current.map.version(), map.shards().len());
        let new_version = map.version();
        let tls_note = tls.summary();
        let next = Arc::new(Routing::new(
            config,
            map,
            tls,
            self.workers,
            generation,
            Some(&current),
            Board {
                stats: &self.stats,
                health: &self.health,
                pauses: &self.pauses,
            },
        ));
        self.stats.retire_planner(current.planner.cache_stats());
        drop(current);
        // What the router knows of the shards' catalog is learned for the new map first, and
        // the primaries it brings get their first connections on every worker.
        super::catalog::learn(&next).await;
        self.warmer.warm(&next, true).await;
        {
            let mut routings = self.routings.lock().unwrap_or_else(|p| p.into_inner());
            routings.retain(|w| w.strong_count() > 0);
            routings.push(Arc::downgrade(&next));
        }
        self.routing.store(next);
        self.generation.store(generation, Ordering::Release);
        self.pauses.set_generation(generation);
        let mut summary =
            format!("reloaded: shard map version {old_version} -> {new_version}, {shards} shards");
        if let Some(note) = tls_note {
            summary.push_str(", ");
            summary.push_str(&note);
        }
        if !restart.is_empty() {
            summary.push_str("; needs a restart to change: ");
            summary.push_str(&restart.join(", "));
        }
        tracing::info!(generation, "{summary}");
        Ok(Reloaded {
            generation,
            summary,
        })
    }

    /// A shard for statements that touch no user table: round robin.
    pub fn any_shard(&self, shards: usize) -> usize {
        self.next_any.fetch_add(1, Ordering::Relaxed) % shards.max(1)
    }

    /// Remembers a real backend's ParameterStatus values (the first login wins).
    pub fn learn_server_params(&self, params: &[(String, String)]) {
        if self.params_learned.load(Ordering::Relaxed) || params.is_empty() {
            return;
        }
        *self
            .server_params
            .write()
            .unwrap_or_else(|p| p.into_inner()) = params.to_vec();
        self.params_learned.store(true, Ordering::Relaxed);
    }

    pub fn server_params_learned(&self) -> bool {
        self.params_learned.load(Ordering::Relaxed)
    }
}

/// Used until a backend has been reached (the first real login replaces them).
fn default_server_params() -> Vec<(String, String)> {
    [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("TimeZone", "UTC"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("IntervalStyle", "postgres"),
        ("is_superuser", "off"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A setting that cannot change while the router runs: when the reloaded file changes it, the
/// running value stays (`new` is set back to it) and `restart` says so.
fn keep_running<T: PartialEq + Clone>(
    restart: &mut Vec<String>,
    name: &str,
    new: &mut T,
    running: &T,
    show: impl Fn(&T) -> String,
) {
    if new != running {
        restart.push(format!(
            "{name} {} (still {} until a restart)",
            show(new),
            show(running)
        ));
        *new = running.clone();
    }
}
