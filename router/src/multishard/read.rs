//! A read on several shards whose rows are concatenated in shard order: the shards answer at
//! once ([`super::fanout`]), and their rows are forwarded shard by shard as they stream in
//! ([`super::gather`]), so a big scan never sits in memory. The first error ends the read.

use tokio::sync::mpsc;

use super::client::Client;
use super::fanout::Chunk;
use super::gather::{Concat, Seen};
use crate::errors;
use crate::protocol::frame::frames;
use crate::protocol::reply::SqlError;

/// Forwards the shards' answers (in the order of `receivers`) as one, without ReadyForQuery;
/// `Ok(true)` when it ended with an error. `asked` lists the extended batch's messages to
/// answer (empty for a simple query).
/// `gather` says how (labels, a limit, replicas).
pub async fn concatenated<C: Client>(
    client: &mut C,
    mut receivers: Vec<mpsc::Receiver<Chunk>>,
    mut gather: Concat<'_>,
) -> std::io::Result<bool> {
    for (i, rx) in receivers.iter_mut().enumerate() {
        'shard: loop {
            let chunk = match rx.recv().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(err)) => {
                    err.write(client.out());
                    return Ok(true);
                }
                None => {
                    SqlError::new(
                        errors::CONNECTION_FAILURE,
                        "internal: a shard's read ended early",
                    )
                    .write(client.out());
                    return Ok(true);
                }
            };
            for frame in frames(&chunk).map_while(Result::ok) {
                match gather.frame(i, frame, client.out()) {
                    Seen::More => {}
                    Seen::Done => break 'shard,
                    // The other shards' connections are dropped when their channels close.
                    Seen::Failed => return Ok(true),
                }
            }
            client.flush_if_full().await?;
        }
    }
    gather.finish(client.out());
    Ok(false)
}
