//! Helpers shared by the integration tests: run the `shardgate-cluster` binary of this package,
//! find free ports, and a cluster directory that is cleaned up however the test ends.

// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const CLUSTER: &str = env!("CARGO_BIN_EXE_shardgate-cluster");

pub fn free_port() -> u16 {
    pgharness::free_port().expect("a free port")
}

/// The router binary, next to `shardgate-cluster` in the same target profile directory. Cargo
/// does not build other packages' binaries for a test, so build it here; this is a no-op when it
/// is fresh. (Cargo releases its build lock before it runs tests, so nesting is safe.)
pub fn router_binary() -> PathBuf {
    let cluster = Path::new(CLUSTER);
    let release = cluster
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|n| n == "release");
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.."));
    pgharness::router::build(root, release).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `shardgate-cluster ARGS` and returns its output; stdout/stderr are echoed for failures.
pub fn cluster(router: &Path, args: &[&str]) -> Output {
    let out = Command::new(CLUSTER)
        .args(args)
        .env("SHARDGATE_BIN", router)
        .output()
        .expect("running shardgate-cluster");
    println!(
        "$ cluster {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn pid_alive(pid: u32) -> bool {
    pgharness::proc::alive(pid)
}

/// The cluster directory; removed on drop, after a best-effort `down` if the test failed midway.
pub struct Dir {
    pub path: PathBuf,
    /// The router binary, for `down`; empty in tests that start no router.
    pub router: PathBuf,
}

impl Drop for Dir {
    fn drop(&mut self) {
        if self.path.join("cluster.json").exists() {
            let _ = Command::new(CLUSTER)
                .arg("down")
                .arg("--dir")
                .arg(&self.path)
                .env("SHARDGATE_BIN", &self.router)
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A free port whose next `n - 1` ports are free too.
pub fn free_ports(n: u16) -> u16 {
    for _ in 0..100 {
        let p = free_port();
        if p.checked_add(n).is_some() && (1..n).all(|k| pgharness::check_port_free(p + k).is_ok()) {
            return p;
        }
    }
    panic!("no {n} free ports in a row");
}
