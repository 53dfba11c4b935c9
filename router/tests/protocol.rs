//! The extended protocol as drivers other than tokio-postgres use it, spoken byte by byte:
//! Flush without Sync (asyncpg, JDBC), several batches in one write, several Bind/Execute pairs
//! before one Sync, Close; and COPY into an unsharded table with psql.

mod common;

use std::process::Command;

use common::raw::*;
use common::{pg_program, run, shared_env, Router};

fn trust_router() -> &'static Router {
    static R: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        let r = Router::start_with(
            &shared_env().map,
            "auth = \"trust\"\n[pool]\nmax_size = 2\n",
        );
        if std::env::var_os("SHARDGATE_TEST_LOG").is_some() {
            eprintln!("router log: {}", r.dir.join("router.log").display());
        }
        r
    })
}

#[test]
fn flush_without_sync_answers_what_was_sent() {
    let env = shared_env();
    let mut c = Raw::connect(trust_router());
    let id = env.key_on(3, 10_000_000).to_string();
    c.send(
        &[
            parse("ins", "INSERT INTO kv (id, v) VALUES ($1, 'flushed')"),
            describe_statement("ins"),
            flush(),
        ]
        .concat(),
    );
    assert_eq!(
        c.read_n(3),
        b"1tn",
        "ParseComplete, ParameterDescription, NoData before any Sync"
    );
    c.send(&[bind("ins", &[&id]), execute(), flush()].concat());
    assert_eq!(c.read_n(2), b"2C");
    c.send(&sync());
    assert_eq!(c.read_until(b'Z'), b"Z");
    assert_eq!(
        env.on_shard(3, &format!("SELECT v FROM kv WHERE id = {id}")),
        "flushed"
    );
    // The statement follows the client to whatever connection serves it next.
    c.send(&[parse("sel", "SELECT v FROM kv WHERE id = $1"), sync()].concat());
    assert_eq!(c.read_until(b'Z'), b"1Z");
    for _ in 0..5 {
        c.send(&[bind("sel", &[&id]), execute(), sync()].concat());
        assert_eq!(c.read_until(b'Z'), b"2DCZ");
    }
    c.send(&[close_statement("sel"), close_statement("ins"), sync()].concat());
    assert_eq!(c.read_until(b'Z'), b"33Z");
    c.send(&[bind("sel", &[&id]), execute(), sync()].concat());
    assert_eq!(
        c.read_until(b'Z'),
        b"EZ",
        "a closed statement is gone (26000)"
    );
}

#[test]
fn batches_and_pairs_pipelined_in_one_write() {
    let env = shared_env();
    let mut c = Raw::connect(trust_router());
    let a = env.key_on(0, 10_100_000).to_string();
    let b = env.key_on(1, 10_100_000).to_string();
    let a2 = env
        .key_on(0, a.parse::<i64>().expect("a number") + 1)
        .to_string();
    // Two batches for two shards, three Bind/Execute pairs for one shard before one Sync, and a
    // simple query, all in one write.
    let mut all = vec![parse("p", "INSERT INTO kv (id, v) VALUES ($1, 'pipe')")];
    all.push(bind("p", &[&a]));
    all.push(execute());
    all.push(sync());
    all.push(bind("p", &[&b]));
    all.push(execute());
    all.push(sync());
    all.push(parse("", "SELECT v FROM kv WHERE id = $1"));
    for k in [&a, &a2, &a] {
        all.push(bind("", &[k.as_str()]));
        all.push(execute());
    }
    all.push(sync());
    all.push(msg(
        b'Q',
        format!("SELECT v FROM kv WHERE id = {b}\0").as_bytes(),
    ));
    c.send(&all.concat());
    assert_eq!(c.read_until(b'Z'), b"12CZ");
    assert_eq!(c.read_until(b'Z'), b"2CZ");
    assert_eq!(
        c.read_until(b'Z'),
        b"12DC2C2DCZ",
        "a2 has no row: CommandComplete without DataRow"
    );
    assert_eq!(c.read_until(b'Z'), b"TDCZ");
}

#[test]
fn errors_mid_batch_skip_to_sync() {
    let env = shared_env();
    let mut c = Raw::connect(trust_router());
    let a = env.key_on(2, 10_200_000).to_string();
    c.send(
        &[msg(
            b'Q',
            format!("INSERT INTO kv (id, v) VALUES ({a}, 'x')\0").as_bytes(),
        )]
        .concat(),
    );
    assert_eq!(c.read_until(b'Z'), b"CZ");
    // Duplicate key: the error, then nothing until ReadyForQuery, then the next batch works.
    c.send(
        &[
            parse("", "INSERT INTO kv (id, v) VALUES ($1, 'dup')"),
            bind("", &[&a]),
            execute(),
            bind("", &[&a]),
            execute(),
            sync(),
        ]
        .concat(),
    );
    assert_eq!(c.read_until(b'Z'), b"12EZ");
    // An unroutable statement mid-batch: the router's error, skip to Sync.
    c.send(
        &[
            parse("", "SELECT v FROM kv UNION SELECT v FROM kv"),
            bind("", &[]),
            execute(),
            sync(),
        ]
        .concat(),
    );
    assert_eq!(c.read_until(b'Z'), b"EZ");
    c.send(
        &[
            parse("", "SELECT v FROM kv WHERE id = $1"),
            bind("", &[&a]),
            execute(),
            sync(),
        ]
        .concat(),
    );
    assert_eq!(c.read_until(b'Z'), b"12DCZ");
}

