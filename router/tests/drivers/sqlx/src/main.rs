//! sqlx's script of the driver matrix through a shardgate router. sqlx runs every query with
//! arguments as a named server-side prepared statement (`sqlx_s_N`, its per-connection
//! statement cache), so the point selects exercise named statements from the first use.
//!
//! Environment: SHARDGATE_URL, SHARDGATE_KEY_BASE, SHARDGATE_DRIVER (see
//! ../python/psycopg_driver.py); `SHARDGATE_MODE=isolation` runs [`isolation`] instead, with
//! SHARDGATE_KEYS. Prints one line per step; exits 1 with "FAIL <step>: ..." on the first
//! deviation.

use std::time::{Duration, Instant};

use sqlx::types::BigDecimal;
use sqlx::{Connection, Executor, PgConnection, Row};

const ROWS: i64 = 20;
const REPEAT: usize = 12;
const SCATTER_REPEAT: usize = 7;

type Result<T> = std::result::Result<T, String>;

fn sqlstate<T: std::fmt::Debug>(
    r: std::result::Result<T, sqlx::Error>,
    want: &str,
) -> Result<String> {
    match r {
        Ok(v) => Err(format!(
            "expected SQLSTATE {want}, the statement succeeded: {v:?}"
        )),
        Err(sqlx::Error::Database(db)) => match db.code() {
            Some(code) if code == want => Ok(db.message().to_string()),
            code => Err(format!(
                "expected SQLSTATE {want}, got {code:?}: {}",
                db.message()
            )),
        },
        Err(e) => Err(format!("expected SQLSTATE {want}, got {e}")),
    }
}

async fn value(conn: &mut PgConnection, k: i64) -> Result<Option<String>> {
    sqlx::query_scalar::<_, String>("SELECT v FROM kv WHERE id = $1")
        .bind(k)
        .fetch_optional(conn)
        .await
        .map_err(|e| format!("select {k}: {e}"))
}

async fn expect_value(conn: &mut PgConnection, k: i64, want: &str, what: &str) -> Result<()> {
    match value(conn, k).await? {
        Some(v) if v == want => Ok(()),
        got => Err(format!("{what}: key {k}: expected {want:?}, got {got:?}")),
    }
}

async fn select_one(conn: &mut PgConnection, what: &str) -> Result<()> {
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(conn)
        .await
        .map_err(|e| format!("{what}: {e}"))?;
    if one != 1 {
        return Err(format!("{what}: SELECT 1 returned {one}"));
    }
    Ok(())
}

