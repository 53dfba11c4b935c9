//! Leak handling: a server kept in a never-dropped static is stopped and deleted at process exit,
//! and one left by a crashed process is removed by the next sweep (child processes run the leaks).

use std::sync::OnceLock;

use pgharness::{Server, ServerOptions};

static SERVER: OnceLock<Server> = OnceLock::new();

#[test]
#[ignore = "run by exit_hook_cleans_up_statics in a child process"]
fn leak_a_static_server() {
    let server =
        SERVER.get_or_init(|| Server::start(&ServerOptions::default()).expect("start server"));
    // Tell the parent where the server lives.
    println!("LEAKED {} {}", server.port(), server.dir().display());
    if std::env::var_os("PGHARNESS_TEST_ABORT").is_some() {
        // A crash: no destructors, no atexit hooks (and, unlike abort(), no core file).
        // SAFETY: _exit only ends the process.
        unsafe { libc::_exit(70) };
    }
}

/// Runs `leak_a_static_server` in a child process; returns the leaked server's port and dir.
fn run_child(abort: bool) -> (u16, std::path::PathBuf) {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        "leak_a_static_server",
        "--nocapture",
        "--test-threads=1",
    ]);
    if abort {
        cmd.env("PGHARNESS_TEST_ABORT", "1");
    }
    let out = cmd.output().expect("run child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.success(),
        !abort,
        "child: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("LEAKED ").map(|(_, rest)| rest))
        .expect("child printed its server");
    let (port, dir) = line.split_once(' ').expect("port and dir");
    (port.parse().expect("port"), dir.into())
}

#[test]
fn exit_hook_cleans_up_statics() {
    let (port, dir) = run_child(false);
    assert!(
        !dir.exists(),
        "{} survived the child process",
        dir.display()
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still open"
    );
}

#[test]
fn sweep_cleans_up_after_crashed_processes() {
    let (port, dir) = run_child(true);
    assert!(
        dir.exists(),
        "the crashed child's server dir should still be there"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "the crashed child's server should still run"
    );
    pgharness::sweep_stale();
    assert!(!dir.exists(), "{} survived the sweep", dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still open after the sweep"
    );
}
