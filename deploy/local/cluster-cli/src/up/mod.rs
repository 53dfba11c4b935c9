//! `cluster up`: a sequence of steps over one [`Up`] context. Each step reads what the ones
//! before it decided or started (in `Up`) and records what it starts in the state file, so that
//! `down` can clean up after any step fails. Later steps (e.g. running loadgen against the
//! router) slot in after `start_router`, before `print_summary`.
//!
//! Every server (shard servers and the spares of `--spare`, in [`spares`]) runs with
//! [`SERVER_SETTINGS`]: `wal_level = logical`, so that any shard can be the source of an online
//! split by logical replication.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use pgharness::{Cluster, ClusterOptions, Readiness, Schema, Server, ServerOptions};

use crate::router::{self, RouterOptions};
use crate::state::{
    stable_hash, ClusterState, Phase, RouterState, ServerState, ShardState, SpareState,
    SHARDMAP_FILE,
};
use crate::{down, repo_root, DirArgs, Result};

mod routers;
pub mod spares;
use routers::{check_router_port, keep_running, print_loadgen_targets, start_router};

/// Prefix of the shard databases' names (`shard_000`, ...); spare databases continue the
/// numbering ([`spares::database_name`]).
pub const SHARD_DATABASE_PREFIX: &str = "shard_";

/// postgresql.conf settings of every server `up` starts, beyond pgharness's own: logical
/// decoding and room for replication connections and slots, so that any shard can be the source
/// of an online split (logical replication from one shard primary to another).
pub const SERVER_SETTINGS: [(&str, &str); 3] = [
    ("wal_level", "logical"),
    ("max_wal_senders", "16"),
    ("max_replication_slots", "16"),
];

/// Shard databases of a new cluster when `--shards` is not given (`up` and `demo` alike).
pub const DEFAULT_SHARDS: u64 = 4;

/// What cluster to make and where it listens: the options `up` and `demo` share, declared once
/// so that both have the same defaults. A cluster that is already up keeps its own.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Number of shard databases (the keyspace is split evenly over them) [default: 4]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub shards: Option<u64>,

    /// Number of PostgreSQL servers; shard i lives on server i % K [default: min(N, 4)]
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub servers: Option<u64>,

    #[command(flatten)]
    pub dir: DirArgs,

    /// Port of server 0; server i listens on 127.0.0.1:(P + i)
    #[arg(long, value_name = "P", default_value_t = 5433)]
    pub base_port: u16,

    /// Port of the router (shardgate); clients connect to 127.0.0.1:PORT, database `app`
    #[arg(long, value_name = "PORT", default_value_t = 6432)]
    pub router_port: u16,
}

/// Options of `cluster up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// SQL applied to every shard database [default: <repo>/deploy/local/schema.sql]
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,

    /// max_connections of every server
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub max_connections: u32,

    /// shared_buffers of every server (PostgreSQL units)
    #[arg(long, value_name = "SIZE", default_value = "64MB")]
    pub shared_buffers: String,

    /// Routers to start, all on the same shard map: router k listens on --router-port + k - 1
    /// (and --http-port + k - 1), with DIR/router-K.toml and DIR/router-K.log from the second on
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..=64)
    )]
    pub routers: u64,

    /// User that clients log in to the router as
    #[arg(long, value_name = "NAME", default_value = "app")]
    pub user: String,

    /// Password of --user (the router checks it with SCRAM-SHA-256)
    #[arg(long, value_name = "PASSWORD", default_value = "app")]
    pub password: String,

    /// Start only the PostgreSQL servers, no router
    #[arg(long, conflicts_with_all = ["router_port", "routers", "http_port"])]
    pub no_router: bool,

    /// Turn TLS on: make a CA and certificates in DIR/tls, start the servers with ssl = on, and
    /// the router with [tls] mode = "allow" and [backend] sslmode = "verify-full"
    #[arg(long)]
    pub tls: bool,

    /// Also serve the router's HTTP side port on 127.0.0.1:PORT (/metrics, /health, /ready).
    /// Only when the router starts: a running cluster's router keeps what it was started with
    /// (`up` refuses a different --http-port then; `cluster down` first)
    #[arg(long, value_name = "PORT")]
    pub http_port: Option<u16>,

    /// Extra empty PostgreSQL servers beside the shard servers, not in the shard map, to split
    /// shards into: spare j listens on P + K + j and holds one database without the schema,
    /// named like the next shard (shard_N, shard_N+1, ...); `status` prints their URLs. On a
    /// running cluster a larger N adds spares (a smaller one removes none)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        value_parser = clap::value_parser!(u64).range(0..=256)
    )]
    pub spare: u64,
}

