//! Tests of reading TLS material: good files load, every bad one is named with the line of
//! its setting, and a pool can tell whether the shards' CA changed.

use std::path::{Path, PathBuf};

use pgharness::tls::TestCa;

use super::*;
use crate::config::{SslMode, TlsMode};

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir =
            std::env::temp_dir().join(format!("shardgate-tls-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test dir");
        Dir(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.path(file), text).expect("write a test file");
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA (`ca.pem`) and a certificate it signed for localhost (`router.pem`, `router.key`).
fn files(dir: &Dir) -> TestCa {
    let ca = TestCa::new("shardgate test CA").expect("CA");
    ca.write(&dir.path("ca.pem")).expect("write CA");
    ca.issue(&["localhost", "127.0.0.1"])
        .expect("issue")
        .write(&dir.path("router.pem"), &dir.path("router.key"))
        .expect("write cert");
    ca
}

/// The config in `dir` with `tls` appended (lines 1-5 are the minimal config).
fn config(dir: &Dir, tls: &str) -> Config {
    let text =
        format!("shardmap = \"shardmap.toml\"\ndatabase = \"app\"\nauth = \"trust\"\n\n\n{tls}");
    crate::config::parse(&text, &dir.path("router.toml")).expect("a valid config")
}

const REQUIRE: &str = "[tls]\nmode = \"require\"\ncert = \"router.pem\"\nkey = \"router.key\"\n";
const VERIFY: &str = "[backend]\nsslmode = \"verify-full\"\nca = \"ca.pem\"\n";

/// Asserts that `shown` has a problem at `at` (`:LINE: setting`) that says `words`.
fn assert_problem(shown: &str, at: &str, words: &str) {
    assert!(
        shown.lines().any(|l| l.contains(at) && l.contains(words)),
        "no {at:?} problem with {words:?} in:\n{shown}"
    );
}

fn load_err(c: &Config) -> String {
    match load(c) {
        Ok(m) => panic!("expected problems, loaded {m:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn good_files_load() {
    let dir = Dir::new("good");
    files(&dir);
    let m = load(&config(&dir, &format!("{REQUIRE}{VERIFY}"))).expect("loads");
    assert_eq!(m.clients.as_ref().map(|c| c.mode), Some(TlsMode::Require));
    assert_eq!(m.backend.mode, SslMode::VerifyFull);
    assert!(m.backend.client_config().is_some());
    let plain = load(&config(&dir, "")).expect("loads");
    assert!(plain.clients.is_none());
    assert_eq!(plain.backend, BackendTls::disabled());
    assert!(plain.backend.client_config().is_none());
    assert_eq!(
        files_of(&config(&dir, &format!("{REQUIRE}{VERIFY}"))),
        [
            dir.path("router.pem"),
            dir.path("router.key"),
            dir.path("ca.pem")
        ]
    );
}

fn files_of(c: &Config) -> Vec<PathBuf> {
    super::files(c).into_iter().map(Path::to_path_buf).collect()
}

#[test]
fn missing_and_invalid_files_are_named_at_their_lines() {
    let dir = Dir::new("bad");
    let origin = dir.path("router.toml").display().to_string();
    // Nothing written yet: both files are missing, both reported.
    let shown = load_err(&config(&dir, REQUIRE));
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    assert!(
        lines[0].starts_with(&format!(
            "{origin}:8: tls.cert {}: cannot read it",
            dir.path("router.pem").display()
        )),
        "{shown}"
    );
    assert!(
        lines[1].starts_with(&format!("{origin}:9: tls.key")),
        "{shown}"
    );

    dir.write("router.pem", "not a certificate\n");
    dir.write(
        "router.key",
        "-----BEGIN PRIVATE KEY-----\n%%%\n-----END PRIVATE KEY-----\n",
    );
    let shown = load_err(&config(&dir, REQUIRE));
    assert_problem(&shown, ":8: tls.cert", "holds no certificate");
    assert_problem(&shown, ":9: tls.key", "is not a valid PEM file");

    // A certificate with the key of another one.
    files(&dir);
    let other = TestCa::new("other")
        .expect("CA")
        .issue(&["localhost"])
        .expect("issue");
    dir.write("router.key", &other.key_pem);
    let shown = load_err(&config(&dir, REQUIRE));
    assert!(
        shown.starts_with(&format!("{origin}:9: tls.key"))
            && shown.contains("is not the private key of the certificate in"),
        "{shown}"
    );
    // A key where the certificate should be.
    dir.write("router.pem", &other.key_pem);
    let shown = load_err(&config(&dir, REQUIRE));
    assert_problem(&shown, ":8: tls.cert", "holds no certificate");

    // The shards' CA: missing, then not a certificate authority at all.
    std::fs::remove_file(dir.path("ca.pem")).expect("remove ca.pem");
    let shown = load_err(&config(&dir, &format!("\n\n\n\n{VERIFY}")));
    assert!(
        shown.starts_with(&format!(
            "{origin}:12: backend.ca {}: cannot read it",
            dir.path("ca.pem").display()
        )),
        "{shown}"
    );
    dir.write(
        "ca.pem",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let shown = load_err(&config(&dir, VERIFY));
    assert_problem(
        &shown,
        ":8: backend.ca",
        "cannot be a certificate authority",
    );
}

#[test]
fn a_pool_sees_whether_the_shards_ca_changed() {
    let dir = Dir::new("ca");
    files(&dir);
    let verify = config(&dir, VERIFY);
    let first = load(&verify).expect("loads").backend;
    assert_eq!(
        first,
        load(&verify).expect("loads").backend,
        "same file, same identity"
    );
    let require = load(&config(&dir, "[backend]\nsslmode = \"require\"\n")).expect("loads");
    assert_ne!(first, require.backend);
    assert_ne!(require.backend, BackendTls::disabled());
    files(&dir); // a new CA in the same file
    assert_ne!(
        first,
        load(&verify).expect("loads").backend,
        "a replaced CA is a new identity"
    );
}

/// A one-connection server on 127.0.0.1 that answers the SSLRequest with `answer` and, when
/// that is `S`, echoes everything it reads over TLS.
async fn echo_server(
    answer: u8,
    clients: Option<ClientTls>,
) -> (u16, tokio::task::JoinHandle<std::io::Result<u64>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await?;
        let mut request = [0u8; 8];
        tcp.read_exact(&mut request).await?;
        tcp.write_all(&[answer]).await?;
        let Some(clients) = clients.filter(|_| answer == b'S') else {
            return Ok(0);
        };
        let tls = clients.acceptor.accept(tcp).await?;
        let (mut rd, mut wr) = tokio::io::split(tls);
        let n = tokio::io::copy(&mut rd, &mut wr).await?;
        wr.shutdown().await?;
        Ok(n)
    });
    (port, task)
}

async fn open(
    port: u16,
    host: &str,
    tls: &BackendTls,
) -> Result<crate::backend::stream::BackendStream, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    crate::backend::stream::BackendStream::open(tcp, tls, host)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_exchange_over_tls_writes_and_reads_at_once() {
    use crate::backend::stream::Outgoing;
    let dir = Dir::new("exchange");
    files(&dir);
    let m = load(&config(&dir, &format!("{REQUIRE}{VERIFY}"))).expect("loads");
    let (port, server) = echo_server(b'S', m.clients.clone()).await;
    let mut stream = open(port, "127.0.0.1", &m.backend)
        .await
        .expect("verified by IP");
    assert!(stream.is_tls());
    assert!(
        stream.try_write(b"x").is_err(),
        "TLS never writes around its records"
    );
    // Far more than the socket buffers hold: writing all before reading would deadlock with
    // a server that echoes as it reads.
    let request: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut out = Outgoing::new(&request, 0);
    let mut echoed = bytes::BytesMut::new();
    while echoed.len() < request.len() {
        let want_read = true;
        std::future::poll_fn(|cx| stream.poll_exchange(cx, &mut out, &mut echoed, want_read))
            .await
            .expect("exchange");
    }
    assert!(out.done());
    assert!(
        echoed[..] == request[..],
        "the echo differs from the request"
    );
    tokio::io::AsyncWriteExt::shutdown(&mut stream)
        .await
        .expect("close_notify");
    assert_eq!(
        server.await.expect("server task").expect("server"),
        request.len() as u64
    );
}

#[tokio::test]
async fn verify_full_refuses_another_name_another_ca_and_plain_servers() {
    let dir = Dir::new("refuse");
    files(&dir);
    let m = load(&config(&dir, &format!("{REQUIRE}{VERIFY}"))).expect("loads");
    let (port, _server) = echo_server(b'S', m.clients.clone()).await;
    let err = open(port, "db.example.com", &m.backend)
        .await
        .err()
        .expect("wrong name");
    assert!(
        err.contains("TLS handshake failed")
            && err.contains("not valid for name \"db.example.com\""),
        "{err}"
    );

    let other = Dir::new("refuse-other");
    files(&other);
    let foreign = load(&config(&other, VERIFY)).expect("loads").backend;
    let (port, _server) = echo_server(b'S', m.clients.clone()).await;
    let err = open(port, "localhost", &foreign)
        .await
        .err()
        .expect("another CA");
    assert!(err.contains("invalid peer certificate"), "{err}");

    // `require` does not check the certificate, but never goes without TLS.
    let require = load(&config(&dir, "[backend]\nsslmode = \"require\"\n"))
        .expect("loads")
        .backend;
    let (port, _server) = echo_server(b'S', m.clients.clone()).await;
    assert!(open(port, "db.example.com", &require)
        .await
        .expect("unverified")
        .is_tls());
    let (port, _server) = echo_server(b'N', None).await;
    let err = open(port, "localhost", &require)
        .await
        .err()
        .expect("plain server");
    assert!(
        err.contains("does not accept TLS") && err.contains("sslmode = \"require\""),
        "{err}"
    );
}
