//! One real PostgreSQL server: a copy of the template data directory, started with `pg_ctl -w`,
//! either throw-away (tests: free port, temp dir, stopped and deleted on drop or at process exit)
//! or persistent (the local cluster tool: fixed port and directory, left running).

use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::cleanup::{self, fnv1a, SOCK_DIR_PREFIX, TEST_DIR_PREFIX};
use crate::error::{Error, Result};
use crate::template::{PASSWORD, SUPERUSER};
use crate::user::{chown, client_command, server_command};
use crate::{harness, Harness};

mod psql;
mod standby;

/// The address every server listens on.
pub const HOST: &str = "127.0.0.1";
/// Name of the file in a server directory that describes it (see [`Server::attach`]).
pub const INFO_FILE: &str = "pgharness.info";
/// The certificate and key of a server with [`ServerOptions::tls`], in its data directory.
const SSL_CERT_FILE: &str = "server.crt";
const SSL_KEY_FILE: &str = "server.key";
/// How many times a server on an automatically chosen port is retried when the port got taken.
const PORT_ATTEMPTS: usize = 5;

/// How to start a [`Server`]. `ServerOptions::default()` is what tests want.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Fixed TCP port; `None` picks a free one (retried if it gets taken before PostgreSQL binds it).
    pub port: Option<u16>,
    /// Fixed server directory (must not exist or be empty; holds `data/`, `sock/`, `postgres.log`).
    /// `None` creates `<temp dir>/shardgate-test-<pid>-<n>`.
    pub dir: Option<PathBuf>,
    /// Leave the server running and its directory in place when the `Server` is dropped or the
    /// process exits (the cluster tool); stop it with [`Server::stop`] or [`Server::remove`].
    pub persistent: bool,
    /// `max_connections`.
    pub max_connections: u32,
    /// `shared_buffers`, in PostgreSQL units (e.g. `"64MB"`).
    pub shared_buffers: String,
    /// Further `postgresql.conf` settings, e.g. `("wal_level", "logical")`.
    pub settings: Vec<(String, String)>,
    /// How long `pg_ctl -w` waits for the server to accept connections.
    pub start_timeout: Duration,
    /// `ssl = on` with this certificate and key (see [`crate::tls`]); they are written into
    /// the data directory, owned by the user the server runs as, the key with mode 0600.
    pub tls: Option<crate::tls::Issued>,
    /// `pg_hba.conf` lines put before the template's own (the first line that matches a
    /// connection decides), e.g. `hostnossl all all 0.0.0.0/0 reject` to allow only TLS.
    pub hba: Vec<String>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            port: None,
            dir: None,
            persistent: false,
            max_connections: 200,
            shared_buffers: "64MB".into(),
            settings: Vec::new(),
            start_timeout: Duration::from_secs(60),
            tls: None,
            hba: Vec::new(),
        }
    }
}

/// Whether a server accepts connections (from `pg_isready`, or a TCP connect without it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Accepting connections.
    Accepting,
    /// Up but rejecting connections (starting up or shutting down).
    Rejecting,
    /// Nothing answers on the port.
    NoResponse,
}

impl std::fmt::Display for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Readiness::Accepting => "accepting connections",
            Readiness::Rejecting => "rejecting connections",
            Readiness::NoResponse => "no response",
        })
    }
}

/// The contents of a server directory's [`INFO_FILE`].
#[derive(Debug, Clone)]
pub(crate) struct Info {
    pub port: u16,
    pub data_dir: PathBuf,
    pub socket_dir: PathBuf,
    pub log_file: PathBuf,
    /// Test process owning the server (0 for persistent servers).
    pub owner_pid: u32,
    pub owner_start: u64,
}

impl Info {
    pub(crate) fn read(dir: &Path) -> Result<Info> {
        let path = dir.join(INFO_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::NotAServerDir {
            dir: dir.to_path_buf(),
            reason: format!("cannot read {}: {e}", path.display()),
        })?;
        let get = |key: &str| -> Result<&str> {
            text.lines()
                .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
                .ok_or_else(|| Error::NotAServerDir {
                    dir: dir.to_path_buf(),
                    reason: format!("{} has no `{key}=` line", path.display()),
                })
        };
        let num = |key: &str| -> Result<u64> {
            get(key)?.parse().map_err(|_| Error::NotAServerDir {
                dir: dir.to_path_buf(),
                reason: format!("{} has a malformed `{key}=` line", path.display()),
            })
        };
        Ok(Info {
            port: u16::try_from(num("port")?).unwrap_or(0),
            data_dir: get("data_dir")?.into(),
            socket_dir: get("socket_dir")?.into(),
            log_file: get("log_file")?.into(),
            owner_pid: u32::try_from(num("owner_pid")?).unwrap_or(0),
            owner_start: num("owner_start")?,
        })
    }

