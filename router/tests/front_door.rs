//! The front door: connections that have not logged in are capped (`[limits] max_logins`) and
//! closed after `login_timeout_ms`, so a crowd of silent sockets cannot make a real client
//! wait; a second router may share the port only with `reuse_port = true`.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Router;

/// Reads what the router sends on a socket that says nothing, until it closes the socket;
/// `None` when it is still open after `bound` (a hang).
fn read_until_closed(mut socket: TcpStream, bound: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + bound;
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match socket.read(&mut chunk) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(got),
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_are_capped_and_timed_out_and_never_block_a_real_login() {
    const SILENT: usize = 300;
    const MAX_LOGINS: usize = 20;
    let env = common::shared_env();
    let http = common::free_port();
    let router = Router::start_with(
        &env.map,
        &format!("[limits]\nmax_logins = {MAX_LOGINS}\nlogin_timeout_ms = 2000\n[http]\nlisten = \"127.0.0.1:{http}\"\n"),
    );
    let port = router.port;
    let silent: Vec<TcpStream> = (0..SILENT)
        .map(|i| {
            TcpStream::connect(("127.0.0.1", port))
                .unwrap_or_else(|e| panic!("silent socket {i}: {e}"))
        })
        .collect();

    // A real client now logs in or is refused with 53300, at once either way (the bound only
    // catches a hang; the login timeout is 2 s and nothing may wait for it).
    let real = tokio::time::timeout(Duration::from_secs(20), common::connect(&router.url()))
        .await
        .expect("a real client is answered while the silent sockets wait");
    match real {
        Ok(client) => {
            client.simple_query("SELECT 1").await.expect("serves");
        }
        Err(e) => assert_eq!(common::sqlstate(&e), "53300", "{e:?}"),
    }

    // Every silent socket is closed: beyond the cap at once with a 53300, within it at the
    // login timeout.
    let ends = tokio::task::spawn_blocking(move || {
        silent
            .into_iter()
            .map(|s| read_until_closed(s, Duration::from_secs(30)))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    let hung = ends.iter().filter(|e| e.is_none()).count();
    assert_eq!(hung, 0, "silent sockets the router never closed");
    let refused = ends
        .iter()
        .flatten()
        .filter(|bytes| String::from_utf8_lossy(bytes).contains("53300"))
        .count();
    // The real client may have taken one of the places.
    assert!(
        refused >= SILENT - MAX_LOGINS - 1,
        "only {refused} of {SILENT} silent sockets were refused at the door"
    );
    let timed_out = router.wait_for_log("did not finish logging in within 2s", 1);
    assert!(!timed_out.is_empty());

    // The door is free again: a real client logs in.
    let client = router.connect().await;
    let rows = common::rows(&client.simple_query("SELECT 1").await.expect("select"));
    assert_eq!(rows, vec![vec!["1".to_string()]]);
    // Each refusal at the door is counted.
    let (_, metrics) = common::http_get(http, "/metrics");
    let counted = common::metric(&metrics, "shardgate_client_connections_refused_total");
    assert!(
        counted >= refused as f64,
        "{counted} counted, {refused} refused"
    );
    assert!(router.is_alive());
    assert!(!router.log_text().contains("panicked"));
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
