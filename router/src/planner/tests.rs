//! End-to-end planner tests: text in, routes and resolved keys out, against a 4-shard map
//! with `kv (id bigint)`, `users (user_id uuid)`, `names (name text)` and unsharded `settings`.

use std::sync::Arc;

use shardmap::{Key, KeyType, ShardMap, Table};

use super::*;

fn planner() -> Planner {
    let urls: Vec<String> = (0..4).map(|i| format!("postgres://h/s{i}")).collect();
    let tables = vec![
        Table::new("kv", "id", KeyType::BigInt),
        Table::new("users", "user_id", KeyType::Uuid),
        Table::new("names", "name", KeyType::Text),
    ];
    let map = ShardMap::even_split(&urls, tables).expect("valid map");
    Planner::new(Arc::new(map), 1000)
}

fn routes(p: &Planner, sql: &str) -> Vec<Route> {
    let mut buf = NormalizeBuf::new();
    p.plan(sql, &mut buf).statements().to_vec()
}

fn route(p: &Planner, sql: &str) -> Route {
    let r = routes(p, sql);
    assert_eq!(r.len(), 1, "{sql}: {r:?}");
    r.into_iter().next().unwrap_or(Route::Unparsed)
}

/// The key values of a single keyed statement, resolved: literals as text, Bind as `$i`.
fn keys(p: &Planner, sql: &str) -> Vec<String> {
    let mut buf = NormalizeBuf::new();
    let plan = p.plan(sql, &mut buf);
    match plan.statements() {
        [Route::Keyed { keys, .. }] => keys
            .iter()
            .map(|k| match plan.key_value(k) {
                Some(KeyValue::Text(t)) => t.to_string(),
                Some(KeyValue::Bind(i)) => format!("bind {i}"),
                None => "?".to_string(),
            })
            .collect(),
        other => panic!("{sql}: not keyed: {other:?}"),
    }
}

/// `sql` is not routed as it is: refused with a message that says `needle`, or (when the
/// refusal was the merge's) finished in two stages, which [`staged_part`] tests apart.
fn unroutable(p: &Planner, sql: &str, needle: &str) {
    match route(p, sql) {
        Route::Unroutable { message } => assert!(message.contains(needle), "{sql}: {message}"),
        _ if staged_part(p, sql).is_some() => {}
        other => panic!("{sql}: expected Unroutable, got {other:?}"),
    }
}

/// Whether `sql` reads every shard with the shards' answers merged (not in two stages).
fn merged(p: &Planner, sql: &str) -> bool {
    matches!(route(p, sql), Route::Scatter { merge, .. } if !matches!(merge, Merge::Staged(_)))
}

/// Which part of `sql` runs across shards first, when it is read in two stages.
fn staged_part(p: &Planner, sql: &str) -> Option<super::staged::Part> {
    match route(p, sql) {
        Route::Scatter {
            merge: Merge::Staged(s),
            ..
        }
        | Route::Keyed {
            spread: Some(Merge::Staged(s)),
            ..
        } => Some(s.part.clone()),
        _ => None,
    }
}

