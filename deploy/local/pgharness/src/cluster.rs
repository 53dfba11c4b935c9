//! A local sharded cluster: K PostgreSQL servers holding N shard databases, every one with the
//! same schema. Used by integration tests (throw-away) and by the cluster tool (persistent).
//!
//! Placement is round-robin: shard `i` lives on server `i % K`, so neighbouring key ranges sit
//! on different servers. Databases are named `<prefix><i>` with `i` zero-padded to at least
//! three digits (`shard_000` ... `shard_511`).

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::server::{quote_ident, Server, ServerOptions};

/// The schema applied to every shard database.
#[derive(Debug, Clone)]
pub enum Schema {
    /// SQL text (psql meta-commands allowed).
    Sql(String),
    /// A file of SQL.
    File(PathBuf),
}

impl Schema {
    fn text(&self) -> Result<String> {
        match self {
            Schema::Sql(sql) => Ok(sql.clone()),
            Schema::File(path) => std::fs::read_to_string(path)
                .map_err(|e| Error::io("reading the schema file", path, e)),
        }
    }
}

/// How to start a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of shard databases (N >= 1).
    pub shards: usize,
    /// Number of PostgreSQL servers (1 <= K <= N).
    pub servers: usize,
    /// Schema applied to every shard database.
    pub schema_sql: Option<Schema>,
    /// Shard database name prefix (default `shard_`).
    pub database_prefix: String,
    /// Options of every server. A fixed `port` is the base port (server `i` gets `port + i`); a
    /// fixed `dir` is the base directory (server `i` gets `dir/pg-<i>`).
    pub server: ServerOptions,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            shards: 1,
            servers: 1,
            schema_sql: None,
            database_prefix: "shard_".into(),
            server: ServerOptions::default(),
        }
    }
}

/// One shard database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardDb {
    /// Index into [`Cluster::servers`].
    pub server: usize,
    /// Database name.
    pub database: String,
    /// `postgres://postgres:postgres@127.0.0.1:PORT/database`.
    pub url: String,
}

/// K servers holding N shard databases.
#[derive(Debug)]
pub struct Cluster {
    servers: Vec<Server>,
    shards: Vec<ShardDb>,
}

/// Names of `n` shard databases: `<prefix>000`, ... (width fits `n - 1`, at least 3).
pub fn shard_database_names(prefix: &str, n: usize) -> Vec<String> {
    let width = n.saturating_sub(1).to_string().len().max(3);
    (0..n).map(|i| format!("{prefix}{i:0width$}")).collect()
}

