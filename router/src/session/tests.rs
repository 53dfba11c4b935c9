//! The session's state machine in memory: client frames in over a pipe, the session's answers
//! out, with shards that cannot be reached (nothing listens on their port), so every answer
//! here comes from the router itself: its transitions (idle, a BEGIN not yet sent, a
//! transaction that failed before reaching a shard, an extended batch held or skipped to its
//! Sync, a DDL batch the router answers), and its errors when a shard is needed but down.
//! What reaches the backend is checked in `outbox`; the cluster tests run it all against real
//! Postgres.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::protocol::frame::{next_frame, put_frame};

/// A router whose four shards are all unreachable.
fn shared() -> Arc<Router> {
    let config = crate::config::parse(
        "shardmap = \"shardmap.toml\"\ndatabase = \"app\"\nauth = \"trust\"\n\
         [pool]\nconnect_timeout_ms = 2000\ncheckout_timeout_ms = 2000\n\
         [failover]\nhold_ms = 200\n",
        std::path::Path::new("/nonexistent/router.toml"),
    )
    .expect("a valid config");
    // Port 1 on loopback: connections are refused at once.
    let urls: Vec<String> = (0..4)
        .map(|i| format!("postgres://127.0.0.1:1/s{i}"))
        .collect();
    let tables = vec![shardmap::Table::new("kv", "id", shardmap::KeyType::BigInt)];
    let map = shardmap::ShardMap::even_split(&urls, tables).expect("a valid map");
    Arc::new(Router::new(config, map, crate::tls::Material::none(), 1))
}

/// The client's end of a session running on its own task.
struct Client {
    io: DuplexStream,
    buf: BytesMut,
    session: tokio::task::JoinHandle<Result<(), SessionError>>,
}

impl Client {
    fn start() -> Client {
        let shared = shared();
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let (_, slot) = shared.clients.add();
        let session = Session::new(
            shared,
            theirs,
            BytesMut::new(),
            slot,
            Settings::default(),
            "app".into(),
        );
        Client {
            io: ours,
            buf: BytesMut::new(),
            session: tokio::spawn(session.run()),
        }
    }

    async fn send(&mut self, frames: &[Vec<u8>]) {
        for f in frames {
            self.io.write_all(f).await.expect("write to the session");
        }
    }

    /// The next frame from the session; `None` when it closed the pipe.
    async fn frame(&mut self) -> Option<(char, Vec<u8>)> {
        loop {
            if let Some(h) = next_frame(&self.buf).expect("a valid frame") {
                let frame = self.buf.split_to(h.total);
                return Some((char::from(frame[0]), frame[5..].to_vec()));
            }
            let read =
                tokio::time::timeout(Duration::from_secs(20), self.io.read_buf(&mut self.buf))
                    .await
                    .expect("the session answers within 20 s")
                    .expect("read from the session");
            if read == 0 {
                return None;
            }
        }
    }

    /// The tags of the frames up to and including the next ReadyForQuery, and its status.
    async fn until_ready(&mut self) -> (String, char) {
        let mut tags = String::new();
        loop {
            let (tag, body) = self.frame().await.expect("a ReadyForQuery");
            tags.push(tag);
            if tag == 'Z' {
                return (tags, char::from(body[0]));
            }
        }
    }

    /// Like [`Client::until_ready`], with the SQLSTATE of each error on the way.
    async fn errors_until_ready(&mut self) -> (Vec<String>, char) {
        let mut codes = Vec::new();
        loop {
            let (tag, body) = self.frame().await.expect("a ReadyForQuery");
            if tag == 'E' {
                codes.push(sqlstate(&body));
            }
            if tag == 'Z' {
                return (codes, char::from(body[0]));
            }
        }
    }
}

fn sqlstate(error_body: &[u8]) -> String {
    error_body
        .split(|&b| b == 0)
        .find_map(|f| f.strip_prefix(b"C"))
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .unwrap_or_default()
}

fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    put_frame(&mut v, tag, body);
    v
}

fn query(sql: &str) -> Vec<u8> {
    msg(b'Q', format!("{sql}\0").as_bytes())
}

fn parse(name: &str, sql: &str) -> Vec<u8> {
    msg(b'P', format!("{name}\0{sql}\0\0\0").as_bytes())
}

fn bind(statement: &str) -> Vec<u8> {
    msg(b'B', format!("\0{statement}\0\0\0\0\0\0\0").as_bytes())
}

fn describe(kind: u8, name: &str) -> Vec<u8> {
    msg(b'D', format!("{}{name}\0", kind as char).as_bytes())
}

fn close(kind: u8, name: &str) -> Vec<u8> {
    msg(b'C', format!("{}{name}\0", kind as char).as_bytes())
}

