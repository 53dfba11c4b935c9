//! The router of a local cluster: one `shardgate` process in front of the shard databases,
//! started detached by `up`, probed by `status`, stopped by `down`.
//!
//! The router outlives the `cluster` command that started it, so everything later commands need
//! to find it again (pid, port, config, log) goes into the state file; see [`RouterState`].

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::state::{router_files, RouterState, SHARDMAP_FILE};
use crate::Result;

/// The logical database clients name; every shard database answers to it through the router.
pub const DATABASE: &str = "app";

/// How long `up` waits for a fresh router to accept connections. It binds its port within
/// milliseconds; the margin is for a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `down` waits after SIGTERM before it sends SIGKILL. The router exits at once on
/// SIGTERM (it does not drain yet); a router that takes longer is stuck.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What a router serves and who may log in.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// Which router of the cluster (1-based): names its config and log ([`router_files`]).
    pub index: usize,
    pub port: u16,
    pub user: String,
    pub password: String,
    /// `[pool] max_size`: backend connections per shard database (per router worker).
    pub pool_size: usize,
    /// `[pool] connect_timeout_ms`.
    pub connect_timeout_ms: u64,
    /// TLS toward clients and shards (`up --tls`; see [`crate::tls`]).
    pub tls: bool,
    /// `[http] listen` on 127.0.0.1 (`up --http-port`).
    pub http_port: Option<u16>,
}

impl RouterOptions {
    /// The options of router `k` of several: the first one's, with ports shifted by `k - 1`.
    pub fn for_router(&self, k: usize) -> Result<RouterOptions> {
        let shift = |p: u16| {
            u16::try_from(usize::from(p) + k - 1)
                .map_err(|_| format!("port {p} leaves no room for {k} routers"))
        };
        Ok(RouterOptions {
            index: k,
            port: shift(self.port)?,
            http_port: self.http_port.map(shift).transpose()?,
            ..self.clone()
        })
    }
}

/// Backend connections per shard database and router worker thread (each worker of the router
/// has its own pools): enough for a handful of busy clients per shard, but never more than the
/// servers can take. Each server holds `ceil(shards / servers)` shard databases, so the pools of
/// one server share its `max_connections`; a quarter stays free for psql, pgbench or loadgen
/// connecting directly.
pub fn pool_size(max_connections: u32, shards: usize, servers: usize, workers: usize) -> usize {
    let per_server = shards.div_ceil(servers.max(1)).max(1) * workers.max(1);
    let budget = (max_connections as usize * 3 / 4).max(1);
    (budget / per_server).clamp(1, 20)
}

/// `max_connections` each server needs so that every router worker holds one connection to
/// each of its shard databases (the router opens them at start: a shared connection per worker,
/// or `[pool] warm_connections` pooled ones with sharing off) and
/// as many again are left for clients straight to the shards (`loadgen prepare`, a direct
/// run): `requested`, or more when that is short.
pub fn max_connections_needed(
    requested: u32,
    shards: usize,
    servers: usize,
    workers: usize,
) -> u32 {
    let shards_per_server = shards.div_ceil(servers.max(1)).max(1);
    let per_server = shards_per_server * workers.max(1);
    requested.max((per_server + shards_per_server.max(per_server) + 20) as u32)
}

/// Worker threads the router will run (its default: one per core).
pub fn router_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Connecting and logging in to many shard databases at once (the first read across all of
/// them) takes longer than to a few: SCRAM costs CPU on both ends.
pub fn connect_timeout_ms(shards: usize) -> u64 {
    if shards > 64 {
        10_000
    } else {
        2_000
    }
}

/// The `shardgate` binary: `$SHARDGATE_BIN`, else the one next to this executable (where
/// `cargo build -p shardgate-cluster -p shardgate` puts both).
pub fn find_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SHARDGATE_BIN").filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            return Err(format!("SHARDGATE_BIN={} is not a file", bin.display()).into());
        }
        return Ok(bin);
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let sibling = exe.with_file_name("shardgate");
    if sibling.is_file() {
        return Ok(sibling);
    }
    Err(format!(
        "the router binary is not at {}; build it with `cargo build --release -p shardgate` \
         (deploy/local/cluster does this), point SHARDGATE_BIN at it, or pass --no-router",
        sibling.display()
    )
    .into())
}

/// `postgres://USER:PASSWORD@127.0.0.1:PORT/DATABASE`, with user and password percent-encoded so
/// that the string can be pasted into a shell and parsed by libpq as it is.
pub fn connection_url(user: &str, password: &str, port: u16) -> String {
    format!(
        "postgres://{}:{}@127.0.0.1:{port}/{DATABASE}",
        percent_encode(user),
        percent_encode(password)
    )
}

pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A TOML string literal (escaped as TOML requires).
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Writes `DIR/router.toml` (`router-K.toml` for router K; see docs/configuration.md) and
/// returns its path. The shard map is
/// named relative to the config, so the directory can be inspected or moved as a whole.
pub fn write_config(dir: &Path, opts: &RouterOptions) -> Result<PathBuf> {
    let text = format!(
        "# Written by `deploy/local/cluster up`, rewritten by every `up` that starts a router,\n\
         # deleted by `down`. Format: docs/configuration.md.\n\
         listen = {listen}\n\
         shardmap = {shardmap}\n\
         database = {database}\n\
         auth = \"scram-sha-256\"\n\
         \n\
         # Also an admin: the console is the database `shardgate` on the same port.\n\
         [[users]]\n\
         name = {user}\n\
         password = {password}\n\
         admin = true\n\
         \n\
         {http}\
         {tls}\
         # The superuser every pgharness server accepts over TCP.\n\
         [backend]\n\
         user = {backend_user}\n\
         password = {backend_password}\n\
         {backend_tls}\
         \n\
         # One pool per shard database and worker thread; sized so the pools of one server fit its\n\
         # max_connections.\n\
         [pool]\n\
         max_size = {pool_size}\n\
         connect_timeout_ms = {connect_timeout}\n",
        listen = toml_str(&format!("127.0.0.1:{}", opts.port)),
        shardmap = toml_str(SHARDMAP_FILE),
        database = toml_str(DATABASE),
        user = toml_str(&opts.user),
        password = toml_str(&opts.password),
        backend_user = toml_str(pgharness::SUPERUSER),
        backend_password = toml_str(pgharness::PASSWORD),
        pool_size = opts.pool_size,
        connect_timeout = opts.connect_timeout_ms,
        http = opts.http_port.map_or(String::new(), |p| {
            format!("[http]\nlisten = {}\n\n", toml_str(&format!("127.0.0.1:{p}")))
        }),
        tls = if opts.tls { crate::tls::router_config() } else { String::new() },
        backend_tls = if opts.tls { crate::tls::backend_config() } else { String::new() },
    );
    let path = dir.join(router_files(opts.index).0);
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// The HTTP side port a router config serves (`[http] listen = "127.0.0.1:PORT"`, as
/// [`write_config`] writes it); `None` when it has no `[http]` table.
pub fn configured_http_port(config: &Path) -> Result<Option<u16>> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| format!("reading {}: {e}", config.display()))?;
    http_port_of(&text).map_err(|e| format!("{}: {e}", config.display()).into())
}

fn http_port_of(config: &str) -> std::result::Result<Option<u16>, String> {
    let doc: toml::Table = config.parse().map_err(|e| format!("not valid TOML: {e}"))?;
    let Some(listen) = doc.get("http").and_then(|h| h.get("listen")) else {
        return Ok(None);
    };
    listen
        .as_str()
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .map(Some)
        .ok_or_else(|| format!("[http] listen = {listen} is not \"HOST:PORT\""))
}

/// Starts `bin --config CONFIG` detached from this command (own session, so neither Ctrl-C in
/// this terminal nor closing it reaches the router), output to `DIR/router.log`, and waits
/// until it is ready (pgharness's launcher). If it exits first, or is not ready in time, the
/// error holds the end of its log (and a router that hangs is killed).
pub fn start(bin: &Path, dir: &Path, config: &Path, opts: &RouterOptions) -> Result<RouterState> {
    let log_file = dir.join(router_files(opts.index).1);
    let mut launch = pgharness::router::Launch::new(bin, config, &log_file);
    launch.detached = true;
    launch.timeout = START_TIMEOUT;
    let router = pgharness::router::start(&launch)?;
    // The process is not waited for: it outlives this command and is reaped by init.
    Ok(RouterState {
        pid: router.pid,
        port: opts.port,
        config: config.to_path_buf(),
        log_file,
        database: DATABASE.into(),
        user: opts.user.clone(),
        url: connection_url(&opts.user, &opts.password, opts.port),
    })
}

/// Starts a router that ran before, as it was recorded: its config (which `up` wrote then and
/// keeps), port, log and users; only the pid is new.
pub fn restart(bin: &Path, old: &RouterState) -> Result<RouterState> {
    let mut launch = pgharness::router::Launch::new(bin, &old.config, &old.log_file);
    launch.detached = true;
    launch.timeout = START_TIMEOUT;
    let router = pgharness::router::start(&launch)?;
    Ok(RouterState {
        pid: router.pid,
        ..old.clone()
    })
}

