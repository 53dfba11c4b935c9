//! The files deploy/aws configures the fleet with are real configuration: `router.toml` and a
//! shard map rendered with the layout's `--primary` template pass `shardgate --check`, and the
//! primaries' `postgresql.conf` starts a real (small) Postgres with every setting taking effect.
//!
//! The templates are filled here with small values by the same `${name}` substitution
//! Terraform's `templatefile` does for them (they use nothing else), so this runs without
//! terraform; where terraform is installed, the config module's own rendering is checked the
//! same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// `${name}` replaced by `values[name]`, `$${` by `${` (templatefile's escape); every placeholder
/// must have a value, and the template must use no other templatefile syntax.
fn render(template: &Path, values: &BTreeMap<&str, String>) -> String {
    let text = std::fs::read_to_string(template).expect("template");
    assert!(
        !text.contains("%{"),
        "{}: directives are not expected",
        template.display()
    );
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("${") {
        if rest[..at].ends_with('$') {
            // `$${`: templatefile's escape for a literal `${` (its first `$` is already out).
            out.push_str(&rest[..at]);
            out.push('{');
            rest = &rest[at + 2..];
            continue;
        }
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}').expect("closed placeholder") + at;
        let name = &rest[at + 2..end];
        let value = values
            .get(name)
            .unwrap_or_else(|| panic!("{}: no value for ${{{name}}}", template.display()));
        out.push_str(value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn shardgate() -> PathBuf {
    pgharness::router::build(&root(), false).expect("build shardgate")
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// router.toml and a shard map of `shards` shards in `dir`, checked by `shardgate --check`.
fn check_router_config(router_toml: &str, dir: &Path, shards: usize) -> String {
    let bin = shardgate();
    // The layout module's template (modules/layout/outputs.tf) with a login filled in.
    let (ok, map) = run(Command::new(&bin).args([
        "shardmap",
        "split",
        "--shards",
        &shards.to_string(),
        "--primary",
        "postgres://shardgate:secret@shard-{index:3}.db.internal:5432/shard",
    ]));
    assert!(ok, "shardmap split: {map}");
    std::fs::write(dir.join("shardmap.toml"), map).expect("write map");
    std::fs::write(dir.join("router.toml"), router_toml).expect("write config");
    let config = dir.join("router.toml");
    let (ok, out) = run(Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .arg("--check"));
    assert!(
        ok,
        "shardgate --check refused the rendered router.toml:\n{out}\n{router_toml}"
    );
    out
}

/// Starts a real Postgres with every setting of a rendered postgresql.conf (the harness keeps
/// its own port, address and sockets) and returns what the server says each setting is.
fn start_with_conf(conf: &str) -> BTreeMap<String, String> {
    let mut opts = pgharness::ServerOptions::default();
    let mut wanted = Vec::new();
    for line in conf.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim().trim_matches('\''));
        if ["port", "listen_addresses"].contains(&key) {
            continue;
        }
        opts.settings.push((key.to_string(), value.to_string()));
        wanted.push(key.to_string());
    }
    assert!(
        wanted.len() > 20,
        "the rendered file has its settings: {conf}"
    );
    let server = pgharness::Server::start(&opts).unwrap_or_else(|e| {
        panic!("Postgres did not start with the rendered postgresql.conf: {e}\n{conf}")
    });
    let quoted: Vec<String> = wanted.iter().map(|k| format!("'{k}'")).collect();
    let rows = server
        .psql(
            "postgres",
            &format!(
                "SELECT name || '=' || current_setting(name) FROM pg_settings WHERE name IN ({})",
                quoted.join(", ")
            ),
        )
        .expect("read the settings back");
    let seen: BTreeMap<String, String> = rows
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let missing: Vec<&String> = wanted.iter().filter(|k| !seen.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "settings Postgres does not know: {missing:?}"
    );
    seen
}

fn small_values() -> BTreeMap<&'static str, String> {
    [
        ("port", "5432"),
        ("max_connections", "60"),
        ("shared_buffers", "64MB"),
        ("huge_pages", "try"),
        ("effective_cache_size", "192MB"),
        ("work_mem", "4MB"),
        ("maintenance_work_mem", "64MB"),
        ("max_worker_processes", "8"),
        ("max_parallel_workers", "2"),
        ("max_slot_wal_keep_size", "1GB"),
        ("max_wal_size", "1GB"),
        ("router_port", "6432"),
        ("http_port", "9930"),
        ("database", "shard"),
        ("app_user", "app"),
        ("app_password", "app-secret"),
        ("admin_user", "admin"),
        ("admin_password", "admin-secret"),
        ("backend_user", "shardgate"),
        ("backend_password", "backend-secret"),
        ("pool_max_size", "4"),
        ("shared_connections", "1"),
        ("pause_timeout_ms", "60000"),
        ("max_clients", "20000"),
        ("drain_grace_ms", "25000"),
        ("drain_timeout_ms", "30000"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn the_rendered_router_config_and_shard_map_pass_shardgate_check() {
    let dir = temp_dir("fleet-router");
    let toml = render(
        &root().join("deploy/aws/templates/router.toml.tftpl"),
        &small_values(),
    );
    let out = check_router_config(&toml, &dir, 512);
    assert!(out.contains("512 shards"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_rendered_postgresql_conf_starts_a_real_postgres() {
    let conf = render(
        &root().join("deploy/aws/templates/postgresql.conf.tftpl"),
        &small_values(),
    );
    let seen = start_with_conf(&conf);
    assert_eq!(seen.get("wal_level").map(String::as_str), Some("logical"));
    assert_eq!(seen.get("max_connections").map(String::as_str), Some("60"));
    assert_eq!(
        seen.get("max_prepared_transactions").map(String::as_str),
        Some("60")
    );
    assert_eq!(seen.get("shared_buffers").map(String::as_str), Some("64MB"));
    assert_eq!(
        seen.get("shared_preload_libraries").map(String::as_str),
        Some("pg_stat_statements")
    );
}

/// Where terraform is installed: the config module's own rendering, for a small instance.
#[test]
fn the_config_modules_rendering_passes_the_same_checks() {
    let found = Command::new("terraform").arg("version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "NOT RUN: terraform is not installed, so deploy/aws/modules/config's own rendering was not \
             checked (the templates themselves were, by the other tests of this file)"
        );
        return;
    }
    let dir = temp_dir("fleet-tf");
    let module = root().join("deploy/aws/modules/config");
    let tf = |args: &[&str]| {
        run(Command::new("terraform")
            .arg(format!("-chdir={}", module.display()))
            .args(args)
            .env("TF_DATA_DIR", dir.join("tf"))
            .env("TF_IN_AUTOMATION", "1")
            .env("NO_COLOR", "1"))
    };
    let state = dir.join("config.tfstate");
    let state_arg = format!("-state={}", state.display());
    let vars = [
        "-var=primary_memory_gib=1",
        "-var=primary_vcpus=2",
        "-var=max_connections=60",
        "-var=app_password=app-secret",
        "-var=admin_password=admin-secret",
        "-var=backend_password=backend-secret",
    ];
    let (ok, out) = tf(&["init", "-input=false", "-backend=false"]);
    assert!(ok, "{out}");
    let mut apply = vec!["apply", "-auto-approve", "-input=false", &state_arg];
    apply.extend(vars);
    let (ok, out) = tf(&apply);
    assert!(
        ok,
        "terraform apply of the provider-free config module: {out}"
    );
    // stdout only: terraform may warn on stderr (a missing ~/.terraformrc).
    let output = |name: &str| {
        let out = Command::new("terraform")
            .arg(format!("-chdir={}", module.display()))
            .args(["output", "-raw", &state_arg, name])
            .env("TF_DATA_DIR", dir.join("tf"))
            .output()
            .expect("terraform output runs");
        assert!(
            out.status.success(),
            "terraform output {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    };
    let toml = output("router_toml");
    check_router_config(&toml, &dir, 4);
    let conf = output("postgresql_conf");
    let seen = start_with_conf(&conf);
    // A quarter of 1 GiB.
    assert_eq!(
        seen.get("shared_buffers").map(String::as_str),
        Some("256MB")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cloud-init scripts, rendered with a value for every placeholder, are valid shell.
#[test]
fn the_rendered_cloud_init_scripts_are_valid_shell() {
    let dir = root().join("deploy/aws/templates");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("templates") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".sh.tftpl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("template");
        let mut values = BTreeMap::new();
        let pieces: Vec<&str> = text.split("${").collect();
        for (before, piece) in pieces.iter().zip(pieces.iter().skip(1)) {
            if before.ends_with('$') {
                continue; // `$${`: a literal `${` for the shell
            }
            if let Some(name) = piece.split('}').next() {
                values.insert(name, format!("value-of-{name}"));
            }
        }
        let script = render(&path, &values);
        let (ok, out) = run(Command::new("bash").args(["-n", "-c", &script]));
        assert!(
            ok,
            "{} is not valid shell once rendered:\n{out}",
            path.display()
        );
        checked += 1;
    }
    assert_eq!(checked, 3, "primary, router and loadgen cloud-init");
}