#[test]
fn copy_into_an_unsharded_table_with_psql() {
    let env = shared_env();
    let file = env.router.dir.join("settings.csv");
    let rows: String = (0..500).map(|i| format!("copy-{i},value {i}\n")).collect();
    std::fs::write(&file, rows).expect("csv");
    let (ok, out, err) = run(Command::new(pg_program("psql"))
        .arg(env.router.url())
        .args([
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            &format!(
                "\\copy settings (k, v) FROM '{}' WITH (FORMAT csv)",
                file.display()
            ),
            "-At",
            "-c",
            "SELECT count(*) FROM settings WHERE k LIKE 'copy-%'",
        ]));
    assert!(ok, "{out}\n{err}");
    assert!(out.trim_end().ends_with("500"), "{out}");
    assert_eq!(
        env.on_shard(
            env.map.default_shard(),
            "SELECT count(*) FROM settings WHERE k LIKE 'copy-%'"
        ),
        "500"
    );
    // The same file into the sharded table kv: its first column is not a bigint key, so the
    // COPY is refused as a whole (splitting by key is tested in copy.rs).
    let (ok, _, err) = run(Command::new(pg_program("psql"))
        .arg(env.router.url())
        .args([
            "-X",
            "-c",
            &format!(
                "\\copy kv (id, v) FROM '{}' WITH (FORMAT csv)",
                file.display()
            ),
        ]));
    assert!(!ok, "{err}");
    assert!(err.contains("not a bigint"), "{err}");
}

/// pgbench -M prepared with BEGIN: BEGIN and the statement are prepared, then each transaction
/// binds them. The router answers BEGIN itself; nothing of that batch may be sent again later.
#[test]
fn a_router_answered_begin_batch_leaves_nothing_behind() {
    let env = shared_env();
    let mut c = Raw::connect(trust_router());
    let id = env.key_on(2, 20_000_000);
    env.on_shard(2, &format!("INSERT INTO kv VALUES ({id}, 'r1')"));
    let id = id.to_string();
    c.send(&[parse("b", "BEGIN"), sync()].concat());
    assert_eq!(c.read_until(b'Z'), b"1Z");
    c.send(&[parse("sel", "SELECT v FROM kv WHERE id = $1"), sync()].concat());
    assert_eq!(c.read_until(b'Z'), b"1Z");
    for _ in 0..3 {
        c.send(&[bind("b", &[]), execute(), sync()].concat());
        assert_eq!((c.read_until(b'Z'), c.status), (b"2CZ".to_vec(), b'T'));
        c.send(&[bind("sel", &[&id]), execute(), sync()].concat());
        assert_eq!((c.read_until(b'Z'), c.status), (b"2DCZ".to_vec(), b'T'));
        c.send(&msg(b'Q', b"COMMIT\0"));
        assert_eq!((c.read_until(b'Z'), c.status), (b"CZ".to_vec(), b'I'));
    }
    c.send(&sync());
    assert_eq!(c.read_until(b'Z'), b"Z", "a lone Sync after it all");
}

/// A driver that prepares with Flush inside a BEGIN the router holds, then binds DDL for every
/// shard (which cannot run in a transaction): refused without touching a backend, and the
/// transaction fails as on Postgres.
#[test]
fn a_refused_bind_after_a_flush_prepare_keeps_the_transaction() {
    let mut c = Raw::connect(trust_router());
    c.send(&msg(b'Q', b"BEGIN\0"));
    assert_eq!((c.read_until(b'Z'), c.status), (b"CZ".to_vec(), b'T'));
    c.send(
        &[
            parse("", "CREATE INDEX IF NOT EXISTS kv_v_in_tx ON kv (v)"),
            describe_statement(""),
            flush(),
        ]
        .concat(),
    );
    assert_eq!(c.read_n(3), b"1tn");
    c.send(&[bind("", &[]), execute(), sync()].concat());
    assert_eq!((c.read_until(b'Z'), c.status), (b"EZ".to_vec(), b'E'));
    c.send(&msg(b'Q', b"SELECT 1\0"));
    assert_eq!((c.read_until(b'Z'), c.status), (b"EZ".to_vec(), b'E'));
    c.send(&msg(b'Q', b"COMMIT\0"));
    assert_eq!((c.read_until(b'Z'), c.status), (b"CZ".to_vec(), b'I'));
}

/// Simple Queries in the middle of an extended batch that only prepared: each is routed on
/// its own, to its key's shard.
#[test]
fn a_query_inside_a_prepare_only_batch_goes_to_its_own_shard() {
    let env = shared_env();
    let mut c = Raw::connect(trust_router());
    c.send(&[parse("", "SELECT 1"), flush()].concat());
    assert_eq!(c.read_n(1), b"1");
    let ids: Vec<i64> = (0..4)
        .map(|s| env.key_on(s, 30_000_000 + 1000 * s as i64))
        .collect();
    for id in &ids {
        c.send(&msg(
            b'Q',
            format!("INSERT INTO kv (id, v) VALUES ({id}, 'r3')\0").as_bytes(),
        ));
        assert_eq!(c.read_until(b'Z'), b"CZ");
    }
    c.send(&sync());
    assert_eq!(c.read_until(b'Z'), b"Z");
    for (shard, id) in ids.iter().enumerate() {
        assert_eq!(
            env.on_shard(shard, &format!("SELECT v FROM kv WHERE id = {id}")),
            "r3",
            "key {id} on its shard {shard}"
        );
    }
}
