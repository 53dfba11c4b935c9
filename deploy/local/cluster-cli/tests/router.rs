//! `cluster up` starts a router that answers queries for the shard databases, `status` reports
//! it, a second `up` leaves it alone, and `down` stops it. Runs the real binaries: the
//! `shardgate-cluster` of this package and the `shardgate` router (built here if needed).

use std::process::Command;

mod common;
use common::{cluster, free_port, free_ports, pid_alive, router_binary, stdout, Dir};

/// `up` of two shards on one server: fast, and routing still matters.
fn small_cluster<'a>(dir: &'a str, base_port: &'a str, router_port: &'a str) -> Vec<&'a str> {
    vec![
        "up",
        "--shards",
        "2",
        "--servers",
        "1",
        "--dir",
        dir,
        "--base-port",
        base_port,
        "--router-port",
        router_port,
    ]
}

#[tokio::test(flavor = "current_thread")]
async fn up_starts_a_router_that_routes_and_down_stops_it() {
    let router = router_binary();
    // Under the system temp dir: as root the `postgres` user must be able to reach the data.
    let dir = Dir {
        path: std::env::temp_dir()
            .join(format!("shardgate-cluster-cli-test-{}", std::process::id())),
        router: router.clone(),
    };
    let _ = std::fs::remove_dir_all(&dir.path);
    let dir_arg = dir.path.to_str().expect("utf-8 temp dir").to_string();
    let base_port = free_port().to_string();
    let router_port = free_port();
    let router_port_arg = router_port.to_string();

    let mut up_args = small_cluster(&dir_arg, &base_port, &router_port_arg);
    up_args.extend(["--user", "tester", "--password", "s3cret p@ss"]);
    let up = cluster(&router, &up_args);
    assert!(up.status.success(), "up failed");
    let expected_url = format!("postgres://tester:s3cret%20p%40ss@127.0.0.1:{router_port}/app");
    assert!(
        stdout(&up).contains(&format!("psql {expected_url}")),
        "up does not print the connection string"
    );
    let config = std::fs::read_to_string(dir.path.join("router.toml")).expect("router.toml");
    assert!(config.contains(&format!("listen = \"127.0.0.1:{router_port}\"")));

    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path.join("cluster.json")).expect("cluster.json"),
    )
    .expect("valid state file");
    let pid = state["router"]["pid"]
        .as_u64()
        .expect("router pid in state") as u32;
    assert!(pid_alive(pid));

    // Queries through the router, with the printed connection string as it is.
    let (client, conn) = tokio_postgres::connect(&expected_url, tokio_postgres::NoTls)
        .await
        .expect("connecting to the router");
    let conn = tokio::spawn(conn);
    for id in 1..=20i64 {
        client
            .execute(
                "INSERT INTO kv (id, v) VALUES ($1, $2)",
                &[&id, &format!("v{id}")],
            )
            .await
            .expect("insert through the router");
    }
    for id in 1..=20i64 {
        let row = client
            .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
            .await
            .expect("select through the router");
        assert_eq!(row.get::<_, String>(0), format!("v{id}"));
    }
    drop(client);
    let _ = conn.await;

    // The rows went to both shard databases, all 20 of them.
    let mut counts = Vec::new();
    for shard in state["shards"].as_array().expect("shards") {
        let url = shard["url"].as_str().expect("shard url");
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connecting to a shard");
        let conn = tokio::spawn(conn);
        let n: i64 = c
            .query_one("SELECT count(*) FROM kv", &[])
            .await
            .expect("count")
            .get(0);
        counts.push(n);
        drop(c);
        let _ = conn.await;
    }
    assert_eq!(counts.iter().sum::<i64>(), 20, "rows per shard: {counts:?}");
    assert!(counts.iter().all(|&n| n > 0), "rows per shard: {counts:?}");

    let status = cluster(&router, &["status", "--dir", &dir_arg]);
    assert!(status.status.success());
    let text = stdout(&status);
    let router_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("router"))
        .expect("status shows the router");
    assert!(router_line.contains(&format!("127.0.0.1:{router_port}")));
    assert!(router_line.contains(&pid.to_string()));
    assert!(router_line.contains("accepting connections"));

    // A second `up` is harmless: same router, nothing restarted.
    let again = cluster(&router, &up_args);
    assert!(again.status.success());
    assert!(stdout(&again).contains("already up"));
    assert!(stdout(&again).contains(&format!("router pid {pid}")));
    assert!(
        !stdout(&again).contains("metrics:"),
        "no HTTP port was asked for"
    );

    // `--http-port` on the running cluster, whose router serves none: refused (nothing would
    // listen there), and the router is left alone.
    let http_port = free_port().to_string();
    let mut with_http = up_args.clone();
    with_http.extend(["--http-port", &http_port]);
    let refused = cluster(&router, &with_http);
    assert!(!refused.status.success(), "up --http-port was not refused");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("without an HTTP port") && err.contains("cluster down"),
        "unclear refusal: {err}"
    );
    assert!(!stdout(&refused).contains("metrics:"));
    assert!(pid_alive(pid));

    let down = cluster(&router, &["down", "--dir", &dir_arg]);
    assert!(down.status.success());
    assert!(stdout(&down).contains(&format!("stopped router (port {router_port}, pid {pid})")));
    assert!(!pid_alive(pid), "the router still runs after down");
    assert!(!dir.path.join("cluster.json").exists());
    assert!(!dir.path.join("router.toml").exists());
    assert!(pgharness::check_port_free(router_port).is_ok());
}