fn execute() -> Vec<u8> {
    msg(b'E', b"\0\0\0\0\0")
}

fn sync() -> Vec<u8> {
    msg(b'S', b"")
}

fn flush() -> Vec<u8> {
    msg(b'H', b"")
}

#[tokio::test]
async fn begin_and_its_end_are_answered_by_the_router() {
    let mut c = Client::start();
    c.send(&[query("BEGIN")]).await;
    assert_eq!(c.until_ready().await, ("CZ".into(), 'T'));
    c.send(&[query("COMMIT")]).await;
    assert_eq!(c.until_ready().await, ("CZ".into(), 'I'));
    c.send(&[
        query("BEGIN ISOLATION LEVEL SERIALIZABLE"),
        query("ROLLBACK"),
    ])
    .await;
    assert_eq!(c.until_ready().await, ("CZ".into(), 'T'));
    assert_eq!(c.until_ready().await, ("CZ".into(), 'I'));
}

#[tokio::test]
async fn a_refusal_fails_the_transaction_until_its_end() {
    let mut c = Client::start();
    c.send(&[query("BEGIN"), query("CREATE INDEX ON kv (v)")])
        .await;
    assert_eq!(c.until_ready().await.1, 'T');
    // DDL for every shard cannot join a transaction: refused, and the transaction fails.
    assert_eq!(c.errors_until_ready().await, (vec!["0A000".into()], 'E'));
    c.send(&[query("SELECT 1")]).await;
    assert_eq!(c.errors_until_ready().await, (vec!["25P02".into()], 'E'));
    // The extended protocol is refused the same way.
    c.send(&[parse("", "SELECT 1"), bind(""), execute(), sync()])
        .await;
    assert_eq!(c.errors_until_ready().await, (vec!["25P02".into()], 'E'));
    // COMMIT of a failed transaction rolls back, as on Postgres.
    c.send(&[query("COMMIT")]).await;
    let (tag, body) = c.frame().await.unwrap();
    assert_eq!((tag, body.as_slice()), ('C', &b"ROLLBACK\0"[..]));
    assert_eq!(c.until_ready().await, ("Z".into(), 'I'));
}

#[tokio::test]
async fn an_unreachable_shard_is_an_error_and_the_session_goes_on() {
    let mut c = Client::start();
    c.send(&[query("SELECT v FROM kv WHERE id = 1")]).await;
    let (codes, status) = c.errors_until_ready().await;
    assert!(
        matches!(codes[..], [ref c] if c.starts_with("08")),
        "{codes:?}"
    );
    assert_eq!(status, 'I');
    // Inside a transaction the failure fails it.
    c.send(&[query("BEGIN"), query("SELECT v FROM kv WHERE id = 1")])
        .await;
    assert_eq!(c.until_ready().await.1, 'T');
    assert_eq!(c.errors_until_ready().await.1, 'E');
    c.send(&[query("ROLLBACK")]).await;
    assert_eq!(c.until_ready().await.1, 'I');
    // The extended protocol: the error, then the rest of the batch is skipped to its Sync.
    c.send(&[
        parse("", "SELECT v FROM kv WHERE id = $1"),
        msg(b'B', b"\0\0\0\0\0\x01\0\0\0\x011\0\0"),
        execute(),
        sync(),
    ])
    .await;
    let (codes, status) = c.errors_until_ready().await;
    assert_eq!((codes.len(), status), (1, 'I'), "{codes:?}");
}

#[tokio::test]
async fn a_batch_of_transaction_control_is_answered_by_the_router() {
    let mut c = Client::start();
    c.send(&[
        parse("b", "BEGIN"),
        describe(b'S', "b"),
        bind("b"),
        describe(b'P', ""),
        execute(),
        sync(),
    ])
    .await;
    // ParseComplete, ParameterDescription + NoData, BindComplete, NoData, CommandComplete.
    assert_eq!(c.until_ready().await, ("1tn2nCZ".into(), 'T'));
    c.send(&[parse("", "COMMIT"), bind(""), execute(), sync()])
        .await;
    assert_eq!(c.until_ready().await, ("12CZ".into(), 'I'));
}

