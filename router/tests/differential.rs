//! The differential test: random statements over a small schema (two tables sharded by the same
//! key, a reference table, an unsharded table; NULLs, numerics, dates, text with case and spaces), each run
//! through a router over 4 shards and on one plain Postgres holding the same rows, and the
//! answers compared: rows in order where ORDER BY fixes the order and as multisets otherwise,
//! values as Postgres prints them, column names and types, row counts, SQLSTATEs. Writes go to
//! both; the tables are compared after every batch of statements. A refusal by the router
//! (`0A000`, with its reason) is counted, never a mismatch; a wrong answer or an error where
//! Postgres has none is a failure that prints the seed and the statement.
//!
//! `SHARDGATE_DIFF_SEED` picks the seed (default: a new one, printed), `SHARDGATE_DIFF_STATEMENTS`
//! the number of statements (default 2,000).

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardmap::{KeyType, Reference, ShardMap, Table};
use tokio_postgres::{Client, SimpleQueryMessage};

const SCHEMA: &str = "
CREATE TABLE orders (customer_id bigint NOT NULL, order_id bigint NOT NULL, amount numeric(12,2),
    status text, qty int, created date, PRIMARY KEY (customer_id, order_id));
CREATE TABLE items (customer_id bigint NOT NULL, order_id bigint NOT NULL, sku text NOT NULL,
    price numeric(10,2), PRIMARY KEY (customer_id, order_id, sku));
CREATE TABLE regions (code text PRIMARY KEY, name text);
CREATE TABLE notes (code text PRIMARY KEY, body text);
";

const CUSTOMERS: i64 = 40;
const STATUSES: &[&str] = &["new", "paid", "Shipped", "on hold", "paid "];
const SKUS: &[&str] = &["a-1", "B-2", "c 3", "d-4", "E-5"];

/// What one statement gave.
#[derive(Debug, PartialEq)]
enum Answer {
    Rows {
        columns: Vec<String>,
        rows: Vec<Vec<Option<String>>>,
    },
    Done(u64),
    Error {
        code: String,
        message: String,
    },
}

async fn run(client: &Client, sql: &str) -> Answer {
    match client.simple_query(sql).await {
        Ok(messages) => {
            let mut columns = Vec::new();
            let mut rows = Vec::new();
            let mut done = None;
            for m in messages {
                match m {
                    SimpleQueryMessage::RowDescription(cols) => {
                        columns = cols.iter().map(|c| c.name().to_string()).collect();
                    }
                    SimpleQueryMessage::Row(row) => {
                        rows.push(
                            (0..row.len())
                                .map(|i| row.get(i).map(str::to_string))
                                .collect(),
                        );
                    }
                    SimpleQueryMessage::CommandComplete(n) => done = Some(n),
                    _ => {}
                }
            }
            if columns.is_empty() && rows.is_empty() {
                Answer::Done(done.unwrap_or(0))
            } else {
                Answer::Rows { columns, rows }
            }
        }
        Err(e) => error_of(&e),
    }
}

/// Any value as the bytes that came: tokio-postgres asks for binary results, so what the
/// extended protocol answers is compared byte for byte (the merges' binary encodings too).
struct Raw(Vec<u8>);

impl<'a> tokio_postgres::types::FromSql<'a> for Raw {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(raw.to_vec()))
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }
}

/// The statement through the extended protocol (Parse, Describe, Bind with binary results,
/// Execute): column names and types, and the rows as bytes.
async fn extended(client: &Client, sql: &str) -> Answer {
    let stmt = match client.prepare(sql).await {
        Ok(stmt) => stmt,
        Err(e) => return error_of(&e),
    };
    let columns = stmt
        .columns()
        .iter()
        .map(|c| format!("{} {}", c.name(), c.type_().name()))
        .collect();
    match client.query(&stmt, &[]).await {
        Ok(rows) => Answer::Rows {
            columns,
            rows: rows
                .iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| {
                            r.get::<_, Option<Raw>>(i)
                                .map(|v| v.0.iter().map(|b| format!("{b:02x}")).collect())
                        })
                        .collect()
                })
                .collect(),
        },
        Err(e) => error_of(&e),
    }
}

