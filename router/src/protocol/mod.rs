//! The Postgres wire protocol (v3), sans-IO: framing, what the router reads from clients and
//! from backends, and what it writes to each.
//!
//! Everything here works on byte buffers and never touches a socket, so it is unit tested and
//! can be fuzzed. Rows and other replies from Postgres are never decoded: [`frame`] only finds
//! where each message ends.
//!
//! | module | direction | what |
//! |---|---|---|
//! | [`frame`] | both | tag + length framing, whole-frame iteration, frame writers |
//! | [`startup`] | client → router | SSLRequest, CancelRequest, StartupMessage |
//! | [`frontend`] | client → router | Query, Parse, Bind (with its parameters), Describe, Close |
//! | [`copy`] | client → router | rows and key fields of COPY data (text, CSV) |
//! | [`reply`] | router → client | the router's own errors, completions, login greeting |
//! | [`request`] | router → backend | Parse, Bind, Execute, Sync, Query, ... (postgres-protocol) |
//! | [`backend`] | backend → router | error fields, command tags, ReadyForQuery status |

pub mod backend;
pub mod copy;
pub mod frame;
pub mod frontend;
pub mod reply;
pub mod request;
pub mod startup;

pub use frame::{FrameError, FrameHeader, MAX_MESSAGE_LEN};

/// A message or statement text longer than this is long: the router then spends a syscall or
/// an allocation to hold it once rather than copy it (moved into the request, written behind
/// the router's own messages instead of copied after them, kept by the session only in part).
pub const LONG: usize = 64 << 10;