#[test]
fn point_statements_are_keyed() {
    let p = planner();
    for (sql, want) in [
        ("SELECT * FROM kv WHERE id = 42", vec!["42"]),
        ("select v from KV where 42 = ID", vec!["42"]),
        ("SELECT * FROM kv k WHERE k.id = -7 AND k.v > 3", vec!["-7"]),
        ("SELECT * FROM public.kv WHERE kv.id = '9'", vec!["9"]),
        ("SELECT * FROM kv WHERE public.kv.id = 9", vec!["9"]),
        (
            "SELECT * FROM kv WHERE (id = $1::bigint) AND v = 'x'",
            vec!["bind 0"],
        ),
        (
            "SELECT * FROM kv WHERE id = CAST($2 AS int8) AND v = $1",
            vec!["bind 1"],
        ),
        (
            "SELECT * FROM kv WHERE id IN (1, 2, 3)",
            vec!["1", "2", "3"],
        ),
        ("SELECT * FROM kv WHERE id IN (1, 2) AND id = 2", vec!["2"]),
        ("UPDATE kv SET v = v + 1 WHERE id = 5", vec!["5"]),
        ("DELETE FROM kv WHERE id = 6 RETURNING *", vec!["6"]),
        ("SELECT * FROM names WHERE name = E'it\\'s'", vec!["it's"]),
        ("SELECT * FROM names WHERE name = $$a$$", vec!["a"]),
        (
            "SELECT * FROM users WHERE user_id = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid",
            vec!["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
        ),
        ("EXPLAIN ANALYZE SELECT * FROM kv WHERE id = 8", vec!["8"]),
        (
            "SELECT count(*) FROM kv WHERE id = 1 GROUP BY v ORDER BY 1 LIMIT 10",
            vec!["1"],
        ),
    ] {
        assert_eq!(keys(&p, sql), want, "{sql}");
    }
    match route(&p, "SELECT * FROM users WHERE user_id = $1") {
        Route::Keyed {
            table,
            key_type,
            keys,
            ..
        } => {
            assert_eq!((table.as_str(), key_type), ("users", KeyType::Uuid));
            assert_eq!(keys, [KeySource::Param(0)]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn inserts() {
    let p = planner();
    assert_eq!(keys(&p, "INSERT INTO kv (id, v) VALUES (1, 'a')"), ["1"]);
    assert_eq!(
        keys(&p, "INSERT INTO kv (v, id) VALUES ('a', 1), ('b', $1)"),
        ["1", "bind 0"]
    );
    assert_eq!(
        keys(
            &p,
            "INSERT INTO kv (id, v) VALUES (1, 'a') ON CONFLICT (id) DO UPDATE SET v = excluded.v"
        ),
        ["1"]
    );
    unroutable(&p, "INSERT INTO kv VALUES (1, 'a')", "column list");
    // Once the column order is known, the key is found by position.
    let at_0 = TableFacts {
        key_position: Some(0),
        key_default: KeyDefault::None,
        ..TableFacts::default()
    };
    p.learn_tables([("kv".to_string(), at_0)].into_iter().collect());
    assert_eq!(
        keys(&p, "INSERT INTO kv VALUES (1, 'a'), (2, 'b')"),
        ["1", "2"]
    );
    // A SELECT of VALUES (SQLAlchemy's many-row INSERT): the key is the VALUES column the
    // SELECT puts at the key's place.
    assert_eq!(
        keys(
            &p,
            "INSERT INTO kv (id, v) SELECT p0::BIGINT, p1 FROM (VALUES (1, 'a', 0), (2, 'b', 1)) AS s(p0, p1, n) ORDER BY n"
        ),
        ["1", "2"]
    );
    assert_eq!(
        keys(
            &p,
            "INSERT INTO kv (v, id) SELECT * FROM (VALUES ('a', 3)) AS s(a, b)"
        ),
        ["3"]
    );
    unroutable(
        &p,
        "INSERT INTO kv (id, v) SELECT p0 + 1, p1 FROM (VALUES (1, 'a')) AS s(p0, p1)",
        "could not tell",
    );
    // A key from a sequence: an INSERT that leaves it out gets keys from the router.
    let from_sequence = TableFacts {
        key_position: Some(0),
        key_default: KeyDefault::Always,
        ..TableFacts::default()
    };
    p.learn_tables([("kv".to_string(), from_sequence)].into_iter().collect());
    let mut buf = NormalizeBuf::new();
    let plan = p.plan(
        "INSERT INTO kv (v) VALUES ('a'), ('b') RETURNING id",
        &mut buf,
    );
    assert!(
        matches!(
            plan.statements.as_slice(),
            [Route::NewKeys {
                rows: NewRows::Values(2),
                always: true,
                ..
            }]
        ),
        "{:?}",
        plan.statements
    );
    let mut buf = NormalizeBuf::new();
    let plan = p.plan(
        "INSERT INTO kv (v) SELECT * FROM UNNEST($1::text[])",
        &mut buf,
    );
    assert!(
        matches!(plan.statements.as_slice(), [Route::NewKeys { rows: NewRows::Unnest(a), .. }] if a.len() == 1),
        "{:?}",
        plan.statements
    );
    unroutable(
        &p,
        "INSERT INTO kv (v) SELECT v FROM kv WHERE id = 1",
        "UNNEST",
    );
    p.learn_tables(Default::default());
    unroutable(&p, "INSERT INTO kv (v) VALUES ('a')", "sharding key id");
    unroutable(
        &p,
        "INSERT INTO kv (id, v) SELECT id, v FROM kv WHERE id = 1",
        "VALUES",
    );
    unroutable(
        &p,
        "INSERT INTO kv (id, v) VALUES (1 + 1, 'a')",
        "literal or a parameter",
    );
    unroutable(
        &p,
        "INSERT INTO kv (id, v) VALUES (1, 'a') ON CONFLICT (v) DO UPDATE SET id = 2",
        "move the row",
    );
    unroutable(&p, "INSERT INTO kv DEFAULT VALUES", "column list");
    assert_eq!(
        route(&p, "INSERT INTO settings VALUES ('a', 1)"),
        Route::Default
    );
    unroutable(
        &p,
        "INSERT INTO settings SELECT * FROM kv WHERE id = 1",
        "unsharded table",
    );
}

#[test]
fn keys_that_cannot_be_pinned() {
    let p = planner();
    // Reads without a pinned key are scattered to every shard (their rows concatenate).
    for sql in [
        "SELECT * FROM kv",
        "SELECT * FROM kv WHERE id > 5",
        "SELECT * FROM kv WHERE id = 1 OR id = 2",
        "SELECT * FROM kv WHERE id = 1 OR v = 'x'",
        "SELECT * FROM kv WHERE id + 0 = 1",
        "SELECT * FROM kv WHERE id::text = '1'",
        "SELECT * FROM kv WHERE id = v",
        "SELECT * FROM kv WHERE id NOT IN (1)",
        "SELECT * FROM names WHERE name = $1::varchar(2)",
        "SELECT * FROM kv WHERE id = 1.5::numeric",
    ] {
        assert!(
            matches!(
                route(&p, sql),
                Route::Scatter {
                    merge: Merge::Concat { limit: None },
                    ..
                }
            ),
            "{sql}: {:?}",
            route(&p, sql)
        );
    }
    assert!(matches!(
        route(&p, "SELECT count(*) FROM kv WHERE v = 'x'"),
        Route::Scatter {
            merge: Merge::Combine(_),
            ..
        }
    ));
    assert!(matches!(
        route(&p, "SELECT id FROM kv LIMIT 5"),
        Route::Scatter {
            merge: Merge::Concat { limit: Some(_) },
            ..
        }
    ));
    // Sorted, grouped and aggregated reads go to the merge engine.
    for sql in [
        "SELECT id, v FROM kv ORDER BY id",
        "SELECT avg(id) FROM kv",
        "SELECT v, count(*) FROM kv GROUP BY v",
        "SELECT DISTINCT v FROM kv",
        "SELECT id FROM kv ORDER BY id OFFSET 2",
    ] {
        assert!(
            matches!(
                route(&p, sql),
                Route::Scatter {
                    merge: Merge::Combine(_),
                    ..
                }
            ),
            "{sql}"
        );
    }
    for (sql, why) in [
        ("SELECT id FROM kv ORDER BY v", "ORDER BY"),
        (
            "SELECT v, count(*) FROM kv GROUP BY v HAVING count(*) > 1",
            "HAVING",
        ),
        ("SELECT DISTINCT ON (v) v FROM kv", "DISTINCT ON"),
        ("SELECT string_agg(v, ',') FROM kv", "function"),
        ("SELECT id FROM kv UNION SELECT id FROM kv", "not fix"),
    ] {
        unroutable(&p, sql, why);
    }
    unroutable(&p, "UPDATE kv SET id = 7 WHERE id = 5", "delete the row");
    for sql in ["DELETE FROM kv", "UPDATE kv SET v = 'x' WHERE v = 'y'"] {
        assert!(
            matches!(route(&p, sql), Route::ScatterWrite { ref message, .. } if message.contains("allow_scatter_writes")),
            "{sql}"
        );
    }
}

#[test]
fn joins_and_subqueries() {
    let p = planner();
    unroutable(
        &p,
        "SELECT * FROM kv JOIN settings s ON s.k = kv.v WHERE kv.id = 1",
        "unsharded table settings",
    );
    unroutable(
        &p,
        "SELECT * FROM kv a JOIN kv b ON a.v = b.v WHERE a.id = 1",
        "its own",
    );
    unroutable(
        &p,
        "SELECT * FROM kv WHERE id = 1 AND v IN (SELECT v FROM kv)",
        "its own",
    );
    unroutable(
        &p,
        "SELECT * FROM kv WHERE id IN (SELECT id FROM kv WHERE id = 1)",
        "WHERE id",
    );
    unroutable(
        &p,
        "SELECT * FROM kv, names WHERE kv.id = 1 AND names.name = 'x'",
        "different key types",
    );
    unroutable(
        &p,
        "SELECT * FROM kv a LEFT JOIN kv b ON b.id = 1 WHERE a.id = 1",
        "its own",
    );
    // Every reference pinned (the caller checks the keys share a shard).
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv a JOIN kv b ON b.id = 2 WHERE a.id = 1"
        ),
        ["1", "2"]
    );
    assert_eq!(
        keys(&p, "SELECT * FROM kv a, kv b WHERE a.id = 1 AND b.id = 1"),
        ["1", "1"]
    );
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv WHERE id = 1 AND EXISTS (SELECT 1 FROM kv k2 WHERE k2.id = 1)"
        ),
        ["1", "1"]
    );
    assert_eq!(
        keys(
            &p,
            "WITH x AS (SELECT * FROM kv WHERE id = 3) SELECT * FROM x"
        ),
        ["3"]
    );
    assert_eq!(
        keys(&p, "SELECT * FROM (SELECT * FROM kv WHERE id = 4) sub"),
        ["4"]
    );
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv WHERE id = 4 UNION ALL SELECT * FROM kv WHERE id = 5"
        ),
        ["4", "5"]
    );
    // Catalogs are on every shard.
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv WHERE id = 4 AND EXISTS (SELECT 1 FROM pg_catalog.pg_class)"
        ),
        ["4"]
    );
    // An unqualified key with two sharded tables of that column is ambiguous: not a pin.
    unroutable(&p, "SELECT * FROM kv a, kv b WHERE id = 1", "its own");
    // Keys made equal by the query pin each other's table (an inner join's ON, WHERE, USING,
    // where an unqualified key means the joined column).
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv a JOIN kv b ON a.id = b.id WHERE a.id = 1"
        ),
        ["1", "1"]
    );
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv a, kv b WHERE b.id = a.id AND b.id = 2"
        ),
        ["2", "2"]
    );
    assert_eq!(
        keys(&p, "SELECT * FROM kv a JOIN kv b USING (id) WHERE id = 7"),
        ["7", "7"]
    );
    // Joined by equal keys without any: on every shard, each joined row made on one.
    assert!(matches!(
        route(
            &p,
            "SELECT a.v, count(*) FROM kv a JOIN kv b USING (id) GROUP BY a.v"
        ),
        Route::Scatter { .. }
    ));
    assert!(matches!(
        route(
            &p,
            "SELECT a.id, b.v FROM kv a JOIN kv b ON a.id = b.id ORDER BY a.id"
        ),
        Route::Scatter { .. }
    ));
    // Not by the keys, of other key types, or an outer join's ON: not pinned, not co-located.
    unroutable(&p, "SELECT * FROM kv a JOIN kv b ON a.v = b.v", "its own");
    unroutable(
        &p,
        "SELECT * FROM kv a LEFT JOIN kv b ON a.id = b.id WHERE a.id = 1",
        "its own",
    );
    unroutable(
        &p,
        "SELECT * FROM kv a LEFT JOIN kv b ON a.id = b.id",
        "its own",
    );
    unroutable(
        &p,
        "SELECT * FROM kv JOIN names ON names.name = kv.v WHERE kv.id = 1",
        "its own",
    );
    unroutable(&p, "WITH kv AS (SELECT 1) SELECT * FROM kv", "rename");
}