#[tokio::test(flavor = "current_thread")]
async fn up_tls_encrypts_both_ways_and_plain_clients_still_connect() {
    let router = router_binary();
    let dir = Dir {
        path: std::env::temp_dir().join(format!(
            "shardgate-cluster-cli-tls-test-{}",
            std::process::id()
        )),
        router: router.clone(),
    };
    let _ = std::fs::remove_dir_all(&dir.path);
    let dir_arg = dir.path.to_str().expect("utf-8 temp dir").to_string();
    let base_port = free_port().to_string();
    let router_port = free_port().to_string();
    let mut up_args = small_cluster(&dir_arg, &base_port, &router_port);
    up_args.push("--tls");
    let up = cluster(&router, &up_args);
    assert!(up.status.success(), "up --tls failed");
    let printed = stdout(&up);
    let tls_url = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("with TLS:   psql '"))
        .and_then(|l| l.strip_suffix('\''))
        .expect("up --tls prints a verify-full connection string")
        .to_string();
    assert!(tls_url.contains("sslmode=verify-full"), "{tls_url}");
    let config = std::fs::read_to_string(dir.path.join("router.toml")).expect("router.toml");
    assert!(
        config.contains("mode = \"allow\"") && config.contains("sslmode = \"verify-full\""),
        "{config}"
    );

    // psql with the printed string: TLS to the router (verified), and TLS from the router to
    // the shard (pg_stat_ssl of the backend that ran the statement).
    let psql = pgharness::pg_install().expect("postgres").program("psql");
    let out = Command::new(psql)
        .arg(&tls_url)
        .args(["-X", "-At", "-c", "\\conninfo", "-c"])
        .arg("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .output()
        .expect("run psql");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("SSL connection"), "{text}");
    assert_eq!(text.lines().last(), Some("t"), "{text}");

    // Clients without TLS (loadgen, cluster demo) are still served.
    let url = format!("postgres://app:app@127.0.0.1:{router_port}/app");
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("a plain client connects");
    let conn = tokio::spawn(conn);
    let row = client.query_one("SELECT 1", &[]).await.expect("select");
    assert_eq!(row.get::<_, i32>(0), 1);
    drop(client);
    let _ = conn.await;

    let down = cluster(&router, &["down", "--dir", &dir_arg]);
    assert!(down.status.success());
    assert!(
        !dir.path.join("tls").exists(),
        "down leaves the certificates"
    );
}