impl UpArgs {
    /// `up` with the cluster options `cluster` and every other option at its default, as
    /// declared above (what `demo` runs).
    pub fn with_defaults(cluster: ClusterArgs) -> Result<UpArgs> {
        use clap::FromArgMatches;
        let matches = UpArgs::augment_args(clap::Command::new("up"))
            .try_get_matches_from(["up"])
            .map_err(|e| format!("internal error: the defaults of `up`: {e}"))?;
        let mut args = UpArgs::from_arg_matches(&matches)
            .map_err(|e| format!("internal error: the defaults of `up`: {e}"))?;
        args.cluster = cluster;
        Ok(args)
    }
}

/// Everything `up` decided and started so far.
struct Up {
    dir: PathBuf,
    /// Whether `up` created `dir` (removed again when `up` fails early).
    created_dir: bool,
    data_root: PathBuf,
    data_root_external: bool,
    schema: PathBuf,
    shards: usize,
    servers: usize,
    /// Whether `--shards` or `--servers` was given (rather than the defaults).
    layout_given: bool,
    base_port: u16,
    server_options: ServerOptions,
    /// The first router to start; `None` with `--no-router`.
    router: Option<RouterOptions>,
    /// How many (`--routers`; 0 with `--no-router`).
    routers: usize,
    /// `--tls` (or, for a running cluster, how it was made).
    tls: bool,
    /// `--spare`: spare servers wanted.
    spares: usize,
    state: Option<ClusterState>,
    cluster: Option<Cluster>,
    /// The spares [`start_postgres`] started (with their pids).
    started_spares: Vec<SpareState>,
    started_at: Instant,
}

/// Runs `cluster up`.
pub fn run(args: &UpArgs) -> Result<ExitCode> {
    let mut up = plan(args)?;
    if let Some(state) = running_cluster(&up)? {
        up.state = Some(state);
        return keep_running(&mut up);
    }
    if let Err(e) = check_ports(&up) {
        if up.created_dir {
            let _ = std::fs::remove_dir(&up.dir);
        }
        return Err(e);
    }
    write_initial_state(&mut up)?;
    if let Err(e) = make_certificates(&mut up).and_then(|()| start_postgres(&mut up)) {
        // Cluster::start already stopped what it started; forget the half-made cluster.
        let _ = std::fs::remove_file(ClusterState::path(&up.dir));
        let _ = crate::tls::remove(&up.dir);
        if up.data_root_external {
            let _ = std::fs::remove_dir(&up.data_root);
        }
        return Err(e);
    }
    write_shardmap(&up)?;
    write_final_state(&mut up)?;
    // The servers are up and recorded from here on: a failing router leaves them running (the
    // error says so), and `up` again retries just the router.
    start_router(&mut up)?;
    print_summary(&up);
    Ok(ExitCode::SUCCESS)
}