#[test]
fn tables_outside_the_map_and_no_tables() {
    let p = planner();
    assert_eq!(route(&p, "SELECT * FROM settings"), Route::Default);
    assert_eq!(route(&p, "UPDATE settings SET v = 1"), Route::Default);
    assert_eq!(
        route(&p, "SELECT * FROM app.other o JOIN settings s ON true"),
        Route::Default
    );
    assert_eq!(route(&p, "SELECT nextval('ids')"), Route::Default);
    assert_eq!(route(&p, "SELECT my_func(1)"), Route::Default);
    assert_eq!(
        route(
            &p,
            "WITH settings AS (SELECT * FROM settings) SELECT * FROM settings"
        ),
        Route::Default
    );
    for sql in [
        "SELECT 1",
        "select now(), version()",
        "SELECT * FROM pg_catalog.pg_type",
        "SELECT * FROM pg_class",
        "SELECT table_name FROM information_schema.tables",
        "SELECT * FROM generate_series(1, 3)",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "SET search_path = app, public",
        "SET application_name TO 'x'",
        "RESET ALL",
        "SHOW server_version",
        "DISCARD ALL",
        "VALUES (1), (2)",
    ] {
        assert_eq!(route(&p, sql), Route::Any, "{sql}");
    }
    // Run by the session on the client's named statements.
    for sql in [
        "DEALLOCATE ALL",
        "PREPARE p AS SELECT * FROM kv WHERE id = $1",
        "EXECUTE p(1)",
    ] {
        assert_eq!(route(&p, sql), Route::PreparedSql, "{sql}");
    }
    // The session keeps the connection it makes it on (`planner::temporary`).
    assert_eq!(route(&p, "CREATE TEMP TABLE t (x int)"), Route::Default);
    assert_eq!(route(&p, "CREATE TEMP TABLE t (LIKE kv)"), Route::Default);
    // A view over a sharded table would read one shard's rows.
    for sql in [
        "CREATE TEMP VIEW v AS SELECT * FROM kv",
        "CREATE VIEW v AS SELECT v FROM kv WHERE id > 3",
        "CREATE MATERIALIZED VIEW v AS SELECT count(*) FROM kv",
    ] {
        assert!(matches!(route(&p, sql), Route::Unroutable { .. }), "{sql}");
    }
    assert_eq!(
        route(&p, "CREATE TEMP TABLE t (x int) ON COMMIT DROP"),
        Route::Default
    );
}

#[test]
fn transaction_control() {
    let p = planner();
    for (sql, want) in [
        ("BEGIN", Route::Begin),
        (
            "START TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            Route::Begin,
        ),
        ("COMMIT", Route::Commit),
        ("END", Route::Commit),
        ("ROLLBACK", Route::Rollback),
        ("ABORT", Route::Rollback),
        ("SAVEPOINT s1", Route::Savepoint),
        ("RELEASE SAVEPOINT s1", Route::Savepoint),
        ("ROLLBACK TO SAVEPOINT s1", Route::Savepoint),
    ] {
        assert_eq!(route(&p, sql), want, "{sql}");
    }
}

#[test]
fn ddl() {
    let p = planner();
    for sql in [
        "CREATE TABLE kv (id bigint primary key, v text)",
        "ALTER TABLE kv ADD COLUMN w int",
        "CREATE INDEX kv_v ON kv (v)",
        "TRUNCATE kv",
        "DROP TABLE kv",
        "COMMENT ON TABLE kv IS 'x'",
    ] {
        assert_eq!(route(&p, sql), Route::Broadcast, "{sql}");
    }
    unroutable(&p, "DROP TABLE settings, kv", "separate statements");
    for sql in [
        "CREATE TABLE settings2 (k text, v text)",
        "ALTER TABLE settings ADD COLUMN w int",
        "CREATE INDEX ON settings (k)",
        "DROP TABLE settings",
        "TRUNCATE settings",
        "CREATE SEQUENCE ids",
    ] {
        assert_eq!(route(&p, sql), Route::Default, "{sql}");
    }
    unroutable(&p, "CREATE TABLE t2 AS SELECT * FROM kv", "AS SELECT");
    for sql in [
        "CREATE EXTENSION pgcrypto",
        "CREATE SCHEMA app",
        "CREATE TYPE mood AS ENUM ('sad', 'ok')",
        "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql",
        "DROP SCHEMA app",
    ] {
        assert_eq!(route(&p, sql), Route::Broadcast, "{sql}");
    }
    unroutable(&p, "CREATE ROLE reader", "every server");
    unroutable(&p, "DROP INDEX kv_v", "which table");
}

#[test]
fn copy() {
    let p = planner();
    assert_eq!(route(&p, "COPY settings FROM STDIN"), Route::Default);
    assert!(matches!(
        route(&p, "COPY kv TO STDOUT"),
        Route::Scatter { .. }
    ));
    assert!(matches!(
        route(
            &p,
            "COPY kv (v, id) FROM STDIN WITH (FORMAT csv, HEADER true)"
        ),
        Route::CopyIn(CopyRows::ByKey {
            format: CopyFormat {
                csv: true,
                header: true,
                key_index: 1,
                columns: 2,
                delimiter: b',',
                ..
            },
            ..
        })
    ));
    assert!(matches!(
        route(&p, "COPY kv (id, v) FROM STDIN"),
        Route::CopyIn(CopyRows::ByKey {
            format: CopyFormat {
                csv: false,
                delimiter: b'\t',
                key_index: 0,
                ..
            },
            ..
        })
    ));
    unroutable(&p, "COPY kv FROM STDIN", "column list");
    unroutable(
        &p,
        "COPY kv (id, v) FROM STDIN WITH (FORMAT binary)",
        "binary",
    );
    unroutable(&p, "COPY kv TO '/tmp/x'", "file or program");
    unroutable(
        &p,
        "COPY (SELECT count(*) FROM kv) TO STDOUT",
        "COPY of a sorted, grouped or limited query",
    );
    assert_eq!(
        keys(&p, "COPY (SELECT * FROM kv WHERE id = 3) TO STDOUT"),
        ["3"]
    );
}

