//! Checks the merge engine (`shardgate::merge`) against a real Postgres: for many value sets,
//! split into "shards", the merged per-shard answers must be byte for byte what Postgres
//! answers for the whole set (avg, numeric and float sums, float formatting, and ORDER BY of
//! ints, numeric, floats, text, dates and timestamps with NULLs first or last), and binary
//! `numeric` is decoded and encoded exactly as Postgres's `numeric_send` / `numeric_out`.
//!
//! The "shards" are just subsets of a VALUES list run on one throw-away server.

use std::cmp::Ordering;
use std::sync::OnceLock;

use shardgate::merge::numeric::Numeric;
use shardgate::merge::value::{compare, Kind};
use shardgate::merge::{
    compare_rows, data_row_body, fields, float, AggOp, Column, GroupMerge, Out, SortKey,
};
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

fn server() -> &'static pgharness::Server {
    static SERVER: OnceLock<pgharness::Server> = OnceLock::new();
    SERVER.get_or_init(|| pgharness::Server::start(&Default::default()).expect("start Postgres"))
}

async fn connect() -> Client {
    let (client, conn) = tokio_postgres::connect(&server().url("postgres"), NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute("SET DateStyle = 'ISO, MDY'; SET TimeZone = 'America/St_Johns'")
        .await
        .expect("session settings");
    client
}

type Rows = Vec<Vec<Option<String>>>;

/// Runs `;`-separated statements, returning the text rows of each.
async fn query(client: &Client, sql: &str) -> Vec<Rows> {
    let msgs = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut results = Vec::new();
    let mut current = Vec::new();
    for m in msgs {
        match m {
            SimpleQueryMessage::Row(r) => {
                current.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            SimpleQueryMessage::CommandComplete(_) => results.push(std::mem::take(&mut current)),
            _ => {}
        }
    }
    results
}

/// splitmix64: a fixed-seed generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.below(10) as u8))
            .collect()
    }
}

/// A VALUES list of `values` (SQL literals or NULL) cast to `ty`, led by a typed NULL so an
/// empty shard still has a type.
fn values_list(values: &[String], ty: &str) -> String {
    let mut s = format!("(NULL::{ty})");
    for v in values {
        s.push_str(&format!(", (({v})::{ty})"));
    }
    s
}

/// Splits `values` over 2-4 shards at random (some shards may be empty).
fn split(rng: &mut Rng, values: &[String]) -> Vec<Vec<String>> {
    let n = 2 + rng.below(3) as usize;
    let mut shards = vec![Vec::new(); n];
    for v in values {
        shards[rng.below(n as u64) as usize].push(v.clone());
    }
    shards
}

fn text_row(values: &[Option<String>]) -> Vec<u8> {
    let v: Vec<Option<&[u8]>> = values
        .iter()
        .map(|v| v.as_deref().map(str::as_bytes))
        .collect();
    data_row_body(&v)
}

/// The text fields of the DataRow frames in `out`.
fn frames_to_rows(out: &[u8]) -> Rows {
    let mut rest = out;
    let mut rows = Vec::new();
    while !rest.is_empty() {
        assert_eq!(rest[0], b'D');
        let len = i32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let f = fields(&rest[5..1 + len]).expect("a DataRow");
        rows.push(
            f.iter()
                .map(|v| v.map(|v| String::from_utf8(v.to_vec()).expect("utf8")))
                .collect(),
        );
        rest = &rest[1 + len..];
    }
    rows
}

/// A random numeric literal: sign, up to `int_len` integer and `frac_len` fraction digits.
fn numeric_value(rng: &mut Rng) -> String {
    let sign = if rng.below(3) == 0 { "-" } else { "" };
    let (int_len, frac_len) = match rng.below(6) {
        0 => (0, rng.below(15) as usize + 1),  // small decimals
        1 => (rng.below(30) as usize + 10, 0), // huge integers
        2 => (0, 0),
        3 => (rng.below(3) as usize + 1, rng.below(40) as usize), // many decimals
        _ => (rng.below(8) as usize + 1, rng.below(5) as usize),
    };
    let int = if int_len == 0 {
        "0".to_string()
    } else {
        rng.digits(int_len)
    };
    if frac_len == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{}", rng.digits(frac_len))
    }
}

