//! TLS end to end, with real clients and real Postgres: psql with `sslmode=verify-full`
//! against a CA made for the test, `[tls] mode` = disable / allow / require, plaintext
//! cancel requests under `require`, clients that misbehave during the negotiation, TLS from
//! the router to a Postgres that accepts only TLS (`[backend] sslmode`), and certificates
//! swapped by a reload while a session keeps going.

mod common;

use std::path::Path;
use std::process::Command;

use common::tls::{connect_tls, trusting, Certs, Rustls, CA_SEQ};
use common::{pg_program, run, sqlstate, Router, DATABASE, PASSWORD, USER};
use pgharness::tls::TestCa;
use shardmap::ShardMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_postgres::Client;

/// psql through the router on `port` with libpq connection options `opts`; returns
/// (success, stdout, stderr).
fn psql(port: u16, opts: &str, commands: &[&str]) -> (bool, String, String) {
    let conninfo = format!(
        "port={port} dbname={DATABASE} user={USER} password={PASSWORD} connect_timeout=10 {opts}"
    );
    let mut cmd = Command::new(pg_program("psql"));
    cmd.arg(conninfo)
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1"]);
    for c in commands {
        cmd.arg("-c").arg(c);
    }
    run(&mut cmd)
}

fn verify_full(host: &str, ca: &Path) -> String {
    format!(
        "host={host} sslmode=verify-full sslrootcert={}",
        ca.display()
    )
}

