//! The Terraform under `deploy/aws` is formatted (`terraform fmt -check`), and the provider-free
//! modules (layout, config) validate and pass their own tests (`terraform test`) offline. Where the
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
    for module in ["modules/layout", "modules/config"] {
        let dir = aws.join(module);
        let data = data.join(module);
        for args in [
            &["init", "-input=false", "-backend=false"][..],
            &["validate", "-no-color"][..],
            &["test", "-no-color"][..],
        ] {
            let (ok, out) = terraform(&dir, &data, args);
            assert!(ok, "terraform {args:?} in {module} failed:\n{out}");
            if args[0] == "test" {
                assert!(out.contains("0 failed"), "{out}");
            }
        }
    }
    // The root module needs the hashicorp/aws provider, which `init` must download.
    if std::env::var_os("SHARDGATE_TF_ROOT").is_some() {
        for args in [
            &["init", "-input=false", "-backend=false"][..],
            &["validate", "-no-color"][..],
        ] {
            let (ok, out) = terraform(&aws, &data.join("root"), args);
            assert!(ok, "terraform {args:?} in deploy/aws failed:\n{out}");
        }
    } else {
        eprintln!(
            "NOT RUN: terraform init/validate of deploy/aws itself (it needs the hashicorp/aws provider \
             from the registry; set SHARDGATE_TF_ROOT=1 where it can be downloaded)"
        );
    }
    let _ = std::fs::remove_dir_all(&data);
}
