//! Integration tests of single throw-away servers.

use std::net::TcpStream;
use std::time::Duration;

use pgharness::{Server, ServerOptions};

#[test]
fn starts_and_answers_queries() {
    let server = Server::start(&ServerOptions::default()).expect("start server");
    assert_eq!(server.psql("postgres", "SELECT 1 + 1").expect("query"), "2");
    assert_eq!(
        server
            .psql("postgres", "SHOW fsync; SHOW max_connections")
            .expect("query"),
        "off\n200"
    );
    assert!(server.url("app").starts_with(&format!(
        "postgres://postgres:postgres@127.0.0.1:{}/app",
        server.port()
    )));
    // TCP with the password works too (what routers use).
    let out = std::process::Command::new(server.bin("psql"))
        .args(["-X", "-At", "-c", "SELECT current_user, inet_server_port()"])
        .arg(server.url("postgres"))
        .env_remove("PGPASSWORD")
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql over TCP failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("postgres|{}", server.port())
    );
}

#[test]
fn sql_errors_carry_psql_stderr() {
    let server = Server::start(&ServerOptions::default()).expect("start server");
    let err = server
        .psql("postgres", "SELECT * FROM no_such_table")
        .unwrap_err();
    assert!(err.to_string().contains("no_such_table"), "{err}");
}

#[test]
fn dropped_server_closes_port_and_removes_dir() {
    let server = Server::start(&ServerOptions::default()).expect("start server");
    let port = server.port();
    let dir = server.dir().to_path_buf();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
    drop(server);
    assert!(!dir.exists(), "{} still exists", dir.display());
    let refused =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1));
    assert!(refused.is_err(), "port {port} still accepts connections");
}

#[test]
fn stop_and_restart_keeps_data() {
    let mut server = Server::start(&ServerOptions::default()).expect("start server");
    server
        .psql(
            "postgres",
            "CREATE TABLE t (x int); INSERT INTO t VALUES (7)",
        )
        .expect("create");
    server.stop().expect("stop");
    assert!(!server.is_running());
    assert_eq!(server.readiness(), pgharness::Readiness::NoResponse);
    server.restart().expect("restart");
    assert_eq!(server.readiness(), pgharness::Readiness::Accepting);
    assert_eq!(
        server.psql("postgres", "SELECT x FROM t").expect("select"),
        "7"
    );
}

#[test]
fn fixed_port_in_use_is_a_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let err = Server::start(&ServerOptions {
        port: Some(port),
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        matches!(err, pgharness::Error::PortInUse { port: p } if p == port),
        "{err}"
    );
}
