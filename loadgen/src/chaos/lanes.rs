//! The load of a chaos run: lanes (one connection each, to the routers in turn) sending a mix
//! of point reads, counter increments, inserts and transfers at a fixed rate, and keeping the
//! ledger the invariants are checked against.
//!
//! A lane behaves like an application's pooled connection: when its connection breaks (a
//! router killed or drained) it opens a new one to the next router, and what it could not send
//! in the meantime waits, measured from when it should have been sent. A request still unsent
//! after `timeout` is a timeout. Any failure is *ambiguous*: the write may have been applied
//! before the connection broke, and the ledger says so instead of guessing.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::{Client, Statement};

use super::bank::{Claims, Size};
use super::timeline::{Outcome, Timeline};
use crate::pacer::Pacer;
use crate::target::{connect_owned, error_code};

/// Weights of the four operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    pub read: u32,
    pub increment: u32,
    pub insert: u32,
    pub transfer: u32,
}

impl std::str::FromStr for Mix {
    type Err = String;

    /// `read=60,increment=15,insert=15,transfer=10`; operations left out weigh 0.
    fn from_str(s: &str) -> Result<Mix, String> {
        let mut m = Mix {
            read: 0,
            increment: 0,
            insert: 0,
            transfer: 0,
        };
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: write NAME=WEIGHT"))?;
            let w: u32 = weight
                .trim()
                .parse()
                .map_err(|_| format!("{part:?}: the weight must be a whole number"))?;
            match name.trim() {
                "read" => m.read = w,
                "increment" => m.increment = w,
                "insert" => m.insert = w,
                "transfer" => m.transfer = w,
                other => {
                    return Err(format!(
                        "{other:?} is not an operation: read, increment, insert or transfer"
                    ))
                }
            }
        }
        if m.read + m.increment + m.insert + m.transfer == 0 {
            return Err("give at least one operation a weight above 0".into());
        }
        Ok(m)
    }
}

impl std::fmt::Display for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "read={},increment={},insert={},transfer={}",
            self.read, self.increment, self.insert, self.transfer
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Increment,
    Insert,
    Transfer,
}

impl Mix {
    fn pick(&self, rng: &mut StdRng) -> Op {
        let total = self.read + self.increment + self.insert + self.transfer;
        let mut x = rng.random_range(0..total);
        for (w, op) in [
            (self.read, Op::Read),
            (self.increment, Op::Increment),
            (self.insert, Op::Insert),
        ] {
            if x < w {
                return op;
            }
            x -= w;
        }
        Op::Transfer
    }
}

/// What every lane shares.
pub struct Shared {
    pub timeline: Timeline,
    pub routers: Vec<String>,
    pub mix: Mix,
    pub size: Size,
    pub timeout: Duration,
    pub end: Instant,
    next_event: AtomicI64,
    increments: Vec<(AtomicU64, AtomicU64)>,
    anomalies: Mutex<Vec<String>>,
}

impl Shared {
    pub fn new(
        timeline: Timeline,
        routers: Vec<String>,
        mix: Mix,
        size: Size,
        timeout: Duration,
        end: Instant,
    ) -> Shared {
        Shared {
            timeline,
            routers,
            mix,
            size,
            timeout,
            end,
            next_event: AtomicI64::new(1),
            increments: (0..size.counters)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
            anomalies: Mutex::new(Vec::new()),
        }
    }

    fn anomaly(&self, what: String) {
        self.anomalies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
    }

    /// The ledger, with the inserts of every lane.
    pub fn claims(&self, lanes: Vec<Inserts>) -> Claims {
        let mut claims = Claims {
            increments: self
                .increments
                .iter()
                .map(|(ok, maybe)| (ok.load(Ordering::Relaxed), maybe.load(Ordering::Relaxed)))
                .collect(),
            anomalies: self
                .anomalies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            ..Claims::default()
        };
        for lane in lanes {
            claims.inserted.extend(lane.acknowledged);
            claims.maybe_inserted.extend(lane.ambiguous);
        }
        claims
    }
}

/// The event ids one lane inserted, or may have.
#[derive(Debug, Default)]
pub struct Inserts {
    pub acknowledged: Vec<i64>,
    pub ambiguous: Vec<i64>,
}