/// Step 1: resolve defaults and decide where the data goes.
fn plan(args: &UpArgs) -> Result<Up> {
    let c = &args.cluster;
    let dir = c.dir.resolve()?;
    let shards = c.shards.unwrap_or(DEFAULT_SHARDS) as usize;
    let servers = c.servers.map(|k| k as usize).unwrap_or(shards.min(4));
    if servers > shards {
        return Err(format!(
            "--servers {servers} is more than --shards {shards}; every server needs a shard"
        )
        .into());
    }
    let spare_count = args.spare as usize;
    if usize::from(c.base_port) + servers + spare_count - 1 > usize::from(u16::MAX)
        || c.base_port == 0
    {
        return Err(format!(
            "--base-port {} leaves no room for {servers} servers and {spare_count} spare servers",
            c.base_port
        )
        .into());
    }
    if args.user.is_empty() || args.password.is_empty() {
        return Err("--user and --password must not be empty".into());
    }
    if !args.no_router && c.router_port == 0 {
        return Err("--router-port 0 is not a port; pick a free one, e.g. 6432".into());
    }
    let routers = if args.no_router {
        0
    } else {
        args.routers as usize
    };
    if routers > 0 && usize::from(c.router_port) + routers - 1 > usize::from(u16::MAX) {
        return Err(format!(
            "--router-port {} leaves no room for {routers} routers",
            c.router_port
        )
        .into());
    }
    // Every worker of every router keeps its own pool per shard database.
    let workers = router::router_workers() * routers.max(1);
    let max_connections = if args.no_router {
        args.max_connections
    } else {
        router::max_connections_needed(args.max_connections, shards, servers, workers)
    };
    if max_connections > args.max_connections {
        println!(
            "max_connections {max_connections} per server (not {}): {workers} router workers each keep a pool per shard database",
            args.max_connections
        );
    }
    let router = (!args.no_router).then(|| RouterOptions {
        index: 1,
        port: c.router_port,
        user: args.user.clone(),
        password: args.password.clone(),
        pool_size: router::pool_size(max_connections, shards, servers, workers),
        connect_timeout_ms: router::connect_timeout_ms(shards),
        tls: args.tls,
        http_port: args.http_port,
    });
    let schema = match &args.schema {
        Some(s) => std::path::absolute(s)
            .map_err(|e| format!("resolving --schema {}: {e}", s.display()))?,
        None => crate::normalize(&repo_root().join("deploy/local/schema.sql")),
    };
    if !schema.is_file() {
        return Err(format!("schema file {} does not exist", schema.display()).into());
    }
    let created_dir = !dir.exists();
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;

    // As root, PostgreSQL runs as `postgres`, which cannot enter e.g. /root/...: keep the data
    // under the system temp dir then, in a directory named after the cluster directory.
    let reachable = pgharness::postgres_can_reach(&dir)?;
    let (data_root, data_root_external) = if reachable {
        (dir.clone(), false)
    } else {
        let hash = stable_hash(dir.as_os_str().as_encoded_bytes());
        (
            pgharness::temp_root().join(format!("shardgate-cluster-{hash:016x}")),
            true,
        )
    };
    Ok(Up {
        dir,
        created_dir,
        data_root,
        data_root_external,
        schema,
        shards,
        servers,
        layout_given: c.shards.is_some() || c.servers.is_some(),
        base_port: c.base_port,
        server_options: ServerOptions {
            persistent: true,
            max_connections,
            shared_buffers: args.shared_buffers.clone(),
            settings: SERVER_SETTINGS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        },
        router,
        routers,
        tls: args.tls,
        spares: spare_count,
        state: None,
        cluster: None,
        started_spares: Vec::new(),
        started_at: Instant::now(),
    })
}

/// Step 2: a cluster whose servers all run is kept (and returned); a dead one is cleaned away.
fn running_cluster(up: &Up) -> Result<Option<ClusterState>> {
    let Some(state) = ClusterState::load(&up.dir)? else {
        return Ok(None);
    };
    let all_accepting = state.phase == Phase::Up
        && state.servers.iter().all(|s| {
            Server::attach(&s.dir)
                .map(|srv| srv.readiness() == Readiness::Accepting)
                .unwrap_or(false)
        });
    if all_accepting {
        return Ok(Some(state));
    }
    println!(
        "found a cluster state in {} whose servers are not all running; cleaning it up first",
        up.dir.display()
    );
    down::teardown(&state)?;
    Ok(None)
}

/// Step 3: every port must be free before anything starts.
fn check_ports(up: &Up) -> Result<()> {
    for i in 0..up.servers {
        let port = up.base_port + i as u16;
        if pgharness::check_port_free(port).is_err() {
            return Err(format!(
                "port {port} (for server {i}) is already in use on 127.0.0.1; stop what listens there or pick another --base-port"
            )
            .into());
        }
    }
    let mut taken: Vec<(u16, String)> = (0..up.servers)
        .map(|i| (up.base_port + i as u16, format!("server {i}")))
        .collect();
    for j in 0..up.spares {
        let port = spares::port(up.base_port, up.servers, j)?;
        if pgharness::check_port_free(port).is_err() {
            return Err(spares::port_taken(j, port));
        }
        taken.push((port, format!("spare server {j}")));
    }
    if let Some(r) = &up.router {
        let server_ports: Vec<u16> = taken.iter().map(|(p, _)| *p).collect();
        for k in 1..=up.routers {
            let opts = r.for_router(k)?;
            check_router_port(opts.port, &server_ports)?;
            let mut mine = vec![(opts.port, format!("router {k}"))];
            if let Some(h) = opts.http_port {
                if pgharness::check_port_free(h).is_err() {
                    return Err(format!(
                        "port {h} (router {k}'s HTTP port) is already in use on 127.0.0.1; pick another --http-port"
                    )
                    .into());
                }
                mine.push((h, format!("router {k}'s HTTP port")));
            }
            for (port, what) in mine {
                if let Some((_, other)) = taken.iter().find(|(p, _)| *p == port) {
                    return Err(format!(
                        "port {port} would be both {other} and {what}; with --routers N the routers take --router-port .. +N-1 and --http-port .. +N-1, so pick ports that do not overlap"
                    )
                    .into());
                }
                taken.push((port, what));
            }
        }
    }
    Ok(())
}

