//! The driver matrix: the same script, through one router in front of a 4-shard cluster, with
//! each real client driver an application would use: tokio-postgres (in this process), sqlx,
//! psycopg 3, asyncpg, node-postgres and pgjdbc (each a small program under `tests/drivers/`,
//! run as a subprocess with the router's URL in `SHARDGATE_URL`). psql and pgbench
//! (-M simple|extended|prepared) are covered by `tests/clients.rs`.
//!
//! The script: connect; a DDL broadcast (`CREATE INDEX IF NOT EXISTS kv_drv_<driver> ON kv (v)`,
//! kv being sharded, checked afterwards on every shard directly); 20 inserts into kv with keys
//! from the driver's own range (20,000,000 + k·100,000 + 1..=20, spread over all shards);
//! 12 rounds of point selects by key with bind parameters (so drivers that switch to named
//! server-side statements after N uses do); an UPDATE in a committed transaction; a rolled
//! back transaction (row unchanged); a unique violation (23505) and the connection reused; a
//! cancelled `pg_sleep(10)` (57014); and reads without a key, scattered to every shard and
//! summed: `SELECT count(*) FROM kv WHERE id BETWEEN <first> AND <last>` of the driver's own
//! range (exactly 20, whatever the other drivers insert meanwhile; 7 times, so that it runs as
//! a named statement too) and `SELECT count(*) FROM kv` (at least 20); then reads the router
//! merges: `ORDER BY ... LIMIT 3 OFFSET 1`, `count/min/max/sum/avg` (numeric, decoded as each
//! driver decodes numeric, in text or binary) and a `GROUP BY` (`scatter_merge`).
//!
//! The drivers' dependencies are installed by `router/tests/drivers/install.sh`; when they are
//! missing these tests FAIL and say so, they never skip.
//! `docs/compatibility.md` has the resulting matrix.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{shared_env, sqlstate, Env};
use tokio_postgres::{NoTls, SimpleQueryMessage};

const ROWS: i64 = 20;
const REPEAT: usize = 12;
const SCATTER_REPEAT: usize = 7;
/// How long one driver program may run (its cancel step alone takes ~0.5 s; a JVM start and a
/// Python import a second or two).
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(120);

const INSTALL: &str = "run router/tests/drivers/install.sh (it installs the driver matrix's \
                       dependencies: libpostgresql-jdbc-java, a Python venv with psycopg and \
                       asyncpg, node_modules for pg, and the sqlx program)";

/// The first key of driver `k`'s range of kv (keys `base + 1 ..= base + ROWS`).
fn key_base(k: i64) -> i64 {
    20_000_000 + k * 100_000
}

fn drivers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drivers")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Where install.sh puts the Python venv (same rule as the script).
fn venv_dir() -> PathBuf {
    let cache = std::env::var_os("SHARDGATE_DRIVERS_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("shardgate-drivers"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/shardgate-drivers"))
        })
        .expect("HOME or SHARDGATE_DRIVERS_CACHE");
    cache.join("venv")
}

fn require(cond: bool, what: &str) {
    assert!(cond, "driver matrix: {what} is missing: {INSTALL}");
}

fn on_path(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Runs one driver program against the shared router and checks its result and what it left on
/// the shards.
fn run_driver(name: &str, k: i64, cmd: Command) {
    run_driver_with(name, k, cmd, &[]);
}

/// [`run_driver`], and indexes the program created beyond `kv_drv_<name>` (on every shard).
fn run_driver_with(name: &str, k: i64, cmd: Command, more_indexes: &[&str]) {
    let env = shared_env();
    let base = key_base(k);
    run_program(env, name, cmd, &[("SHARDGATE_KEY_BASE", base.to_string())]);
    check_shards(env, name, base);
    for index in more_indexes {
        check_index(env, name, index);
    }
}

/// Runs one driver program against `env`'s router with `vars` in its environment (besides
/// `SHARDGATE_URL` and `SHARDGATE_DRIVER`), and fails unless it ends printing PASS in time.
fn run_program(env: &Env, name: &str, mut cmd: Command, vars: &[(&str, String)]) {
    let out_path = env.router.dir.join(format!("driver-{name}.out"));
    let out = std::fs::File::create(&out_path).expect("driver output file");
    let started = Instant::now();
    cmd.env("SHARDGATE_URL", env.router.url())
        .env("SHARDGATE_DRIVER", name)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("start the {name} driver ({cmd:?}): {e}\n{INSTALL}"));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the driver") {
            break Some(status);
        }
        if started.elapsed() > PROGRAM_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let took = started.elapsed();
    let router_log = || {
        let log = env.router.log_text();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    match status {
        None => panic!(
            "the {name} driver did not finish in {PROGRAM_TIMEOUT:?}:\n{output}\n--- router log (tail) ---\n{}",
            router_log()
        ),
        Some(s) if !s.success() || !output.lines().any(|l| l == "PASS") => panic!(
            "the {name} driver failed ({s}):\n{output}\n--- router log (tail) ---\n{}",
            router_log()
        ),
        Some(_) => {}
    }
    println!("{name} driver passed in {took:.1?}:\n{output}");
}