/// `up --routers 2`: two routers on consecutive ports serve the same shards; `status` lists
/// both; `up` again restarts the one that was killed and leaves the other alone; `down` stops
/// both and removes both configs.
#[tokio::test(flavor = "current_thread")]
async fn several_routers_share_the_shards_and_up_restarts_a_stopped_one() {
    let router = router_binary();
    let dir = Dir {
        path: std::env::temp_dir().join(format!(
            "shardgate-cluster-cli-routers-test-{}",
            std::process::id()
        )),
        router: router.clone(),
    };
    let _ = std::fs::remove_dir_all(&dir.path);
    let dir_arg = dir.path.to_str().expect("utf-8 temp dir").to_string();
    let base_port = free_port().to_string();
    let first = free_ports(2);
    let first_arg = first.to_string();
    let mut up_args = small_cluster(&dir_arg, &base_port, &first_arg);
    up_args.extend(["--routers", "2"]);
    let up = cluster(&router, &up_args);
    assert!(up.status.success(), "up failed");
    let second_url = format!("postgres://app:app@127.0.0.1:{}/app", first + 1);
    assert!(
        stdout(&up).contains(&format!("--target {second_url}")),
        "up does not print the routers for loadgen"
    );
    let config = std::fs::read_to_string(dir.path.join("router-2.toml")).expect("router-2.toml");
    assert!(config.contains(&format!("listen = \"127.0.0.1:{}\"", first + 1)));

    // A row written through one router is read back through the other.
    let connect = |url: String| async move {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
        tokio::spawn(conn);
        client
    };
    let a = connect(format!("postgres://app:app@127.0.0.1:{first}/app")).await;
    let b = connect(second_url.clone()).await;
    a.execute("INSERT INTO kv (id, v) VALUES (7, 'seven')", &[])
        .await
        .expect("insert through router 1");
    let v: String = b
        .query_one("SELECT v FROM kv WHERE id = 7", &[])
        .await
        .expect("select through router 2")
        .get(0);
    assert_eq!(v, "seven");
    drop((a, b));

    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path.join("cluster.json")).expect("cluster.json"),
    )
    .expect("valid state file");
    let pid_1 = state["router"]["pid"].as_u64().expect("router 1 pid") as u32;
    let pid_2 = state["more_routers"][0]["pid"]
        .as_u64()
        .expect("router 2 pid") as u32;
    let status = cluster(&router, &["status", "--dir", &dir_arg]);
    assert!(status.status.success());
    let accepting = stdout(&status)
        .lines()
        .filter(|l| l.trim_start().starts_with("router") && l.contains("accepting connections"))
        .count();
    assert_eq!(accepting, 2);

    // Router 2 dies; status says so, `up` starts it again and leaves router 1 alone.
    // SAFETY: kill(2) on the router this test started.
    unsafe { libc::kill(pid_2 as libc::pid_t, libc::SIGKILL) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pid_alive(pid_2) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status = cluster(&router, &["status", "--dir", &dir_arg]);
    assert!(
        !status.status.success(),
        "status must fail with a router down"
    );
    assert!(stdout(&status).contains("not running"));
    let again = cluster(&router, &up_args);
    assert!(again.status.success());
    assert!(stdout(&again).contains(&format!("router pid {pid_1}")));
    assert!(stdout(&again).contains("starting router 2 of 2"));
    let b = connect(second_url).await;
    b.query_one("SELECT v FROM kv WHERE id = 7", &[])
        .await
        .expect("router 2 serves again");
    drop(b);

    let down = cluster(&router, &["down", "--dir", &dir_arg]);
    assert!(down.status.success());
    assert_eq!(stdout(&down).matches("stopped router").count(), 2);
    assert!(!pid_alive(pid_1));
    assert!(!dir.path.join("router.toml").exists() && !dir.path.join("router-2.toml").exists());
    assert!(
        pgharness::check_port_free(first).is_ok() && pgharness::check_port_free(first + 1).is_ok()
    );
}