async fn run(step: &mut &'static str) -> Result<()> {
    let url = std::env::var("SHARDGATE_URL").map_err(|_| "SHARDGATE_URL is not set")?;
    let base: i64 = std::env::var("SHARDGATE_KEY_BASE")
        .ok()
        .and_then(|b| b.parse().ok())
        .ok_or("SHARDGATE_KEY_BASE is not set")?;
    let name = std::env::var("SHARDGATE_DRIVER").unwrap_or_else(|_| "sqlx".into());
    let ok = |step: &str, detail: &str| {
        if detail.is_empty() {
            println!("ok {step}");
        } else {
            println!("ok {step}: {detail}");
        }
    };

    *step = "connect";
    let url = format!("{url}?sslmode=disable");
    let mut conn = PgConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    ok(step, "sqlx 0.8");

    *step = "ddl_broadcast";
    // A plain &str executes in the simple query protocol.
    conn.execute(format!("CREATE INDEX IF NOT EXISTS kv_drv_{name} ON kv (v)").as_str())
        .await
        .map_err(|e| e.to_string())?;
    ok(step, "simple protocol");

    *step = "insert";
    let keys: Vec<i64> = (1..=ROWS).map(|i| base + i).collect();
    for &k in &keys {
        let r = sqlx::query("INSERT INTO kv (id, v) VALUES ($1, $2)")
            .bind(k)
            .bind(format!("v{k}"))
            .execute(&mut conn)
            .await
            .map_err(|e| format!("insert {k}: {e}"))?;
        if r.rows_affected() != 1 {
            return Err(format!("insert {k}: {} rows", r.rows_affected()));
        }
    }
    ok(step, &format!("{ROWS} rows"));

    *step = "point_select";
    for _ in 0..REPEAT {
        for &k in &keys {
            expect_value(&mut conn, k, &format!("v{k}"), "select").await?;
        }
    }
    let cached = conn.cached_statements_size();
    if cached < 2 {
        return Err(format!(
            "expected named statements in sqlx's cache, it holds {cached}"
        ));
    }
    ok(
        step,
        &format!(
            "{} selects, {cached} named prepared statements",
            REPEAT * keys.len()
        ),
    );

    *step = "tx_commit";
    let k = keys[0];
    {
        let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
        let v: String = sqlx::query("SELECT v FROM kv WHERE id = $1 FOR UPDATE")
            .bind(k)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        if v != format!("v{k}") {
            return Err(format!("in tx: got {v:?}"));
        }
        sqlx::query("UPDATE kv SET v = $1 WHERE id = $2")
            .bind("updated")
            .bind(k)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
    }
    expect_value(&mut conn, k, "updated", "after commit").await?;
    ok(step, "");

    *step = "tx_rollback";
    let k = keys[1];
    {
        let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
        sqlx::query("UPDATE kv SET v = $1 WHERE id = $2")
            .bind("rolled back")
            .bind(k)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        expect_value(&mut tx, k, "rolled back", "inside the tx").await?;
        tx.rollback().await.map_err(|e| e.to_string())?;
    }
    expect_value(&mut conn, k, &format!("v{k}"), "after rollback").await?;
    ok(step, "");

    *step = "unique_violation";
    let k = keys[2];
    let r = sqlx::query("INSERT INTO kv (id, v) VALUES ($1, $2)")
        .bind(k)
        .bind("dup")
        .execute(&mut conn)
        .await;
    sqlstate(r.map(|r| r.rows_affected()), "23505")?;
    expect_value(
        &mut conn,
        k,
        &format!("v{k}"),
        "connection reused after the error",
    )
    .await?;
    ok(step, "");

    *step = "cancel";
    // sqlx has no API to send a CancelRequest (it keeps BackendKeyData private), and dropping
    // a query future does not cancel it on the server. What an application can do is a
    // server-side statement_timeout, which ends the statement with the same 57014.
    conn.execute("SET statement_timeout = '500ms'")
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let r = sqlx::query("SELECT pg_sleep(10)").execute(&mut conn).await;
    sqlstate(r.map(|r| r.rows_affected()), "57014")?;
    let took = started.elapsed();
    conn.execute("RESET statement_timeout")
        .await
        .map_err(|e| e.to_string())?;
    if took > Duration::from_secs(5) {
        return Err(format!("the statement_timeout took {took:?}"));
    }
    select_one(&mut conn, "connection not usable after the cancel").await?;
    ok(
        step,
        &format!(
            "no cancel API; statement_timeout → 57014 after {:.2}s",
            took.as_secs_f64()
        ),
    );

    *step = "scatter_count";
    // A read of the sharded table without a key: scattered to every shard, counts summed. The
    // range count is exact whatever the other drivers insert meanwhile.
    for _ in 0..SCATTER_REPEAT {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM kv WHERE id BETWEEN $1 AND $2")
            .bind(keys[0])
            .bind(keys[keys.len() - 1])
            .fetch_one(&mut conn)
            .await
            .map_err(|e| format!("count of this driver's range: {e}"))?;
        if n != ROWS {
            return Err(format!(
                "count of this driver's range: expected {ROWS}, got {n}"
            ));
        }
    }
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM kv")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| format!("SELECT count(*) FROM kv: {e}"))?;
    if total < ROWS {
        return Err(format!(
            "SELECT count(*) FROM kv: {total} < the {ROWS} rows of this driver alone"
        ));
    }
    ok(
        step,
        &format!("range count {ROWS} x{SCATTER_REPEAT}, total {total}"),
    );

    *step = "scatter_merge";
    // Reads the router merges across shards: ORDER BY (k-way merge) with LIMIT/OFFSET,
    // aggregates, GROUP BY, each a named statement from sqlx's cache. The expectations come from
    // this driver's keys (every one of them still in kv: no step deleted a row, the updates
    // changed only v). sqlx receives results in binary; numeric (sum and avg of bigint) is
    // decoded into BigDecimal and compared exactly.
    let (lo, hi) = (keys[0], keys[keys.len() - 1]);
    let mut desc = keys.clone();
    desc.sort_unstable_by(|a, b| b.cmp(a));
    let want_order = desc[1..4].to_vec();
    let n = keys.len() as i64;
    let (min, max) = (*keys.iter().min().unwrap(), *keys.iter().max().unwrap());
    let want_sum = BigDecimal::from(keys.iter().sum::<i64>());
    // Exact: the keys' average ends after one decimal (BigDecimal's division keeps 100 digits).
    let want_avg = &want_sum / BigDecimal::from(n);
    let want_groups: Vec<(i64, i64)> = (0..2)
        .map(|p| (p, keys.iter().filter(|&&k| k % 2 == p).count() as i64))
        .filter(|&(_, c)| c > 0)
        .collect();
    let (mut sum_got, mut avg_got) = (BigDecimal::from(0), BigDecimal::from(0));
    for _ in 0..SCATTER_REPEAT {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM kv WHERE id BETWEEN $1 AND $2 ORDER BY id DESC LIMIT 3 OFFSET 1",
        )
        .bind(lo)
        .bind(hi)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| format!("ORDER BY id DESC LIMIT 3 OFFSET 1: {e}"))?;
        if ids != want_order {
            return Err(format!(
                "ORDER BY id DESC LIMIT 3 OFFSET 1: expected {want_order:?}, got {ids:?}"
            ));
        }
        let (c, mn, mx, sum, avg): (i64, i64, i64, BigDecimal, BigDecimal) = sqlx::query_as(
            "SELECT count(*), min(id), max(id), sum(id), avg(id) FROM kv WHERE id BETWEEN $1 AND $2",
        )
        .bind(lo)
        .bind(hi)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| format!("count/min/max/sum/avg: {e}"))?;
        if (c, mn, mx) != (n, min, max) {
            return Err(format!(
                "count, min, max: expected {:?}, got {:?}",
                (n, min, max),
                (c, mn, mx)
            ));
        }
        if sum != want_sum {
            return Err(format!("sum(id): expected {want_sum}, got {sum}"));
        }
        if avg != want_avg {
            return Err(format!("avg(id): expected exactly {want_avg}, got {avg}"));
        }
        (sum_got, avg_got) = (sum, avg);
        let groups: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT id % 2 AS parity, count(*) FROM kv WHERE id BETWEEN $1 AND $2 \
             GROUP BY id % 2 ORDER BY parity",
        )
        .bind(lo)
        .bind(hi)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| format!("GROUP BY id % 2: {e}"))?;
        if groups != want_groups {
            return Err(format!(
                "GROUP BY id % 2: expected {want_groups:?}, got {groups:?}"
            ));
        }
    }
    ok(
        step,
        &format!(
            "order/limit/offset, count/min/max/sum/avg (sum {sum_got}, avg {avg_got}), group by \
             x{SCATTER_REPEAT}, named statements, binary numeric"
        ),
    );

    conn.close().await.map_err(|e| e.to_string())?;
    println!("PASS");
    Ok(())
}

