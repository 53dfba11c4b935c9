//! Shared pieces of the router's integration tests: a real cluster of Postgres shards
//! (pgharness), a real `shardgate` process in front of it, and clients.
//!
//! Most tests share one 4-shard cluster and router per test binary (started on first use,
//! stopped at process exit); tests that stop servers start their own.

#![allow(dead_code)]

pub mod raw;
pub mod tls;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use shardmap::{KeyType, ShardMap, Table};
use tokio_postgres::{Client, NoTls};

pub const USER: &str = "app";
pub const PASSWORD: &str = "app-secret";
pub const DATABASE: &str = "app";

pub const SCHEMA: &str = "
CREATE TABLE kv (id bigint PRIMARY KEY, v text NOT NULL);
CREATE TABLE users (user_id uuid PRIMARY KEY, name text);
CREATE TABLE names (name text PRIMARY KEY, n int);
CREATE TABLE settings (k text PRIMARY KEY, v text);
CREATE TABLE pgbench_kv (id bigint PRIMARY KEY, v text);
";

pub fn tables() -> Vec<Table> {
    vec![
        Table::new("kv", "id", KeyType::BigInt),
        Table::new("users", "user_id", KeyType::Uuid),
        Table::new("names", "name", KeyType::Text),
    ]
}

/// A cluster of shards with a router in front.
pub struct Env {
    pub cluster: pgharness::Cluster,
    pub map: ShardMap,
    pub router: Router,
}

impl Env {
    pub fn start(shards: usize, servers: usize, pool_size: usize) -> Env {
        Self::start_with(
            shards,
            servers,
            &format!("[pool]\nmax_size = {pool_size}\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n"),
        )
    }

    /// A cluster and a router with extra config (see [`Router::start_with`]).
    pub fn start_with(shards: usize, servers: usize, extra: &str) -> Env {
        Self::start_threads(shards, servers, extra, 2)
    }

    /// [`Env::start_with`] with `threads` router workers (each has its own pools).
    pub fn start_threads(shards: usize, servers: usize, extra: &str, threads: usize) -> Env {
        let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
            shards,
            servers,
            schema_sql: Some(pgharness::Schema::Sql(SCHEMA.into())),
            ..Default::default()
        })
        .expect("start the shard cluster");
        let map = ShardMap::even_split(&cluster.shard_urls(), tables()).expect("shard map");
        let router = Router::start_threads_pub(&map, extra, threads);
        Env {
            cluster,
            map,
            router,
        }
    }

    /// The shard index of a bigint key.
    pub fn shard_of(&self, id: i64) -> usize {
        self.map.shard_for_key(&shardmap::Key::Int(id))
    }

    /// A key of table kv that lives on `shard`, from `from` upwards.
    pub fn key_on(&self, shard: usize, from: i64) -> i64 {
        (from..)
            .find(|&k| self.shard_of(k) == shard)
            .expect("a key on every shard")
    }

    /// psql in shard `shard`'s database, directly (not through the router).
    pub fn on_shard(&self, shard: usize, sql: &str) -> String {
        self.cluster
            .psql_shard(shard, sql)
            .unwrap_or_else(|e| panic!("{sql} on shard {shard}: {e}"))
    }
}

/// The cluster and router shared by the tests of one binary.
pub fn shared_env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| Env::start(4, 2, 8))
}

/// A `shardgate` process; stopped on drop and at process exit.
pub struct Router {
    pub port: u16,
    pub dir: PathBuf,
    process: Mutex<Option<pgharness::router::RouterProcess>>,
    log: PathBuf,
}

/// Routers still running at process exit (the shared one is never dropped) and their dirs.
static ROUTERS: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

