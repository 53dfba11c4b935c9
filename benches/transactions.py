"""Measures what transactions and batches across shards cost (run by benches/transactions.sh):
for each target (a router in "multi" mode, one in "two_phase" mode, one Postgres directly),
the latency of transactions of two UPDATEs on one shard and on two shards, one client, one after
another; asyncpg executemany of --rows rows over every shard; and one INSERT ... SELECT * FROM
unnest of those rows (split by shard through the router); and reading them back through an
asyncpg cursor (merged step by step through the router). Prints a table."""

import argparse
import asyncio
import json
import random
import statistics
import time

import asyncpg


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


async def transactions(url, pairs, n):
    conn = await asyncpg.connect(url)
    try:
        lat = []
        for i in range(n):
            a, b = pairs[i % len(pairs)]
            t = time.perf_counter()
            async with conn.transaction():
                await conn.execute("UPDATE kv SET v = v WHERE id = $1", a)
                await conn.execute("UPDATE kv SET v = v WHERE id = $1", b)
            lat.append((time.perf_counter() - t) * 1000)
        return lat
    finally:
        await conn.close()


async def timed_insert(url, keys, insert):
    """Times `insert(conn)` writing every key's row (none there before), checks that they all
    arrived, and removes them again."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DELETE FROM kv WHERE id = ANY($1::bigint[])", keys)
        t = time.perf_counter()
        await insert(conn)
        took = time.perf_counter() - t
        n = await conn.fetchval("SELECT count(*) FROM kv WHERE id = ANY($1::bigint[])", keys)
        assert n == len(keys), (n, len(keys))
        await conn.execute("DELETE FROM kv WHERE id = ANY($1::bigint[])", keys)
        return took
    finally:
        await conn.close()


async def executemany(url, keys):
    return await timed_insert(
        url, keys, lambda conn: conn.executemany("INSERT INTO kv (id, v) VALUES ($1, 'many')", [(k,) for k in keys])
    )


async def unnest(url, keys):
    """One INSERT ... SELECT * FROM UNNEST of every row (Django's bulk_create), timed."""
    return await timed_insert(
        url,
        keys,
        lambda conn: conn.execute(
            "INSERT INTO kv (id, v) SELECT * FROM unnest($1::bigint[], $2::text[])", keys, ["unnest"] * len(keys)
        ),
    )


async def cursor(url, keys, prefetch):
    """Reads every row back through an asyncpg cursor (a portal run with a row limit, inside a
    transaction), sorted: what the router merges step by step over the shards."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO kv (id, v) SELECT * FROM unnest($1::bigint[], $2::text[])",
            keys,
            ["cursor"] * len(keys),
        )
        t = time.perf_counter()
        n = 0
        last = None
        async with conn.transaction():
            async for r in conn.cursor(
                "SELECT id, v FROM kv WHERE id = ANY($1::bigint[]) ORDER BY id", keys, prefetch=prefetch
            ):
                assert last is None or r["id"] > last
                last = r["id"]
                n += 1
        took = time.perf_counter() - t
        assert n == len(keys), (n, len(keys))
        await conn.execute("DELETE FROM kv WHERE id = ANY($1::bigint[])", keys)
        return took
    finally:
        await conn.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", required=True)
    ap.add_argument("--transactions", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--multi", required=True)
    ap.add_argument("--two-phase", required=True)
    ap.add_argument("--direct", required=True)
    args = ap.parse_args()
    by_shard = json.load(open(args.keys))
    accounts = [ks[:50] for ks in by_shard]
    rng = random.Random(7)
    one = [(s[i], s[i + 1]) for s in accounts for i in range(0, 48, 2)]
    two = [(accounts[i % 4][j], accounts[(i + 1) % 4][j]) for i in range(4) for j in range(50)]
    rng.shuffle(one)
    rng.shuffle(two)
    targets = [("direct", args.direct), ("multi", args.multi), ("two_phase", args.two_phase)]
    seed = sorted({k for ks in accounts for k in ks})
    for _, url in targets:
        conn = await asyncpg.connect(url)
        await conn.executemany(
            "INSERT INTO kv (id, v) VALUES ($1, 'acct') ON CONFLICT (id) DO NOTHING", [(k,) for k in seed]
        )
        await conn.close()
    print(f"transactions of two UPDATEs (BEGIN, UPDATE, UPDATE, COMMIT), one client, {args.transactions} each:")
    print(f"{'target':<10} {'shards':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, url in targets:
        for label, pairs in [("1", one), ("2", two)]:
            await transactions(url, pairs, min(200, args.transactions))  # warm up
            lat = await transactions(url, pairs, args.transactions)
            print(f"{name:<10} {label:>6} {pct(lat, 0.5):8.3f} {pct(lat, 0.99):8.3f} {statistics.mean(lat):8.3f}")
    fresh = [k for ks in by_shard for k in ks[50:]]
    rows = fresh[: args.rows]
    random.Random(3).shuffle(rows)
    shard_of = {k: i for i, ks in enumerate(by_shard) for k in ks}
    grouped = sorted(rows, key=lambda k: shard_of[k])
    print(f"\nasyncpg executemany of {len(rows)} rows over 4 shards (one batch, one Sync):")
    print(f"{'target':<10} {'order':>8} {'seconds':>8} {'rows/s':>9}")
    for name, url in [("direct", args.direct), ("multi", args.multi)]:
        for order, keys in [("random", rows), ("grouped", grouped)]:
            took = await executemany(url, keys)
            print(f"{name:<10} {order:>8} {took:8.3f} {len(keys) / took:9.0f}")
    print(f"\nINSERT ... SELECT * FROM unnest of {len(rows)} rows over 4 shards (one statement, split by shard):")
    print(f"{'target':<10} {'seconds':>8} {'rows/s':>9}")
    for name, url in [("direct", args.direct), ("multi", args.multi)]:
        took = min([await unnest(url, rows) for _ in range(3)])
        print(f"{name:<10} {took:8.3f} {len(rows) / took:9.0f}")
    print(f"\nasyncpg cursor over those {len(rows)} rows, ORDER BY id, in a transaction (portal with a row limit):")
    print(f"{'target':<10} {'prefetch':>8} {'seconds':>8} {'rows/s':>9}")
    for name, url in [("direct", args.direct), ("multi", args.multi)]:
        for prefetch in (50, 1000):
            took = min([await cursor(url, rows, prefetch) for _ in range(3)])
            print(f"{name:<10} {prefetch:>8} {took:8.3f} {len(rows) / took:9.0f}")


asyncio.run(main())
