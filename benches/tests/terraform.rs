//! The Terraform under `deploy/aws` is formatted (`terraform fmt -check`), and the provider-free
//! layout module validates and passes its own tests (`terraform test`) offline. Where the
//! `terraform` binary is missing (a clean CI machine: it is not a Debian package and providers
//! cannot be downloaded here anyway) the test says plainly which checks it could not run.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// `terraform ARGS` in `dir`, its data dir in `data` (never in the repository); (success, output).
fn terraform(dir: &Path, data: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("terraform")
        .arg(format!("-chdir={}", dir.display()))
        .args(args)
        .env("TF_DATA_DIR", data)
        .env("TF_IN_AUTOMATION", "1")
        .env("NO_COLOR", "1")
        .output()
        .expect("terraform runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_layout_module_passes_fmt_validate_and_its_tests_offline() {
    let found = Command::new("terraform").arg("version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "NOT RUN: terraform is not installed, so `terraform fmt -check -recursive deploy/aws` \
             and `terraform init/validate/test` of deploy/aws/modules/layout were skipped"
        );
        return;
    }
    let data = std::env::temp_dir().join(format!("shardgate-tf-{}", std::process::id()));
    let aws = root().join("deploy/aws");
    let (ok, out) = terraform(&aws, &data, &["fmt", "-check", "-recursive", "-diff"]);
    assert!(ok, "terraform fmt -check found unformatted files:\n{out}");
    let layout = aws.join("modules/layout");
    for args in [
        &["init", "-input=false", "-backend=false"][..],
        &["validate", "-no-color"][..],
        &["test", "-no-color"][..],
    ] {
        let (ok, out) = terraform(&layout, &data, args);
        assert!(ok, "terraform {args:?} failed:\n{out}");
        if args[0] == "test" {
            assert!(out.contains("0 failed"), "{out}");
        }
    }
    let _ = std::fs::remove_dir_all(&data);
}
