//! Running SQL on a server with `psql` (over its Unix socket, as the superuser), and creating
//! databases: what tests and the cluster tool do to a running server.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{quote_ident, status_text, Server};
use crate::error::{Error, Result};
use crate::template::SUPERUSER;
use crate::user::client_command;

impl Server {
    /// A `psql` command connected to `db` over the Unix socket as `postgres`, with `-X -q -At -v
    /// ON_ERROR_STOP=1`; add arguments and run it yourself.
    pub fn psql_command(&self, db: &str) -> Command {
        let mut cmd = client_command(&self.h.install.program("psql"));
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.info.socket_dir)
            .arg("-p")
            .arg(self.info.port.to_string())
            .arg("-U")
            .arg(SUPERUSER)
            .arg("-d")
            .arg(db);
        cmd
    }

    /// Runs `sql` (any number of statements and psql meta-commands, each statement in its own
    /// transaction) in `db`; returns psql's unaligned, tuples-only output without the final newline.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String> {
        let mut cmd = self.psql_command(db);
        cmd.arg("-f").arg("-");
        self.run_psql(cmd, db, Some(sql))
    }

    /// Runs the SQL file `path` in `db`.
    pub fn apply_sql_file(&self, db: &str, path: &Path) -> Result<String> {
        let mut cmd = self.psql_command(db);
        cmd.arg("-f").arg(path);
        self.run_psql(cmd, db, None)
            .map_err(|e| e.while_doing(&format!("applying {}", path.display())))
    }

    fn run_psql(&self, mut cmd: Command, db: &str, input: Option<&str>) -> Result<String> {
        cmd.stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let program = format!("{:?}", cmd.get_program());
        let mut child = cmd.spawn().map_err(|e| Error::Command {
            what: format!("running SQL on port {}", self.info.port),
            program: program.clone(),
            status: format!("could not be run: {e}"),
            stderr: String::new(),
        })?;
        // Feed stdin from a thread so a large script cannot deadlock against a full stdout pipe.
        let writer = match (input, child.stdin.take()) {
            (Some(sql), Some(mut stdin)) => {
                let sql = sql.to_owned();
                Some(std::thread::spawn(move || {
                    let _ = stdin.write_all(sql.as_bytes());
                }))
            }
            _ => None,
        };
        let out = child.wait_with_output().map_err(|e| Error::Command {
            what: format!("running SQL on port {}", self.info.port),
            program,
            status: format!("could not be waited for: {e}"),
            stderr: String::new(),
        })?;
        if let Some(w) = writer {
            let _ = w.join();
        }
        if !out.status.success() {
            return Err(Error::Psql {
                port: self.info.port,
                database: db.to_string(),
                status: status_text(out.status),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let mut stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if stdout.ends_with('\n') {
            stdout.pop();
        }
        Ok(stdout)
    }

    /// Creates the databases (one psql call, `STRATEGY FILE_COPY` on PostgreSQL 15+).
    pub fn create_databases(&self, names: &[String]) -> Result<()> {
        self.create_databases_from(names, None)
    }

    /// Like [`Server::create_databases`], copying `template` instead of `template1`.
    pub fn create_databases_from(&self, names: &[String], template: Option<&str>) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let mut sql = String::new();
        for name in names {
            sql.push_str(&format!("CREATE DATABASE {}", quote_ident(name)));
            if let Some(t) = template {
                sql.push_str(&format!(" TEMPLATE {}", quote_ident(t)));
            }
            if self.h.install.major() >= 15 {
                sql.push_str(" STRATEGY FILE_COPY");
            }
            sql.push_str(";\n");
        }
        self.psql("postgres", &sql).map(drop)
    }
}