/// What every script leaves behind, read from the shards directly: the broadcast index on every
/// shard, and each row on the shard that owns its key with its final value.
fn check_shards(env: &Env, name: &str, base: i64) {
    check_index(env, name, &format!("kv_drv_{name}"));
    let mut shards_used = std::collections::BTreeSet::new();
    for i in 1..=ROWS {
        let k = base + i;
        let want = match i {
            1 => "updated".to_string(),
            _ => format!("v{k}"),
        };
        let shard = env.shard_of(k);
        shards_used.insert(shard);
        assert_eq!(
            env.on_shard(shard, &format!("SELECT v FROM kv WHERE id = {k}")),
            want,
            "{name}: key {k} on its shard {shard}"
        );
    }
    assert_eq!(
        shards_used.len(),
        env.map.shards().len(),
        "{name}: the keys should cover every shard"
    );
}

/// The broadcast index `index` exists on every shard.
fn check_index(env: &Env, name: &str, index: &str) {
    for shard in 0..env.map.shards().len() {
        assert_eq!(
            env.on_shard(
                shard,
                &format!("SELECT count(*) FROM pg_indexes WHERE indexname = '{index}'")
            ),
            "1",
            "{name}: the broadcast CREATE INDEX {index} did not reach shard {shard}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// tokio-postgres, in this process.

/// A `numeric` as tokio-postgres receives it (always binary; the crate has no numeric type of
/// its own), decoded from Postgres's wire format into its decimal text: ndigits, weight, sign,
/// dscale (each 16 bits), then ndigits base-10000 digits, the first one worth 10000^weight.
#[derive(Debug)]
struct Numeric(String);

impl<'a> tokio_postgres::types::FromSql<'a> for Numeric {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let word = |i: usize| -> Result<u16, String> {
            raw.get(2 * i..2 * i + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
                .ok_or_else(|| format!("numeric: {} bytes, truncated", raw.len()))
        };
        let ndigits = word(0)? as usize;
        let weight = word(1)? as i16 as i64;
        let sign = word(2)?;
        let dscale = word(3)? as i64;
        if raw.len() != 8 + 2 * ndigits {
            return Err(format!("numeric: {} bytes for {ndigits} digits", raw.len()).into());
        }
        let digits = (0..ndigits)
            .map(|i| word(4 + i))
            .collect::<Result<Vec<u16>, _>>()?;
        if digits.iter().any(|&d| d > 9999) {
            return Err(format!("numeric: digit out of range in {digits:?}").into());
        }
        // The digit worth 10000^(weight - i), zero where not sent.
        let digit = |i: i64| -> u16 {
            usize::try_from(i)
                .ok()
                .and_then(|i| digits.get(i).copied())
                .unwrap_or(0)
        };
        let mut text = match sign {
            0x0000 => String::new(),
            0x4000 => "-".to_string(),
            0xC000 => return Ok(Numeric("NaN".into())),
            0xD000 => return Ok(Numeric("Infinity".into())),
            0xF000 => return Ok(Numeric("-Infinity".into())),
            _ => return Err(format!("numeric: sign {sign:#06x}").into()),
        };
        if weight < 0 {
            text.push('0');
        } else {
            text.push_str(&digit(0).to_string());
            for i in 1..=weight {
                text.push_str(&format!("{:04}", digit(i)));
            }
        }
        if dscale > 0 {
            let mut frac = String::new();
            for j in 1..=(dscale + 3) / 4 {
                frac.push_str(&format!("{:04}", digit(weight + j)));
            }
            frac.truncate(dscale as usize);
            text.push('.');
            text.push_str(&frac);
        }
        Ok(Numeric(text))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::NUMERIC
    }
}

impl Numeric {
    /// The value as `mantissa / 10^scale`, for exact comparisons (`None` if it does not fit).
    fn scaled(&self) -> Option<(i128, u32)> {
        let (int, frac) = self.0.split_once('.').unwrap_or((&self.0, ""));
        let mantissa = format!("{int}{frac}").parse().ok()?;
        Some((mantissa, frac.len() as u32))
    }

    /// Whether the value is exactly `num / den`.
    fn is_exactly(&self, num: i128, den: i128) -> bool {
        self.scaled().is_some_and(|(m, scale)| {
            10i128
                .checked_pow(scale)
                .and_then(|p| num.checked_mul(p))
                .zip(m.checked_mul(den))
                .is_some_and(|(a, b)| a == b)
        })
    }
}

async fn tokio_postgres_script(
    url: &str,
    name: &str,
    base: i64,
    step: &mut &'static str,
) -> Result<(), String> {
    let e = |e: tokio_postgres::Error| format!("{e:?}");
    *step = "connect";
    let (mut client, conn) = tokio_postgres::connect(url, NoTls).await.map_err(e)?;
    tokio::spawn(conn);
    println!("ok connect");

    *step = "ddl_broadcast";
    client
        .simple_query(&format!(
            "CREATE INDEX IF NOT EXISTS kv_drv_{name} ON kv (v)"
        ))
        .await
        .map_err(e)?;
    println!("ok ddl_broadcast: simple protocol");

    *step = "insert";
    let keys: Vec<i64> = (1..=ROWS).map(|i| base + i).collect();
    let insert = client
        .prepare("INSERT INTO kv (id, v) VALUES ($1, $2)")
        .await
        .map_err(e)?;
    for &k in &keys {
        let n = client
            .execute(&insert, &[&k, &format!("v{k}")])
            .await
            .map_err(e)?;
        if n != 1 {
            return Err(format!("insert {k}: {n} rows"));
        }
    }
    println!("ok insert: {ROWS} rows");

    *step = "point_select";
    // prepare() → a named statement (s0, s1, ...), bound and executed for every select.
    let select = client
        .prepare("SELECT v FROM kv WHERE id = $1")
        .await
        .map_err(e)?;
    let value =
        |rows: Vec<tokio_postgres::Row>| -> Vec<String> { rows.iter().map(|r| r.get(0)).collect() };
    for _ in 0..REPEAT {
        for &k in &keys {
            let got = value(client.query(&select, &[&k]).await.map_err(e)?);
            if got != [format!("v{k}")] {
                return Err(format!("key {k}: got {got:?}"));
            }
        }
    }
    println!(
        "ok point_select: {} selects, named statement",
        REPEAT * keys.len()
    );

    *step = "tx_commit";
    let k = keys[0];
    {
        let tx = client.transaction().await.map_err(e)?;
        let got = value(
            tx.query("SELECT v FROM kv WHERE id = $1 FOR UPDATE", &[&k])
                .await
                .map_err(e)?,
        );
        if got != [format!("v{k}")] {
            return Err(format!("in tx: got {got:?}"));
        }
        tx.execute("UPDATE kv SET v = $1 WHERE id = $2", &[&"updated", &k])
            .await
            .map_err(e)?;
        tx.commit().await.map_err(e)?;
    }
    let got = value(client.query(&select, &[&k]).await.map_err(e)?);
    if got != ["updated"] {
        return Err(format!("after commit: got {got:?}"));
    }
    println!("ok tx_commit");

    *step = "tx_rollback";
    let k = keys[1];
    {
        let tx = client.transaction().await.map_err(e)?;
        tx.execute("UPDATE kv SET v = $1 WHERE id = $2", &[&"rolled back", &k])
            .await
            .map_err(e)?;
        let got = value(tx.query(&select, &[&k]).await.map_err(e)?);
        if got != ["rolled back"] {
            return Err(format!("inside the tx: got {got:?}"));
        }
        tx.rollback().await.map_err(e)?;
    }
    let got = value(client.query(&select, &[&k]).await.map_err(e)?);
    if got != [format!("v{k}")] {
        return Err(format!("after rollback: got {got:?}"));
    }
    println!("ok tx_rollback");

    *step = "unique_violation";
    let k = keys[2];
    match client.execute(&insert, &[&k, &"dup"]).await {
        Ok(n) => return Err(format!("expected 23505, inserted {n} rows")),
        Err(err) if sqlstate(&err) == "23505" => {}
        Err(err) => return Err(format!("expected 23505, got {}: {err:?}", sqlstate(&err))),
    }
    let got = value(client.query(&select, &[&k]).await.map_err(e)?);
    if got != [format!("v{k}")] {
        return Err(format!("connection reused after the error: got {got:?}"));
    }
    println!("ok unique_violation");

    *step = "cancel";
    let token = client.cancel_token();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        token.cancel_query(NoTls).await
    });
    let started = Instant::now();
    match client.simple_query("SELECT pg_sleep(10)").await {
        Ok(_) => return Err("pg_sleep(10) returned instead of being cancelled".into()),
        Err(err) if sqlstate(&err) == "57014" => {}
        Err(err) => return Err(format!("expected 57014, got {}: {err:?}", sqlstate(&err))),
    }
    let took = started.elapsed();
    canceller
        .await
        .map_err(|j| j.to_string())?
        .map_err(|err| format!("cancel_query: {err:?}"))?;
    if took > Duration::from_secs(5) {
        return Err(format!("the cancel took {took:?}"));
    }
    let one: i32 = client.query_one("SELECT 1", &[]).await.map_err(e)?.get(0);
    if one != 1 {
        return Err("connection not usable after the cancel".into());
    }
    println!("ok cancel: 57014 after {:.2}s", took.as_secs_f64());

    *step = "scatter_count";
    // A read of the sharded table without a key: scattered to every shard, counts summed. The
    // range count is exact whatever the other drivers insert meanwhile.
    let count = client
        .prepare("SELECT count(*) FROM kv WHERE id BETWEEN $1 AND $2")
        .await
        .map_err(e)?;
    for _ in 0..SCATTER_REPEAT {
        let n: i64 = client
            .query_one(&count, &[&keys[0], &keys[keys.len() - 1]])
            .await
            .map_err(e)?
            .get(0);
        if n != ROWS {
            return Err(format!(
                "count of this driver's range: expected {ROWS}, got {n}"
            ));
        }
    }
    let total: i64 = client
        .query_one("SELECT count(*) FROM kv", &[])
        .await
        .map_err(e)?
        .get(0);
    if total < ROWS {
        return Err(format!(
            "SELECT count(*) FROM kv: {total} < the {ROWS} rows of this driver alone"
        ));
    }
    let msgs = client
        .simple_query("SELECT count(*) FROM kv")
        .await
        .map_err(e)?;
    if !msgs.iter().any(|m| matches!(m, SimpleQueryMessage::Row(r) if r.get(0).and_then(|n| n.parse::<i64>().ok()).is_some_and(|n| n >= total))) {
        return Err(format!("simple-protocol SELECT count(*) FROM kv: {msgs:?}"));
    }
    println!("ok scatter_count: range count {ROWS} x{SCATTER_REPEAT}, total {total}");

    *step = "scatter_merge";
    // Reads the router merges across shards: ORDER BY (k-way merge) with LIMIT/OFFSET,
    // aggregates, GROUP BY, each a named statement. The expectations come from this driver's
    // keys (every one of them still in kv: no step deleted a row, the updates changed only v).
    // tokio-postgres receives results in binary; numeric (sum and avg of bigint) is decoded by
    // `Numeric` above and compared exactly.
    let (lo, hi) = (keys[0], keys[keys.len() - 1]);
    let mut desc = keys.clone();
    desc.sort_unstable_by(|a, b| b.cmp(a));
    let want_order = desc[1..4].to_vec();
    let n = keys.len() as i64;
    let (min, max) = (*keys.iter().min().unwrap(), *keys.iter().max().unwrap());
    let want_sum: i128 = keys.iter().map(|&k| k as i128).sum();
    let want_groups: Vec<(i64, i64)> = (0..2)
        .map(|p| (p, keys.iter().filter(|&&k| k % 2 == p).count() as i64))
        .filter(|&(_, c)| c > 0)
        .collect();
    let order = client
        .prepare("SELECT id FROM kv WHERE id BETWEEN $1 AND $2 ORDER BY id DESC LIMIT 3 OFFSET 1")
        .await
        .map_err(e)?;
    let agg = client
        .prepare(
            "SELECT count(*), min(id), max(id), sum(id), avg(id) FROM kv WHERE id BETWEEN $1 AND $2",
        )
        .await
        .map_err(e)?;
    let group = client
        .prepare(
            "SELECT id % 2 AS parity, count(*) FROM kv WHERE id BETWEEN $1 AND $2 \
             GROUP BY id % 2 ORDER BY parity",
        )
        .await
        .map_err(e)?;
    let (mut sum_got, mut avg_got) = (String::new(), String::new());
    for _ in 0..SCATTER_REPEAT {
        let ids: Vec<i64> = client
            .query(&order, &[&lo, &hi])
            .await
            .map_err(e)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if ids != want_order {
            return Err(format!(
                "ORDER BY id DESC LIMIT 3 OFFSET 1: expected {want_order:?}, got {ids:?}"
            ));
        }
        let row = client.query_one(&agg, &[&lo, &hi]).await.map_err(e)?;
        let got: (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        if got != (n, min, max) {
            return Err(format!(
                "count, min, max: expected {:?}, got {got:?}",
                (n, min, max)
            ));
        }
        let sum: Numeric = row.try_get(3).map_err(e)?;
        let avg: Numeric = row.try_get(4).map_err(e)?;
        if !sum.is_exactly(want_sum, 1) {
            return Err(format!("sum(id): expected {want_sum}, got {}", sum.0));
        }
        if !avg.is_exactly(want_sum, n as i128) {
            return Err(format!(
                "avg(id): expected exactly {want_sum}/{n}, got {}",
                avg.0
            ));
        }
        (sum_got, avg_got) = (sum.0, avg.0);
        let groups: Vec<(i64, i64)> = client
            .query(&group, &[&lo, &hi])
            .await
            .map_err(e)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if groups != want_groups {
            return Err(format!(
                "GROUP BY id % 2: expected {want_groups:?}, got {groups:?}"
            ));
        }
    }
    println!(
        "ok scatter_merge: order/limit/offset, count/min/max/sum/avg (sum {sum_got}, avg \
         {avg_got}), group by x{SCATTER_REPEAT}, named statements, binary numeric"
    );
    Ok(())
}

#[test]
fn tokio_postgres() {
    let env = shared_env();
    let name = "tokio_postgres";
    let base = key_base(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut step = "start";
    let result = rt.block_on(async {
        tokio::time::timeout(
            PROGRAM_TIMEOUT,
            tokio_postgres_script(&env.router.url(), name, base, &mut step),
        )
        .await
    });
    match result {
        Ok(Ok(())) => {}
        Ok(Err(msg)) => panic!(
            "FAIL {step}: {msg}\n--- router log ---\n{}",
            env.router.log_text()
        ),
        Err(_) => panic!(
            "FAIL {step}: timed out\n--- router log ---\n{}",
            env.router.log_text()
        ),
    }
    check_shards(env, name, base);
}

// ---------------------------------------------------------------------------------------------
// The other drivers, as subprocesses.

/// The sqlx driver program, rebuilt if its source changed since install.sh built it.
fn sqlx_command() -> Command {
    let manifest = drivers_dir().join("sqlx/Cargo.toml");
    let target = workspace_root().join("target/drivers-sqlx");
    let bin = target.join("debug/shardgate-driver-sqlx");
    require(
        bin.exists(),
        &format!("the sqlx driver program ({})", bin.display()),
    );
    // A no-op when nothing changed; offline, so that a test never downloads anything. Tests
    // that run it at once wait for each other on cargo's lock.
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let out = Command::new(cargo)
        .args(["build", "-q", "--locked", "--offline", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building the sqlx driver failed:\n{}\n{INSTALL}",
        String::from_utf8_lossy(&out.stderr)
    );
    Command::new(bin)
}

#[test]
fn sqlx() {
    run_driver("sqlx", 1, sqlx_command());
}

fn python(script: &str) -> Command {
    let python = venv_dir().join("bin/python");
    require(
        python.exists(),
        &format!("the Python venv ({})", python.display()),
    );
    let ok = Command::new(&python)
        .args(["-c", "import psycopg, asyncpg"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(ok, "psycopg or asyncpg in the Python venv");
    let mut cmd = Command::new(python);
    cmd.arg(drivers_dir().join("python").join(script));
    cmd
}

#[test]
fn psycopg() {
    run_driver("psycopg", 2, python("psycopg_driver.py"));
}

#[test]
fn asyncpg() {
    run_driver_with(
        "asyncpg",
        3,
        python("asyncpg_driver.py"),
        &["kv_drv_asyncpg_p"],
    );
}

fn node_command() -> Command {
    let dir = drivers_dir().join("node");
    require(on_path("node"), "node (Node.js 20)");
    require(
        dir.join("node_modules/pg/package.json").exists(),
        "node_modules/pg",
    );
    let mut cmd = Command::new("node");
    cmd.arg(dir.join("driver.js"));
    cmd
}

#[test]
fn node_postgres() {
    run_driver("node_postgres", 4, node_command());
}

/// Compiled classes, removed however the test ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The pgjdbc program, compiled into a directory of its own (`tag` names it) that lives as
/// long as the guard.
fn jdbc_command(tag: &str) -> (Command, RemoveOnDrop) {
    jdbc_program(tag, "DriverMatrix")
}

/// The pgjdbc program `class` (`java/<class>.java`), compiled as [`jdbc_command`] does.
fn jdbc_program(tag: &str, class: &str) -> (Command, RemoveOnDrop) {
    let jar = Path::new("/usr/share/java/postgresql.jar");
    require(
        jar.exists(),
        "/usr/share/java/postgresql.jar (libpostgresql-jdbc-java)",
    );
    require(on_path("javac") && on_path("java"), "a JDK (javac, java)");
    let classes = std::env::temp_dir().join(format!(
        "shardgate-drivers-jdbc-{tag}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&classes).expect("class dir");
    let cleanup = RemoveOnDrop(classes.clone());
    let out = Command::new("javac")
        .arg("-cp")
        .arg(jar)
        .arg("-d")
        .arg(&classes)
        .arg(drivers_dir().join(format!("java/{class}.java")))
        .output()
        .expect("run javac");
    assert!(
        out.status.success(),
        "javac {class}.java failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = Command::new("java");
    cmd.arg("-cp")
        .arg(format!("{}:{}", classes.display(), jar.display()))
        .arg(class);
    (cmd, cleanup)
}

#[test]
fn pgjdbc() {
    let (cmd, _cleanup) = jdbc_command("matrix");
    run_driver("pgjdbc", 5, cmd);
}

// ---------------------------------------------------------------------------------------------
// Isolation: one bad shard never reaches the clients of the others.

/// With one server stopped (shards 1 and 3 down) and shard 0's only connection held by a
/// transaction, every driver of the matrix connects (with its own catalog and setup queries),
/// runs `SELECT 1` and prepares and runs point selects keyed to the healthy shard 2, unnamed
/// and named: not one error. Preparation and statements that need no particular shard go to a
/// shard that can serve them. `hold_ms = 0`, so a statement sent to a bad shard would fail at
/// once rather than wait.
#[test]
fn a_bad_shard_never_reaches_the_clients_of_the_others() {
    let mut env = Env::start_threads(
        4,
        2,
        "[pool]\nmax_size = 1\nconnect_timeout_ms = 1000\ncheckout_timeout_ms = 2000\n\
         [failover]\nhold_ms = 0\n",
        1,
    );
    let down: Vec<usize> = (0..4)
        .filter(|&s| env.cluster.shards()[s].server == 1)
        .collect();
    assert_eq!(down, [1, 3], "the layout this test assumes");
    let keys: Vec<i64> = {
        let mut keys = Vec::new();
        let mut from = 90_000_000;
        while keys.len() < 3 {
            let k = env.key_on(2, from);
            keys.push(k);
            from = k + 1;
        }
        keys
    };
    let busy_key = env.key_on(0, 90_000_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let holder = rt.block_on(async {
        let c = env.router.connect().await;
        for &k in &keys {
            c.execute(
                "INSERT INTO kv (id, v) VALUES ($1, $2)",
                &[&k, &format!("v{k}")],
            )
            .await
            .expect("seed");
        }
        c.batch_execute(&format!("BEGIN; SELECT * FROM kv WHERE id = {busy_key}"))
            .await
            .expect("hold shard 0's only connection");
        c
    });
    env.cluster.servers_mut()[1].stop().expect("stop server 1");

    // tokio-postgres, in this process.
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&env.router.url(), NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let select = client
            .prepare("SELECT v FROM kv WHERE id = $1")
            .await
            .expect("prepare");
        for round in 0..REPEAT {
            client
                .simple_query("SELECT 1")
                .await
                .unwrap_or_else(|e| panic!("round {round}: SELECT 1: {e:?}"));
            for &k in &keys {
                let unnamed = client
                    .query_one("SELECT v FROM kv WHERE id = $1", &[&k])
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: unnamed {k}: {e:?}"));
                let named = client
                    .query_one(&select, &[&k])
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: named {k}: {e:?}"));
                for row in [unnamed, named] {
                    assert_eq!(row.get::<_, String>(0), format!("v{k}"));
                }
            }
        }
    });

    let list = keys
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let vars = [
        ("SHARDGATE_MODE", "isolation".to_string()),
        ("SHARDGATE_KEYS", list),
        ("SHARDGATE_KEY_BASE", "0".to_string()),
    ];
    let (jdbc, _cleanup) = jdbc_command("isolation");
    for (name, cmd) in [
        ("sqlx", sqlx_command()),
        ("psycopg", python("psycopg_driver.py")),
        ("asyncpg", python("asyncpg_driver.py")),
        ("node_postgres", node_command()),
        ("pgjdbc", jdbc),
    ] {
        run_program(&env, name, cmd, &vars);
    }
    assert!(env.router.log_lines("panicked").is_empty());
    rt.block_on(async { holder.batch_execute("ROLLBACK").await.expect("rollback") });
    env.cluster.servers_mut()[1]
        .restart()
        .expect("start server 1");
}

/// A database with the test schema on server `server` of the cluster, for a script's direct
/// run on one Postgres: its URL.
fn direct_database(env: &Env, server: usize, name: &str) -> String {
    let server = &env.cluster.servers()[server];
    server
        .psql("postgres", &format!("CREATE DATABASE {name}"))
        .expect("a database for the direct run");
    server
        .psql(name, common::SCHEMA)
        .expect("the schema, directly");
    server.url(name)
}

/// Batches and transactions over several shards as applications make them (asyncpg and
/// psycopg `executemany`, psycopg pipeline mode, SQLAlchemy ORM sessions with default
/// settings), each step compared with the same step run directly on one Postgres
/// (`python/transactions.py`).
#[test]
fn batches_and_orm_sessions_over_several_shards_match_one_postgres() {
    let env = shared_env();
    let python = python("transactions.py");
    let ok = Command::new(venv_dir().join("bin/python"))
        .args(["-c", "import sqlalchemy"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(ok, "sqlalchemy in the Python venv");
    let direct = direct_database(env, 0, "direct_transactions");
    run_program(
        env,
        "transactions",
        python,
        &[
            ("SHARDGATE_KEY_BASE", "36000000".to_string()),
            ("SHARDGATE_DIRECT_URL", direct.clone()),
        ],
    );
}

/// Django's ORM over psycopg 3, with client-side and with server-side binding: bulk_create
/// (`INSERT ... SELECT * FROM UNNEST(...)`), filter/delete by key lists, atomic blocks over
/// several shards, and `.iterator()` (server-side cursors, WITH HOLD in autocommit), compared
/// step by step with one Postgres (`python/django_orm.py`).
#[test]
fn django_orm_over_several_shards_matches_one_postgres() {
    let env = shared_env();
    let python = python("django_orm.py");
    let ok = Command::new(venv_dir().join("bin/python"))
        .args(["-c", "import django"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(ok, "django in the Python venv");
    let direct = direct_database(env, 0, "direct_django");
    run_program(
        env,
        "django",
        python,
        &[
            ("SHARDGATE_KEY_BASE", "38000000".to_string()),
            ("SHARDGATE_DIRECT_URL", direct.clone()),
        ],
    );
}

/// ORM models with an automatic primary key on a sharded identity table (`autos`): Django's
/// default `BigAutoField` with client-side and server-side binding, and a SQLAlchemy
/// autoincrement key, saved, found by the id they got back, updated, deleted, created in bulk
/// (`python/auto_keys.py`), compared step by step with one Postgres.
#[test]
fn orm_models_with_automatic_keys_match_one_postgres() {
    let env = shared_env();
    let python = python("auto_keys.py");
    let direct = direct_database(env, 0, "direct_autos");
    run_program(
        env,
        "auto-keys",
        python,
        &[("SHARDGATE_DIRECT_URL", direct.clone())],
    );
}

/// ORM models on a sharded table with a lookup column (`handles.handle`): Django and
/// SQLAlchemy create rows, find them by the lookup column, save a new value, hit a duplicate
/// (`23505` as one Postgres's unique index), create in bulk and delete
/// (`python/lookup_models.py`), compared step by step with one Postgres.
#[test]
fn orm_models_with_lookup_columns_match_one_postgres() {
    let env = shared_env();
    let python = python("lookup_models.py");
    let direct = direct_database(env, 0, "direct_lookups");
    run_program(
        env,
        "lookup-models",
        python,
        &[("SHARDGATE_DIRECT_URL", direct.clone())],
    );
}

/// pgjdbc inserting into the sharded identity table `autos` without keys: `RETURN_GENERATED_KEYS`
/// on a prepared INSERT past `prepareThreshold`, `executeBatch` with generated keys with and
/// without `reWriteBatchedInserts` (`java/AutoKeys.java`), compared with one Postgres.
#[test]
fn pgjdbc_generated_keys_match_one_postgres() {
    let env = shared_env();
    let (cmd, _cleanup) = jdbc_program("autokeys", "AutoKeys");
    let direct = direct_database(env, 1, "direct_jdbc_keys");
    run_program(
        env,
        "jdbc-auto-keys",
        cmd,
        &[("SHARDGATE_DIRECT_URL", direct)],
    );
}

/// pgjdbc `executeBatch` over several shards, with and without `reWriteBatchedInserts`, with
/// autocommit on and off (`java/Batches.java`), compared step by step with one Postgres.
#[test]
fn pgjdbc_batches_over_several_shards_match_one_postgres() {
    let env = shared_env();
    let (cmd, _cleanup) = jdbc_program("batches", "Batches");
    let server = &env.cluster.servers()[1];
    server
        .psql("postgres", "CREATE DATABASE direct_jdbc")
        .expect("a database for the direct run");
    server
        .psql("direct_jdbc", common::SCHEMA)
        .expect("the schema, directly");
    run_program(
        env,
        "jdbc-batches",
        cmd,
        &[
            ("SHARDGATE_KEY_BASE", "37000000".to_string()),
            ("SHARDGATE_DIRECT_URL", server.url("direct_jdbc")),
        ],
    );
}

/// Not part of the matrix: keeps a cluster and router up for running a driver program by hand
/// (`cargo test -p shardgate --test drivers -- --ignored --nocapture serve`, then e.g.
/// `SHARDGATE_URL=... SHARDGATE_KEY_BASE=29000000 node router/tests/drivers/node/driver.js`).
#[test]
#[ignore]
fn serve() {
    let env = shared_env();
    let secs: u64 = std::env::var("SHARDGATE_SERVE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    println!("SHARDGATE_URL={}", env.router.url());
    for shard in 0..env.map.shards().len() {
        println!("shard {shard}: {}", env.map.shards()[shard].range);
    }
    std::thread::sleep(Duration::from_secs(secs));
}
