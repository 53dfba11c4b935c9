//! Resolver tests: statement text (and Bind parameters) in, targets out, for every plan shape
//! and every transaction rule, against a 4-shard map with `kv (id bigint)`, `users (user_id
//! uuid)`, `names (name text)` and the unsharded `settings`. No server anywhere.

use std::sync::Arc;

use shardmap::{Key, KeyType, ShardMap, Table};

use super::*;
use crate::planner::{NormalizeBuf, Planner};
use crate::protocol::frontend::{self, Bind};

fn map() -> Arc<ShardMap> {
    let urls: Vec<String> = (0..4).map(|i| format!("postgres://h/s{i}")).collect();
    let tables = vec![
        Table::new("kv", "id", KeyType::BigInt),
        Table::new("users", "user_id", KeyType::Uuid),
        Table::new("names", "name", KeyType::Text),
    ];
    Arc::new(ShardMap::even_split(&urls, tables).expect("valid map"))
}

struct Fixture {
    map: Arc<ShardMap>,
    planner: Planner,
}

impl Fixture {
    fn new() -> Fixture {
        let map = map();
        Fixture {
            planner: Planner::new(map.clone(), 1000),
            map,
        }
    }

    fn shard_of(&self, id: i64) -> usize {
        self.map.shard_for_key(&Key::Int(id))
    }

    /// Two keys of kv on different shards.
    fn keys_on_two_shards(&self) -> (i64, i64) {
        let a = 1;
        let b = (2..)
            .find(|&k| self.shard_of(k) != self.shard_of(a))
            .unwrap();
        (a, b)
    }

