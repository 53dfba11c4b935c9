"""ORM models with an automatic primary key on a sharded table whose key is an identity column:
Django's default BigAutoField (client-side and server-side binding) and SQLAlchemy's
autoincrement key: create (the id comes back), get by id, update, delete, bulk_create /
add_all; and asyncpg (named prepared statements) inserting without the key. The router gives the keys; the same steps run directly on one Postgres with the same
schema, and what each step saw (ids aside, which differ) must be the same.

Environment: SHARDGATE_URL, SHARDGATE_DIRECT_URL.
Prints each step's observation; exits 1 with "FAIL ..." on a difference, else prints PASS.
"""

import asyncio
import os
import sys
import urllib.parse

import asyncpg

import django
from django.conf import settings
from sqlalchemy import BigInteger, Integer, Text, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


def database(url, server_side_binding):
    u = urllib.parse.urlparse(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": u.path[1:],
        "USER": urllib.parse.unquote(u.username or ""),
        "PASSWORD": urllib.parse.unquote(u.password or ""),
        "HOST": u.hostname,
        "PORT": u.port,
        "OPTIONS": {"server_side_binding": server_side_binding},
    }


ROUTER = os.environ["SHARDGATE_URL"]
DIRECT = os.environ["SHARDGATE_DIRECT_URL"]

settings.configure(
    DATABASES={
        "default": database(DIRECT, False),
        "router": database(ROUTER, False),
        "direct": database(DIRECT, False),
        "router_ssb": database(ROUTER, True),
        "direct_ssb": database(DIRECT, True),
    },
    INSTALLED_APPS=[],
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    USE_TZ=True,
)
django.setup()

from django.db import models  # noqa: E402


class Auto(models.Model):
    v = models.TextField()
    n = models.IntegerField(null=True)

    class Meta:
        app_label = "shardgate_test"
        db_table = "autos"
        managed = False


def django_steps(db, tag):
    seen = []
    objects = Auto.objects.using(db)
    a = objects.create(v=f"{tag}-a", n=1)
    seen.append(("create: id is an int", isinstance(a.id, int)))
    seen.append(("get by id", objects.get(id=a.id).v == f"{tag}-a"))
    a.v = f"{tag}-b"
    a.save(using=db)
    seen.append(("update, then get", objects.get(id=a.id).v))
    made = objects.bulk_create([Auto(v=f"{tag}-bulk{i}", n=i) for i in range(25)])
    ids = [m.id for m in made]
    seen.append(("bulk_create ids", len(ids), len(set(ids)), all(isinstance(i, int) for i in ids)))
    seen.append(("bulk rows by id", sorted(objects.filter(id__in=ids).values_list("n", flat=True))))
    seen.append(("each found by its id", all(objects.get(id=m.id).n == m.n for m in made[:5])))
    seen.append(("delete", objects.filter(id=a.id).delete()[0], objects.filter(id=a.id).exists()))
    seen.append(("delete bulk", objects.filter(id__in=ids).delete()[0]))
    return seen


class Base(DeclarativeBase):
    pass


class SaAuto(Base):
    __tablename__ = "autos"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    v: Mapped[str] = mapped_column(Text)
    n: Mapped[int] = mapped_column(Integer, nullable=True)


def sqlalchemy_steps(url, tag):
    seen = []
    engine = create_engine(url.replace("postgres://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as s:
            a = SaAuto(v=f"{tag}-a", n=1)
            s.add(a)
            s.commit()
            seen.append(("add, commit: id is an int", isinstance(a.id, int)))
            key = a.id
        with Session(engine) as s:
            got = s.get(SaAuto, key)
            seen.append(("get by id", got.v))
            got.v = f"{tag}-b"
            s.commit()
        with Session(engine) as s:
            seen.append(("update, then get", s.get(SaAuto, key).v))
            many = [SaAuto(v=f"{tag}-many{i}", n=i) for i in range(20)]
            s.add_all(many)
            s.commit()
            ids = [m.id for m in many]
            seen.append(("add_all ids", len(ids), len(set(ids))))
            rows = s.scalars(select(SaAuto.n).where(SaAuto.id.in_(ids))).all()
            seen.append(("add_all rows by id", sorted(rows)))
            s.delete(s.get(SaAuto, key))
            s.commit()
            seen.append(("delete", s.get(SaAuto, key) is None))
    finally:
        engine.dispose()
    return seen


async def asyncpg_steps(url, tag):
    seen = []
    conn = await asyncpg.connect(url)
    try:
        insert = await conn.prepare("INSERT INTO autos (v, n) VALUES ($1, $2) RETURNING id, v, n")
        ids = []
        for i in range(12):
            row = await insert.fetchrow(f"{tag}-{i}", i)
            ids.append(row["id"])
            seen.append(("prepared insert returns", row["v"], row["n"]))
        seen.append(("ids", len(ids), len(set(ids))))
        got = await conn.fetch("SELECT n FROM autos WHERE id = ANY($1::bigint[]) ORDER BY n", ids)
        seen.append(("found by id", [r["n"] for r in got]))
        many = await conn.fetch(
            "INSERT INTO autos (v, n) SELECT * FROM UNNEST($1::text[], $2::int[]) RETURNING id, n",
            [f"{tag}-u{i}" for i in range(7)],
            list(range(100, 107)),
        )
        seen.append(("unnest insert", sorted(r["n"] for r in many), len({r["id"] for r in many})))
        async with conn.transaction():
            key = await conn.fetchval("INSERT INTO autos (v) VALUES ($1) RETURNING id", f"{tag}-tx")
            seen.append(("in a transaction, then read", await conn.fetchval("SELECT v FROM autos WHERE id = $1", key)))
        deleted = await conn.execute("DELETE FROM autos WHERE id = ANY($1::bigint[])", ids + [r["id"] for r in many] + [key])
        seen.append(("deleted", deleted))
    finally:
        await conn.close()
    return seen


def main():
    failed = False
    runs = [
        ("django client-side", lambda: django_steps("router", "dj"), lambda: django_steps("direct", "dj")),
        ("django server-side", lambda: django_steps("router_ssb", "ds"), lambda: django_steps("direct_ssb", "ds")),
        ("sqlalchemy", lambda: sqlalchemy_steps(ROUTER, "sa"), lambda: sqlalchemy_steps(DIRECT, "sa")),
        ("asyncpg", lambda: asyncio.run(asyncpg_steps(ROUTER, "ap")), lambda: asyncio.run(asyncpg_steps(DIRECT, "ap"))),
    ]
    for name, through_router, directly in runs:
        through = through_router()
        plain = directly()
        for a, b in zip(through, plain):
            mark = "ok  " if a == b else "DIFF"
            print(f"{mark} {name}: {a}" + ("" if a == b else f"  (direct: {b})"))
            failed |= a != b
        if len(through) != len(plain):
            print(f"DIFF {name}: {len(through)} steps through the router, {len(plain)} directly")
            failed = True
    if failed:
        print("FAIL ORM models with automatic keys through the router differ from one Postgres")
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
