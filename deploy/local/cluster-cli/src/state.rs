//! The state file `DIR/cluster.json`: what `up` started, so `status` and `down` (possibly from
//! another shell, much later) can find it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Result;

/// File name of the state file inside the cluster directory.
pub const STATE_FILE: &str = "cluster.json";
/// File name of the generated shard map inside the cluster directory.
pub const SHARDMAP_FILE: &str = "shardmap.toml";
/// File name of the generated router config inside the cluster directory.
pub const ROUTER_CONFIG_FILE: &str = "router.toml";
/// File name of the router's stdout+stderr inside the cluster directory.
pub const ROUTER_LOG_FILE: &str = "router.log";

/// Config and log file names of router `k` (1-based): `router.toml` and `router.log` for the
/// first, `router-K.toml` and `router-K.log` for the others (`up --routers N`).
pub fn router_files(k: usize) -> (String, String) {
    if k <= 1 {
        (ROUTER_CONFIG_FILE.into(), ROUTER_LOG_FILE.into())
    } else {
        (format!("router-{k}.toml"), format!("router-{k}.log"))
    }
}

/// Lifecycle of a cluster as recorded in the state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// `up` is (or was, if it died) starting the servers.
    Starting,
    /// Everything was started.
    Up,
}

/// One PostgreSQL server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerState {
    pub index: usize,
    pub port: u16,
    /// The pgharness server directory (data/, postgres.log, pgharness.info).
    pub dir: PathBuf,
    pub data_dir: PathBuf,
    pub socket_dir: PathBuf,
    pub log_file: PathBuf,
    /// Postmaster pid when `up` finished.
    pub pid: Option<u32>,
}

/// A spare server (`up --spare N`): an empty PostgreSQL server beside the shard servers, not in
/// the shard map, with one empty database (no schema) for a shard split to copy into.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpareState {
    /// Port, directories and pid, as for a shard server; `index` counts the spares from 0.
    #[serde(flatten)]
    pub server: ServerState,
    /// Its one database, named like the shard that would come next (see
    /// `up::spares::database_name`).
    pub database: String,
    /// `postgres://postgres:postgres@127.0.0.1:PORT/DATABASE`, e.g. for
    /// `shardgate reshard plan --into URL`.
    pub url: String,
}

/// One shard database.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardState {
    pub shard: usize,
    pub server: usize,
    pub database: String,
    pub url: String,
}

/// The router (`shardgate`) that `up` started in front of the shards.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouterState {
    /// Process id; the router is the leader of its own session and process group.
    pub pid: u32,
    /// Listens on 127.0.0.1:port.
    pub port: u16,
    /// `DIR/router.toml`.
    pub config: PathBuf,
    /// `DIR/router.log`: the router's stdout and stderr.
    pub log_file: PathBuf,
    /// The logical database clients connect to.
    pub database: String,
    /// The user clients log in as.
    pub user: String,
    /// Connection string for clients, e.g. `postgres://app:app@127.0.0.1:6432/app`.
    pub url: String,
}

impl RouterState {
    /// Which router of the cluster this is (1-based), from its config's name
    /// ([`router_files`]).
    pub fn number(&self) -> usize {
        self.config
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| {
                n.strip_prefix("router-")?
                    .strip_suffix(".toml")?
                    .parse()
                    .ok()
            })
            .unwrap_or(1)
    }
}

/// The whole state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterState {
    /// Format version of this file.
    pub format: u32,
    pub phase: Phase,
    /// Seconds since the Unix epoch when `up` started.
    pub created_unix: u64,
    /// The cluster directory.
    pub dir: PathBuf,
    /// Where the server directories live: `dir`, or a directory under the system temp dir when
    /// the `postgres` user cannot reach `dir` (running as root from /root).
    pub data_root: PathBuf,
    /// Whether `data_root` is outside `dir` (and so must be deleted separately).
    pub data_root_external: bool,
    pub shardmap: PathBuf,
    pub schema: Option<PathBuf>,
    pub shard_count: usize,
    pub servers: Vec<ServerState>,
    pub shards: Vec<ShardState>,
    /// The router, once started (`None` with `--no-router`, or in state files written before
    /// routers were part of the cluster).
    #[serde(default)]
    pub router: Option<RouterState>,
    /// A router was asked for (no `--no-router`): with `router` empty, its start failed.
    #[serde(default)]
    pub router_wanted: bool,
    /// Routers 2, 3, ... of `up --routers N`, each on the first router's port + k - 1 with its
    /// own config and log ([`router_files`]); all on the same shard map.
    #[serde(default)]
    pub more_routers: Vec<RouterState>,
    /// How many routers `up` was asked for (0 with `--no-router`; 1 in older state files).
    #[serde(default = "one")]
    pub routers_wanted: usize,
    /// Made with `up --tls`: the servers have ssl = on, the router TLS both ways.
    #[serde(default)]
    pub tls: bool,
    /// Spare servers (`up --spare N`), in order; empty in older state files.
    #[serde(default)]
    pub spares: Vec<SpareState>,
    /// The postgresql.conf settings `up` started every server with beyond pgharness's own
    /// (`wal_level = logical`, ...); empty in state files written before `up` set any.
    #[serde(default)]
    pub server_settings: BTreeMap<String, String>,
}