    /// Resolves `sql` as a simple query (or with `bind`'s body as the Bind), in `tx`, and hands
    /// the target and its printed form to `check`.
    fn with<T>(
        &self,
        sql: &str,
        bind: Option<&[u8]>,
        tx: Transaction,
        manual: Option<&str>,
        allow_scatter_writes: bool,
        check: impl FnOnce(&Target<'_>, String) -> T,
    ) -> T {
        self.in_mode(sql, bind, tx, manual, allow_scatter_writes, false, check)
    }

    /// [`Fixture::with`], and `cross_shard`: whether transactions may span shards.
    #[allow(clippy::too_many_arguments)]
    fn in_mode<T>(
        &self,
        sql: &str,
        bind: Option<&[u8]>,
        tx: Transaction,
        manual: Option<&str>,
        allow_scatter_writes: bool,
        cross_shard: bool,
        check: impl FnOnce(&Target<'_>, String) -> T,
    ) -> T {
        let cx = Context {
            map: &self.map,
            transaction: tx,
            pins: crate::resolver::manual::Pins {
                shard: manual,
                ..Default::default()
            },
            allow_scatter_writes,
            cross_shard,
            keeps: Keeps::default(),
        };
        self.resolving(sql, bind, &cx, check)
    }

    /// Resolves `sql` (with `bind`'s body as the Bind) in `cx`.
    fn resolving<T>(
        &self,
        sql: &str,
        bind: Option<&[u8]>,
        cx: &Context<'_>,
        check: impl FnOnce(&Target<'_>, String) -> T,
    ) -> T {
        let mut buf = NormalizeBuf::new();
        let planned = self.planner.plan(sql, &mut buf);
        let decoded: Option<Bind<'_>> = bind.map(|b| frontend::bind(b).expect("a valid Bind"));
        let stmt = Statement {
            sql,
            plan: &planned,
            params: Params {
                bind: decoded.as_ref(),
                params_before: planned.params_before(),
                literals: &planned,
            },
        };
        let target = resolve(&stmt, cx);
        let text = target.to_string();
        check(&target, text)
    }

    /// The destination of a simple query outside a transaction, and its printed form.
    fn simple(&self, sql: &str) -> (Dest, String) {
        self.with(sql, None, Transaction::None, None, false, take)
    }

    fn in_tx(&self, sql: &str, tx: Transaction) -> Dest {
        self.with(sql, None, tx, None, false, take).0
    }

    fn bound(&self, sql: &str, bind: &[u8]) -> (Dest, String) {
        self.with(sql, Some(bind), Transaction::None, None, false, take)
    }
}

fn take(t: &Target<'_>, text: String) -> (Dest, String) {
    (t.dest.clone(), text)
}

/// A Bind body for the unnamed statement: parameters in text (`None` is NULL) or, with
/// `binary`, the given bytes in binary format.
fn bind_body(params: &[Option<&[u8]>], binary: bool) -> Vec<u8> {
    frontend::bind_body("", "", if binary { &[1] } else { &[] }, params)
}

fn refused(dest: &Dest) -> (&str, &str) {
    match dest {
        Dest::Refused(e) => (&e.code, &e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_key_literal_picks_its_shard_and_says_why() {
    let f = Fixture::new();
    let want = f.shard_of(42);
    let (dest, text) = f.simple("SELECT v FROM kv WHERE id = 42");
    assert!(matches!(dest, Dest::Shard(s) if s == want), "{dest:?}");
    let id = Key::Int(42).keyspace_id();
    let range = &f.map.shards()[want].range;
    assert_eq!(text, format!("shard {range}: kv.id = 42, keyspace id {id}"));
    // The same statement shape with another literal shares the plan, not the shard.
    let (dest, _) = f.simple("SELECT v FROM kv WHERE id = 7");
    assert!(matches!(dest, Dest::Shard(s) if s == f.shard_of(7)));
    f.with(
        "SELECT v FROM kv WHERE id = 42",
        None,
        Transaction::None,
        None,
        false,
        |t, _| {
            assert!(matches!(
                t.why,
                Some(Why::Key {
                    table: "kv",
                    column: "id",
                    value: Key::Int(42),
                    ..
                })
            ));
        },
    );
}

#[test]
fn bind_parameters_in_text_and_binary_pick_the_same_shard() {
    let f = Fixture::new();
    let want = f.shard_of(-9_000_000_001);
    let text = bind_body(&[Some(b"-9000000001")], false);
    let (dest, _) = f.bound("SELECT v FROM kv WHERE id = $1", &text);
    assert!(matches!(dest, Dest::Shard(s) if s == want), "{dest:?}");
    let binary = bind_body(&[Some(&(-9_000_000_001i64).to_be_bytes())], true);
    let (dest, _) = f.bound("SELECT v FROM kv WHERE id = $1", &binary);
    assert!(matches!(dest, Dest::Shard(s) if s == want), "{dest:?}");
    // An int4 of the same value hashes like the int8 (Postgres folds them).
    let int4 = bind_body(&[Some(&7i32.to_be_bytes())], true);
    let (dest, _) = f.bound("SELECT v FROM kv WHERE id = $1", &int4);
    assert!(matches!(dest, Dest::Shard(s) if s == f.shard_of(7)));
    // Text and uuid keys.
    let uuid = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
    let key = KeyType::Uuid.parse_key(uuid).unwrap();
    let (dest, text) = f.simple(&format!("SELECT * FROM users WHERE user_id = '{uuid}'"));
    assert!(matches!(dest, Dest::Shard(s) if s == f.map.shard_for_key(&key)));
    assert!(text.contains(&format!("users.user_id = {uuid}")), "{text}");
    let (dest, text) = f.simple("SELECT * FROM names WHERE name = 'it''s'");
    assert!(matches!(dest, Dest::Shard(s) if s == f.map.shard_for_key(&Key::Text("it's"))));
    assert!(text.contains("names.name = 'it''s'"), "{text}");
}

#[test]
fn bad_or_missing_keys_are_refused_never_guessed() {
    let f = Fixture::new();
    let bad = bind_body(&[Some(b"forty-two")], false);
    let (dest, _) = f.bound("SELECT v FROM kv WHERE id = $1", &bad);
    assert_eq!(refused(&dest).0, "22P02");
    let short = bind_body(&[Some(&[1, 2, 3])], true);
    let (dest, _) = f.bound("SELECT v FROM kv WHERE id = $1", &short);
    assert_eq!(refused(&dest).0, "22P02");
    let none = bind_body(&[], false);
    let (dest, _) = f.bound("SELECT v FROM kv WHERE id = $1", &none);
    assert_eq!(refused(&dest).0, "08P01");
    // A NULL key matches no row anywhere: any shard answers.
    let null = bind_body(&[None], false);
    let (dest, _) = f.bound("SELECT v FROM kv WHERE id = $1", &null);
    assert!(matches!(dest, Dest::Any), "{dest:?}");
}

#[test]
fn tables_outside_the_map_and_no_table_at_all() {
    let f = Fixture::new();
    let (dest, text) = f.simple("SELECT * FROM settings WHERE k = 'a'");
    assert!(matches!(dest, Dest::Shard(s) if s == f.map.default_shard()));
    assert!(
        text.ends_with("unsharded tables live on the default shard"),
        "{text}"
    );
    let (dest, text) = f.simple("SELECT 1");
    assert!(matches!(dest, Dest::Any));
    assert_eq!(text, "any shard: no sharded or unsharded table");
    let (dest, text) = f.simple("FROBNICATE now");
    assert!(matches!(dest, Dest::Shard(s) if s == f.map.default_shard()));
    assert!(text.contains("not understood"), "{text}");
}

#[test]
fn keys_on_one_shard_or_several() {
    let f = Fixture::new();
    let (a, b) = f.keys_on_two_shards();
    let same = (a + 1..).find(|&k| f.shard_of(k) == f.shard_of(a)).unwrap();
    let (dest, text) = f.simple(&format!("SELECT * FROM kv WHERE id IN ({a}, {same})"));
    assert!(matches!(dest, Dest::Shard(s) if s == f.shard_of(a)));
    assert!(
        text.contains("2 values of kv.id, all in this range"),
        "{text}"
    );
    // A read whose keys fall on several shards runs on those shards only.
    let (dest, text) = f.simple(&format!("SELECT * FROM kv WHERE id IN ({a}, {b})"));
    let Dest::Read(read) = dest else {
        panic!("expected a read on several shards: {dest:?}")
    };
    let mut want = vec![f.shard_of(a), f.shard_of(b)];
    want.sort();
    assert_eq!(read.shards, want);
    assert!(read.keyed && read.merge.is_none());
    assert!(text.contains("those of its keys"), "{text}");
    // So does a write, one transaction per shard.
    let (dest, _) = f.simple(&format!("UPDATE kv SET v = 'x' WHERE id IN ({a}, {b})"));
    assert!(
        matches!(&dest, Dest::Write(w) if w.keyed && w.shards == want),
        "{dest:?}"
    );
    // = ANY of a binary array parameter.
    let mut array = Vec::new();
    for v in [1i32, 0, 20, 2, 1] {
        array.extend_from_slice(&v.to_be_bytes());
    }
    for k in [a, b] {
        array.extend_from_slice(&8i32.to_be_bytes());
        array.extend_from_slice(&k.to_be_bytes());
    }
    let bind = bind_body(&[Some(&array)], true);
    let (dest, _) = f.bound("SELECT * FROM kv WHERE id = ANY($1)", &bind);
    assert!(
        matches!(&dest, Dest::Read(r) if r.shards == want),
        "{dest:?}"
    );
    let broken = bind_body(&[Some(&array[..array.len() - 3])], true);
    let (dest, _) = f.bound("SELECT * FROM kv WHERE id = ANY($1)", &broken);
    assert_eq!(refused(&dest).0, "22P02");
    // A join of two pinned references on two shards cannot run anywhere.
    let (dest, _) = f.simple(&format!(
        "SELECT * FROM kv a JOIN kv b ON true WHERE a.id = {a} AND b.id = {b}"
    ));
    assert!(refused(&dest).1.contains("fall on several shards"));
}

#[test]
fn reads_without_a_key_are_merged_or_refused() {
    let f = Fixture::new();
    let (dest, text) = f.simple("SELECT * FROM kv");
    assert!(
        matches!(&dest, Dest::Read(r) if r.shards == [0, 1, 2, 3] && !r.keyed && r.merge.is_none())
    );
    assert!(text.contains("rows concatenated in shard order"), "{text}");
    let (dest, text) = f.simple("SELECT id, v FROM kv ORDER BY id DESC LIMIT 3 OFFSET 2");
    let Dest::Read(read) = dest else {
        panic!("{dest:?}")
    };
    assert!(read.merge.is_some());
    assert_eq!((read.limit, read.offset), (Some(3), 2));
    assert!(
        read.shard_sql.is_some(),
        "the shards are asked for limit + offset rows"
    );
    assert!(text.contains("sorted streams merged on 1 keys"), "{text}");
    let (dest, text) = f.simple("SELECT avg(id) FROM kv");
    let Dest::Read(read) = dest else {
        panic!("{dest:?}")
    };
    assert!(read
        .shard_sql
        .as_deref()
        .is_some_and(|s| s.contains("sum") && s.contains("count")));
    assert!(text.contains("groups combined"), "{text}");
    // A LIMIT from a Bind parameter.
    let bind = bind_body(&[Some(b"5")], false);
    let (dest, _) = f.bound("SELECT id FROM kv ORDER BY id LIMIT $1", &bind);
    assert!(
        matches!(&dest, Dest::Read(r) if r.limit == Some(5)),
        "{dest:?}"
    );
    // Cast, as SQLAlchemy writes it, and sent as a binary int2.
    let bind = bind_body(&[Some(&3i16.to_be_bytes())], true);
    let (dest, _) = f.bound("SELECT id FROM kv ORDER BY id LIMIT $1::INTEGER", &bind);
    assert!(
        matches!(&dest, Dest::Read(r) if r.limit == Some(3)),
        "{dest:?}"
    );
    let bad = bind_body(&[Some(b"-1")], false);
    let (dest, _) = f.bound("SELECT id FROM kv ORDER BY id LIMIT $1", &bad);
    assert_eq!(refused(&dest).0, "22P02");
    // HAVING the merge cannot judge: the rows in two stages, finished on one shard.
    let (dest, text) = f.simple("SELECT v, count(*) FROM kv GROUP BY v HAVING count(*) > 1");
    let Dest::Read(read) = dest else {
        panic!("{dest:?}")
    };
    let staged = read.staged.expect("read in two stages");
    assert_eq!(read.shards, [0, 1, 2, 3]);
    assert_eq!(read.shard_sql.as_deref(), Some("SELECT * FROM kv"));
    assert_eq!(
        (
            staged.before.as_str(),
            staged.after.as_str(),
            staged.alias.as_str()
        ),
        (
            "SELECT v, count(*) FROM ",
            " GROUP BY v HAVING count(*) > 1",
            "kv"
        )
    );
    assert!(text.contains("then shard"), "{text}");
    // Two reads across shards in one query.
    let (dest, _) = f.simple("SELECT * FROM kv; SELECT 1");
    assert!(refused(&dest).1.contains("must be the only statement"));
}

#[test]
fn writes_without_a_key_need_an_opt_in() {
    let f = Fixture::new();
    let (dest, _) = f.simple("DELETE FROM kv WHERE v = 'x'");
    let (code, message) = refused(&dest);
    assert_eq!(code, "0A000");
    assert!(message.contains("allow_scatter_writes"), "{message}");
    let dest = f.with(
        "DELETE FROM kv WHERE v = 'x'",
        None,
        Transaction::None,
        None,
        true,
        take,
    );
    assert!(
        matches!(&dest.0, Dest::Write(w) if !w.keyed && w.shards.len() == 4),
        "{dest:?}"
    );
    assert!(dest.1.contains("committed together"), "{}", dest.1);
}

#[test]
fn multi_row_inserts_split_by_row() {
    let f = Fixture::new();
    let (a, b) = f.keys_on_two_shards();
    let sql =
        format!("INSERT INTO kv (id, v) VALUES ({a}, 'a'), ({b}, 'b'), ({a}, 'c') RETURNING id");
    let (dest, text) = f.simple(&sql);
    let Dest::SplitInsert(split) = dest else {
        panic!("{dest:?}")
    };
    assert_eq!(split.parts.len(), 2);
    let part_a = split
        .parts
        .iter()
        .position(|p| p.0 == f.shard_of(a))
        .unwrap();
    let part_b = 1 - part_a;
    assert_eq!(split.part_of_row, [part_a, part_b, part_a]);
    assert_eq!(
        split.parts[part_a].1,
        format!("INSERT INTO kv (id, v) VALUES ({a}, 'a'), ({a}, 'c') RETURNING id")
    );
    assert!(text.contains("INSERT of 3 rows split by key"), "{text}");
    // With bound parameters each part numbers its own from $1 and says which are the client's.
    let (sa, sb) = (a.to_string(), b.to_string());
    let bind = bind_body(
        &[
            Some(sa.as_bytes()),
            Some(b"x"),
            Some(sb.as_bytes()),
            Some(b"y"),
            Some(sa.as_bytes()),
        ],
        false,
    );
    let (dest, _) = f.bound(
        "INSERT INTO kv (id, v) VALUES ($1, $2), ($3, $4), ($5, $2) RETURNING id, $4::text",
        &bind,
    );
    let Dest::SplitInsert(split) = dest else {
        panic!("{dest:?}")
    };
    let part_a = split
        .parts
        .iter()
        .position(|p| p.0 == f.shard_of(a))
        .unwrap();
    let part_b = 1 - part_a;
    assert_eq!(
        split.parts[part_a].1,
        "INSERT INTO kv (id, v) VALUES ($1, $2), ($3, $2) RETURNING id, $4::text"
    );
    assert_eq!(split.params[part_a], [0, 1, 4, 3]);
    assert_eq!(
        split.parts[part_b].1,
        "INSERT INTO kv (id, v) VALUES ($1, $2) RETURNING id, $2::text"
    );
    assert_eq!(split.params[part_b], [2, 3]);
    assert_eq!(split.part_of_row, [part_a, part_b, part_a]);
}

#[test]
fn ddl_transaction_control_copy_and_prepared_sql() {
    let f = Fixture::new();
    assert!(matches!(
        f.simple("CREATE INDEX ON kv (v)").0,
        Dest::Broadcast
    ));
    assert!(matches!(
        f.simple("CREATE EXTENSION IF NOT EXISTS pgcrypto").0,
        Dest::Broadcast
    ));
    let (dest, _) = f.simple("CREATE INDEX ON kv (v); SELECT 1");
    assert!(refused(&dest).1.contains("mixes DDL"));
    assert!(matches!(f.simple("BEGIN").0, Dest::Begin));
    assert!(matches!(f.simple("COMMIT").0, Dest::Commit));
    assert!(matches!(f.simple("ROLLBACK").0, Dest::Rollback));
    assert!(matches!(
        f.simple("PREPARE p AS SELECT 1").0,
        Dest::PreparedSql
    ));
    assert!(matches!(
        f.simple("COPY kv (id, v) FROM STDIN").0,
        Dest::CopyIn { .. }
    ));
    let bind = bind_body(&[], false);
    let (dest, _) = f.bound("COPY kv (id, v) FROM STDIN", &bind);
    assert!(refused(&dest).1.contains("simple query protocol only"));
    let (dest, _) = f.bound("EXECUTE p", &bind);
    assert!(refused(&dest).1.contains("simple query protocol only"));
    let (dest, _) = f.simple("COPY kv TO '/tmp/x'");
    assert_eq!(refused(&dest).0, "0A000");
}

#[test]
fn a_transaction_stays_on_its_shard_and_multi_shard_work_stays_out() {
    let f = Fixture::new();
    let (a, b) = f.keys_on_two_shards();
    let on_a = Transaction::Open {
        shard: Some(f.shard_of(a)),
    };
    assert!(matches!(
        f.in_tx(&format!("SELECT * FROM kv WHERE id = {a}"), on_a),
        Dest::Shard(_)
    ));
    let dest = f.in_tx(&format!("SELECT * FROM kv WHERE id = {b}"), on_a);
    let (code, message) = refused(&dest);
    assert_eq!(code, "0A000");
    assert!(
        message.contains("this transaction started on shard"),
        "{message}"
    );
    // Not yet on a shard (a BEGIN the router answered): any shard may be the first.
    let pending = Transaction::Open { shard: None };
    assert!(matches!(
        f.in_tx(&format!("SELECT * FROM kv WHERE id = {b}"), pending),
        Dest::Shard(_)
    ));
    for sql in [
        "SELECT * FROM kv",
        "CREATE INDEX ON kv (v)",
        "COPY kv (id, v) FROM STDIN",
    ] {
        assert_eq!(refused(&f.in_tx(sql, pending)).0, "0A000", "{sql}");
    }
    let split = format!("INSERT INTO kv (id, v) VALUES ({a}, 'a'), ({b}, 'b')");
    assert!(refused(&f.in_tx(&split, pending))
        .1
        .contains("an INSERT inside a transaction cannot do yet"));
    // A failed transaction accepts only its end.
    assert_eq!(
        refused(&f.in_tx("SELECT 1", Transaction::Failed)).0,
        "25P02"
    );
    assert!(matches!(
        f.in_tx("ROLLBACK", Transaction::Failed),
        Dest::Rollback
    ));
    assert!(matches!(
        f.in_tx("COMMIT", Transaction::Failed),
        Dest::Commit
    ));
}

#[test]
fn with_cross_shard_transactions_a_transaction_goes_where_its_statements_go() {
    let f = Fixture::new();
    let (a, b) = f.keys_on_two_shards();
    let on_a = Transaction::Open {
        shard: Some(f.shard_of(a)),
    };
    let multi = |sql: &str| f.in_mode(sql, None, on_a, None, false, true, take).0;
    let to_b = multi(&format!("SELECT * FROM kv WHERE id = {b}"));
    assert!(
        matches!(to_b, Dest::Shard(s) if s == f.shard_of(b)),
        "{to_b:?}"
    );
    assert!(matches!(multi("SELECT count(*) FROM kv"), Dest::Read(_)));
    assert!(matches!(
        multi(&format!("DELETE FROM kv WHERE id IN ({a}, {b})")),
        Dest::Write(_)
    ));
    assert!(matches!(
        multi(&format!(
            "INSERT INTO kv (id, v) VALUES ({a}, 'a'), ({b}, 'b')"
        )),
        Dest::SplitInsert(_)
    ));
    // DDL and COPY still run outside transactions only.
    for sql in ["CREATE INDEX ON kv (v)", "COPY kv (id, v) FROM STDIN"] {
        assert_eq!(refused(&multi(sql)).0, "0A000", "{sql}");
    }
    // A failed transaction still accepts only its end.
    let failed = f
        .in_mode(
            "SELECT 1",
            None,
            Transaction::Failed,
            None,
            false,
            true,
            take,
        )
        .0;
    assert_eq!(refused(&failed).0, "25P02");
}

#[test]
fn what_holds_a_transaction_to_its_shard_keeps_its_statements_there() {
    let f = Fixture::new();
    let (a, b) = f.keys_on_two_shards();
    let pinned = Some(f.shard_of(a));
    let in_tx = |sql: &str, keeps: Keeps| {
        let cx = Context {
            map: &f.map,
            transaction: Transaction::Open { shard: pinned },
            pins: Default::default(),
            allow_scatter_writes: false,
            cross_shard: true,
            keeps: Keeps { pinned, ..keeps },
        };
        f.resolving(sql, None, &cx, take).0
    };
    let to_b = format!("SELECT * FROM kv WHERE id = {b}");
    let to_a = format!("SELECT * FROM kv WHERE id = {a}");
    assert!(matches!(in_tx(&to_b, Keeps::default()), Dest::Shard(_)));
    for (anchor, what) in [
        (Anchor::Savepoint, "a savepoint"),
        (Anchor::Portal, "an open portal"),
    ] {
        let keeps = Keeps {
            anchor: Some(anchor),
            ..Keeps::default()
        };
        let dest = in_tx(&to_b, keeps);
        let (code, message) = refused(&dest);
        assert_eq!(code, "0A000");
        assert!(message.contains(what), "{message}");
        assert!(
            matches!(in_tx(&to_a, keeps), Dest::Shard(_)),
            "its own shard"
        );
        assert_eq!(refused(&in_tx("SELECT count(*) FROM kv", keeps)).0, "0A000");
    }
    let failed = Keeps {
        failed: true,
        ..Keeps::default()
    };
    assert_eq!(refused(&in_tx(&to_b, failed)).0, "25P02");
    assert!(
        matches!(in_tx(&to_a, failed), Dest::Shard(_)),
        "its own shard's backend judges what a failed transaction accepts"
    );
    let spread = Keeps {
        spread: true,
        ..Keeps::default()
    };
    assert_eq!(refused(&in_tx("SAVEPOINT s", spread)).0, "0A000");
    assert!(matches!(in_tx("SAVEPOINT s", Keeps::default()), Dest::Any));
}

#[test]
fn operators_pin_statements_by_hand() {
    let f = Fixture::new();
    let (dest, text) = f.simple("/* shard: 80-c0 */ SELECT count(*) FROM kv");
    let want = f
        .map
        .shard_by_range(&shardmap::KeyRange::parse("80-c0").unwrap())
        .unwrap();
    assert!(matches!(dest, Dest::Shard(s) if s == want), "{dest:?}");
    assert_eq!(
        text,
        "shard 80-c0: pinned by the operator (hint shard: 80-c0)"
    );
    // By a key: the shard of that key, whatever the statement names.
    let (dest, text) = f.simple("/* sharding_key: 42 */ SELECT count(*) FROM kv");
    let of_42 = f.shard_of(42);
    assert!(matches!(dest, Dest::Shard(s) if s == of_42), "{dest:?}");
    assert!(
        text.ends_with("pinned by the operator (hint sharding_key: 42)"),
        "{text}"
    );
    let dest = f.with(
        "SELECT * FROM kv",
        None,
        Transaction::None,
        Some("'-40'"),
        false,
        take,
    );
    assert!(matches!(dest.0, Dest::Shard(0)), "{dest:?}");
    // Transaction control is never pinned; an unknown range is an error.
    let dest = f.with("BEGIN", None, Transaction::None, Some("'-40'"), false, take);
    assert!(matches!(dest.0, Dest::Begin));
    let (dest, _) = f.simple("/* shard: 12- */ SELECT 1");
    assert_eq!(refused(&dest).0, "22023");
    // Still inside the transaction's rules.
    let dest = f.with(
        "/* shard: c0- */ SELECT 1",
        None,
        Transaction::Open { shard: Some(0) },
        None,
        false,
        take,
    );
    assert!(refused(&dest.0)
        .1
        .contains("this transaction started on shard -40"));
}

#[test]
fn explained_routes_are_rows_per_shard() {
    let f = Fixture::new();
    let rows = |sql: &str| {
        f.with(sql, None, Transaction::None, None, false, |t, _| {
            explain::rows(t, sql)
        })
    };
    // One key: its shard, the key and its keyspace ID, the statement as the shard gets it.
    let r = rows("SELECT v FROM kv WHERE id = 42");
    assert_eq!(r.len(), 1);
    let shard = &f.map.shards()[f.shard_of(42)];
    assert_eq!(
        r[0].shard.as_deref(),
        Some(shard.range.to_string().as_str())
    );
    assert_eq!(r[0].primary, Some(shard.primary.endpoint()));
    assert_eq!(r[0].reason, "kv.id = 42");
    assert_eq!(
        r[0].keyspace_id,
        Some(Key::Int(42).keyspace_id().to_string())
    );
    assert_eq!(r[0].sql.as_deref(), Some("SELECT v FROM kv WHERE id = 42"));
    // An IN list on two shards: those two.
    let (a, b) = f.keys_on_two_shards();
    let r = rows(&format!("SELECT * FROM kv WHERE id IN ({a}, {b})"));
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|row| row.reason.contains("keys")));
    // A merged read: every shard, with the text the shards run.
    let r = rows("SELECT avg(id) FROM kv");
    assert_eq!(r.len(), 4);
    assert!(r
        .iter()
        .all(|row| row.how == "groups combined by the router"
            && row.sql.as_deref().is_some_and(|s| s.contains("count"))));
    // A refusal: no shard, the SQLSTATE and why.
    let r = rows("SELECT * FROM kv a JOIN names n ON true");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].shard, None);
    assert!(
        r[0].reason.starts_with("refused (0A000)"),
        "{}",
        r[0].reason
    );
    assert_eq!(r[0].values("hit")[6], Some("hit"));
}

#[test]
fn explain_of_work_on_several_shards_labels_each_shard() {
    let f = Fixture::new();
    let (dest, text) = f.simple("EXPLAIN SELECT id FROM kv ORDER BY id");
    assert!(
        matches!(&dest, Dest::Read(r) if r.labels && r.merge.is_none() && r.shards.len() == 4),
        "{dest:?}"
    );
    assert!(
        text.contains("each shard's answer under a line naming it"),
        "{text}"
    );
    let (dest, _) = f.simple("EXPLAIN SELECT v FROM kv WHERE id = 3");
    assert!(matches!(dest, Dest::Shard(s) if s == f.shard_of(3)));
    let (dest, _) = f.simple("EXPLAIN (ROUTE) SELECT v FROM kv WHERE id = 3");
    assert!(matches!(dest, Dest::ExplainRoute));
    let dest = f
        .with("DELETE FROM kv", None, Transaction::None, None, true, take)
        .0;
    assert!(matches!(dest, Dest::Write(_)));
    let (dest, _) = f.simple("EXPLAIN DELETE FROM kv");
    assert!(
        matches!(&dest, Dest::Read(r) if r.labels),
        "plans only: {dest:?}"
    );
    let (dest, _) = f.simple("EXPLAIN ANALYZE DELETE FROM kv");
    assert!(refused(&dest)
        .1
        .contains("EXPLAIN ANALYZE runs the statement"));
    let (dest, _) =
        f.simple("EXPLAIN (ANALYZE) DELETE FROM kv WHERE id IN (1, 2, 3, 4, 5, 6, 7, 8)");
    assert_eq!(refused(&dest).0, "0A000");
    let bind = bind_body(&[], false);
    let (dest, _) = f.bound("EXPLAIN (ROUTE) SELECT 1", &bind);
    assert!(refused(&dest).1.contains("simple query protocol only"));
}
