"""The driver-matrix script for asyncpg (its own protocol implementation; every query with
arguments runs as a named server-side prepared statement from its statement cache) through a
shardgate router.

Environment: SHARDGATE_URL, SHARDGATE_KEY_BASE, SHARDGATE_DRIVER (see psycopg_driver.py);
SHARDGATE_MODE=isolation runs isolation() instead, with SHARDGATE_KEYS.
Prints one line per step; exits 1 with "FAIL <step>: ..." on the first deviation.
"""

import asyncio
import os
import sys
import time
from decimal import Decimal
from fractions import Fraction

import asyncpg

URL = os.environ["SHARDGATE_URL"]
BASE = int(os.environ["SHARDGATE_KEY_BASE"])
NAME = os.environ.get("SHARDGATE_DRIVER", "asyncpg")
ROWS = 20
REPEAT = 12
SCATTER_REPEAT = 7

step = "start"
deferred = []  # failures of steps that the later steps do not depend on


class Deviation(Exception):
    pass


def fail(msg):
    raise Deviation(msg)


def ok(detail=""):
    print(f"ok {step}{': ' + detail if detail else ''}", flush=True)


async def expect_sqlstate(coro, want):
    try:
        await coro
    except asyncpg.PostgresError as e:
        if e.sqlstate != want:
            fail(f"expected SQLSTATE {want}, got {e.sqlstate}: {e}")
        return e
    fail(f"expected SQLSTATE {want}, the statement succeeded")