fn server_dir(up: &Up, i: usize) -> PathBuf {
    up.data_root.join(format!("pg-{i}"))
}

/// Step 4: record the plan before starting anything, so `down` can clean up after an `up` that
/// was interrupted.
fn write_initial_state(up: &mut Up) -> Result<()> {
    let servers = (0..up.servers)
        .map(|i| {
            let dir = server_dir(up, i);
            ServerState {
                index: i,
                port: up.base_port + i as u16,
                data_dir: dir.join("data"),
                socket_dir: dir.join("sock"),
                log_file: dir.join("postgres.log"),
                dir,
                pid: None,
            }
        })
        .collect();
    let planned_spares = (0..up.spares)
        .map(|j| spares::planned(&up.data_root, up.base_port, up.servers, up.shards, j))
        .collect::<Result<Vec<_>>>()?;
    let state = ClusterState {
        format: 1,
        phase: Phase::Starting,
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        dir: up.dir.clone(),
        data_root: up.data_root.clone(),
        data_root_external: up.data_root_external,
        shardmap: up.dir.join(SHARDMAP_FILE),
        schema: Some(up.schema.clone()),
        shard_count: up.shards,
        servers,
        shards: Vec::new(),
        router: None,
        router_wanted: up.router.is_some(),
        more_routers: Vec::new(),
        routers_wanted: up.routers,
        tls: up.tls,
        spares: planned_spares,
        server_settings: up.server_options.settings.iter().cloned().collect(),
    };
    state.save()?;
    up.state = Some(state);
    Ok(())
}

/// Step 5 (`--tls`): the CA and certificates, in `DIR/tls/`; the servers' own go with them.
fn make_certificates(up: &mut Up) -> Result<()> {
    if !up.tls {
        return Ok(());
    }
    println!(
        "making a CA and certificates in {}...",
        up.dir.join(crate::tls::TLS_DIR).display()
    );
    up.server_options.tls = Some(crate::tls::generate(&up.dir)?);
    Ok(())
}

/// Step 6: start the servers, create the shard databases, apply the schema; start the spare
/// servers beside them (each with its empty database). All or nothing.
fn start_postgres(up: &mut Up) -> Result<()> {
    if up.data_root_external {
        std::fs::create_dir_all(&up.data_root)
            .map_err(|e| format!("creating {}: {e}", up.data_root.display()))?;
    }
    println!(
        "starting {} PostgreSQL servers on ports {}-{} with {} shard databases...",
        up.servers,
        up.base_port,
        up.base_port + up.servers as u16 - 1,
        up.shards
    );
    let planned_spares = up
        .state
        .as_ref()
        .map(|s| s.spares.clone())
        .unwrap_or_default();
    if let (Some(first), Some(last)) = (planned_spares.first(), planned_spares.last()) {
        println!(
            "starting {} spare servers on ports {}-{} (one empty database each)...",
            planned_spares.len(),
            first.server.port,
            last.server.port
        );
    }
    let cluster_options = ClusterOptions {
        shards: up.shards,
        servers: up.servers,
        schema_sql: Some(Schema::File(up.schema.clone())),
        database_prefix: SHARD_DATABASE_PREFIX.into(),
        server: ServerOptions {
            port: Some(up.base_port),
            dir: Some(up.data_root.clone()),
            ..up.server_options.clone()
        },
    };
    // The spares start while the shard servers do.
    let (cluster, started_spares) = std::thread::scope(|scope| {
        let spares = (!planned_spares.is_empty())
            .then(|| scope.spawn(|| spares::start_all(&planned_spares, &up.server_options)));
        let cluster = Cluster::start(&cluster_options);
        let started = match spares {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err("a thread starting the spare servers panicked".into())),
            None => Ok(Vec::new()),
        };
        (cluster, started)
    });
    match (cluster, started_spares) {
        (Ok(cluster), Ok(started)) => {
            up.cluster = Some(cluster);
            up.started_spares = started;
            Ok(())
        }
        (Ok(cluster), Err(e)) => {
            let _ = cluster.remove();
            Err(e.into())
        }
        (Err(e), started) => {
            for s in started.unwrap_or_default() {
                if let Ok(server) = Server::attach(&s.server.dir) {
                    let _ = server.remove();
                }
            }
            Err(e.into())
        }
    }
}