/// Whether a Postgres frontend answers on 127.0.0.1:`port`: it must reply to an SSLRequest
/// with `N` or `S`. A bare TCP connect would also succeed against whatever else holds the port.
pub fn probe(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    // SSLRequest: length 8, code 80877103.
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    if s.write_all(&SSL_REQUEST).is_err() {
        return false;
    }
    let mut reply = [0u8; 1];
    matches!(s.read_exact(&mut reply), Ok(()) if reply[0] == b'N' || reply[0] == b'S')
}

/// Whether the router of `r` still runs: its pid is alive, not a zombie, and is still that
/// router (its command line names its config), so a recycled pid is never mistaken for it.
pub fn is_running(r: &RouterState) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", r.pid)) else {
        return false;
    };
    let config = r.config.as_os_str().as_encoded_bytes();
    if !cmdline.split(|b| *b == 0).any(|arg| arg == config) {
        return false;
    }
    pgharness::proc::alive(r.pid)
}

/// Stops the router of `r`: SIGTERM, then SIGKILL when it is still there after a grace period.
/// Returns what happened, for the user.
pub fn stop(r: &RouterState) -> Result<String> {
    if !is_running(r) {
        return Ok(format!(
            "router (port {}, pid {}) was not running",
            r.port, r.pid
        ));
    }
    let pid = r.pid as libc::pid_t;
    // SAFETY: plain syscall; is_running just checked that pid is our router.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    if wait_gone(r, STOP_GRACE) {
        return Ok(format!("stopped router (port {}, pid {})", r.port, r.pid));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    if wait_gone(r, Duration::from_secs(5)) {
        return Ok(format!(
            "killed router (port {}, pid {}): it did not exit within {}s of SIGTERM; see {}",
            r.port,
            r.pid,
            STOP_GRACE.as_secs(),
            r.log_file.display()
        ));
    }
    Err(format!(
        "router pid {} is still running after SIGKILL; stop it by hand",
        r.pid
    )
    .into())
}

fn wait_gone(r: &RouterState, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !is_running(r) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !is_running(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_fit_the_servers() {
        assert_eq!(pool_size(200, 1, 1, 1), 20);
        assert_eq!(pool_size(200, 4, 4, 2), 20);
        assert_eq!(pool_size(200, 16, 4, 2), 18);
        assert_eq!(pool_size(200, 512, 4, 2), 1);
        assert_eq!(pool_size(200, 64, 4, 1), 9);
        assert_eq!(pool_size(200, 64, 4, 2), 4);
        // Never 0, even when the servers are too small for one connection per shard.
        assert_eq!(pool_size(10, 4096, 1, 2), 1);
        // 512 shards on 4 servers with 2 workers: 256 warm router connections per server and as
        // many for direct clients, more than the default 200.
        assert_eq!(max_connections_needed(200, 512, 4, 2), 532);
        assert_eq!(max_connections_needed(200, 4, 4, 2), 200);
    }

    #[test]
    fn urls_are_percent_encoded() {
        assert_eq!(
            connection_url("app", "app", 6432),
            "postgres://app:app@127.0.0.1:6432/app"
        );
        assert_eq!(
            connection_url("a b", "p@ss:w/rd", 1),
            "postgres://a%20b:p%40ss%3Aw%2Frd@127.0.0.1:1/app"
        );
    }

    #[test]
    fn the_http_port_is_read_back_from_the_config() {
        let dir =
            std::env::temp_dir().join(format!("shardgate-cluster-http-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut opts = RouterOptions {
            index: 1,
            port: 6432,
            user: "app".into(),
            password: "app".into(),
            pool_size: 1,
            connect_timeout_ms: 1,
            tls: false,
            http_port: None,
        };
        let config = write_config(&dir, &opts).expect("config");
        assert_eq!(configured_http_port(&config).ok(), Some(None));
        opts.http_port = Some(9187);
        let config = write_config(&dir, &opts).expect("config");
        assert_eq!(configured_http_port(&config).ok(), Some(Some(9187)));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(http_port_of("[http]\nlisten = \"nowhere\"\n").is_err());
    }

    #[test]
    fn config_strings_are_escaped() {
        // Whatever quoting toml picks, the value must read back unchanged.
        for s in [r#"a"b\c"#, "it's", "line\nbreak", r#"'"'''"#] {
            let doc: toml::Table = format!("x = {}", toml_str(s)).parse().expect("valid TOML");
            assert_eq!(doc["x"].as_str(), Some(s));
        }
    }
}