extern "C" fn kill_routers() {
    if let Ok(routers) = ROUTERS.lock() {
        for (pid, dir) in routers.iter() {
            // SAFETY: kill(2) on a pid this process started.
            unsafe {
                libc::kill(*pid as i32, libc::SIGKILL);
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub fn free_port() -> u16 {
    pgharness::free_port().expect("a free port")
}

pub fn shardgate_bin() -> &'static str {
    env!("CARGO_BIN_EXE_shardgate")
}

impl Router {
    /// A router with two worker threads, each with pools of `pool_size` connections per shard.
    pub fn start(map: &ShardMap, pool_size: usize) -> Router {
        Self::start_with(map, &format!("[pool]\nmax_size = {pool_size}\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n"))
    }

    /// A router with one worker thread, so that every client shares one pool per shard of
    /// exactly `pool_size` connections (tests of what clients may see of each other).
    pub fn start_single_pool(map: &ShardMap, pool_size: usize, extra: &str) -> Router {
        Self::start_threads(
            map,
            &format!("{extra}[pool]\nmax_size = {pool_size}\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n"),
            1,
        )
    }

    /// Starts a router with extra config: top-level settings (before any `[section]` in
    /// `extra`) go to the top of the file, sections are appended.
    pub fn start_with(map: &ShardMap, extra: &str) -> Router {
        Self::start_threads(map, extra, 2)
    }

    /// A router with `threads` worker threads (each has its own pools).
    pub fn start_threads_pub(map: &ShardMap, extra: &str, threads: usize) -> Router {
        Self::start_threads(map, extra, threads)
    }

    fn start_threads(map: &ShardMap, extra: &str, threads: usize) -> Router {
        Self::start_at(map, extra, threads, free_port())
    }

    /// A router on a given port (for fleets whose members must know each other's address).
    pub fn start_at(map: &ShardMap, extra: &str, threads: usize, port: u16) -> Router {
        let split = if extra.starts_with('[') {
            0
        } else {
            extra.find("\n[").map_or(extra.len(), |i| i + 1)
        };
        let (top, sections) = extra.split_at(split);
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a plain extern "C" function once.
        ONCE.call_once(|| unsafe {
            libc::atexit(kill_routers);
        });
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "shardgate-router-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("router test dir");
        let config = pgharness::router::write_config(
            &dir,
            &map.to_toml(),
            port,
            DATABASE,
            (USER, PASSWORD),
            top,
            sections,
        )
        .expect("write the router config");
        let log = dir.join("router.log");
        let filter = std::env::var("SHARDGATE_TEST_LOG").unwrap_or_else(|_| "info".into());
        let mut launch = pgharness::router::Launch::new(Path::new(shardgate_bin()), &config, &log);
        launch.threads = Some(threads);
        launch.log_filter = Some(&filter);
        let process = pgharness::router::start(&launch).unwrap_or_else(|e| panic!("{e}"));
        ROUTERS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((process.pid, dir.clone()));
        Router {
            port,
            dir,
            process: Mutex::new(Some(process)),
            log,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        self.url_as(USER, PASSWORD, DATABASE)
    }

    pub fn url_as(&self, user: &str, password: &str, db: &str) -> String {
        format!("postgres://{user}:{password}@127.0.0.1:{}/{db}", self.port)
    }

    pub async fn connect(&self) -> Client {
        connect(&self.url())
            .await
            .unwrap_or_else(|e| panic!("connect to the router: {e}\n{}", self.log_text()))
    }

    /// Whether the router process is still running.
    pub fn is_alive(&self) -> bool {
        self.process
            .lock()
            .unwrap()
            .as_mut()
            .is_some_and(|p| p.is_alive())
    }

    /// The router's process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.process.lock().unwrap().as_ref().map(|p| p.pid)
    }

    /// Sends `signal` to the router process.
    pub fn signal(&self, signal: i32) {
        if let Some(p) = self.process.lock().unwrap().as_ref() {
            p.signal(signal);
        }
    }

    /// Waits up to `timeout` for the router to exit, and returns its status.
    pub fn wait_exit(&self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.process
            .lock()
            .unwrap()
            .as_mut()
            .and_then(|p| p.wait_exit(timeout))
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("router.toml")
    }

    /// Waits until the router's log has `count` lines with `needle` (at most 30 s).
    pub fn wait_for_log(&self, needle: &str, count: usize) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let lines = self.log_lines(needle);
            if lines.len() >= count {
                return lines;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the router never logged {needle:?} {count} times:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Lines of the router's log that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        std::fs::File::open(&self.log)
            .map(|f| {
                BufReader::new(f)
                    .lines()
                    .map_while(Result::ok)
                    .filter(|l| l.contains(needle))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        drop(
            self.process
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// The SQLSTATE of a failed statement.
pub fn sqlstate(err: &tokio_postgres::Error) -> String {
    err.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("no SQLSTATE: {err}"))
}

/// Runs a command, returning (success, stdout, stderr).
pub fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A client binary of the Postgres installation the harness uses (psql, pgbench).
pub fn pg_program(name: &str) -> PathBuf {
    let install = pgharness::pg_install().expect("postgres installation");
    let p = install.program(name);
    if p.exists() {
        p
    } else {
        Path::new("/usr/bin").join(name)
    }
}

/// The rows of a simple query's answer, every value as text (`NULL` for NULL).
pub fn rows(msgs: &[tokio_postgres::SimpleQueryMessage]) -> Vec<Vec<String>> {
    msgs.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// `GET path` on the router's HTTP side port: the status code and the body.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect to the HTTP port {port}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: router\r\n\r\n").expect("send the request");
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .expect("read the HTTP answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

/// The value of the sample `name{labels}` (exactly as written, `name` alone when it has no
/// labels) in a Prometheus text exposition; 0 when it is not there.
pub fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap_or(f64::NAN))
}
