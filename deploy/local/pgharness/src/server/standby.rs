//! Streaming standbys of a [`Server`]: a base backup taken over the primary's Unix socket,
//! started as its standby, and promoted to a primary (the failover tests' replica).

use std::process::Stdio;

use super::{status_text, Server, ServerOptions, Source};
use crate::error::{Error, Result};
use crate::template::SUPERUSER;
use crate::user::{chown, server_command};

impl Server {
    /// A streaming standby of this server (`pg_basebackup` over its Unix socket, then
    /// `standby.signal` and `primary_conninfo`), started with `opts` (its own port and
    /// directory; the primary's `pg_hba.conf`, certificate and databases come with the backup).
    /// [`Server::promote`] makes it a primary.
    pub fn start_standby(&self, opts: &ServerOptions) -> Result<Server> {
        Self::start_from(opts, Source::StandbyOf(self))
    }

    /// Promotes a standby to a primary and waits until it accepts writes.
    pub fn promote(&self) -> Result<()> {
        let pg_ctl = self.h.install.program("pg_ctl");
        let out = self
            .pg_ctl(&["-w", "-t", "60", "promote"])
            .map_err(|status| Error::Command {
                what: "promoting the standby".into(),
                program: pg_ctl.display().to_string(),
                status,
                stderr: String::new(),
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::Command {
            what: format!("promoting the standby in {}", self.info.data_dir.display()),
            program: pg_ctl.display().to_string(),
            status: status_text(out.status),
            stderr: String::from_utf8_lossy(&out.stderr).trim().into(),
        })
    }

    /// The data directory as a base backup of `primary` (WAL streamed along, so it is
    /// consistent), marked as a standby; returns the `primary_conninfo` setting that follows it.
    pub(super) fn base_backup_of(&self, primary: &Server) -> Result<(String, String)> {
        let run_as = self.h.run_as.as_ref();
        let program = self.h.install.program("pg_basebackup");
        // Over the primary's Unix socket, where the template's pg_hba.conf trusts replication.
        let socket = primary.info.socket_dir.display().to_string();
        let port = primary.info.port.to_string();
        let out = server_command(&program, run_as)
            .args([
                "-h", &socket, "-p", &port, "-U", SUPERUSER, "-X", "stream", "-D",
            ])
            .arg(&self.info.data_dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Command {
                what: "taking a base backup".into(),
                program: program.display().to_string(),
                status: format!("could not be run: {e}"),
                stderr: String::new(),
            })?;
        if !out.status.success() {
            return Err(Error::Command {
                what: format!("taking a base backup of the server on port {port}"),
                program: program.display().to_string(),
                status: status_text(out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().into(),
            });
        }
        let signal = self.info.data_dir.join("standby.signal");
        std::fs::write(&signal, "").map_err(|e| Error::io("writing standby.signal", &signal, e))?;
        chown(&signal, run_as)?;
        Ok((
            "primary_conninfo".into(),
            format!("host={socket} port={port} user={SUPERUSER}"),
        ))
    }
}