async def main():
    global step
    step = "connect"
    conn = await asyncpg.connect(URL, ssl=False)
    ok(f"asyncpg {asyncpg.__version__}")

    step = "ddl_broadcast"
    # execute() without arguments uses the simple query protocol.
    await conn.execute(f"CREATE INDEX IF NOT EXISTS kv_drv_{NAME} ON kv (v)")
    ok("simple protocol")

    step = "ddl_prepared"
    # The same DDL through a prepared statement (Parse + Describe + Flush, then Bind + Execute
    # + Sync), as SQLAlchemy's asyncpg dialect runs all its statements, DDL included. A failure
    # here does not stop the script (the steps after it do not depend on it); it still fails
    # the run at the end.
    try:
        await (await conn.prepare(f"CREATE INDEX IF NOT EXISTS kv_drv_{NAME}_p ON kv (v)")).fetch()
        ok("Parse/Describe/Flush, then Bind/Execute/Sync")
    except asyncpg.PostgresError as e:
        deferred.append(f"FAIL {step}: SQLSTATE {e.sqlstate}: {e}")
        print(deferred[-1], flush=True)

    step = "insert"
    keys = [BASE + i for i in range(1, ROWS + 1)]
    for k in keys:
        status = await conn.execute("INSERT INTO kv (id, v) VALUES ($1, $2)", k, f"v{k}")
        if status != "INSERT 0 1":
            fail(f"insert {k}: {status}")
    ok(f"{ROWS} rows")

    step = "point_select"
    for _ in range(REPEAT):
        for k in keys:
            v = await conn.fetchval("SELECT v FROM kv WHERE id = $1", k)
            if v != f"v{k}":
                fail(f"key {k}: got {v!r}")
    # The same through an explicit prepared statement (Parse/Describe with Flush, then binds).
    stmt = await conn.prepare("SELECT id, v FROM kv WHERE id = $1")
    for k in keys:
        row = await stmt.fetchrow(k)
        if tuple(row) != (k, f"v{k}"):
            fail(f"prepared, key {k}: got {row!r}")
    ok(f"{REPEAT * ROWS + ROWS} selects, named prepared statements (statement cache)")

    step = "tx_commit"
    k = keys[0]
    async with conn.transaction():
        v = await conn.fetchval("SELECT v FROM kv WHERE id = $1 FOR UPDATE", k)
        if v != f"v{k}":
            fail(f"in tx: got {v!r}")
        await conn.execute("UPDATE kv SET v = $1 WHERE id = $2", "updated", k)
    v = await conn.fetchval("SELECT v FROM kv WHERE id = $1", k)
    if v != "updated":
        fail(f"after commit: got {v!r}")
    ok()

    step = "tx_rollback"
    k = keys[1]
    tx = conn.transaction()
    await tx.start()
    await conn.execute("UPDATE kv SET v = $1 WHERE id = $2", "rolled back", k)
    v = await conn.fetchval("SELECT v FROM kv WHERE id = $1", k)
    if v != "rolled back":
        fail(f"inside the tx: got {v!r}")
    await tx.rollback()
    v = await conn.fetchval("SELECT v FROM kv WHERE id = $1", k)
    if v != f"v{k}":
        fail(f"after rollback: got {v!r}")
    ok()

    step = "unique_violation"
    k = keys[2]
    e = await expect_sqlstate(
        conn.execute("INSERT INTO kv (id, v) VALUES ($1, $2)", k, "dup"), "23505"
    )
    if not isinstance(e, asyncpg.UniqueViolationError):
        fail(f"expected UniqueViolationError, got {type(e).__name__}")
    v = await conn.fetchval("SELECT v FROM kv WHERE id = $1", k)
    if v != f"v{k}":
        fail(f"connection reused after the error: got {v!r}")
    ok()

    step = "cancel"
    # asyncpg's cancel API is task cancellation (here through a timeout): it sends a
    # CancelRequest and waits for the server to end the statement; the 57014 it gets back is
    # consumed by asyncpg, so the proof is that the connection is usable again at once
    # instead of after the 10 s sleep.
    started = time.monotonic()
    try:
        await conn.fetchval("SELECT pg_sleep(10)", timeout=0.5)
        fail("pg_sleep(10) returned instead of being cancelled")
    except asyncio.TimeoutError:
        pass
    v = await conn.fetchval("SELECT 1")
    took = time.monotonic() - started
    if v != 1:
        fail(f"after the cancel: got {v!r}")
    if took > 5:
        fail(f"the connection was busy for {took:.1f}s: the CancelRequest did not stop pg_sleep")
    ok(f"timeout → CancelRequest, connection usable after {took:.2f}s")

    step = "scatter_count"
    # A read of the sharded table without a key: scattered to every shard, counts summed.
    # asyncpg's first run of a statement is Parse + Describe + Flush, then Bind + Execute +
    # Sync; later runs reuse the named statement (Bind + Execute + Sync).
    total = await conn.fetchval("SELECT count(*) FROM kv")
    if total < ROWS:
        fail(f"SELECT count(*) FROM kv: {total} < the {ROWS} rows of this driver alone")
    for _ in range(SCATTER_REPEAT):
        n = await conn.fetchval("SELECT count(*) FROM kv WHERE id BETWEEN $1 AND $2", keys[0], keys[-1])
        if n != ROWS:
            fail(f"count of this driver's range: expected {ROWS}, got {n!r}")
    ok(f"range count {ROWS} x{SCATTER_REPEAT}, total {total}")

    step = "scatter_merge"
    # Reads the router merges across shards: ORDER BY (k-way merge) with LIMIT/OFFSET,
    # aggregates, GROUP BY. The expectations come from this driver's keys (every one of them
    # still in kv: no step deleted a row, the updates changed only v). asyncpg receives results
    # in binary; numeric (sum and avg of bigint) becomes decimal.Decimal.
    lo, hi = keys[0], keys[-1]
    want_order = sorted(keys, reverse=True)[1:4]
    want_sum = sum(keys)
    want_avg = Fraction(want_sum, len(keys))
    want_groups = [(p, sum(1 for k in keys if k % 2 == p)) for p in (0, 1)]
    want_groups = [g for g in want_groups if g[1] > 0]
    for _ in range(SCATTER_REPEAT):
        rows = await conn.fetch(
            "SELECT id FROM kv WHERE id BETWEEN $1 AND $2 ORDER BY id DESC LIMIT 3 OFFSET 1", lo, hi
        )
        if [r[0] for r in rows] != want_order:
            fail(f"ORDER BY id DESC LIMIT 3 OFFSET 1: expected {want_order}, got {[tuple(r) for r in rows]}")
        row = await conn.fetchrow(
            "SELECT count(*), min(id), max(id), sum(id), avg(id) FROM kv WHERE id BETWEEN $1 AND $2",
            lo,
            hi,
        )
        n, mn, mx, total_sum, avg = tuple(row)
        if (n, mn, mx) != (len(keys), min(keys), max(keys)):
            fail(f"count, min, max: expected {(len(keys), min(keys), max(keys))}, got {tuple(row)!r}")
        if not isinstance(total_sum, Decimal) or total_sum != Decimal(want_sum):
            fail(f"sum(id): expected Decimal {want_sum}, got {total_sum!r}")
        if not isinstance(avg, Decimal) or Fraction(avg) != want_avg:
            fail(f"avg(id): expected exactly {want_sum}/{len(keys)}, got {avg!r}")
        rows = await conn.fetch(
            "SELECT id % 2 AS parity, count(*) FROM kv WHERE id BETWEEN $1 AND $2"
            " GROUP BY id % 2 ORDER BY parity",
            lo,
            hi,
        )
        if [tuple(r) for r in rows] != want_groups:
            fail(f"GROUP BY id % 2: expected {want_groups}, got {[tuple(r) for r in rows]}")
    ok(
        f"order/limit/offset, count/min/max/sum/avg (sum {total_sum}, avg {avg}), group by"
        f" x{SCATTER_REPEAT}, named statements, binary numeric"
    )

    step = "scatter_two_stages"
    # Reads the merge cannot finish (a window, HAVING on a parameter), run in two stages: the
    # rows across shards, the rest on one shard; asyncpg's parameters (binary, typed by the
    # server's description) in both stages.
    want_ranks = [(k, i + 1) for i, k in enumerate(sorted(keys))]
    for _ in range(SCATTER_REPEAT):
        rows = await conn.fetch(
            "SELECT id, rank() OVER (ORDER BY id) FROM kv WHERE id BETWEEN $1 AND $2 ORDER BY id",
            lo,
            hi,
        )
        if [tuple(r) for r in rows] != want_ranks:
            fail(f"rank() OVER (ORDER BY id): expected {want_ranks}, got {[tuple(r) for r in rows]}")
        rows = await conn.fetch(
            "SELECT id % 2 AS parity, count(*) FROM kv WHERE id BETWEEN $1 AND $2"
            " GROUP BY id % 2 HAVING count(*) >= $3 ORDER BY parity",
            lo,
            hi,
            1,
        )
        if [tuple(r) for r in rows] != want_groups:
            fail(f"HAVING count(*) >= $3: expected {want_groups}, got {[tuple(r) for r in rows]}")
    ok(f"window, HAVING with a parameter x{SCATTER_REPEAT}")

    await conn.close()
    if deferred:
        fail("earlier step(s) failed:\n" + "\n".join(deferred))
    print("PASS", flush=True)


