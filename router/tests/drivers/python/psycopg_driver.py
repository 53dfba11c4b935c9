"""The driver-matrix script for psycopg 3 (libpq underneath) through a shardgate router.

Environment: SHARDGATE_URL (postgres://user:pass@host:port/db), SHARDGATE_KEY_BASE (first key of
this driver's range of kv), SHARDGATE_DRIVER (name used for the broadcast index);
SHARDGATE_MODE=isolation runs isolation() instead, with SHARDGATE_KEYS.
Prints one line per step; exits 1 with "FAIL <step>: ..." on the first deviation.
"""

import os
import sys
import threading
import time
from decimal import Decimal
from fractions import Fraction

import psycopg
from psycopg import errors

URL = os.environ["SHARDGATE_URL"]
BASE = int(os.environ["SHARDGATE_KEY_BASE"])
NAME = os.environ.get("SHARDGATE_DRIVER", "psycopg")
ROWS = 20
REPEAT = 12
SCATTER_REPEAT = 7

step = "start"


def fail(msg):
    print(f"FAIL {step}: {msg}", flush=True)
    sys.exit(1)


def ok(detail=""):
    print(f"ok {step}{': ' + detail if detail else ''}", flush=True)


def expect_sqlstate(fn, want):
    try:
        fn()
    except psycopg.Error as e:
        if e.sqlstate != want:
            fail(f"expected SQLSTATE {want}, got {e.sqlstate}: {e}")
        return e
    fail(f"expected SQLSTATE {want}, the statement succeeded")