fn int_value(rng: &mut Rng, ty: &str) -> String {
    match (ty, rng.below(4)) {
        ("int4", 0) => ["2147483647", "-2147483648", "1", "0"][rng.below(4) as usize].into(),
        ("int8", 0) => {
            ["9223372036854775807", "-9223372036854775808", "7"][rng.below(3) as usize].into()
        }
        ("int4", _) => (rng.below(2_000_001) as i64 - 1_000_000).to_string(),
        _ => (rng.next() as i64 >> rng.below(60)).to_string(),
    }
}

/// Value sets whose averages have notorious digits.
fn edge_sets() -> Vec<(&'static str, Vec<String>)> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        ("int4", s(&["1", "0", "0"])),
        ("int4", s(&["1", "1", "0"])),
        ("int4", s(&["1", "2", "3", "4", "0", "0", "0"])),
        ("int4", s(&["-1", "-1", "0"])),
        ("int4", s(&["5"])),
        (
            "int8",
            s(&["9223372036854775807", "9223372036854775807", "1"]),
        ),
        ("numeric", s(&["0.1", "0.2", "0.0"])),
        ("numeric", s(&["10", "0", "0", "0", "0", "0", "0"])),
        ("numeric", s(&["0.00000000000000000001", "0", "0"])),
        ("numeric", s(&["99999999999999999999999999.999", "1"])),
        ("numeric", s(&["-0.5", "0.5"])),
        ("numeric", s(&["1.5", "NULL", "2.50"])),
        ("numeric", s(&["'NaN'", "1"])),
        ("numeric", s(&["'Infinity'", "1", "2"])),
        ("numeric", s(&["'Infinity'", "'-Infinity'"])),
        ("numeric", s(&["NULL", "NULL"])),
        ("numeric", s(&["0.0005", "0.0005", "0.0005"])),
        ("numeric", s(&["12345678.9", "1", "1", "1", "1", "1", "1"])),
    ]
}

/// The edge sets plus `count` random sets of int4, int8 and numeric values (about one in ten
/// NULL), 1 to 7 values each.
fn value_sets(rng: &mut Rng, count: usize) -> Vec<(&'static str, Vec<String>)> {
    let mut sets = edge_sets();
    for i in 0..count {
        let ty = ["int4", "int8", "numeric"][i % 3];
        let n = 1 + rng.below(7) as usize;
        let values = (0..n)
            .map(|_| match (ty, rng.below(10)) {
                (_, 0) => "NULL".to_string(),
                ("numeric", _) => numeric_value(rng),
                _ => int_value(rng, ty),
            })
            .collect();
        sets.push((ty, values));
    }
    sets
}

/// Each value set split over pretend shards: every shard's row of `part` (over its values)
/// folded by a merge of `out` over the columns `cols(type)` must equal `whole` over all the
/// values, as one Postgres computes it. `{values}` in the SQL stands for a VALUES list.
async fn merged_as_postgres(
    seed: u64,
    part: &str,
    whole: &str,
    cols: impl Fn(&str) -> Vec<Column>,
    out: &[Out],
) {
    let client = connect().await;
    let mut rng = Rng(seed);
    let sets = value_sets(&mut rng, 400);
    for (ty, values) in sets {
        let shards = split(&mut rng, &values);
        let mut sql = String::new();
        for shard in &shards {
            sql.push_str(&part.replace("{values}", &values_list(shard, ty)));
            sql.push(';');
        }
        sql.push_str(&whole.replace("{values}", &values_list(&values, ty)));
        let results = query(&client, &sql).await;
        let mut merge = GroupMerge::new(out.to_vec(), cols(ty), false).expect("mergeable");
        for shard_rows in &results[..shards.len()] {
            merge.fold(&text_row(&shard_rows[0])).expect("fold");
        }
        let mut buf = Vec::new();
        merge.finish(&[], &mut buf).expect("finish");
        assert_eq!(
            frames_to_rows(&buf),
            results[shards.len()],
            "{ty} values {values:?} split as {shards:?}"
        );
    }
}