impl Cluster {
    /// Starts the servers in parallel, creates the shard databases and applies the schema (one
    /// thread per server). On failure every server started so far is stopped and deleted.
    ///
    /// The schema is applied once per server to a scratch database that the shard databases are
    /// then copied from (`CREATE DATABASE .. TEMPLATE .. STRATEGY FILE_COPY`), which makes 512
    /// shards cost little more than 4.
    pub fn start(opts: &ClusterOptions) -> Result<Cluster> {
        if opts.shards == 0 || opts.servers == 0 || opts.servers > opts.shards {
            return Err(Error::InvalidOptions(format!(
                "a cluster needs 1 <= servers <= shards, got {} servers for {} shards",
                opts.servers, opts.shards
            )));
        }
        if let Some(base) = opts.server.port {
            if usize::from(base) + opts.servers > usize::from(u16::MAX) + 1 {
                return Err(Error::InvalidOptions(format!(
                    "base port {base} + {} servers exceeds 65535",
                    opts.servers
                )));
            }
            for i in 0..opts.servers {
                crate::server::check_port_free(base + i as u16)?;
            }
        }
        let schema = opts.schema_sql.as_ref().map(Schema::text).transpose()?;

        let per_server: Vec<ServerOptions> = (0..opts.servers)
            .map(|i| {
                let mut o = opts.server.clone();
                o.port = o.port.map(|p| p + i as u16);
                o.dir = o.dir.map(|d| d.join(format!("pg-{i}")));
                o
            })
            .collect();
        let started: Vec<Result<Server>> = std::thread::scope(|s| {
            let handles: Vec<_> = per_server
                .iter()
                .map(|o| s.spawn(move || Server::start(o)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::ThreadPanicked("starting a server".into())))
                })
                .collect()
        });
        let mut servers = Vec::with_capacity(opts.servers);
        let mut first_error = None;
        for r in started {
            match r {
                Ok(s) => servers.push(s),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            remove_all(servers);
            return Err(e);
        }

        let names = shard_database_names(&opts.database_prefix, opts.shards);
        let shards: Vec<ShardDb> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let server = i % opts.servers;
                ShardDb {
                    server,
                    database: name.clone(),
                    url: servers[server].url(name),
                }
            })
            .collect();

        let scratch = format!("{}schema_template", opts.database_prefix);
        let populated: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = servers
                .iter()
                .enumerate()
                .map(|(k, server)| {
                    let dbs: Vec<String> = shards
                        .iter()
                        .filter(|d| d.server == k)
                        .map(|d| d.database.clone())
                        .collect();
                    let schema = schema.as_deref();
                    let scratch = scratch.as_str();
                    s.spawn(move || populate(server, &dbs, schema, scratch))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::ThreadPanicked("creating shard databases".into()))
                    })
                })
                .collect()
        });
        if let Some(e) = populated.into_iter().find_map(Result::err) {
            remove_all(servers);
            return Err(e);
        }
        Ok(Cluster { servers, shards })
    }

    /// The shard databases, in shard order.
    pub fn shards(&self) -> &[ShardDb] {
        &self.shards
    }

    /// The servers.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// The servers, mutably (to stop and restart one, e.g. to test a shard outage).
    pub fn servers_mut(&mut self) -> &mut [Server] {
        &mut self.servers
    }

    /// URLs of all shard databases, in shard order.
    pub fn shard_urls(&self) -> Vec<String> {
        self.shards.iter().map(|s| s.url.clone()).collect()
    }

    /// The server holding shard `shard`.
    pub fn server_of(&self, shard: usize) -> Option<&Server> {
        self.shards.get(shard).map(|s| &self.servers[s.server])
    }

    /// Runs `sql` through psql in shard database `shard`.
    pub fn psql_shard(&self, shard: usize, sql: &str) -> Result<String> {
        let db = self.shards.get(shard).ok_or_else(|| {
            Error::InvalidOptions(format!(
                "no shard {shard} (cluster has {})",
                self.shards.len()
            ))
        })?;
        self.servers[db.server].psql(&db.database, sql)
    }

    /// Splits into servers and shards (e.g. to keep persistent servers past the `Cluster`).
    pub fn into_parts(self) -> (Vec<Server>, Vec<ShardDb>) {
        (self.servers, self.shards)
    }

    /// Stops every server and deletes its directory.
    pub fn remove(self) -> Result<()> {
        let mut result = Ok(());
        for s in self.servers {
            if let Err(e) = s.remove() {
                result = Err(e);
            }
        }
        result
    }
}

fn remove_all(servers: Vec<Server>) {
    for s in servers {
        let _ = s.remove();
    }
}

/// Creates `dbs` on `server`; with a schema, applies it once to `scratch` and copies that.
fn populate(server: &Server, dbs: &[String], schema: Option<&str>, scratch: &str) -> Result<()> {
    match schema {
        None => server.create_databases(dbs),
        Some(sql) => {
            server.create_databases(&[scratch.to_string()])?;
            server
                .psql(scratch, sql)
                .map_err(|e| e.while_doing("applying the schema"))?;
            server.create_databases_from(dbs, Some(scratch))?;
            server
                .psql(
                    "postgres",
                    &format!("DROP DATABASE {}", quote_ident(scratch)),
                )
                .map(drop)
        }
    }
}