#[test]
fn cache_shares_plans_across_literals() {
    let p = planner();
    let mut buf = NormalizeBuf::new();
    let a = p.plan("SELECT v FROM kv WHERE id = 41", &mut buf);
    let a_plan = Arc::clone(a.plan());
    let a_key = match a.statements() {
        [Route::Keyed { keys, .. }] => a.key_value(&keys[0]).map(|k| format!("{k:?}")),
        _ => None,
    };
    assert_eq!(a_key.as_deref(), Some("Text(\"41\")"));
    let mut buf2 = NormalizeBuf::new();
    let b = p.plan("SELECT v FROM kv WHERE id = 42", &mut buf2);
    assert!(Arc::ptr_eq(&a_plan, b.plan()), "same shape, same plan");
    let Route::Keyed { keys, key_type, .. } = &b.statements()[0] else {
        panic!("not keyed")
    };
    let Some(KeyValue::Text(text)) = b.key_value(&keys[0]) else {
        panic!("no literal")
    };
    assert_eq!(key_from_text(*key_type, text), Ok(Key::Int(42)));
    let stats = p.cache_stats();
    assert_eq!((stats.hits, stats.misses, stats.len), (1, 1, 1));
}

#[test]
fn cache_hit_does_not_reparse_and_keeps_params() {
    let p = planner();
    let mut buf = NormalizeBuf::new();
    let first = Arc::clone(
        p.plan("SELECT v FROM kv WHERE id = $1 AND v = 'a'", &mut buf)
            .plan(),
    );
    let second = p.plan("SELECT v FROM kv WHERE id = $1 AND v = 'b'", &mut buf);
    assert!(Arc::ptr_eq(&first, second.plan()));
    assert_eq!(second.params_before(), 1);
    assert_eq!(second.literal(0), Some("b"));
}

#[test]
fn parse_and_query_texts_of_one_shape_share_a_plan_but_not_params() {
    // `id = $1` from a Parse and `id = 5` from a Query normalize to the same text: the plan
    // is shared, and whether `$1` is a Bind parameter or a literal comes from each text.
    let p = planner();
    let mut buf = NormalizeBuf::new();
    let parsed = p.plan("SELECT v FROM kv WHERE id = $1", &mut buf);
    let shared = Arc::clone(parsed.plan());
    let Route::Keyed { keys, .. } = &parsed.statements()[0] else {
        panic!("not keyed")
    };
    assert_eq!(parsed.key_value(&keys[0]), Some(KeyValue::Bind(0)));
    let mut buf2 = NormalizeBuf::new();
    let queried = p.plan("SELECT v FROM kv WHERE id = 5", &mut buf2);
    assert!(Arc::ptr_eq(&shared, queried.plan()));
    assert_eq!(queried.key_value(&keys[0]), Some(KeyValue::Text("5")));
}

#[test]
fn multi_statement_query() {
    let p = planner();
    let mut buf = NormalizeBuf::new();
    let plan = p.plan(
        "BEGIN; UPDATE kv SET v = 'x' WHERE id = 10; SELECT 1; COMMIT;",
        &mut buf,
    );
    assert_eq!(plan.statements().len(), 4);
    assert_eq!(plan.statements()[0], Route::Begin);
    assert_eq!(plan.statements()[2], Route::Any);
    assert_eq!(plan.statements()[3], Route::Commit);
    let Route::Keyed { keys, .. } = &plan.statements()[1] else {
        panic!("{:?}", plan.statements())
    };
    // Literal numbering runs across the statements: 'x' is $1, 10 is $2.
    assert_eq!(keys, &[KeySource::Param(1)]);
    assert_eq!(plan.key_value(&keys[0]), Some(KeyValue::Text("10")));
    assert!(routes(&p, "").is_empty());
}

#[test]
fn fallback_to_the_original_text() {
    let p = planner();
    assert_eq!(route(&p, "SELECT INTERVAL '1 day'"), Route::Any);
    // Typed literals still route by key, whichever text got planned.
    assert_eq!(
        keys(&p, "SELECT DATE '2020-01-01' FROM kv WHERE id = 3"),
        ["3"]
    );
    assert_eq!(
        keys(&p, "SELECT DATE '2021-02-02' FROM kv WHERE id = 4"),
        ["4"]
    );

    // `varchar($1)` does not parse: the original text is planned, literals kept.
    let mut buf = NormalizeBuf::new();
    let plan = p.plan("SELECT 'x'::varchar(10) FROM kv WHERE id = 3", &mut buf);
    assert!(!plan.normalized);
    match plan.statements() {
        [Route::Keyed { keys, .. }] => {
            assert_eq!(keys, &[KeySource::Literal("3".to_string())]);
            assert_eq!(plan.key_value(&keys[0]), Some(KeyValue::Text("3")));
        }
        other => panic!("{other:?}"),
    }
    // Same shape, another key: its own plan under its own text, still correct.
    assert_eq!(
        keys(&p, "SELECT 'x'::varchar(10) FROM kv WHERE id = 4"),
        ["4"]
    );
    // The same original again hits both the marker entry and the original's plan.
    let before = p.cache_stats();
    let again = p.plan("SELECT 'x'::varchar(10) FROM kv WHERE id = 4", &mut buf);
    assert!(!again.normalized);
    let after = p.cache_stats();
    assert_eq!(
        (after.hits - before.hits, after.misses - before.misses),
        (2, 0)
    );
    // DDL with type modifiers takes the same path.
    assert_eq!(
        route(&p, "CREATE TABLE t (a varchar(10), b numeric(10, 2))"),
        Route::Default
    );
}

#[test]
fn malformed_sql_is_unparsed() {
    let p = planner();
    for sql in [
        "SELEKT 1",
        "SELECT * FROM settings WHERE k = ",
        "SELECT 'unterminated",
        "SELECT (1",
    ] {
        assert_eq!(routes(&p, sql), [Route::Unparsed], "{sql}");
    }
    // Text the parser rejects but that names a sharded table is never sent to one shard
    // blindly: Postgres accepts `TABLE kv`, and the default shard would return part of kv.
    unroutable(&p, "TABLE kv", "does not understand");
    unroutable(&p, "SELECT * FROM kv WHERE id = ", "sharded table kv");
}

#[test]
fn keys_resolve_to_the_right_shard() {
    let p = planner();
    let map = Arc::clone(p.map());
    let mut buf = NormalizeBuf::new();
    for id in [-5i64, 0, 1, 41, 42, 1 << 40] {
        let sql = format!("SELECT * FROM kv WHERE id = {id}");
        let plan = p.plan(&sql, &mut buf);
        let Route::Keyed { keys, key_type, .. } = &plan.statements()[0] else {
            panic!("not keyed")
        };
        let Some(KeyValue::Text(text)) = plan.key_value(&keys[0]) else {
            panic!("no literal")
        };
        let key = key_from_text(*key_type, text).expect("valid key");
        assert_eq!(map.shard_for_key(&key), map.shard_for_key(&Key::Int(id)));
    }
}

#[test]
fn explain_route_inner_text() {
    assert_eq!(
        explain_route_inner("explain (route) SELECT 1"),
        Some("SELECT 1")
    );
    assert_eq!(
        explain_route_inner("  EXPLAIN ( verbose, ROUTE )\n SELECT * FROM kv"),
        Some("SELECT * FROM kv")
    );
    assert_eq!(explain_route_inner("EXPLAIN (VERBOSE) SELECT 1"), None);
    assert_eq!(explain_route_inner("EXPLAIN SELECT 1"), None);
    assert_eq!(explain_route_inner("SELECT 1"), None);
}

