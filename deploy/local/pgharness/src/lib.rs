//! pgharness: real, throw-away PostgreSQL servers for shardgate's integration tests, and the
//! engine of the local cluster tool (`deploy/local/cluster`).
//!
//! - [`Server`]: one server copied from a template data directory (`initdb` runs once per machine),
//!   started with `pg_ctl -w` on a free port (tests) or a fixed port and directory (cluster tool).
//! - [`Cluster`]: K servers holding N shard databases with a schema applied.
//! - [`router`]: a `shardgate` router process in front of them, for tests, benches and the
//!   cluster tool; [`proc`]: what `/proc` says about a process; [`free_port`].
//! - [`tls`]: a throw-away certificate authority and server certificates, for servers started
//!   with `ssl = on` ([`ServerOptions::tls`]) and for the router's own TLS.
//!
//! The API is synchronous (std::process) so it works from plain tests and from inside tokio tests.
//! As root, PostgreSQL runs as the `postgres` user, with its directories under the system temp
//! dir. Throw-away servers are stopped and deleted on drop, at process exit (for servers kept in
//! never-dropped statics), or by the next harness start after a crash.
//!
//! ```no_run
//! let server = pgharness::Server::start(&Default::default())?;
//! assert_eq!(server.psql("postgres", "SELECT 1")?, "1");
//! # Ok::<(), pgharness::Error>(())
//! ```

mod cleanup;
mod cluster;
mod error;
mod install;
pub mod proc;
pub mod router;
mod server;
mod template;
pub mod tls;
mod user;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use cluster::{shard_database_names, Cluster, ClusterOptions, Schema, ShardDb};
pub use error::{Error, Result};
pub use install::PgInstall;
pub use server::{
    check_port_free, free_port, log_tail, quote_ident, Readiness, Server, ServerOptions, HOST,
    INFO_FILE,
};
pub use template::{PASSWORD, SUPERUSER};
pub use user::{postgres_can_reach, RunAs, POSTGRES_USER};

/// What every server of this process shares: the installation, who runs it, the template.
#[derive(Debug)]
pub(crate) struct Harness {
    pub install: PgInstall,
    pub run_as: Option<RunAs>,
    pub tmp: PathBuf,
    pub template: PathBuf,
}

static HARNESS: Mutex<Option<Arc<Harness>>> = Mutex::new(None);

/// Initialises the harness once per process (find binaries, sweep stale directories, make sure the
/// template exists); on failure the next call tries again.
pub(crate) fn harness() -> Result<Arc<Harness>> {
    let mut guard = HARNESS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = guard.as_ref() {
        return Ok(h.clone());
    }
    let install = PgInstall::detect()?;
    let run_as = RunAs::detect()?;
    let tmp = std::env::temp_dir();
    cleanup::sweep_stale(&tmp);
    let template = template::ensure_template(&install, run_as.as_ref(), &tmp)?;
    let h = Arc::new(Harness {
        install,
        run_as,
        tmp,
        template,
    });
    *guard = Some(h.clone());
    Ok(h)
}

/// The PostgreSQL installation the harness uses (initialising the harness if needed).
pub fn pg_install() -> Result<PgInstall> {
    harness().map(|h| h.install.clone())
}

/// Stops and deletes what crashed test processes left in the temp dir (server directories whose
/// owning process is gone, half-built templates). Runs by itself once per process, at the first
/// server start; call it to sweep again.
pub fn sweep_stale() {
    cleanup::sweep_stale(&std::env::temp_dir());
}

/// Directory where throw-away servers, the template and (as root) the cluster tool's data go.
pub fn temp_root() -> PathBuf {
    std::env::temp_dir()
}