#[tokio::test]
async fn errors_in_a_batch_skip_to_its_sync() {
    let mut c = Client::start();
    // A Bind of a statement that does not exist: 26000, and the Execute is dropped.
    c.send(&[bind("nope"), execute(), sync()]).await;
    assert_eq!(c.errors_until_ready().await, (vec!["26000".into()], 'I'));
    c.send(&[describe(b'S', "nope"), sync()]).await;
    assert_eq!(c.errors_until_ready().await, (vec!["26000".into()], 'I'));
    // A second Parse of a name: 42P05.
    c.send(&[parse("s", "BEGIN"), parse("s", "BEGIN"), sync()])
        .await;
    let (codes, _) = c.errors_until_ready().await;
    assert_eq!(codes, ["42P05"]);
    // Closing a statement needs no backend, also when it does not exist; Flush delivers it.
    c.send(&[close(b'S', "s"), close(b'S', "never"), flush()])
        .await;
    assert_eq!(c.frame().await.map(|f| f.0), Some('3'));
    assert_eq!(c.frame().await.map(|f| f.0), Some('3'));
    c.send(&[sync()]).await;
    assert_eq!(c.until_ready().await, ("Z".into(), 'I'));
    // The name is free again.
    c.send(&[parse("s", "ROLLBACK"), sync()]).await;
    assert_eq!(c.until_ready().await, ("1Z".into(), 'I'));
}

#[tokio::test]
async fn statements_on_every_shard_are_batches_of_their_own() {
    let mut c = Client::start();
    // DDL for every shard: the router answers the batch, and its Execute reports that the
    // shards are down.
    c.send(&[
        parse("", "CREATE INDEX ON kv (v)"),
        bind(""),
        describe(b'P', ""),
        execute(),
        sync(),
    ])
    .await;
    let (tags, status) = c.until_ready().await;
    assert_eq!((tags.as_str(), status), ("12nEZ", 'I'));
    // DDL in a transaction the router holds is refused.
    c.send(&[query("BEGIN")]).await;
    c.until_ready().await;
    c.send(&[
        parse("", "CREATE INDEX ON kv (v)"),
        bind(""),
        execute(),
        sync(),
    ])
    .await;
    assert_eq!(c.errors_until_ready().await, (vec!["0A000".into()], 'E'));
    c.send(&[query("ROLLBACK")]).await;
    assert_eq!(c.until_ready().await.1, 'I');
}

#[tokio::test]
async fn sql_prepared_statements_that_do_not_exist() {
    let mut c = Client::start();
    c.send(&[query("EXECUTE nope(1)")]).await;
    assert_eq!(c.errors_until_ready().await, (vec!["26000".into()], 'I'));
    c.send(&[query("DEALLOCATE nope")]).await;
    assert_eq!(c.errors_until_ready().await, (vec!["26000".into()], 'I'));
    c.send(&[query("DEALLOCATE ALL")]).await;
    assert_eq!(c.until_ready().await, ("CZ".into(), 'I'));
}

#[tokio::test]
async fn a_protocol_violation_ends_the_session_with_fatal_08p01() {
    let mut c = Client::start();
    c.send(&[query("BEGIN")]).await;
    c.until_ready().await;
    c.send(&[msg(b'!', b"")]).await;
    let (tag, body) = c.frame().await.expect("the FATAL error");
    assert_eq!((tag, sqlstate(&body).as_str()), ('E', "08P01"));
    assert!(body.windows(5).any(|w| w == b"FATAL"));
    assert_eq!(c.frame().await, None, "then the session closes");
    assert!(matches!(
        c.session.await.expect("join"),
        Err(SessionError::Protocol(_))
    ));
}

#[tokio::test]
async fn terminate_ends_the_session() {
    let mut c = Client::start();
    c.send(&[msg(b'X', b"")]).await;
    assert_eq!(c.frame().await, None);
    assert!(c.session.await.expect("join").is_ok());
}

#[tokio::test]
async fn a_message_split_across_writes_is_read_whole() {
    let mut c = Client::start();
    let q = query("BEGIN");
    for chunk in q.chunks(3) {
        c.io.write_all(chunk).await.unwrap();
        c.io.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(c.until_ready().await, ("CZ".into(), 'T'));
}

#[tokio::test]
async fn nothing_held_outlives_its_batch() {
    let mut c = Client::start();
    // A batch the router answered: a lone Sync and a lone Flush afterwards find nothing left.
    c.send(&[parse("b", "BEGIN"), bind("b"), execute(), sync()])
        .await;
    assert_eq!(c.until_ready().await, ("12CZ".into(), 'T'));
    c.send(&[sync()]).await;
    assert_eq!(c.until_ready().await, ("Z".into(), 'T'));
    c.send(&[flush(), sync()]).await;
    assert_eq!(c.until_ready().await, ("Z".into(), 'T'));
    c.send(&[query("ROLLBACK")]).await;
    assert_eq!(c.until_ready().await, ("CZ".into(), 'I'));
    // A batch whose shard could not be reached at its Sync: the same.
    c.send(&[parse("", "SELECT 1"), bind(""), execute(), sync()])
        .await;
    let (codes, status) = c.errors_until_ready().await;
    assert_eq!((codes.len(), status), (1, 'I'), "{codes:?}");
    c.send(&[sync()]).await;
    assert_eq!(c.until_ready().await, ("Z".into(), 'I'));
}
