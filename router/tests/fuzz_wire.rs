//! A wire-level fuzzer against a live router on real Postgres shards: many connections send
//! random bytes and mutated real sessions (startup, simple queries, the extended protocol),
//! while a bystander client writes and reads its own rows throughout. The router must not
//! panic, every fuzz connection must end within a bound once its client has finished sending,
//! and the bystander must get every answer right with no error.
//!
//! `SHARDGATE_FUZZ_CONNECTIONS=N` (default 400) and `SHARDGATE_FUZZ_SEED=S` scale and vary it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::frontend as pg;
use postgres_protocol::IsNull;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::{Router, DATABASE, USER};

/// How long a fuzz connection may stay open after it has sent everything and closed its
/// sending side: far beyond anything the router should need, short enough to catch a hang.
const END_BOUND: Duration = Duration::from_secs(30);

/// A recorded session: the startup packet, then simple and extended-protocol traffic (reads
/// of `kv`, writes only to the unsharded `settings`, so nothing touches the bystander's rows).
fn session(rng: &mut StdRng) -> Vec<u8> {
    let mut buf = BytesMut::new();
    pg::startup_message([("user", USER), ("database", DATABASE)], &mut buf).expect("startup");
    let id: i64 = rng.random_range(1..1_000_000);
    pg::query(&format!("SELECT v FROM kv WHERE id = {id}"), &mut buf).expect("query");
    pg::query(
        &format!("INSERT INTO settings VALUES ('fuzz{id}', 'x') ON CONFLICT (k) DO NOTHING"),
        &mut buf,
    )
    .expect("query");
    pg::query("SELECT 1; SELECT count(*) FROM kv", &mut buf).expect("query");
    pg::parse("s1", "SELECT v FROM kv WHERE id = $1", [20], &mut buf).expect("parse");
    pg::describe(b'S', "s1", &mut buf).expect("describe");
    let binary = rng.random_bool(0.5);
    pg::bind(
        "",
        "s1",
        [i16::from(binary)],
        [id],
        |v: i64, out: &mut BytesMut| {
            if binary {
                out.extend_from_slice(&v.to_be_bytes());
            } else {
                out.extend_from_slice(v.to_string().as_bytes());
            }
            Ok(IsNull::No)
        },
        [0],
        &mut buf,
    )
    .map_err(|_| "bind")
    .expect("bind");
    pg::execute("", 0, &mut buf).expect("execute");
    pg::sync(&mut buf);
    pg::query("BEGIN", &mut buf).expect("query");
    pg::query(&format!("SELECT v FROM kv WHERE id = {id}"), &mut buf).expect("query");
    pg::query("COMMIT", &mut buf).expect("query");
    pg::terminate(&mut buf);
    buf.to_vec()
}

/// Bytes that matter to the parsers, to make random input hit their branches.
const INTERESTING: &[u8] = b"\0\xff\x7f\x80'\"$\\,;=(){}-/*\nQPBDESHCXp";

fn byte(rng: &mut StdRng) -> u8 {
    if rng.random_bool(0.5) {
        INTERESTING[rng.random_range(0..INTERESTING.len())]
    } else {
        rng.random()
    }
}

/// What one fuzz connection sends.
fn input(rng: &mut StdRng) -> Vec<u8> {
    let real = session(rng);
    let startup_len = i32::from_be_bytes([real[0], real[1], real[2], real[3]]) as usize;
    match rng.random_range(0..6) {
        // Random bytes from the start.
        0 => (0..rng.random_range(0..2000)).map(|_| byte(rng)).collect(),
        // A valid startup, then random bytes.
        1 => {
            let mut b = real[..startup_len].to_vec();
            b.extend((0..rng.random_range(0..2000)).map(|_| byte(rng)));
            b
        }
        // The real session cut anywhere.
        2 => real[..rng.random_range(0..real.len())].to_vec(),
        // A length field (of the startup packet or of a message) corrupted.
        3 => {
            let mut b = real;
            let at = rng.random_range(0..b.len() - 4);
            let v: i32 = [-1, 0, 3, 4, 5, 1 << 30, i32::MAX, rng.random()][rng.random_range(0..8)];
            b[at..at + 4].copy_from_slice(&v.to_be_bytes());
            b
        }
        // Byte flips and random bytes, mostly after the startup so the session decoders run.
        _ => {
            let mut b = real;
            for _ in 0..rng.random_range(1..6) {
                let from = if rng.random_bool(0.8) { startup_len } else { 0 };
                let at = rng.random_range(from..b.len());
                if rng.random_bool(0.5) {
                    b[at] ^= 1 << rng.random_range(0..8);
                } else {
                    b[at] = byte(rng);
                }
            }
            b
        }
    }
}

