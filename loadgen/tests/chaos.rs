//! `benches/chaos.sh --schedule short` end to end, as CI runs it: a fleet of 3 routers over 12
//! shards (4 servers, a standby, the fault proxy), `loadgen chaos` through all routers while a
//! router is SIGKILLed and restarted, a primary restarted, a shard's connections cut, a shard
//! slowed and a server failed over to its standby; then every invariant must hold on the
//! shards (bank total, acknowledged inserts exactly once, counters, no prepared transaction
//! left) and every fault must have been applied. Latency and error counts are reported, never
//! asserted: the machine is shared.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Builds shardgate-cluster beside the test's loadgen (a no-op when it is fresh).
fn cluster_bin(root: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-q", "-p", "shardgate-cluster"])
        .current_dir(root)
        .status()
        .expect("run cargo build -p shardgate-cluster");
    assert!(status.success(), "cargo build -p shardgate-cluster failed");
    let bin = common::shardgate_bin().with_file_name("shardgate-cluster");
    assert!(bin.is_file(), "{} was not built", bin.display());
    bin
}

#[test]
fn a_short_chaos_schedule_keeps_every_invariant() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let shardgate = common::shardgate_bin();
    let cluster = cluster_bin(root);
    let loadgen = PathBuf::from(env!("CARGO_BIN_EXE_loadgen"));
    // chaos.sh takes the three from one directory: the test's own debug builds.
    let bin_dir = common::scratch("chaos-bin");
    for bin in [&shardgate, &cluster, &loadgen] {
        let name = bin.file_name().expect("a file name");
        std::os::unix::fs::symlink(bin, bin_dir.join(name)).expect("link a binary");
    }
    let out = common::scratch("chaos-out");
    let run = Command::new("bash")
        .arg(root.join("benches/chaos.sh"))
        .args(["--schedule", "short", "--duration", "80", "--rate", "150"])
        .args(["--connections", "8", "--shards", "12", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("run benches/chaos.sh");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    println!("{stdout}\n{stderr}");
    let report = std::fs::read_to_string(out.join("chaos.json"))
        .unwrap_or_else(|e| panic!("no chaos.json ({e}):\n{stdout}\n{stderr}"));
    let report: serde_json::Value = serde_json::from_str(&report).expect("chaos.json is JSON");
    let invariants = report["invariants"].as_array().expect("invariants");
    assert_eq!(invariants.len(), 6, "{invariants:?}");
    for check in invariants {
        assert_eq!(check["held"], true, "{check}\n{stdout}");
    }
    let faults = report["faults"].as_array().expect("faults");
    let names: Vec<&str> = faults.iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(
        names,
        ["router-kill", "primary-restart", "cut", "slow", "failover"]
    );
    for f in faults {
        assert!(f["failure"].is_null(), "a fault was not applied: {f}");
    }
    // The load really ran: most of what was scheduled completed (the stalls of the cut and
    // the failover included).
    let ok = report["total"]["ok"].as_u64().expect("total ok");
    assert!(ok > 150 * 80 / 2, "only {ok} requests completed\n{stdout}");
    assert!(run.status.success(), "chaos.sh failed:\n{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&bin_dir);
    let _ = std::fs::remove_dir_all(&out);
}