#[test]
fn only_statements_that_leave_nothing_on_the_connection_may_share_it() {
    let p = planner();
    let shareable = |sql: &str| {
        let mut buf = NormalizeBuf::new();
        p.plan(sql, &mut buf).shareable
    };
    for sql in [
        "SELECT v FROM kv WHERE id = 1",
        "UPDATE kv SET v = 'x' WHERE id = 2",
        "INSERT INTO kv (id, v) VALUES (3, 'a') ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
        "DELETE FROM kv WHERE id = 4",
        "SELECT 1",
        "SELECT temperature FROM readings",
    ] {
        assert!(shareable(sql), "{sql}");
    }
    for sql in [
        "SET search_path = app",
        "RESET ALL",
        "SELECT set_config('search_path', 'app', false)",
        "SELECT pg_advisory_lock(1)",
        "SELECT pg_try_advisory_lock_shared(1)",
        "CREATE TEMP TABLE t (a int)",
        "SELECT * INTO TEMPORARY t FROM kv WHERE id = 1",
        "BEGIN",
        "COMMIT",
        "LISTEN x",
        "COPY kv TO STDOUT",
        "DECLARE c CURSOR FOR SELECT 1",
        "PREPARE p AS SELECT 1",
        "SELECT v FROM kv",
    ] {
        assert!(!shareable(sql), "{sql}");
    }
}

