//! What a statement on several shards needs of its client, and nothing more: where its answer
//! goes, a way to write that out (all at once, or as it grows past a bound, so a long answer
//! streams), and for COPY the client's next message. The session's socket
//! (`crate::session::ClientIo`) is one; a cursor's answer kept by the router is another. This
//! layer never sees the session that owns them.

use bytes::BytesMut;

use crate::protocol::FrameError;

/// The client of a statement on several shards.
// The session's futures run on their worker's own runtime and are generic over the client: the
// futures of these methods are only ever awaited where their concrete type (and so whether
// they are `Send`) is known, which is the case the lint warns about for other users.
#[allow(async_fn_in_trait)]
pub trait Client {
    /// Bytes owed to the client, not yet written.
    fn out(&mut self) -> &mut Vec<u8>;

    /// Writes what is owed.
    async fn flush(&mut self) -> std::io::Result<()>;

    /// Writes what is owed once enough of it is buffered.
    async fn flush_if_full(&mut self) -> std::io::Result<()>;

    /// The client's next whole message, reading until it has arrived; `None` when it left.
    async fn read_frame(&mut self) -> Result<Option<BytesMut>, ClientError>;

    /// The longest message the client may send (`limits.max_message_bytes`).
    fn max_message(&self) -> usize;
}

/// Why reading from the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("client connection: {0}")]
    Io(std::io::Error),
    #[error("{0}")]
    Protocol(FrameError),
    /// A message longer than `limits.max_message_bytes` (refused before its body is read).
    #[error("a message of {len} bytes is longer than limits.max_message_bytes ({limit})")]
    TooLong { len: usize, limit: usize },
}