    fn write(&self, dir: &Path) -> Result<()> {
        let text = format!(
            "port={}\ndata_dir={}\nsocket_dir={}\nlog_file={}\nowner_pid={}\nowner_start={}\n",
            self.port,
            self.data_dir.display(),
            self.socket_dir.display(),
            self.log_file.display(),
            self.owner_pid,
            self.owner_start
        );
        let path = dir.join(INFO_FILE);
        std::fs::write(&path, text).map_err(|e| Error::io("writing the server info file", path, e))
    }
}

/// A running (or stopped) PostgreSQL server. Throw-away servers are stopped (immediate shutdown)
/// and deleted on drop, and at process exit when never dropped.
#[derive(Debug)]
pub struct Server {
    h: std::sync::Arc<Harness>,
    dir: PathBuf,
    info: Info,
    persistent: bool,
    /// Fallback socket directory outside `dir` that we created (removed with the server).
    own_socket_dir: Option<PathBuf>,
    registry_id: Option<u64>,
    removed: bool,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A port on 127.0.0.1 that nothing listens on right now. Another process may take it before
/// the caller binds it; tests and tools that use it live with that small race.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::io("binding 127.0.0.1:0 to find a free port", "127.0.0.1:0", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("reading the address of a bound socket", "127.0.0.1:0", e))
}

/// Fails with [`Error::PortInUse`] when something listens on (or holds) `127.0.0.1:port`.
pub fn check_port_free(port: u16) -> Result<()> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .map(drop)
        .map_err(|_| Error::PortInUse { port })
}

/// Last `lines` lines of the log file `path`, reading from byte `from` on, and at most its last
/// 64 KiB (the end is all that is shown; a huge log is not read whole).
pub fn log_tail(path: &Path, from: u64, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(from.max(len.saturating_sub(64 * 1024))));
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    if tail.is_empty() {
        "(log is empty or missing)".into()
    } else {
        tail
    }
}

fn quote_conf(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Double-quotes an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn status_text(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => status.to_string(),
    }
}

/// Where a new server's data directory comes from.
enum Source<'a> {
    /// A copy of the template (a new, empty cluster).
    Template,
    /// A base backup of a running server, started as its streaming standby.
    StandbyOf(&'a Server),
}

impl Server {
    /// Creates a server directory from the template and starts PostgreSQL in it.
    pub fn start(opts: &ServerOptions) -> Result<Server> {
        Self::start_from(opts, Source::Template)
    }

