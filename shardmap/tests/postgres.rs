//! The Rust keyspace functions against a real Postgres, bit for bit, and the placement
//! predicates against rows stored in Postgres.
//!
//! Each test starts its own throw-away server (pgharness) and compares 10,000+ values per
//! type, including the edges: 0, ±1, the extremes of every integer width, empty and
//! multi-byte text, random UUIDs. Two seeds are checked, the keyspace's and a non-zero one,
//! so the seed path of the hash is covered as well.

use rand::{Rng, SeedableRng};
use shardmap::{hash, predicate, KeyRange, KeyType, ShardMap, Table, KEYSPACE_SEED};
use tokio_postgres::{Client, NoTls};

const SEEDS: [u64; 2] = [KEYSPACE_SEED, 0x7a5b_2236_7996_dcfd];
const RANDOM_VALUES: usize = 10_000;

async fn connect(server: &pgharness::Server) -> Client {
    let (client, conn) = tokio_postgres::connect(&server.url("postgres"), NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(conn);
    client
}

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(0x5eed)
}

/// Runs `SELECT f(v, seed) FROM unnest($1) WITH ORDINALITY` and returns the hashes in order.
async fn pg_hashes<T>(
    client: &Client,
    func: &str,
    array_type: &str,
    values: &[T],
    seed: u64,
) -> Vec<u64>
where
    T: tokio_postgres::types::ToSql + Sync,
{
    let sql = format!(
        "SELECT {func}(v, $2) FROM unnest($1::{array_type}) WITH ORDINALITY AS t(v, n) ORDER BY n"
    );
    let rows = client
        .query(&sql, &[&values, &(seed as i64)])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(rows.len(), values.len());
    rows.iter().map(|r| r.get::<_, i64>(0) as u64).collect()
}

fn assert_same<T: std::fmt::Debug>(what: &str, values: &[T], pg: &[u64], ours: impl Fn(&T) -> u64) {
    let mut mismatches = 0;
    for (v, &expected) in values.iter().zip(pg) {
        let got = ours(v);
        if got != expected {
            mismatches += 1;
            if mismatches <= 5 {
                eprintln!("{what}({v:?}): postgres {expected:016x}, ours {got:016x}");
            }
        }
    }
    assert_eq!(
        mismatches,
        0,
        "{what}: {mismatches} of {} values differ",
        values.len()
    );
}

fn int8_values() -> Vec<i64> {
    let mut r = rng();
    let mut v = vec![
        0,
        1,
        -1,
        i64::MIN,
        i64::MAX,
        i64::MIN + 1,
        i64::MAX - 1,
        i32::MIN as i64,
        i32::MAX as i64,
        i32::MIN as i64 - 1,
        i32::MAX as i64 + 1,
        u32::MAX as i64,
        1 << 32,
        -(1 << 32),
    ];
    v.extend((0..RANDOM_VALUES).map(|i| match i % 3 {
        0 => r.random::<i64>(),
        1 => r.random_range(-1_000_000..1_000_000),
        _ => r.random::<i32>() as i64,
    }));
    v
}

