//! The shell scripts of benches/ and deploy/ are valid bash, and every bench script answers
//! `--help` with its usage without starting anything (they take minutes and real servers, so
//! the test suite runs them no further; docs/benchmarks.md has their results).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

fn scripts(dir: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    found.sort();
    found
}

#[test]
fn every_script_parses() {
    let all: Vec<PathBuf> = ["benches", "deploy/aws/scripts"]
        .iter()
        .flat_map(|d| scripts(d))
        .collect();
    assert!(all.len() >= 8, "scripts found: {all:?}");
    for script in all {
        let out = Command::new("bash")
            .arg("-n")
            .arg(&script)
            .output()
            .expect("bash");
        assert!(
            out.status.success(),
            "{}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_bench_script_explains_itself() {
    // lib.sh is what the scripts source, not a script of its own.
    let benches = scripts("benches");
    assert!(benches.iter().any(|s| s.ends_with("lib.sh")));
    for script in benches.into_iter().filter(|s| !s.ends_with("lib.sh")) {
        let out = Command::new("bash")
            .arg(&script)
            .arg("--help")
            .output()
            .expect("bash");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.to_lowercase().contains("usage:"),
            "{} --help: {}{}",
            script.display(),
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
