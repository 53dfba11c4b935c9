//! A `shardgate` router process: built fresh, started with its log in a file, and waited for
//! until it says it is ready. The one launcher of the router's tests, loadgen's tests, the
//! benchmarks' helpers and the local cluster tool.
//!
//! Ready means the router logged `shardgate is ready`, which it does once it listens and has
//! asked a shard for what it learns at start (the server's parameters, the column order of the
//! sharded tables): a test that starts a router can use it at once, without retrying.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The line the router logs when it is ready.
pub const READY: &str = "shardgate is ready";

/// How to start a router.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub bin: &'a Path,
    /// Its `router.toml`; the router runs in the file's directory.
    pub config: &'a Path,
    /// Where its output goes (created anew).
    pub log: &'a Path,
    /// `--threads`; the router's default (one per core) when `None`.
    pub threads: Option<usize>,
    /// `RUST_LOG` for it (default `info`).
    pub log_filter: Option<&'a str>,
    /// In a session of its own (`setsid`): it outlives the caller, and a Ctrl-C in the
    /// caller's terminal does not reach it. Detached routers are not stopped on drop.
    pub detached: bool,
    /// How long it may take to become ready.
    pub timeout: Duration,
}

impl<'a> Launch<'a> {
    pub fn new(bin: &'a Path, config: &'a Path, log: &'a Path) -> Launch<'a> {
        Launch {
            bin,
            config,
            log,
            threads: None,
            log_filter: None,
            detached: false,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A started router. Unless detached, it is killed when this is dropped.
#[derive(Debug)]
pub struct RouterProcess {
    child: Option<Child>,
    pub pid: u32,
    pub log: PathBuf,
    detached: bool,
}

/// Starts a router and waits until it is ready. A router that exits first, or is not ready in
/// time, is an error that holds the end of its log (and one that hangs is killed).
pub fn start(l: &Launch<'_>) -> Result<RouterProcess> {
    let io = |what: &str, e: std::io::Error| Error::io(what, l.log, e);
    let log = std::fs::File::create(l.log).map_err(|e| io("creating the router log", e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| io("opening the router log", e))?;
    let mut cmd = Command::new(l.bin);
    cmd.arg("--config")
        .arg(l.config)
        .env("RUST_LOG", l.log_filter.unwrap_or("info"))
        // Plain text in the log: no colour escape codes.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if let Some(dir) = l.config.parent().filter(|d| !d.as_os_str().is_empty()) {
        cmd.current_dir(dir);
    }
    if let Some(threads) = l.threads {
        cmd.arg("--threads").arg(threads.to_string());
    }
    if l.detached {
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = cmd
        .spawn()
        .map_err(|e| Error::io("starting the router", l.bin, e))?;
    let mut router = RouterProcess {
        pid: child.id(),
        child: Some(child),
        log: l.log.to_path_buf(),
        detached: l.detached,
    };
    let deadline = Instant::now() + l.timeout;
    loop {
        if router.log_text().contains(READY) {
            return Ok(router);
        }
        if let Some(status) = router.exited() {
            return Err(Error::Router(format!(
                "the router ({} --config {}) exited with {status} before it was ready; the end of {}:\n{}",
                l.bin.display(),
                l.config.display(),
                l.log.display(),
                crate::log_tail(l.log, 0, 20)
            )));
        }
        if Instant::now() >= deadline {
            router.kill();
            return Err(Error::Router(format!(
                "the router (pid {}) was not ready within {}s, so it was killed; the end of {}:\n{}",
                router.pid,
                l.timeout.as_secs(),
                l.log.display(),
                crate::log_tail(l.log, 0, 20)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl RouterProcess {
    /// The router's whole log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status, once it has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whether the router still runs.
    pub fn is_alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => crate::proc::alive(self.pid),
        }
    }

    /// Kills the router (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits up to `timeout` for the router to exit; its status, or `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the router.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of a process this harness started.
        unsafe {
            libc::kill(self.pid as libc::pid_t, signal);
        }
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        if !self.detached {
            self.kill();
        }
    }
}

/// Builds the router with cargo (a no-op when it is fresh, so a test never runs a stale one)
/// and returns its path: `target/debug/shardgate`, or `target/release/shardgate` with
/// `release`. `workspace` is the repository root.
pub fn build(workspace: &Path, release: bool) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", "shardgate", "--bin", "shardgate"])
        .current_dir(workspace);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .map_err(|e| Error::io("running cargo build -p shardgate", "cargo", e))?;
    if !status.success() {
        return Err(Error::Router(format!(
            "cargo build -p shardgate failed ({status})"
        )));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let bin = target
        .join(if release { "release" } else { "debug" })
        .join("shardgate");
    if !bin.is_file() {
        return Err(Error::Router(format!("{} was not built", bin.display())));
    }
    Ok(bin)
}

/// Writes `dir/shardmap.toml` and `dir/router.toml` for a router on `127.0.0.1:port` that
/// serves database `database` to `user` (name, password) and logs in to the shards as the
/// harness superuser. `top` holds top-level settings, `sections` whole `[section]`s; both are
/// added as they are, except that a `[backend]` section of `sections` (e.g. with `sslmode`)
/// gets the superuser's login added to it (TOML allows a table once). Returns the config's
/// path.
pub fn write_config(
    dir: &Path,
    shardmap_toml: &str,
    port: u16,
    database: &str,
    user: (&str, &str),
    top: &str,
    sections: &str,
) -> Result<PathBuf> {
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io("writing", &path, e))?;
        Ok(path)
    };
    write("shardmap.toml", shardmap_toml)?;
    let (name, password) = user;
    let login = format!(
        "[backend]\nuser = \"{}\"\npassword = \"{}\"\n",
        crate::SUPERUSER,
        crate::PASSWORD
    );
    let (backend, sections) = match sections.split_once("[backend]\n") {
        Some((before, after)) => (String::new(), format!("{before}{login}{after}")),
        None => (format!("{login}\n"), sections.to_string()),
    };
    let config = format!(
        "listen = \"127.0.0.1:{port}\"\nshardmap = \"shardmap.toml\"\ndatabase = \"{database}\"\n{top}\n\
         [[users]]\nname = \"{name}\"\npassword = \"{password}\"\n\n{backend}{sections}"
    );
    write("router.toml", &config)
}