    /// `pg_ctl -D DATA ARGS`, run as the server's user: its output, or why it could not run.
    fn pg_ctl(&self, args: &[&str]) -> std::result::Result<std::process::Output, String> {
        let pg_ctl = self.h.install.program("pg_ctl");
        server_command(&pg_ctl, self.h.run_as.as_ref())
            .arg("-D")
            .arg(&self.info.data_dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{} could not be run: {e}", pg_ctl.display()))
    }

    fn start_from(opts: &ServerOptions, source: Source<'_>) -> Result<Server> {
        let h = harness()?;
        if let Some(port) = opts.port {
            check_port_free(port)?;
        }
        let run_as = h.run_as.as_ref();

        let dir = match &opts.dir {
            Some(dir) => {
                let dir = std::path::absolute(dir)
                    .map_err(|e| Error::io("resolving the server directory", dir, e))?;
                std::fs::create_dir_all(&dir)
                    .map_err(|e| Error::io("creating the server directory", &dir, e))?;
                let mut entries = std::fs::read_dir(&dir)
                    .map_err(|e| Error::io("reading the server directory", &dir, e))?;
                if entries.next().is_some() {
                    return Err(Error::InvalidOptions(format!(
                        "server directory {} is not empty (a server left from an earlier run?)",
                        dir.display()
                    )));
                }
                dir
            }
            None => {
                let seq = SEQ.fetch_add(1, Ordering::Relaxed);
                let dir = h
                    .tmp
                    .join(format!("{TEST_DIR_PREFIX}{}-{seq}", std::process::id()));
                std::fs::create_dir(&dir)
                    .map_err(|e| Error::io("creating the server directory", &dir, e))?;
                dir
            }
        };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io("setting permissions of the server directory", &dir, e))?;
        chown(&dir, run_as)?;

        // Unix socket paths are limited to ~107 bytes: fall back to a short temp directory.
        let mut socket_dir = dir.join("sock");
        let mut own_socket_dir = None;
        if socket_dir.as_os_str().len() + ".s.PGSQL.65535.lock".len() + 1 > 100 {
            let hash = fnv1a(&[dir.as_os_str().as_encoded_bytes()]);
            socket_dir = h.tmp.join(format!("{SOCK_DIR_PREFIX}{hash:016x}"));
            own_socket_dir = Some(socket_dir.clone());
        }
        let data_dir = dir.join("data");
        let info = Info {
            port: opts.port.unwrap_or(0),
            data_dir: data_dir.clone(),
            socket_dir: socket_dir.clone(),
            log_file: dir.join("postgres.log"),
            owner_pid: if opts.persistent {
                0
            } else {
                std::process::id()
            },
            owner_start: if opts.persistent {
                0
            } else {
                cleanup::own_start_time()
            },
        };
        let registry_id = (!opts.persistent).then(|| {
            cleanup::register(cleanup::Entry {
                data_dir: data_dir.clone(),
                remove: std::iter::once(dir.clone())
                    .chain(own_socket_dir.clone())
                    .collect(),
            })
        });
        let mut server = Server {
            h: h.clone(),
            dir,
            info,
            persistent: opts.persistent,
            own_socket_dir,
            registry_id,
            removed: false,
        };
        match server.init_and_start(opts, source) {
            Ok(()) => Ok(server),
            Err(e) => {
                let _ = server.destroy();
                Err(e)
            }
        }
    }

