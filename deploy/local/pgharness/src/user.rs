//! Who PostgreSQL runs as: yourself normally, the `postgres` user when running as root (PostgreSQL
//! refuses to run as root), plus the process set-up shared by every program pgharness spawns.

use std::ffi::{CStr, CString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// The unprivileged user PostgreSQL runs as when pgharness runs as root.
#[derive(Debug, Clone)]
pub struct RunAs {
    /// User name (`postgres`).
    pub user: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its home directory.
    pub home: PathBuf,
}

/// Name of the user PostgreSQL runs as when the harness runs as root.
pub const POSTGRES_USER: &str = "postgres";

impl RunAs {
    /// `Some(postgres user)` when running as root, `None` otherwise.
    pub fn detect() -> Result<Option<RunAs>> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        RunAs::lookup(POSTGRES_USER).map(Some)
    }

    /// Looks a user up in the password database.
    pub fn lookup(user: &str) -> Result<RunAs> {
        let not_found = || Error::UserNotFound {
            user: user.to_string(),
        };
        let cname = CString::new(user).map_err(|_| not_found())?;
        let mut buf = vec![0u8; 16 * 1024];
        // SAFETY: passwd is plain old data; zeroed is a valid (empty) value.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: all pointers are valid for the duration of the call and buf's length is passed.
        let rc = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc != 0 || result.is_null() {
            return Err(not_found());
        }
        let home = if pwd.pw_dir.is_null() {
            PathBuf::from("/")
        } else {
            // SAFETY: getpwnam_r succeeded, so pw_dir points to a NUL-terminated string inside buf.
            PathBuf::from(
                unsafe { CStr::from_ptr(pwd.pw_dir) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        Ok(RunAs {
            user: user.to_string(),
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            home,
        })
    }
}

/// Environment variables that would silently change what a spawned PostgreSQL program connects to
/// or how it behaves.
const SCRUBBED_ENV: &[&str] = &[
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGOPTIONS",
    "PGSSLMODE",
    "PGDATA",
    "PGTZ",
    "PGCLIENTENCODING",
    "PGAPPNAME",
    "PGTARGETSESSIONATTRS",
    "PSQLRC",
];

/// Prepares a command for a PostgreSQL server program (`initdb`, `pg_ctl`): runs it as `run_as`
/// when given, from `/` (the caller's cwd may be unreachable for that user), with a clean `PG*`
/// environment and C messages.
pub(crate) fn server_command(program: &Path, run_as: Option<&RunAs>) -> Command {
    let mut cmd = client_command(program);
    if let Some(r) = run_as {
        cmd.uid(r.uid)
            .gid(r.gid)
            .env("HOME", &r.home)
            .env("USER", &r.user)
            .env("LOGNAME", &r.user);
    }
    cmd
}

/// Prepares a command for a client program (`psql`, `pg_isready`) run as ourselves.
pub(crate) fn client_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env("LC_ALL", "C")
        .env("PGCONNECT_TIMEOUT", "10")
        .current_dir("/");
    cmd
}

/// Gives `path` (not recursively) to `run_as`, when there is one.
pub(crate) fn chown(path: &Path, run_as: Option<&RunAs>) -> Result<()> {
    if let Some(r) = run_as {
        std::os::unix::fs::chown(path, Some(r.uid), Some(r.gid))
            .map_err(|e| Error::io(format!("giving the path to user {}", r.user), path, e))?;
    }
    Ok(())
}

/// Whether the user PostgreSQL runs as can traverse `path` (or, when it does not exist yet, its
/// nearest existing ancestor). Always true when not running as root.
pub fn postgres_can_reach(path: &Path) -> Result<bool> {
    let Some(run_as) = RunAs::detect()? else {
        return Ok(true);
    };
    let abs = std::path::absolute(path).map_err(|e| Error::io("resolving path", path, e))?;
    let existing = abs
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let status = server_command(Path::new("/bin/sh"), Some(&run_as))
        .arg("-c")
        .arg(r#"test -x "$1""#)
        .arg("sh")
        .arg(existing)
        .status()
        .map_err(|e| Error::Command {
            what: format!(
                "checking whether user {} can reach {}",
                run_as.user,
                existing.display()
            ),
            program: "/bin/sh".into(),
            status: format!("could not be run: {e}"),
            stderr: String::new(),
        })?;
    Ok(status.success())
}
