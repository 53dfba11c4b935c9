//! Finding the PostgreSQL installation (bin directory and major version) that pgharness runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// A PostgreSQL installation: the directory holding `initdb`, `pg_ctl`, `postgres`, ...
#[derive(Debug, Clone)]
pub struct PgInstall {
    bindir: PathBuf,
    major: u32,
    version: String,
}

impl PgInstall {
    /// Finds the binaries: `$PG_BINDIR` if set, else the highest-version
    /// `/usr/lib/postgresql/*/bin` that contains `postgres`, else `pg_config --bindir`.
    pub fn detect() -> Result<PgInstall> {
        let mut tried = Vec::new();
        if let Some(dir) = std::env::var_os("PG_BINDIR").filter(|d| !d.is_empty()) {
            // An explicit choice is never silently replaced by another installation.
            return PgInstall::from_bindir(Path::new(&dir)).map_err(|e| Error::BinariesNotFound {
                tried: format!("PG_BINDIR={} ({e})", Path::new(&dir).display()),
            });
        }

        let debian_root = Path::new("/usr/lib/postgresql");
        match std::fs::read_dir(debian_root) {
            Ok(entries) => {
                let mut candidates: Vec<(Vec<u32>, PathBuf)> = entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let version: Option<Vec<u32>> =
                            name.split('.').map(|p| p.parse().ok()).collect();
                        version.map(|v| (v, e.path().join("bin")))
                    })
                    .collect();
                candidates.sort();
                for (_, bindir) in candidates.iter().rev() {
                    match PgInstall::from_bindir(bindir) {
                        Ok(install) => return Ok(install),
                        Err(e) => tried.push(format!("{} ({e})", bindir.display())),
                    }
                }
                if candidates.is_empty() {
                    tried.push(format!(
                        "{}/*/bin (no version directories)",
                        debian_root.display()
                    ));
                }
            }
            Err(e) => tried.push(format!("{}/*/bin ({e})", debian_root.display())),
        }

        match Command::new("pg_config").arg("--bindir").output() {
            Ok(out) if out.status.success() => {
                let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
                match PgInstall::from_bindir(&dir) {
                    Ok(install) => return Ok(install),
                    Err(e) => tried.push(format!("pg_config --bindir = {} ({e})", dir.display())),
                }
            }
            Ok(out) => tried.push(format!("pg_config --bindir (exited with {})", out.status)),
            Err(e) => tried.push(format!("pg_config --bindir ({e})")),
        }
        Err(Error::BinariesNotFound {
            tried: tried.join("; "),
        })
    }

    /// Uses the binaries in `bindir`; fails unless it holds a runnable `postgres`.
    pub fn from_bindir(bindir: &Path) -> Result<PgInstall> {
        let postgres = bindir.join("postgres");
        for tool in ["postgres", "initdb", "pg_ctl"] {
            if !bindir.join(tool).is_file() {
                return Err(Error::io(
                    format!("no `{tool}` executable"),
                    bindir,
                    std::io::ErrorKind::NotFound.into(),
                ));
            }
        }
        let out = Command::new(&postgres)
            .arg("--version")
            .output()
            .map_err(|e| Error::Command {
                what: "asking postgres for its version".into(),
                program: postgres.display().to_string(),
                status: format!("could not be run: {e}"),
                stderr: String::new(),
            })?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        // "postgres (PostgreSQL) 15.8 (Debian 15.8-1.pgdg120+1)" -> 15
        let major = version
            .split_whitespace()
            .find_map(|word| {
                let digits: String = word.chars().take_while(|c| c.is_ascii_digit()).collect();
                digits.parse::<u32>().ok()
            })
            .ok_or_else(|| Error::Command {
                what: "asking postgres for its version".into(),
                program: postgres.display().to_string(),
                status: format!("printed no version number ({})", out.status),
                stderr: format!(
                    "stdout: {version:?}, stderr: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            })?;
        Ok(PgInstall {
            bindir: bindir.to_path_buf(),
            major,
            version,
        })
    }

    /// The bin directory.
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// The major version, e.g. 15.
    pub fn major(&self) -> u32 {
        self.major
    }

    /// The full `postgres --version` line.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Path of a program of this installation (`pg_isready`, `pgbench`, ...). `psql` falls back to
    /// `/usr/bin/psql` and then to `psql` on `PATH` when the bin directory has none.
    pub fn program(&self, name: &str) -> PathBuf {
        let own = self.bindir.join(name);
        if own.is_file() || name != "psql" {
            return own;
        }
        let usr = PathBuf::from("/usr/bin/psql");
        if usr.is_file() {
            usr
        } else {
            PathBuf::from("psql")
        }
    }
}
