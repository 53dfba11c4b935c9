//! Memory bounded in bytes: a merged read across shards past `limits.max_merge_bytes` or the
//! router-wide `limits.merge_memory_bytes`, a message past `limits.max_message_bytes`, held
//! extended messages and a COPY row past it, a statement too long to parse past
//! `limits.max_plan_bytes`, a session's prepared statements past `limits.max_prepared_bytes`.
//! Each gets `54000` naming its setting; the session (where Postgres's
//! would) and every other client keep working.

mod common;

use std::io::Write;
use std::sync::OnceLock;

use common::raw::{msg, Raw};
use common::{rows, sqlstate, Env, Router};

/// `max_message_bytes` in these tests: 1 MiB.
const MAX_MESSAGE: usize = 1 << 20;
/// `max_plan_bytes` in these tests.
const MAX_PLAN: usize = 64 << 10;
/// `max_prepared_bytes` in these tests (above the longest statement the other tests prepare).
const MAX_PREPARED: usize = 256 << 10;

/// A cluster whose router has small limits (and trust authentication, for the raw client).
fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let env = Env::start_with(
            4,
            2,
            &format!(
                "auth = \"trust\"\n[limits]\nmax_merge_bytes = 1000000\nmax_message_bytes = {MAX_MESSAGE}\n\
                 max_plan_bytes = {MAX_PLAN}\nmax_prepared_bytes = {MAX_PREPARED}\n"
            ),
        );
        env
    })
}

/// 1000-character values, distinct per id.
fn value(id: i64) -> String {
    format!("{id:0>1000}")
}

/// Inserts ids `from..from + n` with 1000-character values, 200 rows a statement.
async fn insert_wide(client: &tokio_postgres::Client, from: i64, n: i64) {
    for start in (from..from + n).step_by(200) {
        let values: Vec<String> = (start..(start + 200).min(from + n))
            .map(|id| format!("({id}, '{}')", value(id)))
            .collect();
        client
            .batch_execute(&format!(
                "INSERT INTO kv (id, v) VALUES {}",
                values.join(", ")
            ))
            .await
            .expect("insert wide rows");
    }
}