#[test]
fn a_subquery_in_from_is_never_scattered() {
    // Each shard would group, count, DISTINCT or LIMIT its own rows only: summing or
    // concatenating those is not the answer (it was, before: a wrong answer).
    let p = planner();
    for sql in [
        "SELECT count(*) FROM (SELECT v FROM kv GROUP BY v) s",
        "SELECT * FROM (SELECT v, count(*) FROM kv GROUP BY v) s",
        "SELECT * FROM (SELECT * FROM kv LIMIT 5) s",
        "SELECT count(*) FROM (SELECT DISTINCT v FROM kv) s",
        "SELECT s.v FROM kv JOIN (SELECT id, v FROM kv ORDER BY v LIMIT 3) s USING (id)",
        "SELECT count(*) FROM kv WHERE id IN (1, 2, 3, 4, 5, 6, 7, 8) AND v IN (SELECT 'a')",
    ] {
        assert!(!merged(&p, sql), "{sql}: {:?}", route(&p, sql));
    }
    // A subquery that passes rows on is a table's rows (SQLAlchemy's Query.count() writes
    // `SELECT count(*) FROM (SELECT ...) AS anon_1`).
    for sql in [
        "SELECT count(*) FROM (SELECT id, v FROM kv WHERE id BETWEEN 1 AND 100) s",
        "SELECT s.v, count(*) FROM (SELECT v, id + 1 AS n FROM kv) s GROUP BY s.v",
        "SELECT * FROM (SELECT * FROM (SELECT id FROM kv WHERE v = 'a') a) b",
    ] {
        assert!(matches!(route(&p, sql), Route::Scatter { .. }), "{sql}");
    }
    for sql in [
        "SELECT count(*) FROM (SELECT lower(v) FROM kv) s",
        "SELECT * FROM (SELECT * FROM (SELECT id FROM kv LIMIT 1) a) b",
    ] {
        assert!(!merged(&p, sql), "{sql}");
    }
    for sql in [
        "SELECT * FROM (SELECT v, count(*) FROM kv WHERE id IN (1, 2, 3, 4, 5, 6, 7, 8) GROUP BY v) s",
        "SELECT count(*) FROM (SELECT v FROM kv WHERE id = ANY($1) GROUP BY v) s",
    ] {
        match route(&p, sql) {
            Route::Keyed { spread, .. } => assert!(
                spread.is_none() || staged_part(&p, sql).is_some(),
                "{sql}: {spread:?}"
            ),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

#[test]
fn window_functions_and_subqueries_in_the_select_list_are_never_scattered() {
    // A window over each shard's rows is not the window over all rows, also as a DISTINCT key
    // (it was scattered, before: a wrong answer).
    let p = planner();
    for sql in [
        "SELECT DISTINCT v, count(*) OVER () FROM kv",
        "SELECT DISTINCT lower(v), row_number() OVER (ORDER BY v) FROM kv",
        "SELECT v, count(*), rank() OVER (ORDER BY count(*) DESC) FROM kv GROUP BY v",
        "SELECT DISTINCT v, v IN (SELECT 'a') FROM kv",
    ] {
        assert!(!merged(&p, sql), "{sql}: {:?}", route(&p, sql));
    }
    // Expressions of group keys stay fine.
    assert!(matches!(
        route(&p, "SELECT v || 'x', count(*) FROM kv GROUP BY v || 'x'"),
        Route::Scatter { .. }
    ));
}

fn with_regions() -> Planner {
    let urls: Vec<String> = (0..4).map(|i| format!("postgres://h/s{i}")).collect();
    let tables = vec![
        Table::new("kv", "id", KeyType::BigInt),
        Table::new("items", "id", KeyType::BigInt),
    ];
    let map = ShardMap::even_split(&urls, tables)
        .and_then(|m| m.with_references(vec![shardmap::Reference::new("regions")]))
        .expect("valid map");
    Planner::new(Arc::new(map), 1000)
}

#[test]
fn reads_of_reference_tables_go_anywhere_and_join_where_the_sharded_rows_are() {
    let p = with_regions();
    assert_eq!(
        route(&p, "SELECT * FROM regions WHERE code = 'eu'"),
        Route::Any
    );
    unroutable(
        &p,
        "SELECT * FROM regions WHERE code = 'eu' FOR UPDATE",
        "lock its rows on one shard",
    );
    unroutable(
        &p,
        "SELECT * FROM kv JOIN regions r ON r.code = kv.v WHERE kv.id = 1 FOR UPDATE OF r",
        "lock its rows on one shard",
    );
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv k JOIN regions r ON r.code = k.v WHERE k.id = 1 FOR UPDATE OF k"
        ),
        vec!["1"]
    );
    assert_eq!(
        route(
            &p,
            "SELECT r.name, s.v FROM regions r JOIN settings s ON s.k = r.code"
        ),
        Route::Default
    );
    assert_eq!(
        keys(
            &p,
            "SELECT * FROM kv JOIN regions r ON r.code = kv.region WHERE kv.id = 7"
        ),
        vec!["7"]
    );
    for sql in [
        "SELECT kv.id, r.name FROM kv JOIN regions r ON r.code = kv.region",
        "SELECT count(*) FROM kv LEFT JOIN regions r ON r.code = kv.region",
        "SELECT r.name, count(*) FROM kv, regions r WHERE r.code = kv.region GROUP BY r.name",
        "SELECT * FROM kv WHERE kv.region IN (SELECT code FROM regions)",
    ] {
        assert!(matches!(route(&p, sql), Route::Scatter { .. }), "{sql}");
    }
    for (sql, why) in [
        (
            "SELECT * FROM regions r LEFT JOIN kv ON r.code = kv.region",
            "outer join keeps rows",
        ),
        (
            "SELECT * FROM regions r WHERE r.code IN (SELECT region FROM kv)",
            "only in a subquery",
        ),
        (
            "SELECT * FROM kv JOIN settings s ON s.k = kv.region",
            "unsharded table settings",
        ),
    ] {
        unroutable(&p, sql, why);
    }
}

#[test]
fn a_read_whose_rows_every_shard_has_is_not_scattered() {
    let p = planner();
    unroutable(
        &p,
        "SELECT 1 WHERE EXISTS (SELECT 1 FROM kv)",
        "only in a subquery",
    );
    unroutable(
        &p,
        "SELECT * FROM (SELECT 1 AS a) s WHERE a IN (SELECT id FROM kv)",
        "only in a subquery",
    );
    // Keys on several shards: no merge, so the resolver refuses it rather than spread it.
    match route(
        &p,
        "SELECT 1 WHERE EXISTS (SELECT 1 FROM kv WHERE id IN (1, 2, 3))",
    ) {
        Route::Keyed { spread: None, .. } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn writes_of_reference_tables_run_everywhere_and_must_do_the_same_there() {
    let p = with_regions();
    for sql in [
        "INSERT INTO regions (code, name) VALUES ('eu', 'Europe')",
        "INSERT INTO regions VALUES ('eu', 'Europe') ON CONFLICT (code) DO UPDATE SET name = excluded.name RETURNING *",
        "UPDATE regions SET name = upper(name) WHERE code = 'eu'",
        "DELETE FROM regions WHERE code IN (SELECT code FROM regions WHERE name = '')",
    ] {
        assert_eq!(route(&p, sql), Route::Replicated { table: "regions".into() }, "{sql}");
    }
    for (sql, why) in [
        (
            "INSERT INTO regions SELECT region, 'x' FROM kv",
            "not the sharded table kv",
        ),
        (
            "INSERT INTO regions SELECT k, v FROM settings",
            "only on the default shard",
        ),
        (
            "INSERT INTO regions VALUES ('eu', now()::text)",
            "now() would give each shard",
        ),
        (
            "UPDATE regions SET name = gen_random_uuid()::text",
            "gen_random_uuid()",
        ),
        (
            "INSERT INTO regions VALUES (nextval('s')::text, 'x')",
            "nextval()",
        ),
    ] {
        unroutable(&p, sql, why);
    }
    // A sharded write may read a reference table.
    assert_eq!(
        keys(
            &p,
            "UPDATE kv SET v = r.name FROM regions r WHERE r.code = kv.region AND kv.id = 3"
        ),
        vec!["3"]
    );
    match route(&p, "EXPLAIN ANALYZE DELETE FROM regions") {
        Route::Unroutable { message } => assert!(message.contains("EXPLAIN ANALYZE"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(route(&p, "EXPLAIN DELETE FROM regions"), Route::Any);
}

#[test]
fn ddl_of_reference_tables_runs_on_every_shard() {
    let p = with_regions();
    for sql in [
        "CREATE TABLE regions (code text PRIMARY KEY, name text)",
        "ALTER TABLE regions ADD COLUMN note text",
        "CREATE INDEX ON regions (name)",
        "TRUNCATE regions",
        "DROP TABLE regions",
        "DROP TABLE regions, kv",
        "COMMENT ON TABLE regions IS 'everywhere'",
        "CREATE TABLE items (id bigint PRIMARY KEY, region text REFERENCES regions (code))",
    ] {
        assert_eq!(route(&p, sql), Route::Broadcast, "{sql}");
    }
    for sql in [
        "CREATE TABLE notes (id int, region text REFERENCES regions (code))",
        "CREATE VIEW region_names AS SELECT name FROM regions",
    ] {
        assert_eq!(route(&p, sql), Route::Default, "{sql}");
    }
    for (sql, why) in [
        (
            "ALTER TABLE regions ADD COLUMN uid uuid DEFAULT gen_random_uuid()",
            "gen_random_uuid()",
        ),
        (
            "ALTER TABLE regions ADD COLUMN created timestamptz DEFAULT now()",
            "now()",
        ),
        (
            "ALTER TABLE regions ADD COLUMN seq bigserial",
            "sequence values",
        ),
        (
            "ALTER TABLE regions ADD COLUMN n int GENERATED ALWAYS AS IDENTITY",
            "sequence values",
        ),
    ] {
        unroutable(&p, sql, why);
    }
    for sql in [
        "ALTER TABLE regions ADD COLUMN tier int DEFAULT 1",
        "ALTER TABLE regions ADD COLUMN up text GENERATED ALWAYS AS (upper(name)) STORED",
        "ALTER TABLE regions ALTER COLUMN name SET DEFAULT 'x'",
    ] {
        assert_eq!(route(&p, sql), Route::Broadcast, "{sql}");
    }
    unroutable(
        &p,
        "DROP TABLE regions, settings",
        "drop them in separate statements",
    );
    unroutable(
        &p,
        "TRUNCATE regions, settings",
        "only on the default shard",
    );
    assert_eq!(route(&p, "COPY regions TO STDOUT"), Route::Any);
    assert_eq!(
        route(&p, "COPY regions FROM STDIN WITH (FORMAT csv)"),
        Route::CopyIn(CopyRows::ToEveryShard)
    );
    unroutable(
        &p,
        "COPY regions FROM '/tmp/r.csv'",
        "from a file or program",
    );
}

#[test]
fn groups_by_the_key_are_whole_on_their_shard() {
    let p = planner();
    let rows = |sql: &str| match route(&p, sql) {
        Route::Scatter {
            merge: Merge::Concat { .. },
            ..
        } => "concat",
        Route::Scatter {
            merge: Merge::Combine(m),
            ..
        } if m.group.is_none() => "sorted",
        other => panic!("{sql}: {other:?}"),
    };
    assert_eq!(
        rows("SELECT id, sum(n) FROM kv GROUP BY id HAVING sum(n) > 3"),
        "concat"
    );
    assert_eq!(rows("SELECT id, max(n) - min(n), stddev_pop(n), count(DISTINCT v) FROM kv GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 5"), "sorted");
    assert_eq!(
        rows("SELECT DISTINCT ON (id) id, v FROM kv ORDER BY id, v DESC"),
        "sorted"
    );
    assert_eq!(
        rows("SELECT kv.id, string_agg(v, ',' ORDER BY v) FROM kv GROUP BY kv.id, v"),
        "concat"
    );
    // A subquery in FROM whose groups are whole is read like a table.
    assert!(matches!(
        route(&p, "SELECT count(*), sum(s.total) FROM (SELECT id, sum(n) AS total FROM kv GROUP BY id HAVING count(*) > 1) s"),
        Route::Scatter { merge: Merge::Combine(ref m), .. } if m.group.is_some()
    ));
    // Not by the key, or cutting across groups: refused as before.
    for (sql, why) in [
        (
            "SELECT v, sum(n) FROM kv GROUP BY v HAVING sum(n) > 3",
            "HAVING",
        ),
        (
            "SELECT DISTINCT id, count(*) FROM kv GROUP BY id",
            "DISTINCT with aggregates",
        ),
        (
            "SELECT id, rank() OVER (ORDER BY sum(n)) FROM kv GROUP BY id",
            "window",
        ),
        (
            "SELECT count(*) FROM (SELECT id FROM kv GROUP BY id LIMIT 3) s",
            "subquery in FROM",
        ),
        (
            "SELECT id, count(*) FROM kv GROUP BY GROUPING SETS ((id), ()) HAVING count(*) > 1",
            "HAVING",
        ),
    ] {
        unroutable(&p, sql, why);
    }
}

#[test]
fn distinct_keys_add_up_across_shards() {
    let p = planner();
    match route(
        &p,
        "SELECT v, count(DISTINCT id), sum(DISTINCT kv.id) FROM kv GROUP BY v",
    ) {
        Route::Scatter {
            merge: Merge::Combine(m),
            ..
        } => assert_eq!(
            m.group.as_deref(),
            Some(
                &[
                    crate::merge::Out::Key(0),
                    crate::merge::Out::Agg {
                        op: crate::merge::AggOp::Count,
                        column: 1
                    },
                    crate::merge::Out::Agg {
                        op: crate::merge::AggOp::Sum,
                        column: 2
                    },
                ][..]
            )
        ),
        other => panic!("{other:?}"),
    }
    // count(DISTINCT) of another column: the shards group by it too, the router counts.
    match route(&p, "SELECT count(DISTINCT v) AS kinds, count(*) FROM kv") {
        Route::Scatter {
            merge: Merge::Combine(m),
            ..
        } => {
            assert_eq!(
                m.group.as_deref(),
                Some(
                    &[
                        crate::merge::Out::CountDistinct { column: 0 },
                        crate::merge::Out::Agg {
                            op: crate::merge::AggOp::Count,
                            column: 1
                        },
                    ][..]
                )
            );
            assert_eq!(m.avg_names, ["kinds"]);
        }
        other => panic!("{other:?}"),
    }
    unroutable(
        &p,
        "SELECT count(DISTINCT v) FILTER (WHERE n > 1) FROM kv",
        "function in the select list",
    );
    unroutable(
        &p,
        "SELECT avg(DISTINCT id) FROM kv",
        "function in the select list",
    );
}

#[test]
fn subqueries_tied_to_the_enclosing_key_run_with_its_rows() {
    let p = with_regions();
    // Scattered: each items row read lives with its kv row.
    for sql in [
        "SELECT kv.id FROM kv WHERE EXISTS (SELECT 1 FROM items i WHERE i.id = kv.id AND i.n > 2)",
        "SELECT count(*) FROM kv k WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.id = k.id)",
        "SELECT k.id FROM kv k WHERE k.n > (SELECT avg(i.n) FROM items i WHERE k.id = i.id) ORDER BY 1",
    ] {
        assert!(matches!(route(&p, sql), Route::Scatter { .. }), "{sql}");
    }
    // Pinned: the enclosing key pins the subquery's table too.
    assert_eq!(
        keys(&p, "SELECT * FROM kv k WHERE k.id = 7 AND EXISTS (SELECT 1 FROM items i WHERE i.id = k.id)"),
        vec!["7", "7"]
    );
    match route(&p, "SELECT * FROM kv k WHERE k.id IN (1, 2, 3) AND EXISTS (SELECT 1 FROM items i WHERE i.id = k.id)") {
        Route::Keyed { spread: Some(_), .. } => {}
        other => panic!("{other:?}"),
    }
    // Not tied: another column, an unqualified name (the subquery's own), an alias the
    // subquery itself uses, or not an equality at the top of its WHERE.
    for sql in [
        "SELECT kv.id FROM kv WHERE EXISTS (SELECT 1 FROM items i WHERE i.n = kv.id)",
        "SELECT kv.id FROM kv WHERE EXISTS (SELECT 1 FROM items WHERE id = id)",
        "SELECT k.id FROM kv k WHERE EXISTS (SELECT 1 FROM items i, regions k WHERE i.id = k.id)",
        "SELECT k.id FROM kv k WHERE EXISTS (SELECT 1 FROM items i WHERE i.id = k.id OR i.n = 1)",
        "SELECT * FROM items i WHERE i.id IN (SELECT k.id FROM kv k)",
    ] {
        assert!(
            matches!(route(&p, sql), Route::Unroutable { .. }),
            "{sql}: {:?}",
            route(&p, sql)
        );
    }
}

#[test]
fn reference_writes_must_give_columns_whose_default_differs_per_shard() {
    let p = with_regions();
    let facts = TableFacts {
        per_shard_defaults: vec![("id".into(), 0), ("added".into(), 3)],
        ..TableFacts::default()
    };
    p.learn_tables([("regions".to_string(), facts)].into_iter().collect());
    // COPY too: without a column list every column comes from the rows.
    for sql in [
        "COPY regions FROM STDIN",
        "COPY regions (added, id, code) FROM STDIN",
    ] {
        assert_eq!(
            route(&p, sql),
            Route::CopyIn(CopyRows::ToEveryShard),
            "{sql}"
        );
    }
    unroutable(
        &p,
        "COPY regions (code, name, added) FROM STDIN",
        "column id",
    );
    for sql in [
        "INSERT INTO regions (id, code, name, added) VALUES (1, 'eu', 'Europe', '2026-01-01')",
        "INSERT INTO regions VALUES (1, 'eu', 'Europe', '2026-01-01')",
        "INSERT INTO regions (\"ID\", id, added) SELECT 1, 2, 3",
        "UPDATE regions SET name = DEFAULT",
    ] {
        assert_eq!(
            route(&p, sql),
            Route::Replicated {
                table: "regions".into()
            },
            "{sql}"
        );
    }
    for (sql, column) in [
        (
            "INSERT INTO regions (code, name, added) VALUES ('eu', 'Europe', '2026-01-01')",
            "id",
        ),
        (
            "INSERT INTO regions (id, code, added) VALUES (1, 'eu', DEFAULT)",
            "added",
        ),
        ("INSERT INTO regions VALUES (1, 'eu', 'Europe')", "added"),
        ("INSERT INTO regions DEFAULT VALUES", "id"),
        (
            "INSERT INTO regions SELECT 1, 'eu', 'x', '2026-01-01'",
            "id",
        ),
        ("UPDATE regions SET added = DEFAULT WHERE id = 1", "added"),
        ("UPDATE regions SET (name, added) = ('x', DEFAULT)", "added"),
        ("INSERT INTO regions (id, code, name, added) VALUES (1, 'eu', 'E', '2026-01-01') ON CONFLICT (code) DO UPDATE SET added = DEFAULT", "added"),
    ] {
        unroutable(&p, sql, &format!("its column {column}"));
    }
}

#[test]
fn reference_writes_that_could_differ_per_shard_or_hide_in_other_statements_are_refused() {
    let p = with_regions();
    for (sql, why) in [
        ("WITH v(c, n) AS (VALUES ('eu', 'Europe')) INSERT INTO regions SELECT c, n FROM v", "cannot be part of another statement"),
        ("WITH d AS (DELETE FROM regions WHERE code = 'x' RETURNING *) SELECT * FROM d", "cannot be part of another statement"),
        ("WITH r AS (INSERT INTO regions VALUES ('q', 'Q') RETURNING code) SELECT * FROM kv WHERE id = 1", "cannot be part of another statement"),
        ("COPY (DELETE FROM regions RETURNING *) TO STDOUT", "cannot be part of another statement"),
        ("DELETE FROM regions WHERE ctid IN (SELECT ctid FROM regions LIMIT 10)", "differs per shard"),
        ("UPDATE regions SET name = 'x' WHERE code = (SELECT code FROM regions ORDER BY code LIMIT 1)", "LIMIT"),
        ("INSERT INTO regions SELECT 'all', string_agg(code, ',') FROM regions", "string_agg()"),
        ("INSERT INTO regions SELECT code || row_number() OVER (), name FROM regions", "row_number()"),
        ("INSERT INTO regions VALUES ('db', current_database())", "current_database()"),
        ("INSERT INTO regions VALUES ('pid', pg_backend_pid()::text)", "pg_backend_pid()"),
        ("INSERT INTO regions SELECT relname, 'x' FROM pg_class", "system catalogs"),
    ] {
        unroutable(&p, sql, why);
    }
    // Deterministic reads of reference tables are fine.
    assert_eq!(
        route(&p, "INSERT INTO regions SELECT code || '-2', upper(name) FROM regions WHERE code IN (SELECT code FROM regions WHERE name <> '')"),
        Route::Replicated { table: "regions".into() }
    );
}

#[test]
fn names_mean_what_postgres_resolves_them_to() {
    let p = with_regions();
    // A middle query that names `t` itself: `t.id` there is regions', not kv's.
    for sql in [
        "SELECT t.id FROM kv t WHERE EXISTS (SELECT 1 FROM regions t WHERE EXISTS (SELECT 1 FROM items i WHERE i.id = t.id))",
        "SELECT t.id FROM kv t WHERE t.id = 1 AND EXISTS (SELECT 1 FROM (SELECT 5 AS id) t WHERE EXISTS (SELECT 1 FROM items i WHERE i.id = t.id))",
    ] {
        assert!(matches!(route(&p, sql), Route::Unroutable { .. }), "{sql}: {:?}", route(&p, sql));
    }
    // Two levels out, through a middle query without that name: still tied.
    assert!(matches!(
        route(&p, "SELECT k.id FROM kv k WHERE EXISTS (SELECT 1 FROM regions r WHERE EXISTS (SELECT 1 FROM items i WHERE i.id = k.id))"),
        Route::Scatter { .. }
    ));
    // DISTINCT ON reads a bare name as an output column: `n AS id` is not the key.
    unroutable(
        &p,
        "SELECT DISTINCT ON (id) n AS id, v FROM kv ORDER BY id, v",
        "DISTINCT ON",
    );
    assert!(matches!(
        route(&p, "SELECT DISTINCT ON (id) id, v FROM kv ORDER BY id, v"),
        Route::Scatter { .. }
    ));
}

#[test]
fn table_commands_count_as_reads_of_their_table() {
    let p = planner();
    unroutable(&p, "SELECT 1 WHERE EXISTS (TABLE kv)", "only in a subquery");
    unroutable(&p, "SELECT 1 WHERE 5 IN (TABLE kv)", "");
    assert!(matches!(route(&p, "TABLE kv"), Route::Unroutable { .. }));
    assert_eq!(route(&p, "TABLE settings"), Route::Unparsed);
}

#[test]
fn arithmetic_of_two_aggregates_merges() {
    let p = planner();
    match route(
        &p,
        "SELECT v, max(n) - min(n) AS spread, (sum(n)) * count(*) FROM kv GROUP BY v",
    ) {
        Route::Scatter {
            merge: Merge::Combine(m),
            ..
        } => {
            use crate::merge::arith::ArithOp;
            use crate::merge::{AggOp, Out};
            assert_eq!(
                m.group.as_deref(),
                Some(
                    &[
                        Out::Key(0),
                        Out::Arith {
                            op: ArithOp::Sub,
                            left: (AggOp::Max, 1),
                            right: (AggOp::Min, 2)
                        },
                        Out::Arith {
                            op: ArithOp::Mul,
                            left: (AggOp::Sum, 3),
                            right: (AggOp::Count, 4)
                        },
                    ][..]
                )
            );
            assert_eq!(m.avg_names, ["spread", "?column?"]);
        }
        other => panic!("{other:?}"),
    }
    // Other shapes stay refused: a literal operand, a function around it, division.
    for sql in [
        "SELECT max(n) - 1 FROM kv",
        "SELECT abs(max(n) - min(n)) FROM kv",
        "SELECT sum(n) / count(*) FROM kv",
    ] {
        assert!(!merged(&p, sql), "{sql}");
    }
}

#[test]
fn reads_the_merge_cannot_finish_run_in_two_stages() {
    use super::staged::Part;
    let p = with_regions();
    let derived = Part::Derived {
        from: 0,
        join: None,
    };
    // This planner has not read the shards' catalogs: the table's rows go whole.
    let table = Part::Table { columns: None };
    for (sql, part) in [
        ("SELECT count(*) FROM (SELECT v FROM kv GROUP BY v) s", derived.clone()),
        (
            "SELECT r.name, s.n FROM regions r JOIN (SELECT v, count(*) AS n FROM items GROUP BY v) s ON s.v = r.code",
            Part::Derived {
                from: 0,
                join: Some(0),
            },
        ),
        ("SELECT DISTINCT v, count(*) OVER () FROM kv", table.clone()),
        ("SELECT coalesce(sum(n), 0) FROM kv k WHERE k.v > 'a'", table.clone()),
        ("SELECT v, sum(n) FROM kv GROUP BY v HAVING sum(n) > 3", table.clone()),
        // Keys on several shards: the first stage runs on theirs.
        (
            "SELECT v FROM kv WHERE id IN (1, 2, 3, 4, 5, 6, 7, 8) GROUP BY v HAVING count(*) > 1",
            table.clone(),
        ),
    ] {
        assert_eq!(staged_part(&p, sql), Some(part), "{sql}: {:?}", route(&p, sql));
    }
    // Where the rest would need rows the VALUES list does not have, or another shard's.
    for sql in [
        "SELECT v, count(*) OVER () FROM kv FOR UPDATE",
        "SELECT k, row_number() OVER () FROM kv k",
        "SELECT Kv, row_number() OVER () FROM Kv",
        "SELECT to_json(k.*), row_number() OVER () FROM kv k",
        "SELECT ctid, row_number() OVER () FROM kv",
        "SELECT k.v, row_number() OVER () FROM kv k JOIN items i ON i.id = k.id",
        "SELECT * FROM (SELECT v, count(*) FROM kv GROUP BY v) s JOIN kv k ON k.v = s.v",
        "WITH s AS (SELECT v FROM kv) SELECT DISTINCT v, count(*) OVER () FROM s",
        "SELECT my_function(v), row_number() OVER () FROM kv",
        "SELECT v, row_number() OVER (ORDER BY v) FROM (SELECT v COLLATE \"C\" AS v FROM kv GROUP BY 1) s",
        "SELECT count(*) FROM (SELECT v FROM kv GROUP BY v) s, LATERAL (SELECT * FROM kv k WHERE k.v = s.v) l",
    ] {
        assert_eq!(staged_part(&p, sql), None, "{sql}: {:?}", route(&p, sql));
        assert!(!merged(&p, sql), "{sql}");
    }
}

#[test]
fn a_tables_first_stage_carries_only_the_columns_the_statement_names() {
    use super::staged::Part;
    let p = with_regions();
    let facts = TableFacts {
        columns: vec![
            "id".into(),
            "v".into(),
            "n".into(),
            "user".into(),
            "big".into(),
        ],
        ..TableFacts::default()
    };
    p.learn_tables([("kv".to_string(), facts)].into_iter().collect());
    let carried = |sql: &str| match staged_part(&p, sql) {
        Some(Part::Table { columns }) => columns,
        other => panic!("{sql}: {other:?}"),
    };
    let names = |n: &[&str]| Some(n.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(
        carried("SELECT v, row_number() OVER (ORDER BY k.n) FROM kv k WHERE big > 1"),
        names(&["v", "n", "big"])
    );
    assert_eq!(
        carried("SELECT \"user\", lag(v) OVER () AS x FROM kv ORDER BY x"),
        names(&["v", "user"])
    );
    assert_eq!(carried("SELECT count(*) OVER () FROM kv"), names(&["id"]));
    assert_eq!(carried("SELECT *, rank() OVER (ORDER BY v) FROM kv"), None);
    // A `*` in a subquery's select list, or names an alias's column list gives: every column.
    assert_eq!(
        carried("SELECT v, rank() OVER () FROM kv k WHERE EXISTS (SELECT k.* FROM regions)"),
        None
    );
    assert_eq!(
        carried("SELECT a, row_number() OVER (ORDER BY a) FROM kv AS k(a, b)"),
        None
    );
    // The row as a value would be rebuilt from the columns carried: refused.
    for sql in [
        "SELECT (k.*)::text, row_number() OVER (ORDER BY id) FROM kv k",
        "SELECT ARRAY[k.*], count(*) OVER () FROM kv k",
    ] {
        assert_eq!(staged_part(&p, sql), None, "{sql}");
    }
}