    fn init_and_start(&mut self, opts: &ServerOptions, source: Source<'_>) -> Result<()> {
        let run_as = self.h.run_as.clone();
        let run_as = run_as.as_ref();
        std::fs::create_dir_all(&self.info.socket_dir)
            .map_err(|e| Error::io("creating the socket directory", &self.info.socket_dir, e))?;
        std::fs::set_permissions(
            &self.info.socket_dir,
            std::fs::Permissions::from_mode(0o700),
        )
        .map_err(|e| {
            Error::io(
                "setting permissions of the socket directory",
                &self.info.socket_dir,
                e,
            )
        })?;
        chown(&self.info.socket_dir, run_as)?;

        let mut settings = Vec::new();
        match source {
            Source::Template => self.copy_template()?,
            Source::StandbyOf(primary) => settings.push(self.base_backup_of(primary)?),
        }
        self.write_tls_and_hba(opts)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.info.port = match opts.port {
                Some(port) => port,
                None => free_port()?,
            };
            self.write_config(opts, &settings)?;
            self.info.write(&self.dir)?;
            match self.pg_ctl_start(opts.start_timeout) {
                Ok(()) => return Ok(()),
                Err(Error::StartFailed { ref log_tail, .. })
                    if opts.port.is_none()
                        && attempt < PORT_ATTEMPTS
                        && (log_tail.contains("could not bind")
                            || log_tail.contains("Address already in use")) =>
                {
                    cleanup::kill_postmaster(&self.info.data_dir, Duration::from_secs(5));
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The data directory as a copy of the template.
    fn copy_template(&self) -> Result<()> {
        // `cp -a` keeps the template's owner and modes (PostgreSQL insists on 0700/0750).
        let out = Command::new("cp")
            .arg("-a")
            .arg(&self.h.template)
            .arg(&self.info.data_dir)
            .output()
            .map_err(|e| Error::Command {
                what: "copying the template data directory".into(),
                program: "cp".into(),
                status: format!("could not be run: {e}"),
                stderr: String::new(),
            })?;
        if !out.status.success() {
            return Err(Error::Command {
                what: format!(
                    "copying {} to {}",
                    self.h.template.display(),
                    self.info.data_dir.display()
                ),
                program: "cp".into(),
                status: status_text(out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().into(),
            });
        }
        Ok(())
    }

    /// The certificate, key and `pg_hba.conf` lines of `opts`, written once into the fresh
    /// data directory.
    fn write_tls_and_hba(&self, opts: &ServerOptions) -> Result<()> {
        let run_as = self.h.run_as.as_ref();
        if let Some(tls) = &opts.tls {
            let (cert, key) = (
                self.info.data_dir.join(SSL_CERT_FILE),
                self.info.data_dir.join(SSL_KEY_FILE),
            );
            tls.write(&cert, &key)?;
            chown(&cert, run_as)?;
            chown(&key, run_as)?;
        }
        if !opts.hba.is_empty() {
            let path = self.info.data_dir.join("pg_hba.conf");
            let template = std::fs::read_to_string(&path)
                .map_err(|e| Error::io("reading pg_hba.conf", &path, e))?;
            let mut text = String::from("# Written by pgharness: the lines asked for first.\n");
            for line in &opts.hba {
                text.push_str(line);
                text.push('\n');
            }
            text.push_str(&template);
            std::fs::write(&path, text).map_err(|e| Error::io("writing pg_hba.conf", &path, e))?;
        }
        Ok(())
    }

    fn write_config(&self, opts: &ServerOptions, extra: &[(String, String)]) -> Result<()> {
        let mut settings: Vec<(String, String)> = vec![
            ("listen_addresses".into(), HOST.into()),
            ("port".into(), self.info.port.to_string()),
            (
                "unix_socket_directories".into(),
                self.info.socket_dir.display().to_string(),
            ),
            ("fsync".into(), "off".into()),
            ("synchronous_commit".into(), "off".into()),
            ("full_page_writes".into(), "off".into()),
            ("shared_buffers".into(), opts.shared_buffers.clone()),
            ("max_connections".into(), opts.max_connections.to_string()),
            // Two-phase commit across shards (shardgate's `cross_shard = "two_phase"`): as many
            // prepared transactions as sessions, as the Postgres documentation advises.
            (
                "max_prepared_transactions".into(),
                opts.max_connections.to_string(),
            ),
            ("logging_collector".into(), "off".into()),
            ("log_destination".into(), "stderr".into()),
            ("log_line_prefix".into(), "%m [%p] %q%u@%d ".into()),
        ];
        if opts.tls.is_some() {
            settings.extend([
                ("ssl".into(), "on".into()),
                ("ssl_cert_file".into(), SSL_CERT_FILE.into()),
                ("ssl_key_file".into(), SSL_KEY_FILE.into()),
            ]);
        }
        settings.extend(opts.settings.iter().cloned());
        settings.extend(extra.iter().cloned());
        let mut text = String::from(
            "# Do not edit this file manually!\n# It will be overwritten by the ALTER SYSTEM command.\n# Written by pgharness.\n",
        );
        for (key, value) in &settings {
            text.push_str(&format!("{key} = {}\n", quote_conf(value)));
        }
        let path = self.info.data_dir.join("postgresql.auto.conf");
        let mut f = std::fs::File::create(&path)
            .map_err(|e| Error::io("writing the server settings", &path, e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| Error::io("writing the server settings", &path, e))?;
        drop(f);
        chown(&path, self.h.run_as.as_ref())
    }

    fn pg_ctl_start(&self, timeout: Duration) -> Result<()> {
        let log = &self.info.log_file;
        let log_start = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
        let pg_ctl = self.h.install.program("pg_ctl");
        let out = server_command(&pg_ctl, self.h.run_as.as_ref())
            .arg("-D")
            .arg(&self.info.data_dir)
            .arg("-l")
            .arg(log)
            .arg("-w")
            .arg("-t")
            .arg(timeout.as_secs().max(1).to_string())
            .arg("start")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Command {
                what: "starting PostgreSQL".into(),
                program: pg_ctl.display().to_string(),
                status: format!("could not be run: {e}"),
                stderr: String::new(),
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::StartFailed {
            data_dir: self.info.data_dir.clone(),
            port: self.info.port,
            reason: format!(
                "pg_ctl {}: {}{}",
                status_text(out.status),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            log: log.clone(),
            log_tail: log_tail(log, log_start, 30),
        })
    }

    /// Opens a server directory made by an earlier `Server::start` (possibly by another process,
    /// e.g. the cluster tool's `up`), as a persistent server: dropping it does nothing.
    pub fn attach(dir: &Path) -> Result<Server> {
        let h = harness()?;
        let info = Info::read(dir)?;
        let own_socket_dir = (!info.socket_dir.starts_with(dir)).then(|| info.socket_dir.clone());
        Ok(Server {
            h,
            dir: dir.to_path_buf(),
            info,
            persistent: true,
            own_socket_dir,
            registry_id: None,
            removed: false,
        })
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.info.port
    }

    /// Host to connect to (`127.0.0.1`).
    pub fn host(&self) -> &'static str {
        HOST
    }

    /// `postgres://postgres:postgres@127.0.0.1:PORT/db` (TCP, SCRAM password auth).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://{SUPERUSER}:{PASSWORD}@{HOST}:{}/{db}",
            self.info.port
        )
    }

    /// The server directory (holds `data/`, usually `sock/`, `postgres.log`, [`INFO_FILE`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.info.data_dir
    }

    /// The Unix socket directory (connections there are trusted, as user `postgres`).
    pub fn socket_dir(&self) -> &Path {
        &self.info.socket_dir
    }

    /// The server log file.
    pub fn log_file(&self) -> &Path {
        &self.info.log_file
    }

    /// Whether the server is left running when dropped.
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// PID of the running postmaster, from `postmaster.pid`.
    pub fn pid(&self) -> Option<u32> {
        cleanup::postmaster_pid(&self.info.data_dir)
    }

    /// Whether a postmaster is running for this data directory.
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Path of a program of the PostgreSQL installation in use (`pgbench`, `pg_dump`, ...).
    pub fn bin(&self, program: &str) -> PathBuf {
        self.h.install.program(program)
    }

    /// Whether the server accepts TCP connections (`pg_isready`, or a TCP connect without it).
    pub fn readiness(&self) -> Readiness {
        let pg_isready = self.h.install.program("pg_isready");
        if pg_isready.is_file() {
            let status = client_command(&pg_isready)
                .args(["-q", "-h", HOST, "-t", "3", "-p"])
                .arg(self.info.port.to_string())
                .stdin(Stdio::null())
                .status();
            if let Ok(status) = status {
                return match status.code() {
                    Some(0) => Readiness::Accepting,
                    Some(1) => Readiness::Rejecting,
                    _ => Readiness::NoResponse,
                };
            }
        }
        match TcpStream::connect_timeout(
            &(Ipv4Addr::LOCALHOST, self.info.port).into(),
            Duration::from_secs(3),
        ) {
            Ok(_) => Readiness::Accepting,
            Err(_) => Readiness::NoResponse,
        }
    }

    /// Stops the server (fast shutdown) and waits for it; a no-op when it is not running.
    pub fn stop(&mut self) -> Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        let out = self
            .pg_ctl(&["-m", "fast", "-w", "-t", "60", "stop"])
            .map_err(|reason| Error::StopFailed {
                data_dir: self.info.data_dir.clone(),
                reason,
            })?;
        if out.status.success() || !self.is_running() {
            return Ok(());
        }
        Err(Error::StopFailed {
            data_dir: self.info.data_dir.clone(),
            reason: format!(
                "pg_ctl {}: {}",
                status_text(out.status),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }

    /// Starts the server again (after [`Server::stop`], or restarts it when running) on the same
    /// port and directory.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.pg_ctl_start(Duration::from_secs(60))
    }

    /// Stops the server (immediate shutdown) and deletes its directory, persistent or not.
    pub fn remove(mut self) -> Result<()> {
        self.destroy()
    }

    fn destroy(&mut self) -> Result<()> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        cleanup::kill_postmaster(&self.info.data_dir, Duration::from_secs(10));
        if let Some(id) = self.registry_id.take() {
            cleanup::unregister(id);
        }
        let mut result = Ok(());
        for dir in std::iter::once(&self.dir).chain(self.own_socket_dir.as_ref()) {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => result = Err(Error::io("removing the server directory", dir, e)),
            }
        }
        result
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !self.persistent {
            let _ = self.destroy();
        }
    }
}