/// Waits until `query` runs on some shard of `env`.
async fn wait_until_running(env: &common::Env, query: &str) {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = '{}'",
        query.replace('\'', "''")
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(0..env.map.shards().len()).any(|s| env.on_shard(s, &sql) != "0") {
        assert!(
            std::time::Instant::now() < deadline,
            "{query} never started on a shard"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The SQLSTATE and message of `sql`, which must fail (`why` says why it should).
async fn refused(client: &Client, sql: &str, why: &str) -> (String, String) {
    let err = client.simple_query(sql).await.expect_err(why);
    let message = err
        .as_db_error()
        .map_or_else(|| err.to_string(), |e| e.message().to_string());
    (sqlstate(&err), message)
}

async fn one_value(client: &Client, sql: &str) -> String {
    let rows = common::rows(&client.simple_query(sql).await.expect(sql));
    rows[0][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_serves_tls_clients_and_refuses_plaintext_logins() {
    let env = common::shared_env();
    let certs = Certs::new("require");
    let router = Router::start_with(&env.map, &certs.section("require"));
    let ca = certs.path("ca.pem");

    // psql with verify-full, by host name and by IP address (an IP SAN).
    for host in ["localhost", "127.0.0.1"] {
        let (ok, out, err) = psql(
            router.port,
            &verify_full(host, &ca),
            &["\\conninfo", "SELECT 40 + 2"],
        );
        assert!(
            ok,
            "psql verify-full to {host} failed: {err}\n{}",
            router.log_text()
        );
        assert!(out.contains("SSL connection (protocol: TLSv1."), "{out}");
        assert!(out.trim_end().ends_with("42"), "{out}");
    }

    // Without TLS: refused with 28000, a message and a hint.
    let (ok, _, err) = psql(router.port, "host=127.0.0.1 sslmode=disable", &["SELECT 1"]);
    assert!(!ok);
    assert!(
        err.contains("TLS is required: this router does not accept unencrypted logins"),
        "{err}"
    );
    let refused = common::connect(&router.url())
        .await
        .expect_err("a plaintext login is refused");
    assert_eq!(sqlstate(&refused), "28000", "{refused}");
    let db = refused.as_db_error().expect("a server error");
    assert!(
        db.hint().is_some_and(|h| h.contains("sslmode=require")),
        "{db:?}"
    );

    // A CA that did not sign the router's certificate.
    let other = Certs::new("require-other");
    let (ok, _, err) = psql(
        router.port,
        &verify_full("localhost", &other.path("ca.pem")),
        &["SELECT 1"],
    );
    assert!(!ok);
    assert!(err.contains("certificate verify failed"), "{err}");

    // A session over TLS, whose statement is cancelled by a cancel request sent over TLS.
    let client = connect_tls(&router, &ca).await.expect("TLS session");
    let k = env.key_on(2, 7_000_000);
    client
        .simple_query(&format!(
            "INSERT INTO kv VALUES ({k}, 'over tls') ON CONFLICT (id) DO UPDATE SET v = 'over tls'"
        ))
        .await
        .expect("insert over TLS");
    assert_eq!(
        one_value(&client, &format!("SELECT v FROM kv WHERE id = {k}")).await,
        "over tls"
    );
    let token = client.cancel_token();
    let sleep = "SELECT pg_sleep(61)";
    let sleeping = tokio::spawn(async move {
        let r = client.simple_query(sleep).await;
        (client, r)
    });
    // A cancel request that arrives before the statement runs cancels nothing (as with
    // Postgres): send it once the statement runs on its shard.
    wait_until_running(env, sleep).await;
    token
        .cancel_query(Rustls(trusting(&ca)))
        .await
        .expect("send the cancel request");
    let (client, r) = tokio::time::timeout(std::time::Duration::from_secs(30), sleeping)
        .await
        .expect("the statement ends after the cancel request")
        .expect("the sleeping task");
    assert_eq!(sqlstate(&r.expect_err("cancelled")), "57014");
    assert_eq!(one_value(&client, "SELECT 1").await, "1");

    // psql's Ctrl-C: libpq 15 sends its cancel request in plain TCP, even for a TLS session.
    let sleep = "SELECT pg_sleep(62)";
    let conninfo = format!(
        "port={} dbname={DATABASE} user={USER} password={PASSWORD} {}",
        router.port,
        verify_full("localhost", &ca)
    );
    let psql = Command::new(pg_program("psql"))
        .arg(conninfo)
        .args(["-X", "-At", "-c", sleep])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start psql");
    wait_until_running(env, sleep).await;
    // SAFETY: kill(2) on the psql process this test started.
    unsafe { libc::kill(psql.id() as i32, libc::SIGINT) };
    let out = tokio::task::spawn_blocking(move || psql.wait_with_output())
        .await
        .expect("join")
        .expect("psql output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("canceling statement due to user request"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_refuses_ssl_and_allow_serves_both() {
    let env = common::shared_env();
    let certs = Certs::new("allow");
    let ca = certs.path("ca.pem");

    let plain = Router::start_with(&env.map, "");
    let (ok, _, err) = psql(plain.port, &verify_full("localhost", &ca), &["SELECT 1"]);
    assert!(!ok);
    assert!(
        err.contains("server does not support SSL, but SSL was required"),
        "{err}"
    );
    let (ok, out, err) = psql(plain.port, "host=localhost sslmode=prefer", &["SELECT 1"]);
    assert!(ok && out.trim() == "1", "{err}");
    // Asking again after an `N` is a protocol violation (as on Postgres), not a loop.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", plain.port))
        .await
        .expect("connect");
    s.write_all(&SSL_REQUEST).await.expect("write");
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).await.expect("answer");
    assert_eq!(&answer, b"N");
    s.write_all(&SSL_REQUEST).await.expect("write");
    let answer = read_to_close(&mut s).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(
        answer.first() == Some(&b'E')
            && text.contains("08P01")
            && text.contains("SSL encryption was requested again"),
        "{text}"
    );
    plain.wait_for_log("SSL encryption was requested again", 1);

    let allow = Router::start_with(&env.map, &certs.section("allow"));
    let (ok, out, err) = psql(
        allow.port,
        "host=localhost sslmode=disable",
        &["\\conninfo", "SELECT 1"],
    );
    assert!(ok, "{err}");
    assert!(!out.contains("SSL connection"), "{out}");
    let (ok, out, err) = psql(
        allow.port,
        &verify_full("localhost", &ca),
        &["\\conninfo", "SELECT 1"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("SSL connection"), "{out}");
    // libpq's default, sslmode=prefer, gets TLS when it is offered.
    let (ok, out, err) = psql(allow.port, "host=localhost", &["\\conninfo"]);
    assert!(ok && out.contains("SSL connection"), "{out}{err}");
}

/// SSLRequest: length 8, code 80877103; GSSENCRequest: code 80877104.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
const GSSENC_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];

/// Everything the peer sends until it closes the connection.
async fn read_to_close(stream: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut all = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut all),
    );
    // A reset instead of a clean close still ends the connection.
    let _ = read.await.expect("the router closes the connection");
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_tls_clients_are_closed_and_others_served() {
    let env = common::shared_env();
    let certs = Certs::new("misbehave");
    let router = Router::start_with(&env.map, &certs.section("require"));
    let ca = certs.path("ca.pem");
    let bystander = connect_tls(&router, &ca).await.expect("TLS session");
    let addr = ("127.0.0.1", router.port);

    // Bytes sent after the SSLRequest, before its answer, were not encrypted: refused.
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut early = SSL_REQUEST.to_vec();
    early.extend_from_slice(b"\0\0\0\x08injected");
    s.write_all(&early).await.expect("write");
    let answer = read_to_close(&mut s).await;
    assert_eq!(answer.first(), Some(&b'E'), "{answer:?}");
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.contains("08P01") && text.contains("received unencrypted data after SSL request"),
        "{text}"
    );

    // Garbage where the TLS handshake should be.
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(&SSL_REQUEST).await.expect("write");
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).await.expect("answer");
    assert_eq!(&answer, b"S");
    s.write_all(&[0x42; 300]).await.expect("write garbage");
    read_to_close(&mut s).await;
    router.wait_for_log("TLS handshake failed", 1);

    // GSSAPI encryption is refused, then TLS is offered, as libpq's gssencmode=prefer expects;
    // a second SSLRequest inside TLS is a protocol violation.
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(&GSSENC_REQUEST).await.expect("write");
    s.read_exact(&mut answer).await.expect("answer");
    assert_eq!(&answer, b"N");
    s.write_all(&SSL_REQUEST).await.expect("write");
    s.read_exact(&mut answer).await.expect("answer");
    assert_eq!(&answer, b"S");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(trusting(&ca))
        .connect(name, s)
        .await
        .expect("TLS handshake");
    tls.write_all(&SSL_REQUEST).await.expect("write");
    tls.flush().await.expect("flush");
    let answer = read_to_close(&mut tls).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(
        answer.first() == Some(&b'E')
            && text.contains("08P01")
            && text.contains("already encrypted"),
        "{text}"
    );

    // Nobody else noticed.
    assert_eq!(one_value(&bystander, "SELECT 7").await, "7");
    assert!(router.is_alive());
}

/// A cluster whose Postgres has `ssl = on` with a certificate for 127.0.0.1 signed by
/// `certs`' CA; with `tls_only`, its pg_hba.conf refuses every TCP login without TLS.
fn tls_cluster(certs: &Certs, tls_only: bool) -> (pgharness::Cluster, ShardMap) {
    let n = CA_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ca = TestCa::new(&format!("shard CA {n}")).expect("CA");
    ca.write(&certs.path("shard-ca.pem"))
        .expect("write the shard CA");
    let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
        shards: 2,
        servers: 1,
        schema_sql: Some(pgharness::Schema::Sql(common::SCHEMA.into())),
        server: pgharness::ServerOptions {
            tls: Some(ca.issue(&["127.0.0.1", "localhost"]).expect("issue")),
            hba: if tls_only {
                vec!["hostnossl all all all reject".into()]
            } else {
                Vec::new()
            },
            ..Default::default()
        },
        ..Default::default()
    })
    .expect("start a TLS cluster");
    let map = ShardMap::even_split(&cluster.shard_urls(), common::tables()).expect("map");
    (cluster, map)
}