fn grouped(from: i64, to: i64) -> String {
    format!("SELECT v, count(*) FROM kv WHERE id >= {from} AND id < {to} GROUP BY v ORDER BY v")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_merge_over_max_merge_bytes_is_refused_and_all_goes_on() {
    let env = env();
    let client = env.router.connect().await;
    let bystander = env.router.connect().await;
    // 2,000 groups of 1,000-byte keys: about 2.5 MB to combine, over the 1 MB limit.
    insert_wide(&client, 20_000_000, 2000).await;
    let err = client
        .simple_query(&grouped(20_000_000, 20_002_000))
        .await
        .expect_err("over max_merge_bytes");
    assert_eq!(sqlstate(&err), "54000", "{err:?}");
    let db = err.as_db_error().expect("a database error");
    assert!(
        db.message().contains("limits.max_merge_bytes"),
        "{}",
        db.message()
    );
    // The extended protocol too.
    let err = client
        .query(
            "SELECT v, count(*) FROM kv WHERE id >= $1 AND id < $2 GROUP BY v",
            &[&20_000_000i64, &20_002_000i64],
        )
        .await
        .expect_err("over max_merge_bytes");
    assert_eq!(sqlstate(&err), "54000", "{err:?}");
    // The same session: a smaller grouped read is answered exactly.
    let got = rows(
        &client
            .simple_query(&grouped(20_000_000, 20_000_010))
            .await
            .expect("a small grouped read"),
    );
    let want: Vec<Vec<String>> = (20_000_000..20_000_010)
        .map(|id| vec![value(id), "1".to_string()])
        .collect();
    assert_eq!(got, want);
    let one: i32 = bystander
        .query_one("SELECT 1", &[])
        .await
        .expect("the bystander")
        .get(0);
    assert_eq!(one, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sorted_merge_over_max_merge_bytes_is_refused() {
    let env = env();
    let client = env.router.connect().await;
    // Two 600 KB rows on two shards: the sorted merge buffers both (1.2 MB, over 1 MB).
    let (a, b) = (env.key_on(0, 23_000_000), env.key_on(1, 23_000_000));
    let wide = "w".repeat(600 * 1024);
    for id in [a, b] {
        client
            .execute("INSERT INTO kv (id, v) VALUES ($1, $2)", &[&id, &wide])
            .await
            .expect("insert");
    }
    let sorted = "SELECT id, v FROM kv WHERE id >= 23000000 AND id < 23100000 ORDER BY id";
    let err = client
        .simple_query(sorted)
        .await
        .expect_err("over max_merge_bytes");
    assert_eq!(sqlstate(&err), "54000", "{err:?}");
    let message = err
        .as_db_error()
        .expect("a database error")
        .message()
        .to_string();
    assert!(message.contains("limits.max_merge_bytes"), "{message}");
    // The same rows without the wide column are within it.
    let narrow = "SELECT id FROM kv WHERE id >= 23000000 AND id < 23100000 ORDER BY id";
    let got = rows(
        &client
            .simple_query(narrow)
            .await
            .expect("a narrow sorted read"),
    );
    let want: Vec<Vec<String>> = [a.min(b), a.max(b)]
        .iter()
        .map(|id| vec![id.to_string()])
        .collect();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_wide_merge_budget_is_named_and_given_back() {
    let env = env();
    // A router whose reads together may hold 4 KiB, while one read alone may hold 64 MiB.
    let router = Router::start_with(&env.map, "[limits]\nmerge_memory_bytes = 4096\n");
    let client = router.connect().await;
    insert_wide(&client, 21_000_000, 20).await;
    let err = client
        .simple_query(&grouped(21_000_000, 21_000_020))
        .await
        .expect_err("over merge_memory_bytes");
    assert_eq!(sqlstate(&err), "54000", "{err:?}");
    let message = err
        .as_db_error()
        .expect("a database error")
        .message()
        .to_string();
    assert!(message.contains("limits.merge_memory_bytes"), "{message}");
    // Two groups fit; run many times, the budget would run out if a read kept its bytes.
    for _ in 0..20 {
        let got = rows(
            &client
                .simple_query(&grouped(21_000_000, 21_000_002))
                .await
                .expect("a read within the budget"),
        );
        assert_eq!(got.len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_max_message_bytes_ends_only_its_connection() {
    let env = env();
    let bystander = env.router.connect().await;
    // Just under the limit is served (a long comment makes the text long).
    let client = env.router.connect().await;
    let under = format!("SELECT 1 /* {} */", "x".repeat(MAX_MESSAGE - 100));
    let got = rows(&client.simple_query(&under).await.expect("under the limit"));
    assert_eq!(got, [["1".to_string()]]);
    // Over it: 54000 naming the setting, then the connection is closed.
    let over = format!("SELECT 1 /* {} */", "x".repeat(2 * MAX_MESSAGE));
    let err = client
        .simple_query(&over)
        .await
        .expect_err("over the limit");
    assert_eq!(sqlstate(&err), "54000", "{err:?}");
    let message = err
        .as_db_error()
        .expect("a database error")
        .message()
        .to_string();
    assert!(message.contains("limits.max_message_bytes"), "{message}");
    assert!(client.simple_query("SELECT 1").await.is_err(), "closed");
    let one: i32 = bystander
        .query_one("SELECT 1", &[])
        .await
        .expect("the bystander")
        .get(0);
    assert_eq!(one, 1);
    // New connections are served too.
    let again = env.router.connect().await;
    again.simple_query("SELECT 1").await.expect("a new client");
}

#[test]
fn held_messages_over_max_message_bytes_fail_their_batch_only() {
    let env = env();
    let mut c = Raw::connect(&env.router);
    // Binds of a statement with no table wait for the batch's Sync before a shard is picked;
    // three of 400 KB each are more than the 1 MiB the batch may hold.
    let big = "z".repeat(400 * 1024);
    let mut bind = b"\0\0".to_vec();
    bind.extend_from_slice(&0i16.to_be_bytes());
    bind.extend_from_slice(&1i16.to_be_bytes());
    bind.extend_from_slice(&(big.len() as i32).to_be_bytes());
    bind.extend_from_slice(big.as_bytes());
    bind.extend_from_slice(&0i16.to_be_bytes());
    let mut batch = msg(b'P', b"\0SELECT length($1::text)\0\0\0");
    for _ in 0..3 {
        batch.extend(msg(b'B', &bind));
        batch.extend(msg(b'E', b"\0\0\0\0\0"));
    }
    batch.extend(msg(b'S', b""));
    c.s.write_all(&batch).expect("send");
    let (tags, errors) = c.until_ready();
    assert!(tags.contains(&b'E'), "{tags:?}");
    assert!(errors.contains("54000"), "{errors}");
    assert!(errors.contains("limits.max_message_bytes"), "{errors}");
    // The next batch of the same session is answered.
    let mut batch = msg(b'P', b"\0SELECT length($1::text)\0\0\0");
    batch.extend(msg(b'B', &bind));
    batch.extend(msg(b'E', b"\0\0\0\0\0"));
    batch.extend(msg(b'S', b""));
    c.s.write_all(&batch).expect("send");
    let (tags, errors) = c.until_ready();
    assert_eq!(tags, b"12DCZ", "{errors}");
}

#[test]
fn a_copy_row_over_max_message_bytes_fails_the_copy_only() {
    let env = env();
    let mut c = Raw::connect(&env.router);
    // COPY split by key, with one row that never ends, in CopyData messages each well under
    // the limit.
    let id = 22_000_000;
    let mut copy = msg(b'Q', b"COPY kv (id, v) FROM STDIN\0");
    copy.extend(msg(b'd', format!("{id}\t").as_bytes()));
    for _ in 0..3 {
        copy.extend(msg(b'd', "y".repeat(MAX_MESSAGE / 2).as_bytes()));
    }
    copy.extend(msg(b'd', b"\n"));
    copy.extend(msg(b'c', b""));
    c.s.write_all(&copy).expect("send");
    let (tags, errors) = c.until_ready();
    assert_eq!(tags.first(), Some(&b'G'), "{tags:?}");
    assert!(tags.contains(&b'E'), "{tags:?}");
    assert!(errors.contains("54000"), "{errors}");
    assert!(errors.contains("limits.max_message_bytes"), "{errors}");
    // Nothing was copied, and the session goes on.
    let count = format!("SELECT count(*) FROM kv WHERE id = {id}\0");
    c.s.write_all(&msg(b'Q', count.as_bytes())).expect("send");
    let (tags, errors) = c.until_ready();
    assert_eq!(tags, b"TDCZ", "{errors}");
    let shard = env.shard_of(id);
    assert_eq!(
        env.on_shard(shard, &format!("SELECT count(*) FROM kv WHERE id = {id}")),
        "0"
    );
}

/// A statement whose text without its literals is longer than `max_plan_bytes` (a long `IN`
/// list of placeholders, through both protocols) is refused before it is parsed, and the
/// session goes on; a statement as long whose length is in a literal is planned (literals are
/// taken out first) and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_too_long_to_parse_is_refused_and_the_session_goes_on() {
    let env = env();
    let client = env.router.connect().await;
    // 20,000 literals: about 140 KB as sent, 120 KB once each is `$n`.
    let list: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    let sql = format!("SELECT count(*) FROM kv WHERE id IN ({})", list.join(","));
    assert!(sql.len() > MAX_PLAN && sql.len() < MAX_MESSAGE);
    let err = client
        .simple_query(&sql)
        .await
        .expect_err("too long to parse");
    assert_eq!(sqlstate(&err), "54000");
    let message = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(message.contains("limits.max_plan_bytes"), "{message}");
    // Extended protocol: prepared (Postgres describes it), refused when it is to run, and the
    // connection goes on.
    let placeholders: Vec<String> = (1..=20_000).map(|i| format!("${i}")).collect();
    let long = format!(
        "SELECT count(*) FROM kv WHERE id IN ({})",
        placeholders.join(",")
    );
    let stmt = client
        .prepare(&long)
        .await
        .map_err(|e| sqlstate(&e))
        .expect("prepared");
    let keys: Vec<i64> = (0..20_000).collect();
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        keys.iter().map(|k| k as _).collect();
    let err = match client.query(&stmt, &params).await {
        Ok(_) => panic!("a statement too long to parse ran"),
        Err(e) => e,
    };
    let message = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert_eq!(sqlstate(&err), "54000", "{message}");
    assert!(message.contains("limits.max_plan_bytes"), "{message}");
    let one = client
        .simple_query("SELECT 1")
        .await
        .expect("the session goes on");
    assert_eq!(rows(&one), [["1"]]);
    // A long literal is no reason to refuse: the planner sees `$2`.
    let big = "y".repeat(MAX_PLAN * 4);
    let key = env.key_on(1, 91_000_000);
    client
        .simple_query(&format!("INSERT INTO kv (id, v) VALUES ({key}, '{big}')"))
        .await
        .expect("a long literal is planned");
    let back = client
        .simple_query(&format!("SELECT length(v) FROM kv WHERE id = {key}"))
        .await
        .expect("read it back");
    assert_eq!(rows(&back), [[big.len().to_string()]]);
}

/// A long Query is held once while it runs (the session keeps only its start unless it may
/// change settings): a long `SET` is still followed by the session's settings, so the next
/// statements, on whatever pooled connection, see it; and a long statement without one runs as
/// usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_in_a_long_query_is_followed() {
    let env = env();
    let client = env.router.connect().await;
    let note = "n".repeat(200_000);
    client
        .batch_execute(&format!("SET app.note = '{note}' /* {note} */"))
        .await
        .expect("a long query with a SET");
    for _ in 0..3 {
        let got = client
            .simple_query("SELECT length(current_setting('app.note'))")
            .await
            .expect("the setting");
        assert_eq!(rows(&got), [[note.len().to_string()]]);
    }
    let got = client
        .simple_query(&format!("SELECT 7 /* {note} */"))
        .await
        .expect("a long query");
    assert_eq!(rows(&got), [["7"]]);
}

/// A long request for several shards is not copied once per shard: it goes out behind each
/// shard's own messages (the client's settings, the part's BEGIN) from where it is. A read and
/// a write on every shard, each with a 200 KB literal, from a client whose settings differ from
/// the pooled connections' (so each shard gets settings in front): both answer correctly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_request_for_several_shards_runs_on_each() {
    let env = env();
    let client = env.router.connect().await;
    client
        .batch_execute("SET application_name = 'long-scatter'")
        .await
        .expect("a setting");
    let keys: Vec<i64> = (0..4).map(|s| env.key_on(s, 92_000_000)).collect();
    for &k in &keys {
        client
            .execute("INSERT INTO kv (id, v) VALUES ($1, 'short')", &[&k])
            .await
            .expect("seed");
    }
    let long = "z".repeat(200_000);
    let list = keys
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let count = client
        .simple_query(&format!(
            "SELECT count(*) FROM kv WHERE v <> '{long}' AND id >= 92000000 AND id < 93000000 \
             AND current_setting('application_name') = 'long-scatter'"
        ))
        .await
        .expect("a long read on every shard");
    assert_eq!(rows(&count), [["4"]]);
    let updated = client
        .simple_query(&format!("UPDATE kv SET v = '{long}' WHERE id IN ({list})"))
        .await
        .expect("a long write on every shard");
    assert!(
        updated
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::CommandComplete(4))),
        "{} messages",
        updated.len()
    );
    for (shard, &k) in keys.iter().enumerate() {
        assert_eq!(
            env.on_shard(shard, &format!("SELECT length(v) FROM kv WHERE id = {k}")),
            long.len().to_string(),
            "shard {shard}"
        );
    }
}

/// A session that prepares without end is refused with `54000` past `max_prepared_bytes`, both
/// with Parse and with SQL `PREPARE`; it goes on, and closing statements makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_past_max_prepared_bytes_are_refused_and_closing_makes_room() {
    let env = env();
    let client = env.router.connect().await;
    let mut kept = Vec::new();
    let refused = loop {
        let sql = format!("SELECT v FROM kv WHERE id = $1 /* {} */", kept.len());
        match client.prepare(&sql).await {
            Ok(stmt) => kept.push(stmt),
            Err(e) => break e,
        }
        assert!(kept.len() < 10_000, "no bound was reached");
    };
    assert_eq!(sqlstate(&refused), "54000", "{refused:?}");
    assert!(
        format!("{refused:?}").contains("limits.max_prepared_bytes"),
        "{refused:?}"
    );
    // Each statement costs its text plus a fixed part (about 300 bytes here).
    assert!(
        kept.len() > MAX_PREPARED / 400 && kept.len() < MAX_PREPARED / 256,
        "{} statements",
        kept.len()
    );
    let err = client
        .simple_query("PREPARE p1 AS SELECT v FROM kv WHERE id = $1")
        .await
        .expect_err("PREPARE past the bound");
    assert_eq!(sqlstate(&err), "54000", "{err:?}");
    // The session goes on: its statements still run, and closing some makes room.
    let rows = client
        .query(&kept[0], &[&1i64])
        .await
        .expect("a kept statement runs");
    assert!(rows.len() <= 1);
    kept.truncate(kept.len() - 10);
    client.simple_query("SELECT 1").await.expect("serves");
    client
        .prepare("SELECT v FROM kv WHERE id = $1 /* after closing */")
        .await
        .expect("room again after Close");
}
