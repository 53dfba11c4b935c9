//! A request on the shard's shared connections (`backend::mux`, `[pool] shared_connections`):
//! an autocommit statement that leaves nothing on the connection ([`crate::planner::Plan`]'s
//! `shareable`) is pinned to the shard's mux rather than to a connection of the client's own
//! ([`super::pinned::Link::Shared`]). Its messages are written as for a connection that has every
//! router statement; once the request is complete (it ends in Sync, or is a Query) it is
//! handed to a lane, which prepares what it lacks in front of it, and the replies come back
//! through the session's channel to the same [`super::replies`] bookkeeping as on a
//! connection of its own.
//!
//! Anything that needs a connection to itself on the way (a Flush, the client's own Parse of
//! a named statement, a second shard in the batch) turns the pin into one of the client's own
//! first ([`Session::unshare`]), with what the request written so far assumes prepared there.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::pinned::{Link, Pinned};
use super::replay;
use super::{Session, SessionError};
use crate::backend::mux::{Cancelled, Channel, Lane, Reply, Request, ShardMux};
use crate::errors;
use crate::protocol::frame::next_frame;
use crate::protocol::reply::{self, SqlError, TxStatus};
use crate::routing::Checkout;
use crate::stats::RouteKind;

/// What a request that stands alone on a shared connection ends with.
#[derive(Debug, PartialEq, Eq)]
struct Standalone {
    /// Its ReadyForQuery frames (its Syncs and Queries).
    readies: usize,
    /// It holds a Query: Postgres commits a Query's statements before its last CommandComplete,
    /// an extended-protocol request's only at its Sync.
    simple: bool,
}

/// How `bytes` then `tail` (a request) end, when the request stands alone on a shared
/// connection: it ends in a Sync or is a Query, and asks for no Flush or COPY data.
fn standalone(bytes: &[u8], tail: &[u8]) -> Option<Standalone> {
    let mut readies = 0;
    let mut simple = false;
    let mut last = 0;
    for part in [bytes, tail] {
        let mut rest = part;
        while let Ok(Some(h)) = next_frame(rest) {
            match h.tag {
                b'S' => readies += 1,
                b'Q' => {
                    readies += 1;
                    simple = true;
                }
                b'P' | b'B' | b'D' | b'E' | b'C' => {}
                _ => return None,
            }
            last = h.tag;
            rest = &rest[h.total..];
        }
        if !rest.is_empty() {
            return None;
        }
    }
    (readies > 0 && matches!(last, b'S' | b'Q')).then_some(Standalone { readies, simple })
}

/// A request handed to a lane: its ReadyForQuery count, the router statements it uses, the
/// client's settings fingerprint, and the client's cancel count when it began.
struct Submission<'a> {
    readies: usize,
    simple: bool,
    uses: &'a replay::Uses,
    cancels: u64,
}

/// How a shared request ended.
enum Outcome {
    Answered,
    /// The lane could not take it, or lost it before writing it: nothing of it ran.
    NotTaken,
    /// The lane's connection ended after it was written.
    Lost(String),
    /// The server ended the lane's session while it ran, before it answered anything.
    Aborted(String),
    /// The client read its replies too slowly; the rest were dropped.
    Overflow,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// The shard a statement that may share goes to: when sharing is on, the client is
    /// outside any transaction, and the shard is up and not paused.
    pub(super) fn shareable_shard(&self, wanted: Option<usize>) -> Option<usize> {
        // (`wanted: None`: any shard; its shared connections may be passed over later for a
        // shard that can give a connection at once, `Session::unshare`.)
        if self.state.in_transaction() || self.spans_shards() {
            return None;
        }
        let shard =
            wanted.unwrap_or_else(|| self.shared.any_shard(self.routing.map.shards().len()));
        self.routing.mux(shard)?;
        self.routing.shareable_now(shard).then_some(shard)
    }

