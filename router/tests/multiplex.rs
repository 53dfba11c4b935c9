//! Shared backend connections (`[pool] shared_connections`): many clients' autocommit
//! statements pipelined over a few connections per shard, against real Postgres. Every client
//! must get exactly its own results and errors, its own settings and statements, and its own
//! cancels; a client that leaves mid-statement must leave the connection fit for the others.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{sqlstate, Env};
use tokio_postgres::{Client, NoTls};

/// A 2-shard cluster on one server, with a router whose autocommit statements share
/// `shared` connections per shard (and nothing warmed, so that every backend connection the
/// test sees is one the statements needed).
fn env(shared: usize, extra: &str) -> Env {
    Env::start_with(
        2,
        1,
        &format!(
            "{extra}[pool]\nmax_size = 4\nshared_connections = {shared}\nwarm_connections = 0\nconnect_timeout_ms = 2000\ncheckout_timeout_ms = 5000\n"
        ),
    )
}

async fn fill(client: &Client, rows: i64) {
    for id in 1..=rows {
        client
            .execute(
                "INSERT INTO kv (id, v) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
                &[&id, &format!("v{id}")],
            )
            .await
            .expect("insert");
    }
}

/// The router's connections to each shard database, from Postgres's own view: all of them,
/// and those that ran clients' statements (the router's own control work, such as the
/// recovery of prepared transactions and the catalog, keeps one more per shard).
async fn backends_per_shard(env: &Env) -> Vec<(i64, i64)> {
    let mut counts = Vec::new();
    for shard in 0..env.map.shards().len() {
        let url = env.cluster.shard_urls()[shard].clone();
        let (c, conn) = tokio_postgres::connect(&url, NoTls).await.expect("direct");
        tokio::spawn(conn);
        let row = c
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE query ~ 'FROM kv|INTO kv') FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'shardgate'",
                &[],
            )
            .await
            .expect("pg_stat_activity");
        counts.push((row.get::<_, i64>(0), row.get::<_, i64>(1)));
    }
    counts
}