fn error_of(e: &tokio_postgres::Error) -> Answer {
    match e.as_db_error() {
        Some(db) => Answer::Error {
            code: db.code().code().to_string(),
            message: db.message().to_string(),
        },
        None => Answer::Error {
            code: "connection".into(),
            message: e.to_string(),
        },
    }
}

/// A statement and whether its ORDER BY fixes the order of its rows.
struct Generated {
    sql: String,
    ordered: bool,
    reads: bool,
}

fn read(sql: String, ordered: bool) -> Generated {
    Generated {
        sql,
        ordered,
        reads: true,
    }
}

fn write(sql: String) -> Generated {
    Generated {
        sql,
        ordered: false,
        reads: false,
    }
}

fn customer(rng: &mut StdRng) -> i64 {
    rng.random_range(1..=CUSTOMERS)
}

fn customers(rng: &mut StdRng) -> String {
    let n = rng.random_range(1..=5);
    (0..n)
        .map(|_| customer(rng).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn literal(rng: &mut StdRng, choices: &[&str]) -> String {
    format!("'{}'", choices[rng.random_range(0..choices.len())])
}

fn amount(rng: &mut StdRng) -> String {
    if rng.random_bool(0.1) {
        "NULL".into()
    } else {
        format!(
            "{}.{:02}",
            rng.random_range(0..2000),
            rng.random_range(0..100)
        )
    }
}

fn date(rng: &mut StdRng) -> String {
    if rng.random_bool(0.1) {
        "NULL".into()
    } else {
        format!(
            "DATE '2026-{:02}-{:02}'",
            rng.random_range(1..=12),
            rng.random_range(1..=28)
        )
    }
}

/// A session setting that changes how values print (dates, floats, intervals), on both
/// sides: the router must carry it to whichever connection runs the next statement, and
/// answer merged values as Postgres would print them under it.
fn setting(rng: &mut StdRng) -> Generated {
    let sql = match rng.random_range(0..4) {
        0 => format!(
            "SET DateStyle = {}",
            literal(
                rng,
                &["ISO, MDY", "SQL, DMY", "Postgres, YMD", "German", "dmy"]
            )
        ),
        1 => format!("SET extra_float_digits = {}", rng.random_range(-3..=3)),
        2 => format!(
            "SET IntervalStyle = {}",
            literal(rng, &["postgres", "sql_standard", "iso_8601"])
        ),
        _ => "RESET ALL".into(),
    };
    write(sql)
}

/// One random statement.
fn generate(rng: &mut StdRng, next_order: &mut i64) -> Generated {
    let agg = [
        "count(*)",
        "sum(amount)",
        "min(qty)",
        "max(created)",
        "avg(amount)",
        "count(status)",
        "max(status)",
        "sum(qty)",
        "avg(qty)",
        "bool_and(qty > 5)",
        "count(DISTINCT status)",
        "stddev_pop(qty)",
        "count(*) FILTER (WHERE qty > 3)",
        "max(qty) - min(qty)",
    ];
    let pick_agg = |rng: &mut StdRng| agg[rng.random_range(0..agg.len())];
    let filter = |rng: &mut StdRng| match rng.random_range(0..5) {
        0 => format!(" WHERE customer_id = {}", customer(rng)),
        1 => format!(" WHERE customer_id IN ({})", customers(rng)),
        2 => format!(" WHERE status = {}", literal(rng, STATUSES)),
        3 => format!(" WHERE qty > {}", rng.random_range(0..10)),
        _ => String::new(),
    };
    if rng.random_bool(0.01) {
        return setting(rng);
    }
    if rng.random_bool(0.35) {
        return more(rng, next_order);
    }
    match rng.random_range(0..24) {
        0 => read(
            format!(
                "SELECT customer_id, order_id, amount, status, qty, created FROM orders WHERE customer_id = {} ORDER BY order_id",
                customer(rng)
            ),
            true,
        ),
        1 => read(
            format!(
                "SELECT * FROM orders WHERE customer_id IN ({}) ORDER BY customer_id, order_id",
                customers(rng)
            ),
            true,
        ),
        2 => {
            let f = filter(rng);
            read(format!("SELECT {}, {} FROM orders{f}", pick_agg(rng), pick_agg(rng)), true)
        }
        3 => {
            let f = filter(rng);
            let (a, b) = (pick_agg(rng), pick_agg(rng));
            if rng.random_bool(0.5) {
                read(format!("SELECT status, {a}, {b} FROM orders{f} GROUP BY status ORDER BY status NULLS FIRST"), true)
            } else {
                read(format!("SELECT status, {a} FROM orders{f} GROUP BY status"), false)
            }
        }
        4 => {
            let f = filter(rng);
            read(
                format!(
                    "SELECT customer_id, order_id, amount FROM orders{f} ORDER BY amount DESC NULLS LAST, customer_id, order_id LIMIT {} OFFSET {}",
                    rng.random_range(1..8),
                    rng.random_range(0..4)
                ),
                true,
            )
        }
        5 => read(
            format!(
                "SELECT o.order_id, i.sku, i.price FROM orders o JOIN items i USING (customer_id, order_id) WHERE o.customer_id = {} ORDER BY 1, 2",
                customer(rng)
            ),
            true,
        ),
        6 => read(
            "SELECT o.customer_id, count(*) FROM orders o JOIN items i USING (customer_id, order_id) GROUP BY o.customer_id".into(),
            false,
        ),
        7 => read("SELECT code, name FROM regions ORDER BY code".into(), true),
        8 => read(
            format!("SELECT DISTINCT status FROM orders{} ORDER BY 1", filter(rng)),
            true,
        ),
        9 => read(
            format!(
                "SELECT count(*) FROM (SELECT customer_id FROM orders{} GROUP BY customer_id) s",
                filter(rng)
            ),
            true,
        ),
        10 => read(
            format!(
                "SELECT o.status, r.name FROM orders o JOIN regions r ON r.code = o.status WHERE o.customer_id = {}",
                customer(rng)
            ),
            false,
        ),
        16 => {
            let limit = if rng.random_bool(0.5) {
                format!(" LIMIT {}", rng.random_range(1..10))
            } else {
                String::new()
            };
            read(
                format!(
                    "SELECT o.customer_id, o.order_id, i.sku, i.price FROM orders o JOIN items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id WHERE i.price > {} ORDER BY 1, 2, 3{limit}",
                    rng.random_range(0..1500)
                ),
                true,
            )
        }
        17 => read(
            format!(
                "SELECT i.sku, count(*), sum(i.price), max(o.qty), bool_or(o.qty > {}) FROM orders o, items i WHERE o.customer_id = i.customer_id AND o.order_id = i.order_id GROUP BY i.sku ORDER BY i.sku",
                rng.random_range(0..10)
            ),
            true,
        ),
        18 => read(
            format!(
                "SELECT count(*), min(price) FROM orders o JOIN items i USING (customer_id, order_id) WHERE customer_id IN ({})",
                customers(rng)
            ),
            true,
        ),
        19 => read(
            format!(
                "SELECT r.name, count(*), sum(o.amount) FROM orders o JOIN regions r ON r.code = o.status{} GROUP BY r.name ORDER BY 1 NULLS FIRST",
                filter(rng).replace("WHERE ", "WHERE o.")
            ),
            true,
        ),
        20 => read(
            format!(
                "SELECT o.customer_id, o.order_id, r.name FROM orders o LEFT JOIN regions r ON r.code = o.status WHERE o.qty > {} ORDER BY 1, 2",
                rng.random_range(0..10)
            ),
            true,
        ),
        21 => read(
            format!(
                "SELECT customer_id, order_id, status FROM orders WHERE status IN (SELECT code FROM regions WHERE name IS NOT NULL) AND qty < {} ORDER BY 1, 2",
                rng.random_range(0..10)
            ),
            true,
        ),
        22 => reference_write(rng),
        23 => read(
            match rng.random_range(0..3) {
                0 => "SELECT code, body FROM notes ORDER BY code".to_string(),
                1 => "SELECT r.code, r.name, n.body FROM regions r JOIN notes n USING (code) ORDER BY 1".to_string(),
                _ => format!("SELECT o.order_id, n.body FROM orders o JOIN notes n ON n.code = o.status WHERE o.customer_id = {}", customer(rng)),
            },
            true,
        ),
        11 => {
            let rows = rng.random_range(1..4);
            let mut sql = String::from("INSERT INTO orders VALUES ");
            for r in 0..rows {
                *next_order += 1;
                let _ = write!(
                    sql,
                    "{}({}, {}, {}, {}, {}, {})",
                    if r > 0 { ", " } else { "" },
                    customer(rng),
                    *next_order,
                    amount(rng),
                    if rng.random_bool(0.1) { "NULL".into() } else { literal(rng, STATUSES) },
                    rng.random_range(0..10),
                    date(rng)
                );
            }
            write(sql)
        }
        12 => write(format!(
            "UPDATE orders SET qty = qty + 1, amount = {} WHERE customer_id = {} AND order_id = {}",
            amount(rng),
            customer(rng),
            rng.random_range(1..=*next_order)
        )),
        13 => write(format!(
            "DELETE FROM items WHERE customer_id = {} AND sku = {}",
            customer(rng),
            literal(rng, SKUS)
        )),
        14 => write(format!(
            "UPDATE orders SET status = {} WHERE qty = {}",
            literal(rng, STATUSES),
            rng.random_range(0..10)
        )),
        _ => write(format!(
            "INSERT INTO items VALUES ({}, {}, {}, {}) ON CONFLICT DO NOTHING",
            customer(rng),
            rng.random_range(1..=*next_order),
            literal(rng, SKUS),
            amount(rng)
        )),
    }
}

/// A write of the reference table: every shard applies it, the answer is one shard's.
fn reference_write(rng: &mut StdRng) -> Generated {
    let code = literal(rng, &["new", "paid", "Shipped", "on hold", "x", "y"]);
    let name = literal(rng, &["North", "South", "East", "West", "Mid"]);
    write(match rng.random_range(0..3) {
        0 => format!("INSERT INTO regions VALUES ({code}, {name}) ON CONFLICT (code) DO UPDATE SET name = excluded.name RETURNING code, name"),
        1 => format!("UPDATE regions SET name = {name} WHERE code = {code} OR name IS NULL"),
        _ => format!("DELETE FROM regions WHERE code = {code} RETURNING *"),
    })
}

/// More shapes: arrays of keys, positions, functions as group keys, windows on one key, HAVING,
/// DISTINCT ON, NULL tests, writes with RETURNING, transactions in one Query.
fn more(rng: &mut StdRng, next_order: &mut i64) -> Generated {
    let c = customer(rng);
    let list = customers(rng);
    match rng.random_range(0..31) {
        25 => read(
            format!(
                "SELECT status, created, order_id, lag(amount) OVER (PARTITION BY status ORDER BY created NULLS FIRST, customer_id, order_id), rank() OVER (ORDER BY qty NULLS LAST) FROM orders WHERE qty > {} ORDER BY status NULLS FIRST, created NULLS FIRST, customer_id, order_id",
                rng.random_range(0..10)
            ),
            true,
        ),
        26 => read(
            "SELECT customer_id % 3 AS m, string_agg(sku, ',' ORDER BY sku, customer_id, order_id), percentile_cont(0.5) WITHIN GROUP (ORDER BY price) FROM items GROUP BY 1 ORDER BY 1".into(),
            true,
        ),
        27 => read(
            "SELECT r.name, s.n, s.total FROM regions r JOIN (SELECT status, count(*) AS n, sum(amount) AS total FROM orders GROUP BY status) s ON s.status = r.code ORDER BY 1, 2, 3".into(),
            true,
        ),
        28 => read(
            format!(
                "SELECT date_trunc('month', created)::date AS m, count(*), round(avg(amount), 1) FROM orders{} GROUP BY 1 HAVING count(*) > {} ORDER BY 1 NULLS FIRST",
                if rng.random_bool(0.5) { format!(" WHERE customer_id IN ({list})") } else { String::new() },
                rng.random_range(0..3)
            ),
            true,
        ),
        29 => read(
            "SELECT DISTINCT ON (status) status, amount, customer_id, order_id FROM orders ORDER BY status NULLS FIRST, amount DESC NULLS LAST, customer_id, order_id".into(),
            true,
        ),
        30 => read(
            format!(
                "SELECT s.q, count(*), coalesce(max(s.a), 0) FROM (SELECT qty % 4 AS q, amount AS a FROM orders WHERE created > DATE '2026-{:02}-01') s GROUP BY s.q ORDER BY 1 NULLS FIRST",
                rng.random_range(1..=12)
            ),
            true,
        ),
        23 => read(
            format!("SELECT count(*), sum(s.q) FROM (SELECT customer_id, qty + 1 AS q FROM orders WHERE qty > {}) s", rng.random_range(0..8)),
            true,
        ),
        24 => read(
            "SELECT s.status, count(*) FROM (SELECT status, amount FROM orders WHERE amount IS NOT NULL) s GROUP BY s.status ORDER BY 1 NULLS FIRST".into(),
            true,
        ),
        18 => read(
            "SELECT DISTINCT status, count(*) OVER () FROM orders ORDER BY 1 NULLS FIRST".into(),
            true,
        ),
        19 => read(
            format!("SELECT count(*), sum(qty) FROM orders LIMIT 1 OFFSET {}", rng.random_range(0..2)),
            true,
        ),
        20 => read(
            format!(
                "SELECT DISTINCT status FROM orders ORDER BY 1 NULLS FIRST LIMIT {} OFFSET {}",
                rng.random_range(1..4),
                rng.random_range(0..3)
            ),
            true,
        ),
        21 => read(
            format!(
                "SELECT customer_id, count(*), max(amount) FROM orders GROUP BY customer_id ORDER BY 2 DESC, 1 LIMIT {} OFFSET {}",
                rng.random_range(1..6),
                rng.random_range(0..4)
            ),
            true,
        ),
        22 => read(
            format!(
                "SELECT * FROM orders WHERE customer_id IN ({list}) ORDER BY customer_id DESC, order_id DESC OFFSET {} LIMIT {}",
                rng.random_range(0..4),
                rng.random_range(1..5)
            ),
            true,
        ),
        16 => read(
            format!(
                "SELECT count(*) FROM (SELECT status FROM orders WHERE customer_id IN ({list}) GROUP BY status) s"
            ),
            true,
        ),
        17 => read(
            "SELECT * FROM (SELECT status, count(*) AS n FROM orders GROUP BY status) s ORDER BY status NULLS FIRST".into(),
            true,
        ),
        0 => read(
            format!("SELECT * FROM orders WHERE customer_id = ANY('{{{list}}}') ORDER BY customer_id, order_id")
                .replace(", ", ","),
            true,
        ),
        1 => read(
            format!(
                "SELECT status, count(*) FROM orders GROUP BY 1 ORDER BY 2 DESC, 1 NULLS FIRST LIMIT {}",
                rng.random_range(1..5)
            ),
            true,
        ),
        2 => read(
            "SELECT lower(status), count(*), sum(qty) FROM orders GROUP BY lower(status) ORDER BY 1 NULLS LAST".into(),
            true,
        ),
        3 => read(
            format!("SELECT customer_id, order_id, row_number() OVER (PARTITION BY customer_id ORDER BY order_id), sum(qty) OVER (ORDER BY order_id) FROM orders WHERE customer_id = {c} ORDER BY order_id"),
            true,
        ),
        4 => read(
            format!("SELECT coalesce(sum(qty), 0), count(created), min(amount) FROM orders WHERE created > DATE '2026-{:02}-01'", rng.random_range(1..=12)),
            true,
        ),
        5 => read(
            "SELECT count(*), count(amount), count(status) FROM orders WHERE status IS NULL OR amount IS NULL".into(),
            true,
        ),
        6 => read(
            format!("SELECT customer_id, sum(amount) FROM orders GROUP BY customer_id HAVING sum(amount) > {} ORDER BY 1", rng.random_range(0..3000)),
            true,
        ),
        7 => read(
            "SELECT DISTINCT ON (customer_id) customer_id, order_id FROM orders ORDER BY customer_id, order_id DESC".into(),
            true,
        ),
        8 => read(
            "SELECT * FROM orders ORDER BY created NULLS FIRST, customer_id, order_id LIMIT 7".into(),
            true,
        ),
        9 => {
            let lo = rng.random_range(0..1000);
            read(
                format!("SELECT customer_id, order_id, amount FROM orders WHERE amount BETWEEN {lo} AND {} ORDER BY amount, customer_id, order_id", lo + 300),
                true,
            )
        }
        10 => read("SELECT max(sku), min(sku), count(DISTINCT customer_id) FROM items".into(), true),
        11 => write(format!(
            "UPDATE items SET price = price * 2 WHERE customer_id IN ({list}) RETURNING customer_id, order_id, sku, price"
        )),
        12 => write(format!(
            "DELETE FROM orders WHERE customer_id = {c} AND qty < {} RETURNING order_id",
            rng.random_range(0..3)
        )),
        13 => {
            *next_order += 1;
            write(format!(
                "BEGIN; INSERT INTO orders VALUES ({c}, {}, 1.50, 'new', 1, NULL); UPDATE orders SET qty = qty + 10 WHERE customer_id = {c}; SELECT count(*), sum(qty) FROM orders WHERE customer_id = {c}; {}",
                *next_order,
                if rng.random_bool(0.5) { "COMMIT" } else { "ROLLBACK" }
            ))
        }
        14 => read(
            format!("SELECT o.customer_id, count(*) FROM orders o WHERE o.customer_id IN ({list}) AND EXISTS (SELECT 1 FROM items i WHERE i.customer_id = o.customer_id AND i.order_id = o.order_id) GROUP BY o.customer_id ORDER BY 1"),
            true,
        ),
        _ => read(
            format!("WITH mine AS (SELECT * FROM orders WHERE customer_id = {c}) SELECT count(*), max(order_id) FROM mine"),
            true,
        ),
    }
}

/// The first rows of both tables and the regions, for the start.
fn seed_data(rng: &mut StdRng, next_order: &mut i64) -> Vec<String> {
    let mut out = vec![
        "INSERT INTO regions VALUES ('new', 'North'), ('paid', 'South'), ('Shipped', 'East'), ('x', NULL)".to_string(),
        "INSERT INTO notes VALUES ('new', 'fresh'), ('paid', 'settled'), ('zz', NULL)".to_string(),
    ];
    for c in 1..=CUSTOMERS {
        for _ in 0..rng.random_range(0..4) {
            *next_order += 1;
            out.push(format!(
                "INSERT INTO orders VALUES ({c}, {}, {}, {}, {}, {})",
                *next_order,
                amount(rng),
                literal(rng, STATUSES),
                rng.random_range(0..10),
                date(rng)
            ));
            for sku in SKUS.iter().take(rng.random_range(0..3)) {
                out.push(format!(
                    "INSERT INTO items VALUES ({c}, {}, '{sku}', {})",
                    *next_order,
                    amount(rng)
                ));
            }
        }
    }
    out
}

/// Rows compared as Postgres's order gives them, or sorted when the order is not fixed.
fn canonical(answer: Answer, ordered: bool) -> Answer {
    match answer {
        Answer::Rows { columns, mut rows } if !ordered => {
            rows.sort();
            Answer::Rows { columns, rows }
        }
        other => other,
    }
}

struct Tally {
    same: usize,
    /// By reason: how many, and the first statement refused for it.
    refused: BTreeMap<String, (usize, String)>,
    mismatches: Vec<String>,
}

impl Tally {
    async fn compare(&mut self, seed: u64, g: &Generated, routed: &Client, direct: &Client) {
        let through = canonical(run(routed, &g.sql).await, g.ordered);
        let plain = canonical(run(direct, &g.sql).await, g.ordered);
        match (&through, &plain) {
            (a, b) if a == b => self.same += 1,
            (Answer::Error { code, message }, Answer::Rows { .. } | Answer::Done(_))
                if code == "0A000" =>
            {
                // By the reason's words, not its shards or values.
                // A refusal of a read across shards says why after "but".
                let why = message
                    .split_once(", but ")
                    .map_or(message.as_str(), |(_, w)| w);
                let reason: String = why
                    .split(['(', '`'])
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(100)
                    .collect();
                self.refused.entry(reason).or_insert((0, g.sql.clone())).0 += 1;
            }
            // The same failure, told in other words (a refusal's wording is the router's).
            (Answer::Error { code: a, .. }, Answer::Error { code: b, .. }) if a == b => {
                self.same += 1
            }
            _ => self.mismatches.push(format!(
                "seed {seed}: {}\n  router: {through:?}\n  direct: {plain:?}",
                g.sql
            )),
        }
        if g.reads && matches!(through, Answer::Rows { .. }) {
            let through = canonical(extended(routed, &g.sql).await, g.ordered);
            let plain = canonical(extended(direct, &g.sql).await, g.ordered);
            let refused = matches!(&through, Answer::Error { code, .. } if code == "0A000");
            if through != plain && !refused {
                self.mismatches.push(format!(
                    "seed {seed}: in the extended protocol, {}\n  router: {through:?}\n  direct: {plain:?}",
                    g.sql
                ));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_statements_answer_as_one_postgres_or_are_refused() {
    let seed: u64 = std::env::var("SHARDGATE_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let statements: usize = std::env::var("SHARDGATE_DIFF_STATEMENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    println!("differential: seed {seed}, {statements} statements (SHARDGATE_DIFF_SEED={seed})");
    let cluster = pgharness::Cluster::start(&pgharness::ClusterOptions {
        shards: 4,
        servers: 2,
        schema_sql: Some(pgharness::Schema::Sql(SCHEMA.into())),
        ..Default::default()
    })
    .expect("the shard cluster");
    let tables = vec![
        Table::new("orders", "customer_id", KeyType::BigInt),
        Table::new("items", "customer_id", KeyType::BigInt),
    ];
    let map = ShardMap::even_split(&cluster.shard_urls(), tables)
        .and_then(|m| m.with_references(vec![Reference::new("regions")]))
        .expect("map");
    let router = common::Router::start(&map, 4);
    let server = &cluster.servers()[0];
    server
        .psql("postgres", "CREATE DATABASE differential_direct")
        .expect("the direct database");
    server
        .psql("differential_direct", SCHEMA)
        .expect("the schema, directly");
    let routed = router.connect().await;
    let direct = common::connect(&server.url("differential_direct"))
        .await
        .expect("connect directly");

    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_order = 0;
    for sql in seed_data(&mut rng, &mut next_order) {
        routed.batch_execute(&sql).await.expect("seed rows, routed");
        direct
            .batch_execute(&sql)
            .await
            .expect("seed rows, directly");
    }
    let mut tally = Tally {
        same: 0,
        refused: BTreeMap::new(),
        mismatches: Vec::new(),
    };
    // The comparison sees a difference: a row only one side has.
    direct
        .batch_execute("INSERT INTO regions VALUES ('zz', 'only here')")
        .await
        .expect("a row directly");
    let probe = Generated {
        sql: "SELECT code FROM regions ORDER BY code".into(),
        ordered: true,
        reads: true,
    };
    tally.compare(seed, &probe, &routed, &direct).await;
    assert!(!tally.mismatches.is_empty(), "a difference went unseen");
    tally.mismatches.clear();
    direct
        .batch_execute("DELETE FROM regions WHERE code = 'zz'")
        .await
        .expect("and gone");
    let dumps = [
        "SELECT * FROM orders ORDER BY customer_id, order_id",
        "SELECT * FROM items ORDER BY customer_id, order_id, sku",
        "SELECT * FROM regions ORDER BY code",
        "SELECT * FROM notes ORDER BY code",
    ];
    for n in 0..statements {
        let g = generate(&mut rng, &mut next_order);
        tally.compare(seed, &g, &routed, &direct).await;
        if n % 200 == 199 || n + 1 == statements {
            for dump in dumps {
                let g = Generated {
                    sql: dump.into(),
                    ordered: true,
                    reads: false,
                };
                tally.compare(seed, &g, &routed, &direct).await;
            }
        }
        if tally.mismatches.len() >= 10 {
            break;
        }
    }
    let refused: usize = tally.refused.values().map(|(n, _)| n).sum();
    println!(
        "differential: {} the same, {refused} refused, {} mismatched",
        tally.same,
        tally.mismatches.len()
    );
    for (reason, (n, example)) in &tally.refused {
        println!("  refused {n:5}: {reason}\n                 e.g. {example}");
    }
    assert!(
        tally.mismatches.is_empty(),
        "the router answered differently from one Postgres (rerun with SHARDGATE_DIFF_SEED={seed}):\n{}",
        tally.mismatches.join("\n")
    );
    assert!(
        tally.same > statements / 3,
        "too little was compared: {}",
        tally.same
    );
}
