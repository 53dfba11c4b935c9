//! An UPDATE or DELETE on several shards (its keys fall on several, or it has none and the
//! client opted in): the same request on each shard, one part after another in shard order
//! through [`super::commit`], the answers concatenated ([`super::gather`]) and streamed to the
//! client, and the parts committed only when every shard answered without an error.

use super::client::Client;
use super::commit::Parts;
use super::gather::{Concat, Seen};
use crate::backend::settings::Settings;
use crate::routing::Routing;

/// Runs `request` (a Query, or an extended batch ending in Sync) on `shards` and writes the
/// client's answer without ReadyForQuery; `Ok(true)` when it ended with an error. `asked` lists
/// the extended batch's messages to answer (empty for a simple query). With `replicas` (a
/// reference table: the same rows on every shard) the first shard answers and the others must
/// agree with it ([`Concat::replicas`]).
#[allow(clippy::too_many_arguments)]
pub async fn run<C: Client>(
    routing: &Routing,
    settings: &Settings,
    client: &mut C,
    shards: &[usize],
    request: &[u8],
    asked: &[u8],
    replicas: bool,
) -> std::io::Result<bool> {
    let mut parts = Parts::new(routing, settings, "the write");
    let mut gather = Concat::new(asked, None);
    if replicas {
        gather = gather.replicas();
    }
    for (i, &shard) in shards.iter().enumerate() {
        if let Err(err) = parts.begin(shard, request).await {
            parts.rollback().await;
            err.write(client.out());
            return Ok(true);
        }
        let mut ended = Ok(Seen::Done);
        if let Some(mut part) = parts.replies() {
            ended = loop {
                match part.next().await {
                    Ok(Some(frame)) => match gather.frame(i, frame, client.out()) {
                        Seen::More => {
                            if let Err(e) = client.flush_if_full().await {
                                break Err(Ok(e));
                            }
                        }
                        Seen::Failed => {
                            // Read the part to its ReadyForQuery, so that its ROLLBACK finds
                            // the connection in step and it goes back to its pool.
                            let drained = loop {
                                match part.next().await {
                                    Ok(Some(_)) => {}
                                    Ok(None) => break Ok(()),
                                    Err(e) => break Err(e),
                                }
                            };
                            break match drained {
                                Ok(()) => Ok(Seen::Failed),
                                Err(e) => Err(Err(e)),
                            };
                        }
                        seen => break Ok(seen),
                    },
                    Ok(None) => break Ok(Seen::Done),
                    Err(e) => break Err(Err(e)),
                }
            };
        }
        match ended {
            Ok(Seen::Done | Seen::More) => {}
            Ok(Seen::Failed) => {
                parts.rollback().await;
                return Ok(true);
            }
            // The client went away: nothing is committed.
            Err(Ok(client_gone)) => {
                parts.rollback().await;
                return Err(client_gone);
            }
            Err(Err(lost)) => {
                let err = parts.lost(shard, &lost);
                parts.drop_last();
                parts.rollback().await;
                err.write(client.out());
                return Ok(true);
            }
        }
    }
    match parts.commit().await {
        Ok(()) => {
            gather.finish(client.out());
            Ok(false)
        }
        Err(err) => {
            err.write(client.out());
            Ok(true)
        }
    }
}