/// One connection and its prepared statements. Dropping it closes the socket at once (the
/// router then rolls back whatever the abandoned request had open), not when the answers
/// owed arrive.
struct Conn {
    _task: AbortOnDrop,
    client: Client,
    read: Statement,
    increment: Statement,
    insert: Statement,
    debit: Statement,
    credit: Statement,
}

impl Conn {
    async fn open(url: &str, timeout: Duration) -> Result<Conn, tokio_postgres::Error> {
        let (client, task) = connect_owned(url, timeout).await?;
        let conn = Conn {
            _task: AbortOnDrop(task.abort_handle()),
            read: client
                .prepare("SELECT balance FROM chaos_accounts WHERE id = $1")
                .await?,
            increment: client
                .prepare("UPDATE chaos_counters SET n = n + 1 WHERE id = $1")
                .await?,
            insert: client
                .prepare("INSERT INTO chaos_events (id, writer) VALUES ($1, $2)")
                .await?,
            debit: client
                .prepare("UPDATE chaos_accounts SET balance = balance - $2 WHERE id = $1")
                .await?,
            credit: client
                .prepare("UPDATE chaos_accounts SET balance = balance + $2 WHERE id = $1")
                .await?,
            client,
        };
        Ok(conn)
    }
}

/// Aborts the connection task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a request did, as far as the ledger cares.
enum Done {
    Fine,
    /// An answer that cannot be right.
    Wrong(String),
}

/// Runs lane `i` from `first` every `interval` until the run's end.
pub async fn lane(
    i: usize,
    shared: Arc<Shared>,
    first: Instant,
    interval: Duration,
    seed: u64,
) -> Result<Inserts, String> {
    let pacer = Pacer::new().map_err(|e| format!("cannot make a timer: {e}"))?;
    let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut conn: Option<Conn> = None;
    let mut attempt = i;
    let mut inserts = Inserts::default();
    let mut due = first;
    while due < shared.end {
        pacer
            .sleep_until(due)
            .await
            .map_err(|e| format!("lane timer failed: {e}"))?;
        let op = shared.mix.pick(&mut rng);
        let outcome = request(
            &shared,
            &mut conn,
            &mut attempt,
            op,
            due,
            &mut rng,
            &mut inserts,
        )
        .await;
        shared.timeline.record(outcome, due.elapsed());
        due += interval;
    }
    Ok(inserts)
}

/// One request: (re)connects when needed, runs `op` within what is left of the timeout.
async fn request(
    shared: &Shared,
    conn: &mut Option<Conn>,
    attempt: &mut usize,
    op: Op,
    due: Instant,
    rng: &mut StdRng,
    inserts: &mut Inserts,
) -> Outcome {
    let deadline = due + shared.timeout;
    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
        return Outcome::Timeout;
    };
    // As a pool checks a connection before handing it out: one the router closed while it was
    // idle (a drain) is replaced, not used for a request that would fail.
    if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
        *conn = None;
    }
    if conn.is_none() {
        let url = &shared.routers[*attempt % shared.routers.len()];
        *attempt += 1;
        match tokio::time::timeout(left, Conn::open(url, left)).await {
            Ok(Ok(c)) => *conn = Some(c),
            Ok(Err(e)) => return Outcome::Error(error_code(&e, true)),
            Err(_) => return Outcome::Timeout,
        }
    }
    let Some(c) = conn.as_ref() else {
        return Outcome::Error("08001".into());
    };
    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
        return Outcome::Timeout;
    };
    let event = (op == Op::Insert).then(|| shared.next_event.fetch_add(1, Ordering::Relaxed));
    let counter = rng.random_range(1..=shared.size.counters.max(1));
    let result = tokio::time::timeout(left, run_op(shared, c, op, event, counter, rng)).await;
    let outcome = match result {
        Ok(Ok(Done::Fine)) => Outcome::Ok,
        Ok(Ok(Done::Wrong(what))) => {
            shared.anomaly(what);
            Outcome::Error("wrong".into())
        }
        Ok(Err(e)) => {
            // A transfer that failed may have left its transaction open or failed (when its
            // ROLLBACK did not get through): the next request must not run inside it.
            if op == Op::Transfer {
                *conn = None;
            }
            Outcome::Error(error_code(&e, false))
        }
        // The connection may still be busy with the abandoned request: start afresh.
        Err(_) => {
            *conn = None;
            Outcome::Timeout
        }
    };
    ledger(shared, op, event, counter, &outcome, inserts);
    outcome
}

