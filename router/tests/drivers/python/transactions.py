"""Batches and transactions over several shards, the way applications make them: asyncpg's
executemany, psycopg 3's executemany and pipeline mode (with its default, a transaction opened
implicitly), SQLAlchemy's ORM over psycopg with default settings, and psycopg's named
(server-side) cursors. The same steps run twice,
through the router (SHARDGATE_URL) and directly on one Postgres with the same schema
(SHARDGATE_DIRECT_URL); what each step saw (rows, counts, SQLSTATEs) must be the same.

Environment: SHARDGATE_URL, SHARDGATE_DIRECT_URL, SHARDGATE_KEY_BASE (the first key of this
program's range of kv; the keys of a run spread over every shard).
Prints each step's observation; exits 1 with "FAIL ..." on a difference, else prints PASS.
"""

import asyncio
import os
import sys

import asyncpg
import psycopg
from sqlalchemy import BigInteger, String, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

ROUTER = os.environ["SHARDGATE_URL"]
DIRECT = os.environ["SHARDGATE_DIRECT_URL"]
BASE = int(os.environ["SHARDGATE_KEY_BASE"])


class Base(DeclarativeBase):
    pass


class KV(Base):
    __tablename__ = "kv"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    v: Mapped[str] = mapped_column(String)


def in_range(lo, hi):
    return f"id BETWEEN {BASE + lo} AND {BASE + hi}"


async def with_asyncpg(url, seen):
    conn = await asyncpg.connect(url)
    try:
        # 100 rows in one batch (Bind/Execute pairs, one Sync), over every shard.
        await conn.executemany(
            "INSERT INTO kv (id, v) VALUES ($1, $2)",
            [(BASE + i, f"apg{i}") for i in range(1, 101)],
        )
        seen.append(("asyncpg executemany", await conn.fetchval(f"SELECT count(*) FROM kv WHERE {in_range(1, 100)}")))
        # One failing row in the middle: nothing of the batch remains anywhere.
        rows = [(BASE + i, f"apg{i}") for i in range(101, 111)]
        rows.insert(5, (BASE + 5, "dup"))
        try:
            await conn.executemany("INSERT INTO kv (id, v) VALUES ($1, $2)", rows)
            seen.append(("asyncpg failing row", "no error"))
        except asyncpg.PostgresError as e:
            seen.append(("asyncpg failing row", e.sqlstate))
        seen.append(("asyncpg after failure", await conn.fetchval(f"SELECT count(*) FROM kv WHERE {in_range(101, 110)}")))
        # An explicit transaction over several shards, rolled back.
        tr = conn.transaction()
        await tr.start()
        await conn.executemany("UPDATE kv SET v = 'rolled back' WHERE id = $1", [(BASE + i,) for i in range(1, 11)])
        seen.append(("asyncpg in tx", await conn.fetchval(f"SELECT count(*) FROM kv WHERE v = 'rolled back' AND {in_range(1, 10)}")))
        await tr.rollback()
        seen.append(("asyncpg after rollback", await conn.fetchval(f"SELECT count(*) FROM kv WHERE v = 'rolled back' AND {in_range(1, 10)}")))
    finally:
        await conn.close()


def with_psycopg(url, seen):
    # Default settings: no autocommit, so psycopg opens a transaction before the first statement.
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO kv (id, v) VALUES (%s, %s)",
                [(BASE + i, f"pg{i}") for i in range(201, 251)],
            )
            conn.commit()
            cur.execute(f"SELECT count(*) FROM kv WHERE {in_range(201, 250)}")
            seen.append(("psycopg executemany", cur.fetchone()[0]))
            conn.commit()
            rows = [(BASE + i, "x") for i in range(251, 261)] + [(BASE + 201, "dup")]
            try:
                cur.executemany("INSERT INTO kv (id, v) VALUES (%s, %s)", rows)
                seen.append(("psycopg failing row", "no error"))
            except psycopg.Error as e:
                seen.append(("psycopg failing row", e.sqlstate))
            conn.rollback()
            cur.execute(f"SELECT count(*) FROM kv WHERE {in_range(251, 260)}")
            seen.append(("psycopg after failure", cur.fetchone()[0]))
            conn.commit()
        # Pipeline mode: writes and reads of several shards, sent before any answer is read.
        with conn.pipeline():
            with conn.cursor() as a, conn.cursor() as b, conn.cursor() as c:
                a.execute("INSERT INTO kv (id, v) VALUES (%s, %s)", (BASE + 301, "piped"))
                b.execute("SELECT v FROM kv WHERE id = %s", (BASE + 301,))
                c.execute("UPDATE kv SET v = %s WHERE id = %s", ("piped too", BASE + 202))
                conn.commit()
                seen.append(("psycopg pipeline read", b.fetchone()[0]))
        with conn.cursor() as cur:
            cur.execute("SELECT v FROM kv WHERE id = %s", (BASE + 202,))
            seen.append(("psycopg pipeline write", cur.fetchone()[0]))
            conn.commit()
    # Autocommit pipelines mixing reads across shards with writes, in either order; and one
    # whose write fails after a read across shards.
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor() as a, conn.cursor() as b, conn.cursor() as c, conn.cursor() as d:
            with conn.pipeline():
                a.execute(f"SELECT count(*) FROM kv WHERE {in_range(1, 1000)}")
                b.execute("INSERT INTO kv (id, v) VALUES (%s, 'p2'), (%s, 'p2')", (BASE + 311, BASE + 312))
                c.execute(f"SELECT count(*), max(v) FROM kv WHERE {in_range(1, 1000)}")
                d.execute("UPDATE kv SET v = 'p3' WHERE id = %s", (BASE + 311,))
            seen.append(("autocommit pipeline", a.fetchone()[0], c.fetchone()))
        try:
            with conn.pipeline():
                with conn.cursor() as a, conn.cursor() as b:
                    a.execute(f"SELECT count(*) FROM kv WHERE {in_range(1, 1000)}")
                    b.execute("INSERT INTO kv (id, v) VALUES (%s, 'p4'), (%s, 'p4')", (BASE + 313, BASE + 311))
            seen.append(("failing pipeline", "no error"))
        except psycopg.Error as e:
            seen.append(("failing pipeline", e.sqlstate))
        seen.append(("after failing pipeline", conn.execute(f"SELECT count(*) FROM kv WHERE {in_range(311, 313)}").fetchone()[0]))