/// Sends `bytes` (in a few pieces), closes the sending side, and reads until the router closes
/// the connection; an error if it is still open after [`END_BOUND`].
async fn fuzz_one(port: u16, bytes: Vec<u8>, pieces: usize) -> Result<(), String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let step = bytes.len().div_ceil(pieces.max(1)).max(1);
    for chunk in bytes.chunks(step) {
        // The router may close first (a protocol violation): that is an answer too.
        if s.write_all(chunk).await.is_err() {
            break;
        }
    }
    let _ = s.shutdown().await;
    let mut sink = vec![0u8; 64 * 1024];
    let ended = tokio::time::timeout(END_BOUND, async {
        loop {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    ended.map_err(|_| {
        format!(
            "still open {END_BOUND:?} after sending {} bytes",
            bytes.len()
        )
    })
}

/// Writes and reads its own rows until told to stop; returns (statements, errors).
async fn bystander(url: String, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) -> Vec<String> {
    let mut errors = Vec::new();
    let client = match common::connect(&url).await {
        Ok(c) => c,
        Err(e) => return vec![format!("connect: {e}")],
    };
    let select = match client.prepare("SELECT v FROM kv WHERE id = $1").await {
        Ok(s) => s,
        Err(e) => return vec![format!("prepare: {e}")],
    };
    let mut i: i64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let id = 880_000_000 + i;
        let v = format!("bystander {i}");
        let insert = format!("INSERT INTO kv VALUES ({id}, '{v}')");
        if let Err(e) = client.simple_query(&insert).await {
            errors.push(format!("{insert}: {e:?}"));
        }
        match client.query_one(&select, &[&id]).await {
            Ok(row) if row.get::<_, String>(0) == v => {}
            Ok(row) => errors.push(format!("id {id}: {:?}", row.get::<_, String>(0))),
            Err(e) => errors.push(format!("select {id}: {e:?}")),
        }
        let simple = format!("SELECT v FROM kv WHERE id = {id}");
        match client.simple_query(&simple).await {
            Ok(m) if common::rows(&m) == vec![vec![v.clone()]] => {}
            Ok(m) => errors.push(format!("{simple}: {:?}", common::rows(&m))),
            Err(e) => errors.push(format!("{simple}: {e:?}")),
        }
        done.fetch_add(3, Ordering::Relaxed);
        i += 1;
    }
    errors
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_mutated_sessions_never_hurt_the_router_or_a_bystander() {
    let connections: usize = std::env::var("SHARDGATE_FUZZ_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let seed: u64 = std::env::var("SHARDGATE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xf022);
    let env = common::shared_env();
    // Trust, so recorded sessions get past the login (a SCRAM nonce cannot be replayed); a
    // short login timeout, so cut startups end soon.
    let router = Router::start_with(
        &env.map,
        "auth = \"trust\"\n[limits]\nlogin_timeout_ms = 3000\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let watcher = tokio::spawn(bystander(router.url(), stop.clone(), done.clone()));

    let port = router.port;
    let mut rng = StdRng::seed_from_u64(seed);
    let inputs: Vec<(u64, Vec<u8>, usize)> = (0..connections as u64)
        .map(|n| (n, input(&mut rng), rng.random_range(1..4)))
        .collect();
    let mut failures = Vec::new();
    // 16 at a time.
    for batch in inputs.chunks(16) {
        let tasks: Vec<_> = batch
            .iter()
            .cloned()
            .map(|(n, bytes, pieces)| {
                tokio::spawn(async move { (n, fuzz_one(port, bytes, pieces).await) })
            })
            .collect();
        for t in tasks {
            let (n, result) = t.await.expect("join");
            if let Err(e) = result {
                failures.push(format!("connection {n}: {e}"));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let errors = watcher.await.expect("join the bystander");
    let log = router.log_text();
    assert!(router.is_alive(), "the router died:\n{log}");
    assert!(!log.contains("panicked"), "the router panicked:\n{log}");
    assert!(
        failures.is_empty(),
        "hung connections (seed {seed}): {failures:?}"
    );
    assert!(errors.is_empty(), "the bystander saw errors: {errors:?}");
    assert!(
        done.load(Ordering::Relaxed) > 0,
        "the bystander ran no statement"
    );
    // And the router still serves a new client.
    let client = router.connect().await;
    client
        .simple_query("SELECT 1")
        .await
        .expect("serves after the fuzz");
    // What the fuzz reached: refused at the door, or past the login into a session.
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    eprintln!(
        "fuzz_wire: {connections} connections (seed {seed}): {} refused before a session, {} sessions ended by an error; the bystander ran {} statements",
        count("login failed"),
        count("session ended"),
        done.load(Ordering::Relaxed)
    );
}