fn text_values() -> Vec<String> {
    const ALPHABET: &[&str] = &[
        "a",
        "Z",
        "0",
        " ",
        "-",
        "'",
        "é",
        "ß",
        "漢",
        "字",
        "😀",
        "\u{10ffff}",
        "\t",
    ];
    let mut r = rng();
    let mut v: Vec<String> = [
        "",
        "a",
        "abc",
        "hello world",
        "é",
        "漢字",
        "😀😀😀",
        "x".repeat(12).as_str(),
        "y".repeat(1000).as_str(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Every tail length of the 12-byte blocks, in ASCII and multi-byte text.
    for len in 0..=40 {
        v.push("q".repeat(len));
        v.push("é".repeat(len));
    }
    for _ in 0..RANDOM_VALUES {
        let len = r.random_range(0..48);
        v.push(
            (0..len)
                .map(|_| ALPHABET[r.random_range(0..ALPHABET.len())])
                .collect(),
        );
    }
    v
}

fn uuid_values() -> Vec<String> {
    let mut r = rng();
    let mut v = vec![
        "00000000-0000-0000-0000-000000000000".to_string(),
        "ffffffff-ffff-ffff-ffff-ffffffffffff".to_string(),
    ];
    v.extend((0..RANDOM_VALUES).map(|_| {
        let b: [u8; 16] = r.random();
        uuid::Uuid::from_bytes(b).hyphenated().to_string()
    }));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashes_match_postgres_bit_for_bit() {
    let server = pgharness::Server::start(&Default::default()).expect("start postgres");
    let client = connect(&server).await;

    let int8 = int8_values();
    let int4: Vec<i32> = int8
        .iter()
        .map(|&v| v as i32)
        .chain([0, 1, -1, i32::MIN, i32::MAX])
        .collect();
    let int2: Vec<i16> = (i16::MIN..=i16::MAX)
        .step_by(3)
        .chain([0, 1, -1, i16::MIN, i16::MAX])
        .collect();
    assert!(int2.len() >= 10_000);
    let text = text_values();
    let uuids = uuid_values();
    let uuid_bytes: Vec<[u8; 16]> = uuids
        .iter()
        .map(|u| *uuid::Uuid::parse_str(u).expect("generated uuid").as_bytes())
        .collect();

    for seed in SEEDS {
        let pg = pg_hashes(&client, "hashint8extended", "int8[]", &int8, seed).await;
        assert_same("hashint8extended", &int8, &pg, |&v| {
            hash::hashint8extended(v, seed)
        });

        let pg = pg_hashes(&client, "hashint4extended", "int4[]", &int4, seed).await;
        assert_same("hashint4extended", &int4, &pg, |&v| {
            hash::hashint4extended(v, seed)
        });

        let pg = pg_hashes(&client, "hashint2extended", "int2[]", &int2, seed).await;
        assert_same("hashint2extended", &int2, &pg, |&v| {
            hash::hashint2extended(v, seed)
        });

        let pg = pg_hashes(&client, "hashtextextended", "text[]", &text, seed).await;
        assert_same("hashtextextended", &text, &pg, |v| {
            hash::hashtextextended(v, seed)
        });

        // uuid[] is sent as text[] and cast, so the test needs no uuid support in the driver.
        let sql = "SELECT uuid_hash_extended(v::uuid, $2) FROM unnest($1::text[]) WITH ORDINALITY AS t(v, n) ORDER BY n";
        let rows = client
            .query(sql, &[&uuids, &(seed as i64)])
            .await
            .expect("uuid hashes");
        let pg: Vec<u64> = rows.iter().map(|r| r.get::<_, i64>(0) as u64).collect();
        assert_same("uuid_hash_extended", &uuid_bytes, &pg, |b| {
            hash::uuid_hash_extended(b, seed)
        });
    }

    // The same value as int2, int4 and int8 gets one keyspace ID, in Postgres as here.
    let row = client
        .query_one(
            "SELECT hashint2extended(-7::int2, 0), hashint4extended(-7, 0), hashint8extended(-7::int8, 0)",
            &[],
        )
        .await
        .expect("width query");
    let (a, b, c): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert!(a == b && b == c);
    assert_eq!(c as u64, shardmap::Key::Int(-7).keyspace_id().0);
}

/// A map whose ranges cross the signed/unsigned boundary in every way the predicate handles.
fn maps_to_audit() -> Vec<ShardMap> {
    let urls = |n: usize| {
        (0..n)
            .map(|i| format!("postgres://h/s{i}"))
            .collect::<Vec<_>>()
    };
    let mut maps: Vec<ShardMap> = [1, 2, 3, 4, 7, 16]
        .into_iter()
        .map(|n| ShardMap::even_split(&urls(n), vec![]).expect("even split"))
        .collect();
    let ranges = ["-30", "30-7f", "7f-8001", "8001-c0", "c0-ff", "ff-"];
    let shards = ranges
        .iter()
        .zip(urls(ranges.len()))
        .map(|(r, u)| shardmap::Shard {
            range: KeyRange::parse(r).expect("range"),
            primary: shardmap::Primary::parse(&u).expect("url"),
        })
        .collect();
    maps.push(ShardMap::new(1, vec![], shards, None).expect("hand-made map"));
    maps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_predicates_count_every_row_exactly_once() {
    let server = pgharness::Server::start(&Default::default()).expect("start postgres");
    let client = connect(&server).await;
    client
        .batch_execute(
            "CREATE TABLE kv (id bigint PRIMARY KEY, v text);
             CREATE TABLE names (name text PRIMARY KEY);
             CREATE TABLE things (\"thingId\" uuid PRIMARY KEY);
             CREATE TABLE small (k int4 PRIMARY KEY);
             INSERT INTO kv SELECT g, 'v' FROM generate_series(-5000, 5000) g;
             INSERT INTO kv VALUES (-9223372036854775808, 'min'), (9223372036854775807, 'max');
             INSERT INTO names SELECT 'name-' || g || repeat('é', g % 5) FROM generate_series(1, 5000) g;
             INSERT INTO names VALUES ('');
             INSERT INTO things SELECT md5(g::text)::uuid FROM generate_series(1, 5000) g;
             INSERT INTO small SELECT g FROM generate_series(-3000, 3000) g;",
        )
        .await
        .expect("load rows");

    let tables = [
        (Table::new("kv", "id", KeyType::BigInt), "id::text"),
        (Table::new("names", "name", KeyType::Text), "name"),
        (
            Table::new("things", "thingId", KeyType::Uuid),
            "\"thingId\"::text",
        ),
        (Table::new("small", "k", KeyType::Integer), "k::text"),
    ];
    for map in maps_to_audit() {
        for (table, key_text) in &tables {
            let preds: Vec<String> = map
                .shards()
                .iter()
                .map(|s| predicate::predicate(table, &s.range))
                .collect();
            // Which shard's predicate each row satisfies, and how many predicates it satisfies.
            let which = preds
                .iter()
                .enumerate()
                .map(|(i, p)| format!("WHEN {p} THEN {i}"))
                .collect::<Vec<_>>()
                .join(" ");
            let hits = preds
                .iter()
                .map(|p| format!("({p})::int"))
                .collect::<Vec<_>>()
                .join(" + ");
            let sql = format!(
                "SELECT {key_text}, CASE {which} END, {hits} FROM {}",
                predicate::quote_ident(&table.name)
            );
            let rows = client
                .query(&sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert!(rows.len() >= 5000);
            let mut per_shard = vec![0usize; preds.len()];
            for row in &rows {
                let key: String = row.get(0);
                let pg_shard: Option<i32> = row.get(1);
                let hits: i32 = row.get(2);
                assert_eq!(
                    hits, 1,
                    "{}: row {key:?} matched {hits} shard predicates",
                    table.name
                );
                let ours =
                    map.shard_for_key(&table.key_type.parse_key(&key).expect("key from postgres"));
                assert_eq!(pg_shard, Some(ours as i32), "{}: row {key:?}", table.name);
                per_shard[ours] += 1;
            }
            // Counting per shard with each predicate on its own gives the same split.
            for (i, p) in preds.iter().enumerate() {
                let n: i64 = client
                    .query_one(
                        &format!(
                            "SELECT count(*) FROM {} WHERE {p}",
                            predicate::quote_ident(&table.name)
                        ),
                        &[],
                    )
                    .await
                    .expect("count")
                    .get(0);
                assert_eq!(
                    n as usize,
                    per_shard[i],
                    "{} shard {}",
                    table.name,
                    map.shards()[i].range
                );
            }
        }
    }
}