fn one() -> usize {
    1
}

impl ClusterState {
    /// Every router started, the first one first.
    pub fn routers(&self) -> impl Iterator<Item = &RouterState> {
        self.router.iter().chain(&self.more_routers)
    }

    /// Router `k` (1-based) as recorded, running or not.
    pub fn recorded_router(&self, k: usize) -> Option<&RouterState> {
        match k {
            0 | 1 => self.router.as_ref(),
            _ => self.more_routers.iter().find(|r| r.number() == k),
        }
    }

    /// Records router `k` (`None`: it has none), keeping routers 2, 3, ... in order.
    pub fn set_router(&mut self, k: usize, router: Option<RouterState>) {
        if k <= 1 {
            self.router = router;
            return;
        }
        self.more_routers.retain(|r| r.number() != k);
        if let Some(r) = router {
            let at = self.more_routers.partition_point(|r| r.number() < k);
            self.more_routers.insert(at, r);
        }
    }

    /// Whether the servers run with `wal_level = logical` (clusters made before `up` set it do
    /// not), which a shard split by logical replication needs on its source shard.
    pub fn wal_level_logical(&self) -> bool {
        self.server_settings
            .get("wal_level")
            .is_some_and(|v| v == "logical")
    }

    /// Path of the state file of cluster directory `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_FILE)
    }

    /// Reads the state file of `dir`; `None` when there is none.
    pub fn load(dir: &Path) -> Result<Option<ClusterState>> {
        let path = Self::path(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("reading {}: {e}", path.display()).into()),
        };
        let state = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not a valid cluster state file ({e}); stop leftover servers by hand (pg_ctl -D <data dir> stop) and delete it",
                path.display()
            )
        })?;
        Ok(Some(state))
    }

    /// Writes the state file atomically (temp file + rename).
    pub fn save(&self) -> Result<()> {
        let path = Self::path(&self.dir);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| format!("encoding the cluster state: {e}"))?;
        std::fs::write(&tmp, text + "\n").map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(())
    }
}

/// 64-bit FNV-1a, stable across Rust versions (for directory names).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

#[cfg(test)]
mod tests {
    use super::ClusterState;

    /// A state file from before spares and server settings were recorded still loads.
    #[test]
    fn old_state_files_load_without_spares_or_settings() {
        let old = r#"{
            "format": 1, "phase": "up", "created_unix": 1, "dir": "/c", "data_root": "/c",
            "data_root_external": false, "shardmap": "/c/shardmap.toml", "schema": null,
            "shard_count": 1,
            "servers": [{"index": 0, "port": 5433, "dir": "/c/pg-0", "data_dir": "/c/pg-0/data",
                         "socket_dir": "/c/pg-0/sock", "log_file": "/c/pg-0/postgres.log",
                         "pid": 7}],
            "shards": [{"shard": 0, "server": 0, "database": "shard_000",
                        "url": "postgres://postgres:postgres@127.0.0.1:5433/shard_000"}]
        }"#;
        let state: ClusterState = match serde_json::from_str(old) {
            Ok(s) => s,
            Err(e) => panic!("an old state file does not load: {e}"),
        };
        assert!(state.spares.is_empty());
        assert!(!state.wal_level_logical());
        assert_eq!(state.routers_wanted, 1);
    }

    /// Spares are written flat (port, dir, pid, ... beside database and url) and read back.
    #[test]
    fn spares_round_trip() {
        let spare = r#"{"index": 0, "port": 5435, "dir": "/c/spare-0", "data_dir": "/c/spare-0/data",
            "socket_dir": "/c/spare-0/sock", "log_file": "/c/spare-0/postgres.log", "pid": null,
            "database": "shard_002", "url": "postgres://postgres:postgres@127.0.0.1:5435/shard_002"}"#;
        let parsed: super::SpareState = match serde_json::from_str(spare) {
            Ok(s) => s,
            Err(e) => panic!("a spare does not load: {e}"),
        };
        assert_eq!(parsed.server.port, 5435);
        assert_eq!(parsed.database, "shard_002");
        let text = match serde_json::to_value(&parsed) {
            Ok(v) => v,
            Err(e) => panic!("a spare does not encode: {e}"),
        };
        assert_eq!(text["port"], 5435);
        assert_eq!(
            text["url"],
            "postgres://postgres:postgres@127.0.0.1:5435/shard_002"
        );
    }
}
