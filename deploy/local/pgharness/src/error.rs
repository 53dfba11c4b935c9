//! The error type of pgharness: every variant says what failed, and start failures carry the tail
//! of the PostgreSQL log so a failing test explains itself.

use std::path::PathBuf;

/// Result alias used throughout pgharness.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while finding, creating, starting, using or stopping PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No PostgreSQL server binaries were found.
    #[error("could not find the PostgreSQL server binaries (initdb, pg_ctl, postgres); tried: {tried}. Install PostgreSQL or set PG_BINDIR to its bin directory")]
    BinariesNotFound {
        /// Every place that was looked at, and why it did not qualify.
        tried: String,
    },

    /// A file system operation failed.
    #[error("{what} ({path}): {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Running as root, but the unprivileged user that must own PostgreSQL does not exist.
    #[error("running as root, so PostgreSQL must run as the user `{user}`, but that user does not exist (create it, e.g. by installing the postgresql package, or run as a normal user)")]
    UserNotFound {
        /// The user name looked up.
        user: String,
    },

    /// A program could not be started, or it exited with a failure.
    #[error("{what}: `{program}` {status}{}", stderr_suffix(.stderr))]
    Command {
        /// What the program was run for.
        what: String,
        /// The program path.
        program: String,
        /// How it ended ("could not be run: ..." or "exited with status 1").
        status: String,
        /// Its standard error, trimmed (may be empty).
        stderr: String,
    },

    /// `initdb` failed while creating the template data directory.
    #[error("initdb of the template data directory {dir} failed ({status}):\n{output}")]
    Initdb {
        /// The directory initdb was run on.
        dir: PathBuf,
        /// Exit status.
        status: String,
        /// initdb's stdout and stderr.
        output: String,
    },

    /// The server did not come up.
    #[error("PostgreSQL (data dir {data_dir}, port {port}) failed to start: {reason}\n--- last lines of {log} ---\n{log_tail}")]
    StartFailed {
        /// The data directory.
        data_dir: PathBuf,
        /// The port it was meant to listen on.
        port: u16,
        /// pg_ctl's own message.
        reason: String,
        /// The server log file.
        log: PathBuf,
        /// The last lines of the server log file.
        log_tail: String,
    },

    /// The requested TCP port is taken.
    #[error("port {port} on 127.0.0.1 is already in use; stop whatever listens there or choose another port")]
    PortInUse {
        /// The port.
        port: u16,
    },

    /// A SQL command run through psql failed.
    #[error("psql on port {port}, database `{database}` failed ({status}): {stderr}")]
    Psql {
        /// Server port.
        port: u16,
        /// Database the command ran in.
        database: String,
        /// Exit status.
        status: String,
        /// psql's standard error.
        stderr: String,
    },

    /// Stopping the server failed.
    #[error("stopping PostgreSQL (data dir {data_dir}) failed: {reason}")]
    StopFailed {
        /// The data directory.
        data_dir: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// The options passed in cannot work.
    #[error("invalid options: {0}")]
    InvalidOptions(String),

    /// A directory that should describe a harness server does not.
    #[error("{dir} is not a pgharness server directory: {reason}")]
    NotAServerDir {
        /// The directory.
        dir: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },

    /// A worker thread panicked (a bug in pgharness).
    #[error("a pgharness worker thread panicked while {0}")]
    ThreadPanicked(String),

    /// A shardgate router could not be built or started; the message says why.
    #[error("{0}")]
    Router(String),

    /// A test certificate could not be made.
    #[error("making a test certificate: {0}")]
    Certificate(String),
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl Error {
    /// A psql failure with what was being done in front of psql's own message; other errors
    /// as they are.
    pub(crate) fn while_doing(self, what: &str) -> Self {
        match self {
            Error::Psql {
                port,
                database,
                status,
                stderr,
            } => Error::Psql {
                port,
                database,
                status,
                stderr: format!("{what}: {stderr}"),
            },
            e => e,
        }
    }

    pub(crate) fn io(
        what: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }
}