def with_sqlalchemy(url, seen):
    engine = create_engine(url.replace("postgres://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as s:
            one, two = s.get(KV, BASE + 1), s.get(KV, BASE + 2)
            seen.append(("orm get", (one.v, two.v)))
            one.v = "orm"
            s.delete(two)
            s.flush()
            seen.append(("orm count", s.scalar(select(func.count()).select_from(KV).where(KV.id.between(BASE + 1, BASE + 1000)))))
            top = s.scalars(select(KV).where(KV.id.between(BASE + 1, BASE + 1000)).order_by(KV.id.desc()).limit(3)).all()
            seen.append(("orm ordered limit", [(k.id - BASE, k.v) for k in top]))
            s.add_all([KV(id=BASE + 400 + i, v=f"orm{i}") for i in range(50)])
            s.commit()
        with Session(engine) as s:
            seen.append(("orm after commit", s.scalar(select(func.count()).select_from(KV).where(KV.id.between(BASE + 400, BASE + 449)))))
            seen.append(("orm changed", s.get(KV, BASE + 1).v, s.get(KV, BASE + 2)))
            # Work on several shards, rolled back: nothing of it stays.
            s.add_all([KV(id=BASE + 500 + i, v="gone") for i in range(20)])
            for k in s.scalars(select(KV).where(KV.id.between(BASE + 400, BASE + 409))).all():
                s.delete(k)
            s.flush()
            s.rollback()
            seen.append(("orm after rollback", s.scalar(select(func.count()).select_from(KV).where(KV.id.between(BASE + 400, BASE + 549)))))
    finally:
        engine.dispose()


def with_named_cursors(url, seen):
    """psycopg's server-side (named) cursors, with its defaults (a transaction opened
    implicitly): over every shard sorted and in shard order, grouped, on one key, WITH HOLD."""
    with psycopg.connect(url) as conn:
        with conn.cursor("sorted") as cur:
            cur.itersize = 7
            cur.execute(f"SELECT id, v FROM kv WHERE {in_range(1, 1000)} ORDER BY v DESC, id")
            first = cur.fetchmany(5)
            one = cur.fetchone()
            cur.scroll(3)
            rest = list(cur)
            seen.append(("named sorted", [(i - BASE, v) for i, v in first + [one] + rest]))
        with conn.cursor("plain") as cur:
            cur.execute(f"SELECT count(*) FROM (SELECT id FROM kv WHERE {in_range(1, 1000)}) s")
            seen.append(("named count", cur.fetchall()))
        with conn.cursor("bykey") as cur:
            cur.execute("SELECT id, v FROM kv WHERE id = %s", [BASE + 3])
            seen.append(("named one key", cur.fetchall()))
        with conn.cursor("grouped") as cur:
            cur.execute(f"SELECT v, count(*) FROM kv WHERE {in_range(1, 1000)} GROUP BY v ORDER BY v LIMIT 4")
            seen.append(("named grouped", cur.fetchmany(2), cur.fetchall()))
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor("held", withhold=True) as cur:
            cur.execute(f"SELECT id FROM kv WHERE {in_range(1, 1000)} ORDER BY id LIMIT 20 OFFSET 3")
            seen.append(("named with hold", [i - BASE for (i,) in cur.fetchmany(4)], cur.fetchone()[0] - BASE))


def final_rows(url, seen):
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(f"SELECT id, v FROM kv WHERE {in_range(1, 1000)} ORDER BY id").fetchall()
        seen.append(("final rows", [(i - BASE, v) for i, v in rows]))


def run(url):
    seen = []
    asyncio.run(with_asyncpg(url, seen))
    with_psycopg(url, seen)
    with_sqlalchemy(url, seen)
    with_named_cursors(url, seen)
    final_rows(url, seen)
    return seen


def main():
    direct = run(DIRECT)
    routed = run(ROUTER)
    for d, r in zip(direct, routed):
        shown = r if len(repr(r)) < 300 else repr(r)[:300] + "..."
        print(f"{'ok' if d == r else 'DIFFERENT'} {shown}", flush=True)
        if d != r:
            print(f"FAIL through the router {r!r}, directly {d!r}", flush=True)
            sys.exit(1)
    if len(direct) != len(routed):
        print(f"FAIL {len(routed)} steps through the router, {len(direct)} directly", flush=True)
        sys.exit(1)
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