/// Step 7: the shard map: an even split of the keyspace over the shard databases, table `kv`.
fn write_shardmap(up: &Up) -> Result<()> {
    let cluster = up.cluster.as_ref().ok_or("internal error: no cluster")?;
    let tables = vec![shardmap::Table::new("kv", "id", shardmap::KeyType::BigInt)];
    let map = shardmap::ShardMap::even_split(&cluster.shard_urls(), tables)
        .map_err(|e| format!("building the shard map: {e}"))?;
    let path = up.dir.join(SHARDMAP_FILE);
    std::fs::write(&path, map.to_toml()).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(())
}

/// Step 8: the state file with pids and shard databases.
fn write_final_state(up: &mut Up) -> Result<()> {
    let cluster = up.cluster.as_ref().ok_or("internal error: no cluster")?;
    let state = up.state.as_mut().ok_or("internal error: no state")?;
    state.servers = cluster
        .servers()
        .iter()
        .enumerate()
        .map(|(i, s)| ServerState {
            index: i,
            port: s.port(),
            dir: s.dir().to_path_buf(),
            data_dir: s.data_dir().to_path_buf(),
            socket_dir: s.socket_dir().to_path_buf(),
            log_file: s.log_file().to_path_buf(),
            pid: s.pid(),
        })
        .collect();
    state.shards = cluster
        .shards()
        .iter()
        .enumerate()
        .map(|(i, d)| ShardState {
            shard: i,
            server: d.server,
            database: d.database.clone(),
            url: d.url.clone(),
        })
        .collect();
    state.spares = up.started_spares.clone();
    state.phase = Phase::Up;
    state.save()
}

/// Step 10: tell the user what runs where.
fn print_summary(up: &Up) {
    let (Some(cluster), Some(state)) = (up.cluster.as_ref(), up.state.as_ref()) else {
        return;
    };
    println!(
        "cluster up in {:.1}s:",
        up.started_at.elapsed().as_secs_f64()
    );
    for (i, s) in cluster.servers().iter().enumerate() {
        let count = cluster.shards().iter().filter(|d| d.server == i).count();
        println!(
            "  server 127.0.0.1:{}  pid {}  {} shard databases  data {}",
            s.port(),
            s.pid().map(|p| p.to_string()).unwrap_or_else(|| "?".into()),
            count,
            s.data_dir().display()
        );
    }
    spares::print_servers(state);
    let shards = cluster.shards();
    if let (Some(first), Some(last)) = (shards.first(), shards.last()) {
        println!(
            "  {} shards: {} .. {}",
            shards.len(),
            first.database,
            last.database
        );
        println!("  shard map:  {}", state.shardmap.display());
        println!("  state file: {}", ClusterState::path(&up.dir).display());
        for r in state.routers() {
            println!(
                "  router:     127.0.0.1:{}  pid {}  config {}  log {}",
                r.port,
                r.pid,
                r.config.display(),
                r.log_file.display()
            );
        }
        println!(
            "one shard:  psql '{}' -c 'SELECT count(*) FROM kv'",
            first.url
        );
        spares::print_urls(state);
        if let Some(r) = &state.router {
            println!("connect:    psql {}", r.url);
            print_urls(up, r);
        }
        print_loadgen_targets(state);
    }
}

/// With TLS, how to connect with the certificate checked (`sslmode=verify-full`); the admin
/// console (the cluster's user is an admin); the HTTP side port when the router serves one (as
/// its config says, whatever this invocation's `--http-port`).
fn print_urls(up: &Up, router: &RouterState) {
    let url = router.url.as_str();
    if up.tls {
        println!(
            "with TLS:   psql '{}'",
            crate::tls::connection_url(url, &up.dir)
        );
    }
    if let Some((base, _)) = url.rsplit_once('/') {
        println!("admin:      psql {base}/shardgate -c 'SHOW SHARDS'");
    }
    if let Ok(Some(port)) = router::configured_http_port(&router.config) {
        println!("metrics:    curl http://127.0.0.1:{port}/metrics");
    }
}
