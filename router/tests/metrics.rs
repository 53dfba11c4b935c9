//! The HTTP side port as a load balancer and Prometheus use it: `/metrics` counts exactly the
//! statements clients ran (by route, outcome, shard and SQLSTATE class), `/ready` says 503
//! until every shard has answered and again once a drain starts, `/health` says 200 while the
//! process serves. The Grafana dashboard and the Prometheus alerts in deploy/monitoring use only
//! metrics a router exports, and the alerts pass their promtool unit tests.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, http_get, metric, Env, Router};
use shardmap::ShardMap;

fn http_config(port: u16, extra: &str) -> String {
    format!("[http]\nlisten = \"127.0.0.1:{port}\"\n{extra}[pool]\nmax_size = 4\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 3000\n")
}

/// Waits until `/ready` answers `want`, returning its body.
fn wait_ready(port: u16, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(port, "/ready");
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/ready stayed {status} ({body:?}), wanted {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn scrape(port: u16) -> String {
    let (status, body) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_the_statements_clients_ran() {
    let port = free_port();
    let env = Env::start_with(2, 1, &http_config(port, ""));
    wait_ready(port, 200);
    let (k, other) = (env.key_on(0, 1), env.key_on(1, 1));
    env.on_shard(0, &format!("INSERT INTO kv VALUES ({k}, 'a')"));
    let client = env.router.connect().await;
    let prepared = client
        .prepare("SELECT v FROM kv WHERE id = $1")
        .await
        .expect("prepare");
    let shard0 = env.map.shards()[0].range.to_string();
    let before = scrape(port);

    for _ in 0..5 {
        client
            .simple_query(&format!("SELECT v FROM kv WHERE id = {k}"))
            .await
            .expect("select");
    }
    for _ in 0..2 {
        client
            .query(&prepared, &[&k])
            .await
            .expect("extended select");
    }
    client
        .simple_query("SELECT count(*) FROM kv")
        .await
        .expect("scatter");
    let err = client
        .simple_query(&format!("SELECT nosuch FROM kv WHERE id = {k}"))
        .await
        .expect_err("an unknown column");
    assert_eq!(common::sqlstate(&err), "42703");
    client.simple_query("BEGIN").await.expect("begin");
    client.simple_query("ROLLBACK").await.expect("rollback");
    client
        .simple_query(&format!("SELECT v FROM kv WHERE id = {other}"))
        .await
        .expect("select on shard 1");

    let after = scrape(port);
    let delta = |sample: &str| metric(&after, sample) - metric(&before, sample);
    let statements = |route: &str, outcome: &str| {
        delta(&format!(
            "shardgate_statements_total{{route=\"{route}\",outcome=\"{outcome}\"}}"
        ))
    };
    // 5 simple + 2 extended + the failed one on shard 0, one on shard 1.
    assert_eq!(statements("single_shard", "ok"), 8.0, "{after}");
    assert_eq!(statements("single_shard", "error"), 1.0);
    assert_eq!(statements("scatter", "ok"), 1.0);
    // BEGIN is answered by the router; the ROLLBACK of a transaction that never reached a
    // shard too.
    assert_eq!(statements("router", "ok"), 2.0);
    assert_eq!(statements("broadcast", "ok"), 0.0);
    assert_eq!(
        delta(&format!(
            "shardgate_shard_statements_total{{shard=\"{shard0}\",outcome=\"ok\"}}"
        )),
        7.0
    );
    assert_eq!(
        delta(&format!(
            "shardgate_shard_statement_duration_seconds_count{{shard=\"{shard0}\"}}"
        )),
        8.0
    );
    assert_eq!(delta("shardgate_errors_total{class=\"42\"}"), 1.0);
    assert!(delta("shardgate_client_bytes_received_total") > 0.0);
    assert!(delta("shardgate_client_bytes_sent_total") > 0.0);
    assert!(metric(&after, "shardgate_client_connections") >= 1.0);
    assert_eq!(
        metric(&after, "shardgate_shardmap_version"),
        env.map.version() as f64
    );
    assert_eq!(metric(&after, "shardgate_ready"), 1.0);
    for shard in env.map.shards() {
        let primary = shard.primary.endpoint();
        assert!(
            after.contains(&format!(
                "shardgate_pool_open_connections{{primary=\"{primary}\"}}"
            )),
            "no pool gauge for {primary}:\n{after}"
        );
        assert_eq!(
            metric(
                &after,
                &format!(
                    "shardgate_shard_up{{shard=\"{}\",primary=\"{primary}\"}}",
                    shard.range
                )
            ),
            1.0
        );
    }
    assert!(delta("shardgate_plan_cache_hits_total") >= 5.0);
    let (status, body) = http_get(port, "/health");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _) = http_get(port, "/nothing");
    assert_eq!(status, 404);
}

#[test]
fn ready_waits_for_every_shard_and_turns_503_on_drain() {
    let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
        shards: 2,
        servers: 1,
        schema_sql: Some(pgharness::Schema::Sql(common::SCHEMA.into())),
        ..Default::default()
    })
    .expect("cluster");
    let mut urls = cluster.shard_urls();
    // Shard 1's primary is a port where nothing listens (yet).
    let dead = free_port();
    urls[1] = format!("postgres://127.0.0.1:{dead}/nowhere");
    let map = ShardMap::even_split(&urls, common::tables()).expect("map");
    let port = free_port();
    let router = Router::start_with(
        &map,
        &http_config(port, "[shutdown]\ndrain_grace_ms = 3000\n"),
    );
    let why = wait_ready(port, 503);
    assert_eq!(why, "not every shard has answered yet\n");
    assert_eq!(http_get(port, "/health").0, 200);
    let text = scrape(port);
    let range1 = map.shards()[1].range.to_string();
    assert_eq!(
        metric(
            &text,
            &format!(
                "shardgate_shard_up{{shard=\"{range1}\",primary=\"127.0.0.1:{dead}/nowhere\"}}"
            )
        ),
        0.0
    );
    assert_eq!(metric(&text, "shardgate_ready"), 0.0);

    // The shard comes: a reload pointing shard 1 at a real database makes the router ready.
    let good = cluster.shard_urls();
    let map = ShardMap::even_split(&good, common::tables()).expect("map");
    std::fs::write(router.dir.join("shardmap.toml"), map.to_toml()).expect("write the map");
    router.signal(libc::SIGHUP);
    router.wait_for_log("reloaded", 1);
    wait_ready(port, 200);

    // A drain: /ready says no at once, /health still yes, during the grace period.
    router.signal(libc::SIGTERM);
    assert_eq!(wait_ready(port, 503), "draining\n");
    assert_eq!(http_get(port, "/health").0, 200);
    let exit = router.wait_exit(Duration::from_secs(30));
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
}

/// The metric names (`shardgate_...`) a text uses.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("shardgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alerts_use_metrics_the_router_exports() {
    let env = common::shared_env();
    let port = free_port();
    let router = Router::start_with(&env.map, &http_config(port, ""));
    wait_ready(port, 200);
    let client = router.connect().await;
    client.simple_query("SELECT 1").await.expect("a statement");
    let exported = metric_names(&scrape(port));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring");
    for file in ["alerts.yml", "grafana-dashboard.json"] {
        let text = std::fs::read_to_string(dir.join(file)).expect("read");
        let used = metric_names(&text);
        assert!(used.len() >= 5, "{file} uses only {used:?}");
        let unknown: Vec<_> = used.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses metrics the router does not export: {unknown:?}"
        );
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("grafana-dashboard.json")).expect("read"),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["panels"]
        .as_array()
        .is_some_and(|p| p.len() >= 10));

    // The rules' own unit tests, where promtool is installed (deploy/local/install-deps --tests
    // tries to).
    let Ok(promtool) = which("promtool") else {
        eprintln!("promtool is not installed: the alert rules' unit tests are skipped");
        return;
    };
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The path of program `name` on PATH.
fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}