def main():
    global step
    step = "connect"
    # prepare_threshold=5 is psycopg's default: the 6th execution of a query switches to a
    # named server-side prepared statement (_pg3_N).
    conn = psycopg.connect(URL, sslmode="disable", autocommit=True, prepare_threshold=5)
    ok(f"psycopg {psycopg.__version__}, libpq {psycopg.pq.version()}")

    step = "ddl_broadcast"
    # No parameters: psycopg uses the simple query protocol.
    conn.execute(f"CREATE INDEX IF NOT EXISTS kv_drv_{NAME} ON kv (v)")
    ok("simple protocol")

    step = "insert"
    keys = [BASE + i for i in range(1, ROWS + 1)]
    for k in keys:
        cur = conn.execute("INSERT INTO kv (id, v) VALUES (%s, %s)", (k, f"v{k}"))
        if cur.rowcount != 1:
            fail(f"insert {k}: rowcount {cur.rowcount}")
    ok(f"{ROWS} rows")

    step = "point_select"
    for _ in range(REPEAT):
        for k in keys:
            row = conn.execute("SELECT v FROM kv WHERE id = %s", (k,)).fetchone()
            if row != (f"v{k}",):
                fail(f"key {k}: got {row!r}")
    prepared = len(conn._prepared._names)  # psycopg's cache of server-side prepared statements
    if prepared < 1:
        fail("psycopg never switched to a server-side prepared statement")
    ok(f"{REPEAT * ROWS} selects, {prepared} named prepared statement(s)")

    step = "tx_commit"
    k = keys[0]
    with conn.transaction():
        row = conn.execute("SELECT v FROM kv WHERE id = %s FOR UPDATE", (k,)).fetchone()
        if row != (f"v{k}",):
            fail(f"in tx: got {row!r}")
        conn.execute("UPDATE kv SET v = %s WHERE id = %s", ("updated", k))
    row = conn.execute("SELECT v FROM kv WHERE id = %s", (k,)).fetchone()
    if row != ("updated",):
        fail(f"after commit: got {row!r}")
    ok()

    step = "tx_rollback"
    k = keys[1]
    conn.autocommit = False
    conn.execute("UPDATE kv SET v = %s WHERE id = %s", ("rolled back", k))
    row = conn.execute("SELECT v FROM kv WHERE id = %s", (k,)).fetchone()
    if row != ("rolled back",):
        fail(f"inside the tx: got {row!r}")
    conn.rollback()
    conn.autocommit = True
    row = conn.execute("SELECT v FROM kv WHERE id = %s", (k,)).fetchone()
    if row != (f"v{k}",):
        fail(f"after rollback: got {row!r}")
    ok()

    step = "unique_violation"
    k = keys[2]
    e = expect_sqlstate(
        lambda: conn.execute("INSERT INTO kv (id, v) VALUES (%s, %s)", (k, "dup")), "23505"
    )
    if not isinstance(e, errors.UniqueViolation):
        fail(f"expected UniqueViolation, got {type(e).__name__}")
    row = conn.execute("SELECT v FROM kv WHERE id = %s", (k,)).fetchone()
    if row != (f"v{k}",):
        fail(f"connection reused after the error: got {row!r}")
    ok()

    step = "cancel"
    timer = threading.Timer(0.5, conn.cancel_safe)
    started = time.monotonic()
    timer.start()
    expect_sqlstate(lambda: conn.execute("SELECT pg_sleep(10)"), "57014")
    took = time.monotonic() - started
    timer.join()
    if took > 5:
        fail(f"the cancel took {took:.1f}s")
    if conn.execute("SELECT 1").fetchone() != (1,):
        fail("connection not usable after the cancel")
    ok(f"57014 after {took:.2f}s")

    step = "scatter_count"
    # A read of the sharded table without a key: scattered to every shard, counts summed. The
    # range count is exact whatever the other drivers insert meanwhile; repeated so that it
    # also runs as a named prepared statement.
    for _ in range(SCATTER_REPEAT):
        n = conn.execute(
            "SELECT count(*) FROM kv WHERE id BETWEEN %s AND %s", (keys[0], keys[-1])
        ).fetchone()
        if n != (ROWS,):
            fail(f"count of this driver's range: expected {ROWS}, got {n!r}")
    total = conn.execute("SELECT count(*) FROM kv").fetchone()[0]
    if total < ROWS:
        fail(f"SELECT count(*) FROM kv: {total} < the {ROWS} rows of this driver alone")
    ok(f"range count {ROWS} x{SCATTER_REPEAT}, total {total}")

    step = "scatter_merge"
    # Reads the router merges across shards: ORDER BY (k-way merge) with LIMIT/OFFSET,
    # aggregates, GROUP BY. The expectations come from this driver's keys (every one of them
    # still in kv: no step deleted a row, the updates changed only v). psycopg receives
    # everything in text; numeric (sum and avg of bigint) becomes decimal.Decimal.
    lo, hi = keys[0], keys[-1]
    want_order = sorted(keys, reverse=True)[1:4]
    want_sum = sum(keys)
    want_avg = Fraction(want_sum, len(keys))
    want_groups = [(p, sum(1 for k in keys if k % 2 == p)) for p in (0, 1)]
    want_groups = [g for g in want_groups if g[1] > 0]
    for _ in range(SCATTER_REPEAT):
        rows = conn.execute(
            "SELECT id FROM kv WHERE id BETWEEN %s AND %s ORDER BY id DESC LIMIT 3 OFFSET 1",
            (lo, hi),
        ).fetchall()
        if [r[0] for r in rows] != want_order:
            fail(f"ORDER BY id DESC LIMIT 3 OFFSET 1: expected {want_order}, got {rows!r}")
        row = conn.execute(
            "SELECT count(*), min(id), max(id), sum(id), avg(id) FROM kv WHERE id BETWEEN %s AND %s",
            (lo, hi),
        ).fetchone()
        n, mn, mx, total_sum, avg = row
        if (n, mn, mx) != (len(keys), min(keys), max(keys)):
            fail(f"count, min, max: expected {(len(keys), min(keys), max(keys))}, got {row!r}")
        if not isinstance(total_sum, Decimal) or total_sum != Decimal(want_sum):
            fail(f"sum(id): expected Decimal {want_sum}, got {total_sum!r}")
        if not isinstance(avg, Decimal) or Fraction(avg) != want_avg:
            fail(f"avg(id): expected exactly {want_sum}/{len(keys)}, got {avg!r}")
        rows = conn.execute(
            # %% is psycopg's escape of a literal % (the modulo) next to %s placeholders.
            "SELECT id %% 2 AS parity, count(*) FROM kv WHERE id BETWEEN %s AND %s"
            " GROUP BY id %% 2 ORDER BY parity",
            (lo, hi),
        ).fetchall()
        if [tuple(r) for r in rows] != want_groups:
            fail(f"GROUP BY id % 2: expected {want_groups}, got {rows!r}")
    ok(f"order/limit/offset, count/min/max/sum/avg (sum {total_sum}, avg {avg}), group by x{SCATTER_REPEAT}, text numeric")

    step = "scatter_two_stages"
    # Reads the merge cannot finish (a window, a function over aggregates, HAVING), run in two
    # stages: the rows across shards, the rest on one shard. Parameters in both stages,
    # repeated so that they also run as named prepared statements.
    want_ranks = [(k, i + 1) for i, k in enumerate(sorted(keys))]
    for _ in range(SCATTER_REPEAT):
        rows = conn.execute(
            "SELECT id, rank() OVER (ORDER BY id) FROM kv WHERE id BETWEEN %s AND %s ORDER BY id",
            (lo, hi),
        ).fetchall()
        if [tuple(r) for r in rows] != want_ranks:
            fail(f"rank() OVER (ORDER BY id): expected {want_ranks}, got {rows!r}")
        row = conn.execute(
            "SELECT coalesce(max(id) - min(id), 0) + %s FROM kv WHERE id BETWEEN %s AND %s",
            (1, lo, hi),
        ).fetchone()
        if row != (hi - lo + 1,):
            fail(f"coalesce(max(id) - min(id), 0) + 1: expected {hi - lo + 1}, got {row!r}")
        rows = conn.execute(
            "SELECT id %% 2 AS parity, count(*) FROM kv WHERE id BETWEEN %s AND %s"
            " GROUP BY id %% 2 HAVING count(*) >= %s ORDER BY parity",
            (lo, hi, 1),
        ).fetchall()
        if [tuple(r) for r in rows] != want_groups:
            fail(f"GROUP BY id % 2 HAVING count(*) >= 1: expected {want_groups}, got {rows!r}")
    ok(f"window, function over aggregates, HAVING x{SCATTER_REPEAT}")

    conn.close()
    print("PASS", flush=True)


