//! The front door under storms and abuse: a reconnect storm of thousands of simultaneous logins
//! all gets in; a slowloris (more silent sockets than `[limits] max_logins`, held and renewed)
//! never makes a bystander's login fail; a silent socket is closed after `startup_timeout_ms`;
//! a refusal for `max_clients` comes after the startup message, so drivers see `53300`; each
//! with TLS as well; a router out of file descriptors closes the oldest connections still
//! logging in rather than locking everyone out. Also: a second router may share the port only
//! with `reuse_port = true`.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tls::{connect_tls, Certs};
use common::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The SSLRequest packet.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Opens a TCP connection to `port` from source address `from`.
async fn connect_from(from: &str, port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse().expect("address"), 0))?;
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
}

/// Reads until the peer closes (or resets) the connection.
async fn until_closed(stream: &mut TcpStream) {
    let mut chunk = [0u8; 256];
    while let Ok(n) = stream.read(&mut chunk).await {
        if n == 0 {
            return;
        }
    }
}

/// `count` attackers from 127.0.0.2, each holding one connection that says nothing (or, with
/// `ssl`, every other one an SSLRequest and then nothing), opened again as soon as the router
/// closes it, until `stop`. Returns how many connections the router closed.
fn slowloris(port: u16, count: usize, ssl: bool, stop: Arc<AtomicBool>) -> Arc<AtomicUsize> {
    let closed = Arc::new(AtomicUsize::new(0));
    for i in 0..count {
        let (stop, closed) = (stop.clone(), closed.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut stream) = connect_from("127.0.0.2", port).await else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if ssl && i % 2 == 1 && stream.write_all(&SSL_REQUEST).await.is_err() {
                    continue;
                }
                tokio::select! {
                    () = until_closed(&mut stream) => {
                        closed.fetch_add(1, Ordering::Relaxed);
                    }
                    () = async { while !stop.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    } } => return,
                }
            }
        });
    }
    closed
}

/// Logs in every 200 ms for `attempts` times, each a new connection that runs `SELECT 1` (with
/// TLS when `ca` is given); returns the failures, each with its error.
async fn bystander(router: &Router, attempts: usize, ca: Option<&std::path::Path>) -> Vec<String> {
    let mut failures = Vec::new();
    for _ in 0..attempts {
        let started = Instant::now();
        let login = async {
            let client = match ca {
                Some(ca) => connect_tls(router, ca).await,
                None => common::connect(&router.url()).await,
            }
            .map_err(|e| format!("{e:?}"))?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| format!("{e:?}"))?;
            Ok::<(), String>(())
        };
        match tokio::time::timeout(Duration::from_secs(20), login).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push("no answer within 20 s".to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200).saturating_sub(started.elapsed())).await;
    }
    failures
}

/// The router's log lines about connections from the bystander's address (the attackers'
/// is 127.0.0.2); `login failed` lines for closing to make room are logged at debug level.
fn bystander_lines(router: &Router) -> String {
    let text = router.log_text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("127.0.0.1:")).collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

