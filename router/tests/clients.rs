//! Real client programs through the router: psql (simple protocol, several statements per
//! query, a script with a transaction) and pgbench in simple, extended and prepared modes,
//! all with zero errors.

mod common;

use std::process::Command;

use common::{pg_program, run, shared_env};

#[test]
fn psql_reads_and_writes_through_the_router() {
    let env = shared_env();
    let url = env.router.url();
    let id = 8_000_000i64;
    let (ok, out, err) = run(Command::new(pg_program("psql")).arg(&url).args([
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-At",
        "-c",
        &format!("INSERT INTO kv (id, v) VALUES ({id}, 'from psql')"),
        "-c",
        &format!("SELECT v FROM kv WHERE id = {id}"),
        "-c",
        &format!("UPDATE kv SET v = v || '!' WHERE id = {id}; SELECT v FROM kv WHERE id = {id}"),
        "-c",
        "SELECT current_setting('server_version_num')::int >= 150000",
    ]));
    assert!(ok, "psql failed: {err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["from psql", "from psql!", "t"],
        "{out}"
    );
    assert_eq!(
        env.on_shard(
            env.shard_of(id),
            &format!("SELECT v FROM kv WHERE id = {id}")
        ),
        "from psql!"
    );

    // A script with a transaction, as psql -f runs it.
    let script = env.router.dir.join("tx.sql");
    let k = id + 1;
    std::fs::write(
        &script,
        format!("BEGIN;\nINSERT INTO kv (id, v) VALUES ({k}, 'a');\nUPDATE kv SET v = 'b' WHERE id = {k};\nCOMMIT;\nSELECT v FROM kv WHERE id = {k};\n"),
    )
    .expect("write script");
    let (ok, out, err) = run(Command::new(pg_program("psql"))
        .arg(&url)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", "-f"])
        .arg(&script));
    assert!(ok, "psql -f failed: {err}");
    assert_eq!(out.trim(), "b");

    // An unroutable statement fails with the router's message; psql exits non-zero.
    let (ok, _, err) = run(Command::new(pg_program("psql")).arg(&url).args([
        "-X",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        "SELECT v FROM kv UNION SELECT v FROM kv",
    ]));
    assert!(!ok);
    assert!(err.contains("kv is sharded by id"), "{err}");
}

#[test]
fn pgbench_point_selects_in_every_mode_with_zero_errors() {
    let env = shared_env();
    let url = env.router.url();
    let rows = 1000;
    let (ok, _, err) = run(Command::new(pg_program("psql")).arg(&url).args([
        "-X",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        "SELECT 1",
    ]));
    assert!(ok, "{err}");
    // Load keys 9,000,001.. through the router, one shard at a time as the router routes them.
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    client_rt.block_on(async {
        let client = env.router.connect().await;
        let insert = client
            .prepare("INSERT INTO kv (id, v) VALUES ($1, $2)")
            .await
            .expect("prepare");
        for i in 1..=rows {
            let id = 9_000_000i64 + i;
            client
                .execute(&insert, &[&id, &format!("bench {id}")])
                .await
                .expect("load");
        }
    });
    let script = env.router.dir.join("point_select.sql");
    std::fs::write(
        &script,
        format!(
            "\\set id random(9000001, {})\nSELECT v FROM kv WHERE id = :id;\n",
            9_000_000 + rows
        ),
    )
    .expect("script");
    for mode in ["simple", "extended", "prepared"] {
        let (ok, out, err) = run(Command::new(pg_program("pgbench"))
            .args(["-n", "-c", "4", "-j", "2", "-t", "250", "-M", mode, "-f"])
            .arg(&script)
            .arg(&url));
        assert!(ok, "pgbench -M {mode} failed:\n{out}\n{err}");
        assert!(
            out.contains("number of transactions actually processed: 1000/1000"),
            "-M {mode}:\n{out}"
        );
        assert!(
            out.contains("number of failed transactions: 0 (0.000%)"),
            "-M {mode}:\n{out}"
        );
    }
}