/// `sum` of int4 is bigint; of int8 and numeric, numeric.
fn sum_oid(ty: &str) -> u32 {
    if ty == "int4" {
        20
    } else {
        1700
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avg_and_sums_of_integers_and_numeric_match_postgres() {
    let out = [
        Out::Avg { sum: 0, count: 1 },
        Out::Agg {
            op: AggOp::Sum,
            column: 0,
        },
        Out::Agg {
            op: AggOp::Count,
            column: 1,
        },
    ];
    merged_as_postgres(
        0x5eed_0001,
        "SELECT sum(x), count(x) FROM (VALUES {values}) v(x)",
        "SELECT avg(x), sum(x), count(x) FROM (VALUES {values}) v(x)",
        |ty| {
            vec![
                Column::new(b"sum", sum_oid(ty), false),
                Column::new(b"count", 20, false),
            ]
        },
        &out,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variance_and_stddev_of_integers_and_numeric_match_postgres() {
    use shardgate::merge::variance::Dispersion;
    let out = [
        Dispersion::StddevPop,
        Dispersion::StddevSamp,
        Dispersion::VarPop,
        Dispersion::VarSamp,
    ]
    .map(|kind| Out::Dispersion {
        kind,
        count: 0,
        sum: 1,
        squares: 2,
    });
    merged_as_postgres(
        0x5eed_0007,
        "SELECT count(x), sum(x), sum(x::numeric * x::numeric) FROM (VALUES {values}) v(x)",
        "SELECT stddev_pop(x), stddev_samp(x), var_pop(x), var_samp(x) FROM (VALUES {values}) v(x)",
        |ty| {
            vec![
                Column::new(b"count", 20, false),
                Column::new(b"sum", sum_oid(ty), false),
                Column::new(b"sum", 1700, false),
            ]
        },
        &out,
    )
    .await;
}

/// A random float8 literal (finite, away from overflow and underflow on division).
fn float_value(rng: &mut Rng) -> String {
    match rng.below(12) {
        0 => ["'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "0"][rng.below(5) as usize].into(),
        1 => (rng.below(2001) as i64 - 1000).to_string(),
        2 => format!("{}.{}", rng.below(100), rng.digits(2)),
        _ => {
            let m = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            let e = rng.below(600) as i32 - 300;
            let sign = if rng.below(2) == 0 { "-" } else { "" };
            format!("{sign}{:e}", m * 10f64.powi(e))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn float_sums_and_avg_match_postgres() {
    let client = connect().await;
    let mut rng = Rng(0x5eed_0002);
    for i in 0..300 {
        let ty = if i % 4 == 3 { "real" } else { "float8" };
        let n = 1 + rng.below(7) as usize;
        let values: Vec<String> = (0..n)
            .map(|_| {
                let v = float_value(&mut rng);
                // Keep real values in float4 range.
                match (ty, v.split_once('e')) {
                    ("real", Some((m, e))) if e.parse::<i32>().unwrap_or(0).abs() > 30 => {
                        format!("{m}e{}", e.parse::<i32>().unwrap_or(0) % 30)
                    }
                    _ => v,
                }
            })
            .collect();
        let shards = split(&mut rng, &values);
        let mut sql = String::new();
        for shard in &shards {
            sql.push_str(&format!(
                "SELECT sum(x), count(x) FROM (VALUES {}) v(x);",
                values_list(shard, ty)
            ));
        }
        let results = query(&client, &sql).await;
        let shard_rows: Vec<&Vec<Option<String>>> = results.iter().map(|r| &r[0]).collect();
        // Postgres adding the shards' sums in shard order (what the merge does), and the avg
        // float8_avg computes from that sum.
        let sums: Vec<String> = shard_rows
            .iter()
            .filter_map(|r| r[0].as_ref().map(|s| format!("'{s}'")))
            .collect();
        let count: i64 = shard_rows
            .iter()
            .map(|r| r[1].as_deref().unwrap_or("0").parse::<i64>().unwrap_or(0))
            .sum();
        let expected = query(
            &client,
            &format!(
                "SELECT sum(x), CASE WHEN {count} > 0 THEN sum(x::float8) / {count} END \
                 FROM (VALUES {}) v(x)",
                values_list(&sums, ty)
            ),
        )
        .await;
        let oid = if ty == "real" { 700 } else { 701 };
        let cols = vec![
            Column::new(b"sum", oid, false),
            Column::new(b"count", 20, false),
        ];
        let mut out = vec![Out::Agg {
            op: AggOp::Sum,
            column: 0,
        }];
        if ty == "float8" {
            out.push(Out::Avg { sum: 0, count: 1 });
        }
        let mut merge = GroupMerge::new(out, cols, false).expect("mergeable");
        for r in &shard_rows {
            merge.fold(&text_row(r)).expect("fold");
        }
        let mut buf = Vec::new();
        merge.finish(&[], &mut buf).expect("finish");
        let mut want = expected[0][0].clone();
        if ty == "real" {
            want.truncate(1);
        }
        assert_eq!(
            frames_to_rows(&buf)[0],
            want,
            "{ty} values {values:?} split as {shards:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn float_text_is_float8out_and_float4out() {
    let client = connect().await;
    let mut rng = Rng(0x5eed_0003);
    let mut f64s: Vec<f64> = vec![1e15, 1e16, 123456789012345.6, 1e-4, 1e-5, 5e-324, f64::MAX];
    let mut f32s: Vec<f32> = vec![1e5, 1e6, 123456.5, 1e-4, 1e-5, 1e-45, f32::MAX];
    for _ in 0..2000 {
        let d = f64::from_bits(rng.next());
        if d.is_finite() {
            f64s.push(d);
        }
        let f = f32::from_bits(rng.next() as u32);
        if f.is_finite() {
            f32s.push(f);
        }
        // Numbers of everyday size, where the fixed/scientific switch happens.
        let e = rng.below(30) as i32 - 8;
        f64s.push((rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 10f64.powi(e));
        f32s.push(((rng.next() >> 40) as f32 / (1u32 << 24) as f32) * 10f32.powi(e / 2));
    }
    // Rust's `{:e}` text reads back to the same value, so Postgres gets exactly these.
    let list = |v: Vec<String>, ty: &str| {
        v.iter()
            .map(|s| format!("('{s}'::{ty})"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let sql = format!(
        "SELECT x FROM (VALUES {}) v(x); SELECT x FROM (VALUES {}) v(x)",
        list(f64s.iter().map(|v| format!("{v:e}")).collect(), "float8"),
        list(f32s.iter().map(|v| format!("{v:e}")).collect(), "real"),
    );
    let results = query(&client, &sql).await;
    for (v, row) in f64s.iter().zip(&results[0]) {
        assert_eq!(Some(float::format_f64(*v)), row[0], "float8 {v:e}");
    }
    for (v, row) in f32s.iter().zip(&results[1]) {
        assert_eq!(Some(float::format_f32(*v)), row[0], "real {v:e}");
    }
}

/// A row for the ORDER BY test: id, int4, numeric, float8, text, date, timestamptz.
fn order_row(rng: &mut Rng, id: usize) -> Vec<String> {
    let null = |rng: &mut Rng, v: String| {
        if rng.below(8) == 0 {
            "NULL".to_string()
        } else {
            v
        }
    };
    let int = (rng.below(21) as i64 - 10).to_string();
    let numeric = match rng.below(8) {
        0 => [
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1.0",
            "1.00",
            "-0.000",
        ][rng.below(6) as usize]
            .to_string(),
        _ => numeric_value(rng),
    };
    let float = match rng.below(5) {
        0 => ["'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "0", "1e-5"][rng.below(6) as usize]
            .to_string(),
        _ => float_value(rng),
    };
    const ALPHABET: [&str; 10] = ["a", "A", "b", "B", " ", "z", "0", "é", "~", "ab"];
    let text_len = rng.below(4);
    let text: String = (0..text_len)
        .map(|_| ALPHABET[rng.below(ALPHABET.len() as u64) as usize])
        .collect();
    let year = 1 + rng.below(3000);
    let bc = if rng.below(6) == 0 { " BC" } else { "" };
    let date = match rng.below(10) {
        0 => "'infinity'".to_string(),
        1 => "'-infinity'".to_string(),
        _ => format!(
            "'{year:04}-{:02}-{:02}{bc}'",
            1 + rng.below(12),
            1 + rng.below(28)
        ),
    };
    let frac_len = 1 + rng.below(6) as usize;
    let ts = format!(
        "'{year:04}-{:02}-{:02} {:02}:{:02}:{:02}.{}{}{bc}'",
        1 + rng.below(12),
        1 + rng.below(28),
        rng.below(24),
        rng.below(60),
        rng.below(60),
        rng.digits(frac_len),
        ["+00", "-05:30", "+14", "-03:30"][rng.below(4) as usize],
    );
    vec![
        id.to_string(),
        null(rng, int),
        null(rng, numeric),
        null(rng, float),
        null(rng, format!("'{text}'")),
        null(rng, date),
        null(rng, ts),
    ]
}

const ORDER_TYPES: [&str; 7] = [
    "int4",
    "int4",
    "numeric",
    "float8",
    "text",
    "date",
    "timestamptz",
];
const ORDER_OIDS: [u32; 7] = [23, 23, 1700, 701, 25, 1082, 1184];

fn order_values(rows: &[Vec<String>]) -> String {
    let mut s = format!(
        "({})",
        ORDER_TYPES
            .iter()
            .map(|t| format!("NULL::{t}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    for r in rows {
        s.push_str(&format!(", ({})", r.join(",")));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_by_merge_matches_postgres() {
    let client = connect().await;
    let mut rng = Rng(0x5eed_0004);
    let cols: Vec<Column> = ORDER_OIDS
        .iter()
        .map(|&oid| Column::new(b"c", oid, false))
        .collect();
    for round in 0..6 {
        let rows: Vec<Vec<String>> = (0..150).map(|id| order_row(&mut rng, id)).collect();
        let shards = split(
            &mut rng,
            &rows.iter().map(|r| r.join("\u{1}")).collect::<Vec<_>>(),
        );
        let shards: Vec<Vec<Vec<String>>> = shards
            .iter()
            .map(|s| {
                s.iter()
                    .map(|r| r.split('\u{1}').map(String::from).collect())
                    .collect()
            })
            .collect();
        for column in 1..ORDER_TYPES.len() {
            for (descending, nulls_first) in
                [(false, false), (false, true), (true, false), (true, true)]
            {
                let order = format!(
                    "ORDER BY c{column} {} NULLS {}, c0",
                    if descending { "DESC" } else { "ASC" },
                    if nulls_first { "FIRST" } else { "LAST" }
                );
                // The typed NULL row leading each VALUES list has c0 NULL; leave it out.
                let select = |rows: &[Vec<String>]| {
                    format!(
                        "SELECT * FROM (VALUES {}) v(c0,c1,c2,c3,c4,c5,c6) \
                         WHERE c0 IS NOT NULL {order};",
                        order_values(rows)
                    )
                };
                let mut sql: String = shards.iter().map(|s| select(s)).collect();
                sql.push_str(&select(&rows));
                let results = query(&client, &sql).await;
                let keys = [
                    SortKey {
                        column,
                        descending,
                        nulls_first,
                    },
                    SortKey {
                        column: 0,
                        descending: false,
                        nulls_first: false,
                    },
                ];
                shardgate::merge::check_sortable(&keys, &cols, true).expect("sortable");
                // k-way merge of the shards' sorted rows.
                let mut streams: Vec<Vec<Vec<u8>>> = results[..shards.len()]
                    .iter()
                    .map(|rs| rs.iter().map(|r| text_row(r)).collect())
                    .collect();
                for s in &mut streams {
                    s.reverse();
                }
                let mut merged = Vec::new();
                loop {
                    let mut best: Option<usize> = None;
                    for (i, s) in streams.iter().enumerate() {
                        let Some(head) = s.last() else { continue };
                        best = match best {
                            Some(b)
                                if compare_rows(
                                    head,
                                    streams[b].last().expect("head"),
                                    &keys,
                                    &cols,
                                )
                                .expect("comparable")
                                    != Ordering::Less =>
                            {
                                Some(b)
                            }
                            _ => Some(i),
                        };
                    }
                    let Some(b) = best else { break };
                    let row = streams[b].pop().expect("head");
                    merged.push(fields(&row).expect("row")[0].map(|v| v.to_vec()));
                }
                let want: Vec<Option<Vec<u8>>> = results[shards.len()]
                    .iter()
                    .map(|r| r[0].as_ref().map(|v| v.as_bytes().to_vec()))
                    .collect();
                assert_eq!(merged, want, "round {round}: {order}");
            }
        }
    }
}

/// A binary numeric or bigint field as Postgres sent it (tokio-postgres asks for binary).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Raw(Vec<u8>);

impl<'a> FromSql<'a> for Raw {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(raw.to_vec()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC || *ty == Type::INT8
    }
}

/// Numeric SQL expressions whose binary form is easy to get wrong: zeros with scales,
/// trailing zeros inside and past a base-10000 digit, powers of 10000, the specials.
fn numeric_edge_values() -> Vec<String> {
    let mut v: Vec<String> = [
        "0",
        "-0.00",
        "0.0",
        "1",
        "-1",
        "1.500",
        "-1.500",
        "1.5000",
        "1.50000",
        "10000",
        "10000.0000",
        "9999",
        "99999999",
        "100000000",
        "0.0001",
        "0.00010",
        "0.00001",
        "-0.00001",
        "123456789.123456789",
        "-123456789.123456789",
        "100000000.000000010",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "1e100",
        "-1e-100",
        "1.0e-20",
        "1::numeric / 3",
        "2::numeric / 3",
        "10::numeric / 4",
        "1.5 * 1.000",
        "12345678901234567890123456789012345678901234567890",
        "0.000000000000000000000000000000000000000000000000001",
        "power(10::numeric, 300)",
        "1 / power(10::numeric, 300)",
        "round(2.5, 20)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for scale in 0..9 {
        v.push(format!("round(1234.5678::numeric, {scale})"));
        v.push(format!("round(-70000::numeric, {scale})"));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_numeric_is_numeric_send() {
    let client = connect().await;
    let mut rng = Rng(0x5eed_0005);
    let mut values = numeric_edge_values();
    values.extend((0..600).map(|_| numeric_value(&mut rng)));
    let list: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("({i}, ({v})::numeric)"))
        .collect();
    let sql = format!(
        "SELECT x, x::text FROM (VALUES {}) v(i, x) ORDER BY i",
        list.join(",")
    );
    let rows = client.query(&sql, &[]).await.expect("numeric values");
    assert_eq!(rows.len(), values.len());
    for (v, row) in values.iter().zip(&rows) {
        let Raw(bytes) = row.get(0);
        let text: String = row.get(1);
        let decoded = Numeric::from_binary(&bytes).expect("decodes");
        assert_eq!(decoded.to_text(), text, "{v}: decoding {bytes:02x?}");
        let encoded = Numeric::parse(text.as_bytes())
            .expect("parses")
            .to_binary()
            .expect("encodes");
        assert_eq!(encoded, bytes, "{v}: encoding {text}");
    }
    // ORDER BY on binary numeric: Postgres's order, and its equalities (1.5 = 1.500).
    let sql = format!(
        "SELECT x, x = lead(x) OVER (ORDER BY x, i) FROM (VALUES {}) v(i, x) ORDER BY x, i",
        list.join(",")
    );
    let rows = client
        .query(&sql, &[])
        .await
        .expect("sorted numeric values");
    for pair in rows.windows(2) {
        let (Raw(a), Raw(b)) = (pair[0].get(0), pair[1].get(0));
        let equal: bool = pair[0].get(1);
        let ord = compare(Kind::Numeric, true, &a, &b).expect("comparable");
        let want = if equal {
            Ordering::Equal
        } else {
            Ordering::Less
        };
        assert_eq!(ord, want, "{a:02x?} vs {b:02x?}");
    }
}

/// A DataRow body of raw (binary) fields.
fn raw_row(values: &[Option<Raw>]) -> Vec<u8> {
    let v: Vec<Option<&[u8]>> = values
        .iter()
        .map(|v| v.as_ref().map(|r| r.0.as_slice()))
        .collect();
    data_row_body(&v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_avg_and_sums_match_postgres() {
    let client = connect().await;
    let mut rng = Rng(0x5eed_0006);
    let sets = value_sets(&mut rng, 300);
    for (ty, values) in sets {
        let shards = split(&mut rng, &values);
        let sum_oid = if ty == "int4" { 20 } else { 1700 };
        let cols = vec![
            Column::new(b"sum", sum_oid, true),
            Column::new(b"count", 20, true),
        ];
        let out = vec![
            Out::Avg { sum: 0, count: 1 },
            Out::Agg {
                op: AggOp::Sum,
                column: 0,
            },
            Out::Agg {
                op: AggOp::Count,
                column: 1,
            },
        ];
        let mut merge = GroupMerge::new(out, cols, false).expect("mergeable");
        for shard in &shards {
            let sql = format!(
                "SELECT sum(x), count(x) FROM (VALUES {}) v(x)",
                values_list(shard, ty)
            );
            let row = client.query_one(&sql, &[]).await.expect("shard sum");
            let fields: Vec<Option<Raw>> = vec![row.get(0), row.get(1)];
            merge.fold(&raw_row(&fields)).expect("fold");
        }
        let sql = format!(
            "SELECT avg(x), sum(x), count(x) FROM (VALUES {}) v(x)",
            values_list(&values, ty)
        );
        let row = client.query_one(&sql, &[]).await.expect("whole avg");
        let want: Vec<Option<Raw>> = vec![row.get(0), row.get(1), row.get(2)];
        let mut buf = Vec::new();
        merge.finish(&[], &mut buf).expect("finish");
        assert_eq!(buf[0], b'D');
        let got: Vec<Option<Raw>> = fields(&buf[5..])
            .expect("a DataRow")
            .iter()
            .map(|f| f.map(|v| Raw(v.to_vec())))
            .collect();
        assert_eq!(got, want, "{ty} values {values:?} split as {shards:?}");
    }
}