async fn slowloris_locks_nobody_out(tls: bool) {
    // The case: 1,200 silent sockets against 1,000 places.
    const ATTACKERS: usize = 1200;
    const MAX_LOGINS: usize = 1000;
    let env = common::shared_env();
    let certs = Certs::new(if tls { "slowloris-tls" } else { "slowloris" });
    let http = common::free_port();
    let router = Router::start_with(
        &env.map,
        &format!(
            "[limits]\nmax_logins = {MAX_LOGINS}\nstartup_timeout_ms = 1500\n\
             [http]\nlisten = \"127.0.0.1:{http}\"\n{}",
            if tls {
                certs.section("allow")
            } else {
                String::new()
            }
        ),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let closed = slowloris(router.port, ATTACKERS, tls, stop.clone());
    // Let the attackers fill the room before the bystander comes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, metrics) = common::http_get(http, "/metrics");
    let waiting = common::metric(&metrics, "shardgate_client_logins_in_progress");
    assert!(
        waiting <= MAX_LOGINS as f64,
        "{waiting} connections logging in, more than max_logins"
    );
    let ca = certs.path("ca.pem");
    let failures = bystander(&router, 25, tls.then_some(ca.as_path())).await;
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "the bystander's failed logins; what the router logged of its address (127.0.0.1):\n{}",
        bystander_lines(&router)
    );
    // The attackers were pushed out to make room, far more often than they were.
    let closed = closed.load(Ordering::Relaxed);
    assert!(
        closed >= ATTACKERS,
        "the router closed only {closed} silent connections of {ATTACKERS}"
    );
    let (_, metrics) = common::http_get(http, "/metrics");
    let refused = common::metric(&metrics, "shardgate_client_connections_refused_total");
    assert!(
        refused >= closed as f64 / 2.0,
        "{refused} counted, {closed} closed"
    );
    // More attackers than places: most were closed to make room, not by the startup timeout.
    let made_room = common::metric(&metrics, "shardgate_client_logins_closed_total");
    assert!(
        made_room >= (ATTACKERS - MAX_LOGINS) as f64,
        "{made_room} closed to make room"
    );
    assert!(router.is_alive());
    assert!(!router.log_text().contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_of_more_sockets_than_max_logins_never_fails_a_bystander() {
    slowloris_locks_nobody_out(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_never_fails_a_bystander_that_logs_in_with_tls() {
    slowloris_locks_nobody_out(true).await;
}

/// A router whose open-file limit is lowered under it (to 200) while silent sockets take every
/// descriptor: accepting closes the oldest of them, and a bystander still logs in every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_oldest_silent_connections_make_room() {
    let env = common::shared_env();
    let router = Router::start_with(&env.map, "");
    let pid = router.pid().expect("running").to_string();
    let lowered = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=200:200"])
        .status()
        .expect("run prlimit");
    assert!(lowered.success(), "prlimit failed");
    let stop = Arc::new(AtomicBool::new(false));
    let closed = slowloris(router.port, 400, false, stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let failures = bystander(&router, 10, None).await;
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "the bystander's failed logins; what the router logged of its address (127.0.0.1):\n{}",
        bystander_lines(&router)
    );
    assert!(
        closed.load(Ordering::Relaxed) > 0,
        "no silent connection was closed"
    );
    assert!(router.is_alive());
}

/// `clients` log in at the same moment (with TLS when `ca` is given) and each runs `SELECT 1`;
/// returns the failures.
async fn storm(router: &Router, clients: usize, ca: Option<&std::path::Path>) -> Vec<String> {
    let go = Arc::new(tokio::sync::Barrier::new(clients));
    let url = router.url();
    let ca = ca.map(|p| p.to_path_buf());
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (go, url, ca) = (go.clone(), url.clone(), ca.clone());
            let port = router.port;
            tokio::spawn(async move {
                go.wait().await;
                let client = match &ca {
                    Some(ca) => common::tls::connect_tls_to(port, ca).await,
                    None => common::connect(&url).await,
                }
                .map_err(|e| format!("{}: {e:?}", common::sqlstate(&e)))?;
                client
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|e| format!("{e:?}"))?;
                // Held until every client is in, as after a fleet restart.
                Ok::<_, String>(client)
            })
        })
        .collect();
    let mut failures = Vec::new();
    let mut held = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(client)) => held.push(client),
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(format!("task: {e}")),
        }
    }
    failures
}

/// Why logins failed, by what the router's log says, for a failure's message.
fn login_failures(router: &Router) -> String {
    let mut why = std::collections::BTreeMap::<String, usize>::new();
    for line in router.log_text().lines() {
        if let Some((_, e)) = line.split_once("login failed: ") {
            let e = e.split(" peer=").next().unwrap_or(e);
            *why.entry(e.to_string()).or_default() += 1;
        }
    }
    format!("{why:?}")
}

