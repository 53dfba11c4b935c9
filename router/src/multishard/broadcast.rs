//! DDL for every shard: one statement text run on all shards in parallel, answered once.
//!
//! Each shard runs the text in its own autocommit transaction on a connection from its pool
//! (with the client's session settings, so `search_path` applies). The client gets one reply:
//! the first shard's command tags when every shard succeeded; Postgres's own error when every
//! shard failed the same way (the table already exists everywhere, say); otherwise an error that
//! names the shards where it failed, because the others have applied it.

use std::sync::Arc;

use bytes::BytesMut;

use crate::backend::settings::Settings;
use crate::errors;
use crate::protocol::backend::error_fields;
use crate::protocol::reply::SqlError;
use crate::protocol::request;
use crate::routing::Routing;

/// How one shard answered.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The CommandComplete frames, and the NoticeResponses among them, in order.
    Done(Vec<u8>),
    /// Postgres's ErrorResponse frame, its SQLSTATE and message.
    Failed {
        frame: Vec<u8>,
        code: String,
        message: String,
    },
    /// The shard could not be reached, or the connection broke.
    Unavailable(SqlError),
}

/// Runs `sql` on every shard of the map at once; the outcomes are in shard order.
pub async fn run(routing: &Arc<Routing>, sql: &str, settings: &Settings) -> Vec<Outcome> {
    let mut tasks = tokio::task::JoinSet::new();
    for shard in 0..routing.map.shards().len() {
        let routing = routing.clone();
        let sql = sql.to_string();
        let settings = settings.clone();
        tasks.spawn(async move { (shard, on_shard(&routing, shard, &sql, &settings).await) });
    }
    let mut outcomes = vec![None; routing.map.shards().len()];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((shard, outcome)) => outcomes[shard] = Some(outcome),
            Err(e) => tracing::error!("a broadcast task failed: {e}"),
        }
    }
    outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                Outcome::Unavailable(SqlError::new(
                    errors::CONNECTION_FAILURE,
                    "internal: the shard's task did not finish",
                ))
            })
        })
        .collect()
}

async fn on_shard(routing: &Routing, shard: usize, sql: &str, settings: &Settings) -> Outcome {
    let mut pooled = match routing.checkout_for(shard, settings).await {
        Ok(c) => c,
        Err(e) => return Outcome::Unavailable(e),
    };
    let mut out = BytesMut::new();
    let apply = match settings.write_apply(pooled.settings_fp, &mut out) {
        Ok(apply) => apply,
        Err(e) => return Outcome::Unavailable(errors::internal(e)),
    };
    if let Err(e) = request::query(&mut out, sql) {
        return Outcome::Unavailable(errors::internal(e));
    }
    // Skip the settings query's replies, then collect the statement's.
    let prelude = apply;
    let (mut tags, mut error) = (Vec::new(), None::<Vec<u8>>);
    let result = async {
        let mut replies = pooled.request(&out, prelude + 1).await?;
        replies.skip_prelude(prelude, |_| {}).await?;
        while let Some(frame) = replies.next().await? {
            match frame[0] {
                // Notices ("drop cascades to ...") go to the client with the tags, in order.
                b'C' | b'N' => tags.extend_from_slice(frame),
                b'E' if error.is_none() => error = Some(frame.to_vec()),
                _ => {}
            }
        }
        Ok::<(), std::io::Error>(())
    }
    .await;
    match result {
        Ok(()) => {
            pooled.settings_fp = settings.fingerprint();
            match error {
                None => Outcome::Done(tags),
                Some(frame) => {
                    let (code, message) = error_fields(&frame);
                    Outcome::Failed {
                        frame,
                        code,
                        message,
                    }
                }
            }
        }
        Err(e) => {
            let endpoint = routing.pools().for_shard(shard).endpoint.name();
            crate::backend::pool::discard(pooled);
            let name = routing.map.shards()[shard].range.to_string();
            Outcome::Unavailable(errors::shard_lost(&name, &endpoint, &e.to_string()))
        }
    }
}

/// The one answer for the client: the command tags to send, or the error.
pub enum Combined {
    Done(Vec<u8>),
    /// A Postgres ErrorResponse to forward as it is.
    PostgresError(Vec<u8>),
    Error(SqlError),
}

/// Combines the shards' outcomes (pure, so it is unit tested); `names` are the shard ranges.
/// When every shard did it, the client gets the first shard's answer: its tags and notices
/// (the others' are the same statement's on the same schema).
pub fn combine(outcomes: &[Outcome], names: &[String]) -> Combined {
    let failed: Vec<usize> = (0..outcomes.len())
        .filter(|&i| !matches!(outcomes[i], Outcome::Done(_)))
        .collect();
    if failed.is_empty() {
        return match outcomes.first() {
            Some(Outcome::Done(tags)) => Combined::Done(tags.clone()),
            _ => Combined::Done(Vec::new()),
        };
    }
    // The same Postgres error everywhere: nothing was applied anywhere; say it as Postgres does.
    if failed.len() == outcomes.len() {
        if let Some(Outcome::Failed { frame, code, .. }) = outcomes.first() {
            let same = outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Failed { code: c, .. } if c == code));
            if same {
                return Combined::PostgresError(frame.clone());
            }
        }
    }
    let (code, first) = match &outcomes[failed[0]] {
        Outcome::Failed { code, message, .. } => (code.clone(), message.clone()),
        Outcome::Unavailable(e) => (e.code.to_string(), e.message.clone()),
        Outcome::Done(_) => (errors::CONNECTION_FAILURE.to_string(), String::new()),
    };
    let where_failed: Vec<&str> = failed.iter().map(|&i| names[i].as_str()).collect();
    let applied = outcomes.len() - failed.len();
    Combined::Error(
        SqlError::with_code(
            code,
            format!(
                "the statement failed on {} of {} shards ({}): {first}; it was applied on the other {applied}",
                failed.len(),
                outcomes.len(),
                where_failed.join(", ")
            ),
        )
        .with_hint("the shards now differ: fix the cause and re-run the statement on the failed shards (docs/operations.md, \"Repairing a partial DDL\")"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    fn failed(code: &str) -> Outcome {
        Outcome::Failed {
            frame: format!("E{code}").into_bytes(),
            code: code.into(),
            message: format!("boom {code}"),
        }
    }

    #[test]
    fn all_done_answers_with_the_first_shards_tags() {
        let o = vec![Outcome::Done(b"C1".to_vec()), Outcome::Done(b"C2".to_vec())];
        assert!(matches!(combine(&o, &names(2)), Combined::Done(t) if t == b"C1"));
    }

    #[test]
    fn the_same_error_everywhere_is_postgres_own() {
        let o = vec![failed("42P07"), failed("42P07")];
        assert!(matches!(combine(&o, &names(2)), Combined::PostgresError(f) if f == b"E42P07"));
    }

    #[test]
    fn a_partial_failure_names_the_shards() {
        let o = vec![
            Outcome::Done(Vec::new()),
            failed("42P07"),
            Outcome::Unavailable(SqlError::new("08006", "down")),
        ];
        match combine(&o, &names(3)) {
            Combined::Error(e) => {
                assert_eq!(e.code, "42P07");
                assert!(
                    e.message.contains("2 of 3 shards (s1, s2)")
                        && e.message.contains("applied on the other 1"),
                    "{}",
                    e.message
                );
            }
            _ => panic!("expected an error"),
        }
    }
}
