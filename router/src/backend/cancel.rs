//! Cancel requests the router sends: to a shard's primary for a client's running statement, or
//! to another router of the fleet whose client it is.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long delivering one cancel request may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends a CancelRequest for backend (or router client) `pid` to `addr`: a Postgres server, or
/// another router of the fleet. Like Postgres's own cancel, it says nothing about whether
/// anything was running; errors are only about reaching `addr`.
pub async fn send_cancel(
    addr: impl tokio::net::ToSocketAddrs,
    pid: i32,
    secret: i32,
) -> std::io::Result<()> {
    let packet = crate::protocol::request::cancel_request(pid, secret);
    let send = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(&packet).await?;
        // The receiver closes the connection when it has acted; wait for that.
        let mut sink = [0u8; 16];
        let _ = s.read(&mut sink).await;
        Ok(())
    };
    match tokio::time::timeout(CANCEL_TIMEOUT, send).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the cancel request timed out",
        )),
    }
}