/// Whether every shard's connections fit `shared` lanes for clients, and the router's own
/// control connections besides (at most one per worker).
fn within(backends: &[(i64, i64)], shared: i64) -> bool {
    backends
        .iter()
        .all(|&(all, clients)| clients <= shared && all <= shared + 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_over_two_connections_per_shard_get_their_own_results_and_errors() {
    let env = env(2, "");
    let setup = env.router.connect().await;
    fill(&setup, 400).await;
    let wrong = Arc::new(AtomicUsize::new(0));
    // All 200 are connected before any runs, 20 logins at a time: the test is about sharing,
    // not about 200 SCRAM logins (a debug build's) at once within the login timeout.
    let mut clients = Vec::new();
    for _ in 0..10 {
        let logins: Vec<_> = (0..20)
            .map(|_| {
                let url = env.router.url();
                tokio::spawn(async move { common::connect(&url).await })
            })
            .collect();
        for login in logins {
            clients.push(login.await.expect("login task").expect("connect"));
        }
    }
    let mut tasks = Vec::new();
    for (c, client) in (0i64..).zip(clients) {
        let wrong = wrong.clone();
        tasks.push(tokio::spawn(async move {
            let select = client
                .prepare("SELECT v, $2::bigint AS client FROM kv WHERE id = $1")
                .await
                .expect("prepare");
            let mut seen = (0, 0, 0);
            for i in 0..20i64 {
                let id = (c * 7 + i * 13) % 400 + 1;
                match i % 5 {
                    // A prepared point select: its own row and its own client number back.
                    0 | 1 => {
                        let row = client.query_one(&select, &[&id, &c]).await.expect("select");
                        if row.get::<_, String>(0) != format!("v{id}") || row.get::<_, i64>(1) != c
                        {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        seen.0 += 1;
                    }
                    // A simple query with literals.
                    2 => {
                        let rows = client
                            .simple_query(&format!("SELECT v, {c} FROM kv WHERE id = {id}"))
                            .await
                            .expect("simple select");
                        let got = common::rows(&rows);
                        if got != vec![vec![format!("v{id}"), c.to_string()]] {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        seen.0 += 1;
                    }
                    // Division by zero: this client's error, and only this client's.
                    3 => {
                        let err = client
                            .query_one(
                                "SELECT 1 / ($2::int - $2::int) FROM kv WHERE id = $1",
                                &[&id, &(c as i32)],
                            )
                            .await
                            .expect_err("division by zero");
                        if sqlstate(&err) != "22012" {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        seen.1 += 1;
                    }
                    // A unique violation, then the client's own new row.
                    _ => {
                        let err = client
                            .execute("INSERT INTO kv (id, v) VALUES ($1, 'dup')", &[&id])
                            .await
                            .expect_err("unique violation");
                        if sqlstate(&err) != "23505" {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        let own = 10_000 + c * 100 + i;
                        let n = client
                            .execute(
                                "INSERT INTO kv (id, v) VALUES ($1, $2)",
                                &[&own, &format!("c{c}")],
                            )
                            .await
                            .expect("own insert");
                        let back = client
                            .query_one("SELECT v FROM kv WHERE id = $1", &[&own])
                            .await
                            .expect("own row");
                        if n != 1 || back.get::<_, String>(0) != format!("c{c}") {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        seen.2 += 1;
                    }
                }
            }
            seen
        }));
    }
    let mut totals = (0, 0, 0);
    for t in tasks {
        let seen = t
            .await
            .unwrap_or_else(|e| panic!("client task: {e}\n{}", env.router.log_text()));
        totals = (totals.0 + seen.0, totals.1 + seen.1, totals.2 + seen.2);
    }
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "a client saw another's result or error"
    );
    assert_eq!(totals, (200 * 12, 200 * 4, 200 * 4));
    let backends = backends_per_shard(&env).await;
    assert!(
        within(&backends, 2) && backends.iter().all(|&(_, clients)| clients >= 1),
        "200 clients should have shared at most 2 connections per shard, not {backends:?} (all, clients')\n{}",
        env.router.log_text()
    );
    let n = setup
        .query_one("SELECT count(*) FROM kv WHERE id > 10000", &[])
        .await
        .expect("count");
    assert_eq!(
        n.get::<_, i64>(0),
        200 * 4,
        "every client's own rows are there, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_and_timeouts_hit_only_their_own_client() {
    let env = env(1, "[limits]\nstatement_timeout_ms = 400\n");
    let setup = env.router.connect().await;
    fill(&setup, 50).await;

    // Others keep running point selects on the one shared connection per shard throughout.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut others = Vec::new();
    for c in 0..6i64 {
        let url = env.router.url();
        let stop = stop.clone();
        others.push(tokio::spawn(async move {
            let client = common::connect(&url).await.expect("connect");
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let id = c + 1;
                match client
                    .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
                    .await
                {
                    Ok(row) if row.get::<_, String>(0) == format!("v{id}") => ok += 1,
                    Ok(_) => failed.push("wrong row".to_string()),
                    Err(e) => failed.push(format!("{} {e}", sqlstate(&e))),
                }
            }
            (ok, failed)
        }));
    }

    // A client's own cancel, of a statement running on the shared connection.
    let a = env.router.connect().await;
    let token = a.cancel_token();
    let sleeper = tokio::spawn(async move {
        a.simple_query("SELECT pg_sleep(30) FROM kv WHERE id = 1")
            .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    token.cancel_query(NoTls).await.expect("cancel request");
    let err = sleeper.await.expect("task").expect_err("cancelled");
    assert_eq!(sqlstate(&err), "57014", "{err}");

    // The router's statement timeout (400 ms) ends a long statement the same way.
    let b = env.router.connect().await;
    let err = b
        .query("SELECT pg_sleep(30) FROM kv WHERE id = $1", &[&2i64])
        .await
        .expect_err("statement timeout");
    assert_eq!(sqlstate(&err), "57014", "{err}");

    // A statement queued behind a slow one (one connection per shard: nowhere else to go) is
    // cancelled in the router, and the slow one is not.
    let slow = env.router.connect().await;
    let key = env.key_on(0, 1);
    let slow_task = tokio::spawn(async move {
        slow.simple_query(&format!(
            "SELECT pg_sleep(0.35), 'slow-done' FROM kv WHERE id = {key}"
        ))
        .await
    });
    tokio::time::sleep(Duration::from_millis(60)).await;
    let queued = env.router.connect().await;
    let qtoken = queued.cancel_token();
    let queued_key = env.key_on(0, key + 1);
    let queued_task = tokio::spawn(async move {
        queued
            .simple_query(&format!(
                "SELECT pg_sleep(0.2), 'queued-done' FROM kv WHERE id = {queued_key}"
            ))
            .await
    });
    tokio::time::sleep(Duration::from_millis(60)).await;
    qtoken.cancel_query(NoTls).await.expect("cancel request");
    let err = queued_task
        .await
        .expect("task")
        .expect_err("the queued statement is cancelled");
    assert_eq!(sqlstate(&err), "57014", "{err}");
    let message = err.as_db_error().map(|e| e.message().to_string());
    assert_eq!(
        message.as_deref(),
        Some("canceling statement due to user request"),
        "a queued request's own error, as it is"
    );
    let done = slow_task
        .await
        .expect("task")
        .expect("the slow statement is not cancelled");
    assert!(
        common::rows(&done)
            .iter()
            .any(|r| r.contains(&"slow-done".to_string())),
        "{done:?}"
    );

    stop.store(true, Ordering::Relaxed);
    for o in others {
        let (ok, failed) = o.await.expect("other client");
        assert!(ok > 0);
        assert!(
            failed.is_empty(),
            "another client's statements failed: {failed:?}"
        );
    }
    let backends = backends_per_shard(&env).await;
    assert!(within(&backends, 1), "{backends:?} (all, clients')");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_settings_never_reach_another_on_a_shared_connection() {
    let env = env(1, "");
    let setup = env.router.connect().await;
    fill(&setup, 20).await;
    let zones = ["UTC", "Asia/Tokyo", "America/New_York", "Europe/Paris"];
    let mut tasks = Vec::new();
    for (c, zone) in zones.iter().enumerate() {
        let url = env.router.url();
        let zone = zone.to_string();
        tasks.push(tokio::spawn(async move {
            let client = common::connect(&url).await.expect("connect");
            if zone != "UTC" {
                client
                    .simple_query(&format!("SET TimeZone = '{zone}'"))
                    .await
                    .expect("set");
                client
                    .simple_query(&format!("SET application_name = 'client-{c}'"))
                    .await
                    .expect("set");
            }
            let mut wrong = Vec::new();
            // What a client that set nothing sees: the server's defaults, whatever they are.
            let mut default = None;
            for i in 0..150i64 {
                let id = i % 20 + 1;
                let row = client
                    .query_one(
                        "SELECT current_setting('TimeZone'), current_setting('application_name') FROM kv WHERE id = $1",
                        &[&id],
                    )
                    .await
                    .expect("select");
                let (tz, app): (String, String) = (row.get(0), row.get(1));
                let want = if zone == "UTC" {
                    default
                        .get_or_insert_with(|| (tz.clone(), app.clone()))
                        .clone()
                } else {
                    (zone.clone(), format!("client-{c}"))
                };
                if (tz.clone(), app.clone()) != want || zone == "UTC" && app.starts_with("client-") {
                    wrong.push(format!("{zone}: saw TimeZone {tz}, application_name {app:?}"));
                }
            }
            wrong
        }));
    }
    for t in tasks {
        let wrong = t.await.expect("task");
        assert!(wrong.is_empty(), "{:?}", &wrong[..wrong.len().min(5)]);
    }
    let backends = backends_per_shard(&env).await;
    assert!(within(&backends, 1), "{backends:?} (all, clients')");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_prepared_statements_of_several_clients_interleave_on_one_connection() {
    let env = env(1, "");
    let setup = env.router.connect().await;
    fill(&setup, 30).await;
    let mut tasks = Vec::new();
    for c in 0..12i64 {
        let url = env.router.url();
        tasks.push(tokio::spawn(async move {
            let client = common::connect(&url).await.expect("connect");
            // Every client's first statement is named s0 by tokio-postgres, with its own text.
            let own = client
                .prepare(&format!(
                    "SELECT v, {c}::bigint AS client FROM kv WHERE id = $1"
                ))
                .await
                .expect("prepare own");
            let common_text = client
                .prepare("SELECT v FROM kv WHERE id = $1")
                .await
                .expect("prepare common");
            let bad = client
                .prepare(&format!("SELECT no_such_column_{c} FROM kv WHERE id = $1"))
                .await
                .expect_err("a bad statement fails for its client");
            assert_eq!(sqlstate(&bad), "42703");
            let mut wrong = 0;
            for i in 0..60i64 {
                let id = (c + i) % 30 + 1;
                if i % 2 == 0 {
                    let row = client.query_one(&own, &[&id]).await.expect("own");
                    if row.get::<_, String>(0) != format!("v{id}") || row.get::<_, i64>(1) != c {
                        wrong += 1;
                    }
                } else {
                    let row = client
                        .query_one(&common_text, &[&id])
                        .await
                        .expect("common");
                    if row.get::<_, String>(0) != format!("v{id}") {
                        wrong += 1;
                    }
                }
            }
            wrong
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("task"), 0);
    }
    let backends = backends_per_shard(&env).await;
    assert!(within(&backends, 1), "{backends:?} (all, clients')");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_with_statements_queued_leaves_the_connection_to_the_others() {
    let env = env(1, "");
    let setup = env.router.connect().await;
    fill(&setup, 20).await;
    // Clients that send a statement and vanish before its answer, while it runs or waits
    // behind the others on the one shared connection.
    for k in 0..10i64 {
        let (client, connection) = tokio_postgres::connect(&env.router.url(), NoTls)
            .await
            .expect("connect");
        let conn_task = tokio::spawn(connection);
        let id = k % 20 + 1;
        let query = tokio::spawn(async move {
            let _ = client
                .simple_query(&format!("SELECT pg_sleep(0.05), v FROM kv WHERE id = {id}"))
                .await;
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        // The socket closes with the statement queued or running.
        conn_task.abort();
        query.abort();
    }
    // The others, meanwhile and after, get their answers.
    let mut tasks = Vec::new();
    for c in 0..8i64 {
        let url = env.router.url();
        tasks.push(tokio::spawn(async move {
            let client = common::connect(&url).await.expect("connect");
            let mut wrong = 0;
            for i in 0..40i64 {
                let id = (c + i) % 20 + 1;
                let row = client
                    .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
                    .await
                    .expect("select after the killed clients");
                if row.get::<_, String>(0) != format!("v{id}") {
                    wrong += 1;
                }
            }
            wrong
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("task"), 0);
    }
    let fresh = env.router.connect().await;
    let row = fresh
        .query_one("SELECT v FROM kv WHERE id = $1", &[&3i64])
        .await
        .expect("a fresh client");
    assert_eq!(row.get::<_, String>(0), "v3");
    let backends = backends_per_shard(&env).await;
    assert!(within(&backends, 1), "{backends:?} (all, clients')");
    assert!(
        !env.router.log_text().contains("panicked"),
        "{}",
        env.router.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_keeps_a_connection_of_its_own_beside_shared_ones() {
    let env = env(1, "");
    let setup = env.router.connect().await;
    fill(&setup, 10).await;
    let mut a = env.router.connect().await;
    let b = env.router.connect().await;
    // A transaction holds its own connection: what it wrote is not visible to another client
    // before COMMIT, and another client's statements run meanwhile.
    let tx = a.transaction().await.expect("begin");
    tx.execute("UPDATE kv SET v = 'in-tx' WHERE id = $1", &[&1i64])
        .await
        .expect("update");
    let row = b
        .query_one("SELECT v FROM kv WHERE id = $1", &[&1i64])
        .await
        .expect("other client");
    assert_eq!(row.get::<_, String>(0), "v1");
    tx.commit().await.expect("commit");
    let row = b
        .query_one("SELECT v FROM kv WHERE id = $1", &[&1i64])
        .await
        .expect("after commit");
    assert_eq!(row.get::<_, String>(0), "in-tx");
}

/// A client whose settings Postgres refuses (a startup option it does not know) gets that
/// error for its own statements, as on a connection of its own, and the clients whose
/// statements share the connection with it see nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_postgres_refuses_fails_only_its_own_client() {
    let env = env(1, "");
    let setup = env.router.connect().await;
    fill(&setup, 20).await;
    let mut bystanders = Vec::new();
    for b in 0..4i64 {
        let url = env.router.url();
        bystanders.push(tokio::spawn(async move {
            let client = common::connect(&url).await.expect("connect");
            let mut errors = Vec::new();
            for i in 0..300i64 {
                let id = (i + b) % 20 + 1;
                match client
                    .query_one("SELECT v FROM kv WHERE id = $1", &[&id])
                    .await
                {
                    Ok(row) => assert_eq!(row.get::<_, String>(0), format!("v{id}")),
                    Err(e) => errors.push(format!("{e:?}")),
                }
            }
            errors
        }));
    }
    let bad_url = format!("{}?options=-c%20no_such_setting_here%3D1", env.router.url());
    for round in 0..10 {
        let bad = common::connect(&bad_url)
            .await
            .expect("the login itself is accepted");
        for _ in 0..3 {
            let err = bad
                .query_one("SELECT v FROM kv WHERE id = $1", &[&(round % 20 + 1)])
                .await
                .expect_err("Postgres refuses the setting");
            assert_eq!(sqlstate(&err), "42704", "{err:?}");
            assert!(
                format!("{err:?}").contains("no_such_setting_here"),
                "{err:?}"
            );
        }
    }
    // A setting Postgres knows works the same way, from its first statement.
    let good_url = format!("{}?options=-c%20TimeZone%3DAsia/Tokyo", env.router.url());
    let good = common::connect(&good_url).await.expect("connect");
    let row = good
        .query_one(
            "SELECT current_setting('TimeZone') FROM kv WHERE id = $1",
            &[&1i64],
        )
        .await
        .expect("select");
    assert_eq!(row.get::<_, String>(0), "Asia/Tokyo");
    for b in bystanders {
        let errors = b.await.expect("bystander");
        assert!(
            errors.is_empty(),
            "a bystander saw errors: {:?}",
            &errors[..errors.len().min(3)]
        );
    }
    let backends = backends_per_shard(&env).await;
    assert!(within(&backends, 1), "{backends:?} (all, clients')");
}

/// A slow statement on a shared connection does not hold the statements of other clients,
/// whichever worker they landed on: another lane takes them (one of the other worker's, or one
/// opened past the worker's share of `shared_connections`), and they are answered while it
/// still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_statement_holds_no_other_clients_statements() {
    let env = env(2, "");
    let setup = env.router.connect().await;
    fill(&setup, 10).await;
    let slow = env.router.connect().await;
    let mut others = Vec::new();
    for _ in 0..8 {
        others.push(env.router.connect().await);
    }
    // The same shard as the point selects below: id 1's.
    let running = tokio::spawn(async move {
        slow.query_one("SELECT pg_sleep(3), v FROM kv WHERE id = $1", &[&1i64])
            .await
            .map(|_| ())
    });
    // Let it start and run past `mux::SLOW`.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, c) in others.iter().enumerate() {
        for _ in 0..3 {
            let row = c
                .query_one("SELECT v FROM kv WHERE id = $1", &[&1i64])
                .await
                .expect("answered");
            assert_eq!(row.get::<_, String>(0), "v1");
        }
        assert!(
            !running.is_finished(),
            "client {i}'s statements waited for the slow one"
        );
    }
    running.await.expect("joined").expect("the slow statement");
}