/// Books a finished write: acknowledged, or ambiguous when it failed.
fn ledger(
    shared: &Shared,
    op: Op,
    event: Option<i64>,
    counter: i64,
    outcome: &Outcome,
    inserts: &mut Inserts,
) {
    let ok = *outcome == Outcome::Ok;
    match (op, event) {
        (Op::Increment, _) => {
            if let Some((acked, maybe)) = shared.increments.get((counter - 1) as usize) {
                if ok { acked } else { maybe }.fetch_add(1, Ordering::Relaxed);
            }
        }
        (Op::Insert, Some(id)) if ok => inserts.acknowledged.push(id),
        (Op::Insert, Some(id)) => {
            if *outcome == Outcome::Error("23505".into()) {
                shared.anomaly(format!(
                    "the insert of fresh id {id} was answered 23505: it ran twice"
                ));
            }
            inserts.ambiguous.push(id);
        }
        _ => {}
    }
}

async fn run_op(
    shared: &Shared,
    c: &Conn,
    op: Op,
    event: Option<i64>,
    counter: i64,
    rng: &mut StdRng,
) -> Result<Done, tokio_postgres::Error> {
    let accounts = shared.size.accounts.max(1);
    match op {
        Op::Read => {
            let id = rng.random_range(1..=accounts);
            let rows = c.client.query(&c.read, &[&id]).await?;
            Ok(expect_one(rows.len() as u64, || {
                format!("account {id} read as {} rows", rows.len())
            }))
        }
        Op::Increment => {
            let n = c.client.execute(&c.increment, &[&counter]).await?;
            Ok(expect_one(n, || {
                format!("the increment of counter {counter} updated {n} rows")
            }))
        }
        Op::Insert => {
            let id = event.unwrap_or_default();
            let n = c
                .client
                .execute(&c.insert, &[&id, &(shared.routers.len() as i64)])
                .await?;
            Ok(expect_one(n, || {
                format!("the insert of event {id} inserted {n} rows")
            }))
        }
        Op::Transfer => {
            let from = rng.random_range(1..=accounts);
            let to = 1 + (from + rng.random_range(0..accounts.max(2) - 1)) % accounts;
            let amount: i64 = rng.random_range(1..=100);
            transfer(c, from, to, amount).await
        }
    }
}

fn expect_one(n: u64, what: impl FnOnce() -> String) -> Done {
    if n == 1 {
        Done::Fine
    } else {
        Done::Wrong(what())
    }
}

/// Moves `amount` from one account to another in one transaction (across shards, the router's
/// two-phase commit).
async fn transfer(
    c: &Conn,
    from: i64,
    to: i64,
    amount: i64,
) -> Result<Done, tokio_postgres::Error> {
    c.client.batch_execute("BEGIN").await?;
    let debited = c.client.execute(&c.debit, &[&from, &amount]).await;
    let credited = match debited {
        Ok(1) => c.client.execute(&c.credit, &[&to, &amount]).await,
        other => other,
    };
    match credited {
        Ok(1) => {
            c.client.batch_execute("COMMIT").await?;
            Ok(Done::Fine)
        }
        Ok(n) => {
            c.client.batch_execute("ROLLBACK").await?;
            Ok(Done::Wrong(format!(
                "a transfer {from} -> {to} updated {n} rows"
            )))
        }
        Err(e) => {
            // Leave the connection clean for the next request; if it is gone, so is the
            // transaction.
            let _ = c.client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_parse_and_pick_by_weight() {
        let m: Mix = "read=1,transfer=3".parse().unwrap();
        assert_eq!((m.read, m.increment, m.insert, m.transfer), (1, 0, 0, 3));
        assert!("read=0".parse::<Mix>().is_err());
        assert!("reads=1"
            .parse::<Mix>()
            .unwrap_err()
            .contains("not an operation"));
        assert!("read".parse::<Mix>().is_err());
        let mut rng = StdRng::seed_from_u64(7);
        let transfers = (0..4000)
            .filter(|_| m.pick(&mut rng) == Op::Transfer)
            .count();
        assert!((2700..3300).contains(&transfers), "{transfers}");
        let only: Mix = "insert=5".parse().unwrap();
        assert!((0..100).all(|_| only.pick(&mut rng) == Op::Insert));
    }
}
