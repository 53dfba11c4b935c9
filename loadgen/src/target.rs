//! Where load goes: routers (`--target`, any connection reaches any shard) or every shard's
//! primary directly (`--shardmap` alone), and connecting there with tokio-postgres.
//!
//! A `--target` without a shard map is one unsharded database: it gets a one-shard map of
//! its own, so the rest of loadgen always has a map to attribute requests with.

use std::path::Path;
use std::time::Duration;

use shardmap::{KeyType, ShardMap, Table};
use tokio_postgres::{Client, NoTls};

/// Where connections go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Straight to each shard's primary, as written in the map.
    Direct,
    /// Through these routers (or one plain database); connections are spread over them.
    Routers(Vec<String>),
}

/// The shard map and where connections go.
#[derive(Debug, Clone)]
pub struct Topology {
    pub map: ShardMap,
    /// The file the map came from (`None` for the one-shard map of a lone `--target`).
    pub map_path: Option<String>,
    pub mode: Mode,
}

impl Topology {
    /// From `--shardmap` and `--target` as given on the command line.
    pub fn resolve(shardmap: Option<&Path>, targets: &[String]) -> Result<Topology, crate::Error> {
        for t in targets {
            shardmap::Primary::parse(t).map_err(|e| format!("--target: {e}"))?;
        }
        match (shardmap, targets) {
            (None, []) => Err(
                "say where the load goes: --target postgres://ROUTER/DB (repeatable), --shardmap FILE (straight to every shard's primary), or both (through routers, with the map attributing requests to shards)".into(),
            ),
            (Some(path), _) => {
                let map = shardmap::load(path).map_err(|e| e.to_string())?;
                if map.table_by_name("kv").is_none() {
                    return Err(format!(
                        "{}: the shard map has no table kv; add [[tables]] name = \"kv\", key = \"id\", type = \"bigint\"",
                        path.display()
                    ));
                }
                let mode = if targets.is_empty() {
                    Mode::Direct
                } else {
                    Mode::Routers(targets.to_vec())
                };
                Ok(Topology {
                    map,
                    map_path: Some(path.display().to_string()),
                    mode,
                })
            }
            (None, [one]) => Ok(Topology {
                map: single_map(one)?,
                map_path: None,
                mode: Mode::Direct,
            }),
            (None, many) => Ok(Topology {
                map: single_map(&many[0])?,
                map_path: None,
                mode: Mode::Routers(many.to_vec()),
            }),
        }
    }

    /// Whether statements go through routers (which cannot COPY into or broadcast DDL to a
    /// sharded table).
    pub fn via_router(&self) -> bool {
        matches!(self.mode, Mode::Routers(_))
    }

    /// Where connection `i` goes when it serves `shard` (direct) or any shard (routers).
    pub fn url_for(&self, i: usize, shard: usize) -> &str {
        match &self.mode {
            Mode::Direct => self.map.shards()[shard].primary.url(),
            Mode::Routers(t) => &t[i % t.len()],
        }
    }

    /// For reports: the targets (passwords hidden) or "direct".
    pub fn describe(&self) -> String {
        match &self.mode {
            Mode::Direct => format!("direct to {} shard primaries", self.map.shards().len()),
            Mode::Routers(t) => t.iter().map(|u| redact(u)).collect::<Vec<_>>().join(", "),
        }
    }
}

/// A one-shard map (the whole keyspace) whose primary is `url`.
fn single_map(url: &str) -> Result<ShardMap, crate::Error> {
    ShardMap::even_split(
        &[url.to_string()],
        vec![Table::new("kv", "id", KeyType::BigInt)],
    )
    .map_err(|e| e.to_string())
}

/// A URL with its password replaced by `***`.
pub fn redact(url: &str) -> String {
    shardmap::primary::redact(url)
}

/// Connects (giving up after `timeout`) and spawns the connection task.
pub async fn connect(url: &str, timeout: Duration) -> Result<Client, tokio_postgres::Error> {
    Ok(connect_owned(url, timeout).await?.0)
}

/// Like [`connect`], and also returns the connection task: tokio-postgres keeps a socket open
/// until every answer owed has arrived even when its `Client` is gone, so a caller that gives
/// up on a request aborts the task to close the connection at once.
pub async fn connect_owned(
    url: &str,
    timeout: Duration,
) -> Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = url.parse()?;
    if config.get_application_name().is_none() {
        config.application_name("loadgen");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(timeout.max(Duration::from_millis(1)));
    }
    let (client, connection) = config.connect(NoTls).await?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// `what: message (SQLSTATE)` for a server's error, `what: error` for any other (tokio-postgres
/// prints a server's error as just "db error").
pub fn sql_err(what: &str, e: &tokio_postgres::Error) -> crate::Error {
    match e.as_db_error() {
        Some(db) => format!("{what}: {} ({})", db.message(), db.code().code()),
        None => format!("{what}: {e}"),
    }
}

/// The SQLSTATE of an error; `08006` for a connection that closed under a request, `08001`
/// for one that could not be opened (`connecting`), `client` for anything else without one.
pub fn error_code(e: &tokio_postgres::Error, connecting: bool) -> String {
    match e.code() {
        Some(code) => code.code().to_string(),
        None if connecting => "08001".to_string(),
        None if e.is_closed() => "08006".to_string(),
        None => {
            // I/O failures (reset, broken pipe) also mean the connection is gone.
            let text = e.to_string();
            if text.contains("error communicating") || text.contains("connection") {
                "08006".to_string()
            } else {
                "client".to_string()
            }
        }
    }
}