    /// Runs the request in the outbox on a shared connection; `false` when it does not stand
    /// alone or no lane took it (nothing of it ran): it then needs a connection of its own.
    pub(super) async fn exchange_shared(&mut self) -> Result<bool, SessionError> {
        // Cancels asked from here on are for this request (its slot names no backend).
        let cancels = self.slot.cancels();
        let Some(Standalone { readies, simple }) = standalone(&self.out.bytes, &self.out.tail)
        else {
            return Ok(false);
        };
        let Ok(uses) = replay::uses(&self.out.bytes) else {
            return Ok(false);
        };
        let Some((shard, mux)) = self.shared_pin() else {
            return Ok(false);
        };
        let fp = self.settings.fingerprint();
        let Some(lane) = mux.lane(fp, self.routing.config.pool.connect_timeout).await else {
            return Ok(false);
        };
        self.client
            .meter
            .route(RouteKind::SingleShard, self.routing.stats_id(shard));
        let mut channel = self.channel.take().unwrap_or_else(|| {
            // Cancel requests reach the session through the channel it waits on anyway.
            let channel = Channel::default();
            self.slot.hear_cancels(channel.tx.clone());
            channel
        });
        let outcome = self
            .run_shared(
                &lane,
                &mut channel,
                Submission {
                    readies,
                    simple,
                    uses: &uses,
                    cancels,
                },
            )
            .await;
        self.channel = Some(channel);
        match outcome? {
            Outcome::Answered => {}
            Outcome::NotTaken => return Ok(false),
            Outcome::Overflow => {
                self.pin = None;
                let err = SqlError::new(
                    errors::PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "the client read this statement's result too slowly: more than {} MiB of it waited for the client on a shared backend connection",
                        crate::backend::mux::UNREAD_LIMIT >> 20
                    ),
                )
                .with_hint("read results as they come, or run large reads inside a transaction (which has a connection of its own)");
                self.exchange_failed(err).await?;
                return Ok(true);
            }
            Outcome::Aborted(why) => {
                // A shutdown refuses logins from the moment it ends the sessions; a server
                // that still takes one ended this session on purpose: not sent again.
                let endpoint = self.shared_pin().map(|(_, m)| m.endpoint.clone());
                let Some(endpoint) = endpoint else {
                    return Ok(false);
                };
                if crate::backend::BackendConn::connect(&endpoint)
                    .await
                    .is_err()
                {
                    return Ok(false);
                }
                self.pin = None;
                let err = errors::ended_by_server(&self.shard_name(shard), &why);
                self.exchange_failed(err).await?;
                return Ok(true);
            }
            Outcome::Lost(why) => {
                let endpoint = self.shared_endpoint_name();
                self.pin = None;
                let name = self.shard_name(shard);
                tracing::warn!(shard = %name, endpoint = %endpoint, "shared connection lost: {why}");
                let err = errors::shard_lost(&name, &endpoint, &why);
                self.exchange_failed(err).await?;
                return Ok(true);
            }
        }
        self.client.flush().await.map_err(SessionError::Client)?;
        self.out.bytes.clear();
        self.out.tail = BytesMut::new();
        // Timed by the meter, which read the clock when the request began and when its
        // ReadyForQuery went to the client: no third read for the slow-statement log.
        if let Some(elapsed) = self.client.meter.last_elapsed() {
            self.log_if_slow(shard, elapsed, true);
        }
        Ok(true)
    }

    /// The shard and mux of a shared pin, while the session has the routing it was pinned
    /// under. The mux is borrowed from the routing, never cloned for a statement: its count
    /// would be a word written by the sessions of every worker.
    fn shared_pin(&self) -> Option<(usize, &std::sync::Arc<ShardMux>)> {
        match &self.pin {
            Some(Pinned {
                shard,
                conn: Link::Shared { generation, .. },
                ..
            }) if *generation == self.routing.generation => {
                self.routing.mux(*shard).map(|m| (*shard, m))
            }
            _ => None,
        }
    }

    /// The name of a shared pin's endpoint, for errors.
    fn shared_endpoint_name(&self) -> String {
        self.shared_pin()
            .map_or_else(String::new, |(_, m)| m.endpoint.name())
    }

    async fn run_shared(
        &mut self,
        lane: &Lane,
        channel: &mut Channel,
        req: Submission<'_>,
    ) -> Result<Outcome, SessionError> {
        let Submission {
            readies,
            simple,
            uses,
            cancels,
        } = req;
        let statements = &self.statements;
        // Texts of the statements the request binds, kept when it was written (the client may
        // have closed its name since, in the same batch).
        let bound: &[std::sync::Arc<crate::backend::registry::Statement>] = match &self.pin {
            Some(Pinned {
                conn: Link::Shared { bound, .. },
                ..
            }) => bound,
            _ => &[],
        };
        let Some((_, mux)) = self.shared_pin() else {
            return Ok(Outcome::NotTaken);
        };
        let submitted = lane.submit(
            mux,
            Request {
                bytes: &self.out.bytes,
                tail: &self.out.tail,
                readies,
                simple,
                settings: &self.settings,
                sink: channel.tx.clone(),
                // Waiting in the router for a turn on a busy lane is bounded like a pool
                // checkout: the lane takes the request out ([`Reply::Expired`]).
                max_wait: self.routing.config.pool.checkout_timeout,
            },
            |out, prepared| {
                replay::preparation(out, uses, prepared, |id| {
                    bound
                        .iter()
                        .find(|s| s.id == id)
                        .or_else(|| statements.router_statement(id))
                        .map(|s| (&*s.sql, &*s.param_types))
                })
            },
        );
        let Some(seq) = submitted else {
            return Ok(Outcome::NotTaken);
        };
        self.out.replies.drain_synthetic(&mut self.client.out);
        let mut cancels_seen = cancels;
        // The router's statement timeout counts running time, not time spent behind others'
        // statements: a deadline that finds the request not yet running starts again.
        let timeout = self.routing.config.limits.statement_timeout;
        let mut deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let slot = self.slot.clone();
        loop {
            let mut cancel_why = None;
            if slot.cancels() != cancels_seen {
                cancels_seen = slot.cancels();
                cancel_why = Some("canceling statement due to user request");
            } else {
                tokio::select! {
                    biased;
                    reply = channel.rx.recv() => match reply {
                        Some(Reply::Frames(s, frames)) if s == seq => {
                            self.take_shared(&frames, Some(lane))?;
                            if !self.out.replies.awaits_backend() {
                                return Ok(Outcome::Answered);
                            }
                            self.client.flush().await.map_err(SessionError::Client)?;
                        }
                        Some(Reply::Lost { seq: s, why, sent, aborted }) if s == seq => {
                            return Ok(if aborted {
                                Outcome::Aborted(why)
                            } else if sent {
                                Outcome::Lost(why)
                            } else {
                                Outcome::NotTaken
                            });
                        }
                        Some(Reply::Overflow(s)) if s == seq => return Ok(Outcome::Overflow),
                        Some(Reply::Expired(s)) if s == seq => {
                            let shard = self.pin.as_ref().map_or(0, |p| p.shard);
                            let err = errors::pool_exhausted(
                                &self.shard_name(shard),
                                &self.shared_endpoint_name(),
                                self.routing.config.pool.checkout_timeout,
                            );
                            self.answer_unsent(&err, readies)?;
                            return Ok(Outcome::Answered);
                        }
                        Some(Reply::Refused(s, error)) if s == seq => {
                            self.answer_refused(&error, readies)?;
                            return Ok(Outcome::Answered);
                        }
                        // A cancel (counted in the slot, read above), or left over from a
                        // request the session stopped waiting for.
                        Some(_) => {}
                        None => return Ok(Outcome::Lost("the shared connection's channel closed".into())),
                    },
                    () = super::relay::until(deadline), if deadline.is_some() => {
                        if !lane.is_running(seq) {
                            deadline = timeout.map(|t| tokio::time::Instant::now() + t);
                        } else {
                            deadline = None;
                            cancel_why = Some("canceling statement due to statement timeout");
                        }
                    }
                }
            }
            if let Some(why) = cancel_why {
                if lane.cancel(seq) == Cancelled::Removed {
                    // Never written: the router answers as Postgres would have.
                    self.answer_unsent(&SqlError::new(errors::QUERY_CANCELED, why), readies)?;
                    return Ok(Outcome::Answered);
                }
            }
        }
    }

    /// Answers a request the lane never wrote with `err` at each of its `readies` Syncs, as
    /// Postgres answers a request that fails at its start.
    fn answer_unsent(&mut self, err: &SqlError, readies: usize) -> Result<(), SessionError> {
        let mut frame = Vec::new();
        err.write(&mut frame);
        let mut answer = Vec::with_capacity(readies * (frame.len() + 6));
        for _ in 0..readies {
            answer.extend_from_slice(&frame);
            reply::ready_for_query(&mut answer, TxStatus::Idle);
        }
        self.take_shared(&answer, None)
    }

    /// The same for a request whose settings the lane could not give
    /// ([`crate::backend::mux::Reply::Refused`]): Postgres's error of the `SET`, saying so.
    fn answer_refused(&mut self, error: &[u8], readies: usize) -> Result<(), SessionError> {
        let (code, message) = crate::protocol::backend::error_fields(error);
        let shard = self.pinned_shard().map(|s| self.shard_name(s));
        let err = errors::settings_not_given(
            shard.as_deref().unwrap_or("?"),
            Some(SqlError::with_code(code, message)),
            "",
        );
        self.answer_unsent(&err, readies)
    }

    /// Hands reply frames of the session's shared request to its bookkeeping, and what the
    /// client sees to the client's buffer. `lane`: where the request ran; `None` for the
    /// router's answer to a request the lane took out unwritten, whose Parse and Close ran
    /// there all the same ([`crate::backend::mux::Reply::Refused`]).
    fn take_shared(&mut self, mut frames: &[u8], lane: Option<&Lane>) -> Result<(), SessionError> {
        while let Ok(Some(h)) = next_frame(frames) {
            let frame = &frames[..h.total];
            let step = self
                .out
                .replies
                .on_frame(h.tag, &frame[5..])
                .map_err(|d| SessionError::Protocol(format!("shared connection: {d}")))?;
            super::relay::forward(&mut self.client.out, step.action, frame);
            if let Some(status) = step.ready {
                self.state.ready(status);
            }
            self.out.replies.drain_synthetic(&mut self.client.out);
            for (id, clients_own) in self.out.replies.take_failed() {
                // Its Parse failed: the lane does not have it after all.
                if let Some(lane) = lane {
                    lane.forget_prepared(id);
                }
                if clients_own {
                    self.statements.forget(id);
                }
            }
            frames = &frames[h.total..];
        }
        Ok(())
    }

    /// Turns a shared pin into a connection of the client's own to the same shard, given what
    /// the request written so far assumes: the client's settings and the router statements it
    /// uses.
    pub(super) async fn unshare(&mut self) -> Result<(), SqlError> {
        let Some(pin) = self.pin.take_if(|p| p.conn.is_shared()) else {
            return Ok(());
        };
        let any = matches!(pin.conn, Link::Shared { any: true, .. });
        let lost = |this: &Self, shard: usize, why: &str| {
            let endpoint = this.routing.pools().for_shard(shard).endpoint.name();
            errors::shard_lost(&this.shard_name(shard), &endpoint, why)
        };
        let uses = replay::uses(&self.out.bytes).map_err(|e| lost(self, pin.shard, e.0))?;
        let bound: &[std::sync::Arc<crate::backend::registry::Statement>] = match &pin.conn {
            Link::Shared { bound, .. } => bound,
            Link::Own(_) => &[],
        };
        // A shutdown may end the connection taken before the request is written to it (while
        // it is being made fit): then another is taken.
        let mut attempt = 0;
        let (conn, shard) = loop {
            attempt += 1;
            let got = if any {
                // A statement for no particular shard: whichever can give a connection now.
                let start = self.shared.any_shard(self.routing.map.shards().len());
                self.routing.checkout_any(start).await
            } else {
                self.routing
                    .checkout_timed(pin.shard)
                    .await
                    .map(|(conn, waited)| (conn, waited, pin.shard))
            };
            let (conn, waited, shard) = match got {
                Ok(got) => got,
                Err(Checkout::Refused(err)) => return Err(err),
                // The map changed while it waited for a paused shard: the shard that owns the
                // same keys now (the request names router statements, not a shard's, so it fits
                // there).
                Err(Checkout::MapChanged) if !any => self.checkout_after_reload(pin.shard).await?,
                Err(Checkout::MapChanged) => {
                    return Err(errors::map_changed_while_paused(
                        &self.shard_name(pin.shard),
                    ))
                }
            };
            self.client.meter.waited(waited);
            if !self.shared.server_params_learned() {
                self.shared.learn_server_params(&conn.params);
            }
            match self.fit(conn, &uses, bound).await {
                Ok(conn) => break (conn, shard),
                Err(p) if p.connection_ended && attempt < super::attach::PRELUDE_ATTEMPTS => {}
                // Nothing of the request ran: the client gets what the server said.
                Err(crate::backend::conn::PreludeProblem {
                    refused: Some(err), ..
                }) => return Err(err),
                Err(p) => {
                    let why = format!("preparing a connection: {}", p.what);
                    return Err(lost(self, shard, &why));
                }
            }
        };
        self.pin = Some(Pinned {
            shard,
            conn: Link::Own(conn),
            unnamed: pin.unnamed,
            fresh: true,
        });
        self.point_cancel_at_pin();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::request;

    #[test]
    fn only_requests_that_end_in_sync_or_are_a_query_stand_alone() {
        let mut b = BytesMut::new();
        request::query(&mut b, "SELECT 1").unwrap();
        assert_eq!(
            standalone(&b, &[]),
            Some(Standalone {
                readies: 1,
                simple: true
            })
        );
        let mut b = BytesMut::new();
        request::parse(&mut b, "", "SELECT $1", &[]).unwrap();
        request::sync(&mut b);
        request::parse(&mut b, "", "SELECT 2", &[]).unwrap();
        request::sync(&mut b);
        assert_eq!(
            standalone(&b, &[]),
            Some(Standalone {
                readies: 2,
                simple: false
            })
        );
        let mut flush = BytesMut::new();
        request::parse(&mut flush, "", "SELECT 1", &[]).unwrap();
        flush.extend_from_slice(&[b'H', 0, 0, 0, 4]);
        assert_eq!(standalone(&flush, &[]), None);
        let mut open = BytesMut::new();
        request::parse(&mut open, "", "SELECT 1", &[]).unwrap();
        assert_eq!(standalone(&open, &[]), None);
        let mut long = BytesMut::new();
        request::query(&mut long, "SELECT 3").unwrap();
        assert_eq!(standalone(&[], &long).map(|s| s.readies), Some(1));
    }
}