async def isolation():
    """While other shards are down or busy, statements keyed to the healthy shard(s) of
    SHARDGATE_KEYS (rows with v = 'v<key>') and statements that need no shard never fail."""
    global step
    keys = [int(k) for k in os.environ["SHARDGATE_KEYS"].split(",")]
    step = "connect"
    conn = await asyncpg.connect(URL, ssl=False)
    ok()
    step = "isolated"
    for _ in range(REPEAT):
        if await conn.fetchval("SELECT 1") != 1:
            fail("SELECT 1")
        for k in keys:
            # A named statement from asyncpg's cache: Parse + Describe before the first Bind.
            v = await conn.fetchval("SELECT v FROM kv WHERE id = $1", k)
            if v != f"v{k}":
                fail(f"key {k}: got {v!r}")
        # A statement asyncpg prepares anew each round (not cached): Parse + Describe again.
        stmt = await conn.prepare("SELECT v FROM kv WHERE id = $1 AND $2::int >= 0")
        v = await stmt.fetchval(keys[0], 1)
        if v != f"v{keys[0]}":
            fail(f"prepared: got {v!r}")
    ok(f"{REPEAT} rounds of SELECT 1, {len(keys)} keys and a fresh prepare")
    await conn.close()
    print("PASS", flush=True)


if __name__ == "__main__":
    try:
        is_isolation = os.environ.get("SHARDGATE_MODE") == "isolation"
        asyncio.run(isolation() if is_isolation else main())
    except Deviation as e:
        print(f"FAIL {step}: {e}", flush=True)
        sys.exit(1)
    except BaseException as e:
        print(f"FAIL {step}: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