def isolation():
    """While other shards are down or busy, statements keyed to the healthy shard(s) of
    SHARDGATE_KEYS (rows with v = 'v<key>') and statements that need no shard never fail."""
    global step
    keys = [int(k) for k in os.environ["SHARDGATE_KEYS"].split(",")]
    step = "connect"
    conn = psycopg.connect(URL, sslmode="disable", autocommit=True, prepare_threshold=2)
    ok()
    step = "isolated"
    for _ in range(REPEAT):
        if conn.execute("SELECT 1").fetchone() != (1,):
            fail("SELECT 1")
        for k in keys:
            row = conn.execute("SELECT v FROM kv WHERE id = %s", (k,)).fetchone()
            if row != (f"v{k}",):
                fail(f"key {k}: got {row!r}")
    if len(conn._prepared._names) < 1:
        fail("psycopg never switched to a server-side prepared statement")
    ok(f"{REPEAT} rounds of SELECT 1 and {len(keys)} keys, named prepared statements")
    conn.close()
    print("PASS", flush=True)


if __name__ == "__main__":
    try:
        isolation() if os.environ.get("SHARDGATE_MODE") == "isolation" else main()
    except SystemExit:
        raise
    except BaseException as e:  # any unexpected exception is a deviation too
        print(f"FAIL {step}: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