/// Every one of `clients` logging in at once (with TLS under `certs`) gets in.
async fn storm_all_gets_in(clients: usize, certs: Option<&Certs>) {
    let env = common::shared_env();
    let section = certs.map_or(String::new(), |c| c.section("require"));
    let router = Router::start_with(&env.map, &section);
    let ca = certs.map(|c| c.path("ca.pem"));
    let failures = storm(&router, clients, ca.as_deref()).await;
    assert_eq!(
        failures.len(),
        0,
        "{} of {clients} failed, first: {:?}; the router says {}",
        failures.len(),
        failures.first(),
        login_failures(&router)
    );
    assert!(router.is_alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_storm_all_gets_in() {
    storm_all_gets_in(2000, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_storm_with_tls_all_gets_in() {
    storm_all_gets_in(1000, Some(&Certs::new("storm-tls"))).await;
}

/// A socket that says nothing is closed after `startup_timeout_ms`, long before the login
/// timeout; one that sent an SSLRequest and then nothing is too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_socket_is_closed_at_the_startup_timeout() {
    let env = common::shared_env();
    let certs = Certs::new("silent");
    let router = Router::start_with(
        &env.map,
        &format!(
            "[limits]\nstartup_timeout_ms = 300\nlogin_timeout_ms = 600000\n{}",
            certs.section("allow")
        ),
    );
    let mut silent = connect_from("127.0.0.1", router.port)
        .await
        .expect("connect");
    let mut after_ssl = connect_from("127.0.0.1", router.port)
        .await
        .expect("connect");
    after_ssl.write_all(&SSL_REQUEST).await.expect("SSLRequest");
    let mut answer = [0u8; 1];
    after_ssl.read_exact(&mut answer).await.expect("answer");
    assert_eq!(&answer, b"S");
    for stream in [&mut silent, &mut after_ssl] {
        tokio::time::timeout(Duration::from_secs(60), until_closed(stream))
            .await
            .expect("closed long before the 10-minute login timeout");
    }
    // A real client is not hurried: it logs in and works.
    let client = router.connect().await;
    client.simple_query("SELECT 1").await.expect("serves");
}

/// Past `max_clients` the refusal is sent after the startup message (and after TLS), so the
/// driver reports its SQLSTATE and message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_clients_is_refused_with_53300_after_the_startup_message() {
    let env = common::shared_env();
    let certs = Certs::new("max-clients");
    let router = Router::start_with(
        &env.map,
        &format!("[limits]\nmax_clients = 1\n{}", certs.section("allow")),
    );
    let first = router.connect().await;
    let Err(plain) = common::connect(&router.url()).await else {
        panic!("a second client got in past max_clients = 1");
    };
    assert_eq!(common::sqlstate(&plain), "53300", "{plain:?}");
    assert!(
        format!("{plain:?}").contains("too many clients already"),
        "{plain:?}"
    );
    let Err(tls) = connect_tls(&router, &certs.path("ca.pem")).await else {
        panic!("a second client got in with TLS past max_clients = 1");
    };
    assert_eq!(common::sqlstate(&tls), "53300", "{tls:?}");
    first
        .simple_query("SELECT 1")
        .await
        .expect("the first goes on");
}

/// With `reuse_port = true` a second router starts on the same address (and says the port may
/// be shared); without it the second one refuses (tests/lifecycle.rs).
#[test]
fn reuse_port_lets_a_second_router_share_the_address() {
    let env = common::shared_env();
    let router = Router::start_with(&env.map, "reuse_port = true\n");
    let log = router.dir.join("second.log");
    let config = router.config_path();
    let mut launch = pgharness::router::Launch::new(
        std::path::Path::new(common::shardgate_bin()),
        &config,
        &log,
    );
    launch.threads = Some(1);
    let second = pgharness::router::start(&launch)
        .unwrap_or_else(|e| panic!("the second router with reuse_port = true: {e}"));
    let text = second.log_text();
    assert!(
        text.contains("reuse_port = true: another process may listen on this address too"),
        "{text}"
    );
    assert!(router.is_alive());
    drop(second);
    assert!(router.is_alive());
}

/// The open-file limit is raised to the hard limit at start, and the log says so.
#[test]
fn the_open_file_limit_is_raised_and_logged() {
    let env = common::shared_env();
    let router = Router::start_with(&env.map, "");
    let line = router.wait_for_log("open-file limit (RLIMIT_NOFILE)", 1);
    assert!(
        line[0].contains("raised:") || line[0].contains("already at its hard limit"),
        "{line:?}"
    );
}