fn backend_section(sslmode: &str, ca: Option<&Path>) -> String {
    let ca = ca.map_or(String::new(), |ca| format!("ca = \"{}\"\n", ca.display()));
    format!("[backend]\nsslmode = \"{sslmode}\"\n{ca}[pool]\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_verify_full_reaches_a_postgres_that_only_accepts_tls() {
    let certs = Certs::new("backend");
    let (_cluster, map) = tls_cluster(&certs, true);
    let shard_ca = certs.path("shard-ca.pem");

    let router = Router::start_with(&map, &backend_section("verify-full", Some(&shard_ca)));
    let client = router.connect().await;
    assert_eq!(
        one_value(
            &client,
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        )
        .await,
        "t"
    );
    for id in 1..=20 {
        client
            .simple_query(&format!("INSERT INTO kv VALUES ({id}, 'v{id}')"))
            .await
            .expect("insert over TLS to the shards");
    }
    // A read on both shards, and a big answer through TLS records.
    assert_eq!(one_value(&client, "SELECT count(*) FROM kv").await, "20");
    let big = one_value(
        &client,
        "SELECT length(string_agg(md5(g::text), '')) FROM generate_series(1, 50000) g",
    )
    .await;
    assert_eq!(big, "1600000");
    let stmt = client
        .prepare("SELECT v FROM kv WHERE id = $1")
        .await
        .expect("prepare");
    let row = client.query_one(&stmt, &[&7_i64]).await.expect("execute");
    assert_eq!(row.get::<_, String>(0), "v7");

    // Without TLS, Postgres refuses the router's login: the client is told which shard and why.
    let plain = Router::start_with(&map, &backend_section("disable", None));
    let client = plain.connect().await;
    let (code, message) = refused(
        &client,
        "SELECT v FROM kv WHERE id = 7",
        "the shard refuses plaintext",
    )
    .await;
    assert_eq!(code, "08001", "{message}");
    assert!(
        message.contains("pg_hba.conf rejects connection") && message.contains("no encryption"),
        "{message}"
    );

    // Another CA than the one that signed the shard's certificate.
    let wrong = Router::start_with(
        &map,
        &backend_section("verify-full", Some(&certs.path("ca.pem"))),
    );
    let client = wrong.connect().await;
    let (code, message) = refused(&client, "SELECT v FROM kv WHERE id = 7", "an unknown CA").await;
    assert_eq!(code, "08001", "{message}");
    assert!(message.contains("invalid peer certificate"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_require_needs_a_server_with_tls() {
    let env = common::shared_env();
    let router = Router::start_with(&env.map, &backend_section("require", None));
    let client = router.connect().await;
    let (code, message) = refused(&client, "SELECT 1", "the shards have ssl = off").await;
    assert_eq!(code, "08001", "{message}");
    assert!(
        message.contains("does not accept TLS") && message.contains("sslmode = \"require\""),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_verify_full_does_not_reuse_plain_connections() {
    let certs = Certs::new("backend-reload");
    let (_cluster, map) = tls_cluster(&certs, false);
    let router = Router::start_single_pool(&map, 2, "");
    let client = router.connect().await;
    let ssl = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
    assert_eq!(one_value(&client, ssl).await, "f");

    let path = router.config_path();
    let text = std::fs::read_to_string(&path).expect("read router.toml");
    let text = text.replacen(
        "[backend]\n",
        &format!(
            "[backend]\nsslmode = \"verify-full\"\nca = \"{}\"\n",
            certs.path("shard-ca.pem").display()
        ),
        1,
    );
    std::fs::write(&path, text).expect("write router.toml");
    router.signal(libc::SIGHUP);
    router.wait_for_log("reloaded:", 1);
    for _ in 0..4 {
        assert_eq!(
            one_value(&client, ssl).await,
            "t",
            "a plain connection was reused"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_the_certificate_for_new_clients() {
    let env = common::shared_env();
    let certs = Certs::new("reload");
    let router = Router::start_with(&env.map, &certs.section("require"));
    let (old_ca, new_ca) = (certs.path("ca.pem"), certs.path("ca2.pem"));
    let session = connect_tls(&router, &old_ca).await.expect("TLS session");
    assert_eq!(one_value(&session, "SELECT 1").await, "1");

    certs.issue_router_cert("ca2.pem");
    router.signal(libc::SIGHUP);
    let reloaded = router.wait_for_log("reloaded:", 1);
    assert!(
        reloaded[0].contains("TLS files read again (clients: require, shards: disable)"),
        "{reloaded:?}"
    );

    let (ok, _, err) = psql(
        router.port,
        &verify_full("localhost", &old_ca),
        &["SELECT 1"],
    );
    assert!(!ok && err.contains("certificate verify failed"), "{err}");
    let (ok, out, err) = psql(
        router.port,
        &verify_full("localhost", &new_ca),
        &["SELECT 1"],
    );
    assert!(ok && out.trim() == "1", "{err}");
    assert_eq!(
        one_value(&session, "SELECT 2").await,
        "2",
        "the old session goes on"
    );

    // A broken key is refused at reload; the certificate loaded last keeps serving.
    std::fs::write(certs.path("router.key"), "not a key\n").expect("break the key");
    router.signal(libc::SIGHUP);
    let refused = router.wait_for_log("reload refused", 1);
    assert!(
        refused[0].contains("router.toml:")
            && refused[0].contains("tls.key")
            && refused[0].contains("holds no private key"),
        "{refused:?}"
    );
    let (ok, out, err) = psql(
        router.port,
        &verify_full("localhost", &new_ca),
        &["SELECT 3"],
    );
    assert!(ok && out.trim() == "3", "{err}");
    assert_eq!(one_value(&session, "SELECT 4").await, "4");
}