/// `SHARDGATE_MODE=isolation`: while other shards are down or busy, statements keyed to the
/// healthy shard(s) of `SHARDGATE_KEYS` (rows with v = 'v<key>') and statements that need no
/// shard never fail.
async fn isolation(step: &mut &'static str) -> Result<()> {
    let url = std::env::var("SHARDGATE_URL").map_err(|_| "SHARDGATE_URL is not set")?;
    let keys = std::env::var("SHARDGATE_KEYS")
        .map_err(|_| "SHARDGATE_KEYS is not set")?
        .split(',')
        .map(|k| k.parse::<i64>().map_err(|e| format!("SHARDGATE_KEYS: {e}")))
        .collect::<Result<Vec<i64>>>()?;
    *step = "connect";
    let mut conn = PgConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    println!("ok connect");
    *step = "isolated";
    for _ in 0..REPEAT {
        select_one(&mut conn, "SELECT 1").await?;
        for &k in &keys {
            expect_value(&mut conn, k, &format!("v{k}"), "isolated").await?;
        }
    }
    println!(
        "ok isolated: {REPEAT} rounds of SELECT 1 and {} keys, named statements",
        keys.len()
    );
    conn.close().await.map_err(|e| e.to_string())?;
    println!("PASS");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut step = "start";
    let result = if std::env::var("SHARDGATE_MODE").as_deref() == Ok("isolation") {
        isolation(&mut step).await
    } else {
        run(&mut step).await
    };
    if let Err(e) = result {
        println!("FAIL {step}: {e}");
        std::process::exit(1);
    }
}
