//! The Postgres wire protocol (v3), sans-IO: framing, the frontend messages the router reads,
//! and the backend messages it writes itself.
//!
//! Everything here works on byte buffers and never touches a socket, so it is unit tested and
//! can be fuzzed. Rows and other replies from Postgres are never decoded: [`frame`] only finds
//! where each message ends.

pub mod frame;
pub mod frontend;
pub mod reply;
pub mod startup;

pub use frame::{FrameError, FrameHeader, MAX_MESSAGE_LEN};
