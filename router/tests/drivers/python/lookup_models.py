"""ORM models on a sharded table with a lookup column (`handles`: an identity key the router
gives, and `handle`, unique, declared `lookup = { handle = "text" }` in the shard map): Django
(client-side and server-side binding) and SQLAlchemy create rows, find them by the lookup
column, change it by saving the whole row, hit a duplicate, create in bulk, and delete. The same
steps run directly on one Postgres with the same schema, and what each step saw (ids aside,
which differ) must be the same.

Environment: SHARDGATE_URL, SHARDGATE_DIRECT_URL.
Prints each step's observation; exits 1 with "FAIL ..." on a difference, else prints PASS.
"""

import os
import sys
import urllib.parse

import django
from django.conf import settings
from django.db import IntegrityError, transaction
from sqlalchemy import BigInteger, Integer, Text, create_engine, select
from sqlalchemy.exc import IntegrityError as SaIntegrityError
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


class Handle(models.Model):
    handle = models.TextField(unique=True, null=True)
    n = models.IntegerField(null=True)

    class Meta:
        app_label = "shardgate_test"
        db_table = "handles"
        managed = False


def django_steps(db, tag):
    seen = []
    objects = Handle.objects.using(db)
    a = objects.create(handle=f"{tag}-a", n=1)
    seen.append(("create: id is an int", isinstance(a.id, int)))
    seen.append(("get by handle", objects.get(handle=f"{tag}-a").n))
    a.handle = f"{tag}-b"
    a.n = 2
    a.save(using=db)
    seen.append(("saved with a new handle: old gone", objects.filter(handle=f"{tag}-a").exists()))
    seen.append(("found by the new handle", objects.get(handle=f"{tag}-b").id == a.id))
    try:
        with transaction.atomic(using=db):
            objects.create(handle=f"{tag}-b", n=3)
        seen.append(("duplicate", "accepted"))
    except IntegrityError as e:
        seen.append(("duplicate", "IntegrityError", getattr(e.__cause__, "sqlstate", None)))
    made = objects.bulk_create([Handle(handle=f"{tag}-bulk{i}", n=i) for i in range(12)])
    seen.append(("bulk_create", len({m.id for m in made})))
    seen.append(("each found by its handle", [objects.get(handle=f"{tag}-bulk{i}").n for i in range(12)]))
    seen.append(("delete by id", objects.filter(id=a.id).delete()[0]))
    again = objects.create(handle=f"{tag}-b", n=4)
    seen.append(("the handle of a deleted row, again", objects.get(handle=f"{tag}-b").id == again.id))
    seen.append(("delete bulk", objects.filter(id__in=[m.id for m in made] + [again.id]).delete()[0]))
    return seen


class Base(DeclarativeBase):
    pass


class SaHandle(Base):
    __tablename__ = "handles"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    handle: Mapped[str] = mapped_column(Text, nullable=True)
    n: Mapped[int] = mapped_column(Integer, nullable=True)


def sqlalchemy_steps(url, tag):
    seen = []
    engine = create_engine(url.replace("postgres://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as s:
            a = SaHandle(handle=f"{tag}-a", n=1)
            s.add(a)
            s.commit()
            key = a.id
            seen.append(("add, commit: id is an int", isinstance(key, int)))
        with Session(engine) as s:
            got = s.scalars(select(SaHandle).where(SaHandle.handle == f"{tag}-a")).one()
            seen.append(("select by handle", got.n, got.id == key))
            got.handle = f"{tag}-b"
            s.commit()
        with Session(engine) as s:
            seen.append(("old handle gone", s.scalars(select(SaHandle).where(SaHandle.handle == f"{tag}-a")).first()))
            seen.append(("new handle found", s.scalars(select(SaHandle.id).where(SaHandle.handle == f"{tag}-b")).one() == key))
        with Session(engine) as s:
            s.add(SaHandle(handle=f"{tag}-b", n=9))
            try:
                s.commit()
                seen.append(("duplicate", "accepted"))
            except SaIntegrityError as e:
                seen.append(("duplicate", "IntegrityError", getattr(e.orig, "sqlstate", None)))
                s.rollback()
        with Session(engine) as s:
            many = [SaHandle(handle=f"{tag}-many{i}", n=i) for i in range(10)]
            s.add_all(many)
            s.commit()
            seen.append(("add_all", len({m.id for m in many})))
            seen.append(("each found by its handle", [s.scalars(select(SaHandle.n).where(SaHandle.handle == f"{tag}-many{i}")).one() for i in range(10)]))
            for m in many:
                s.delete(m)
            s.delete(s.get(SaHandle, key))
            s.commit()
            seen.append(("deleted", s.scalars(select(SaHandle).where(SaHandle.handle == f"{tag}-b")).first()))
    finally:
        engine.dispose()
    return seen


def main():
    failed = False
    runs = [
        ("django client-side", lambda: django_steps("router", "lj"), lambda: django_steps("direct", "lj")),
        ("django server-side", lambda: django_steps("router_ssb", "ls"), lambda: django_steps("direct_ssb", "ls")),
        ("sqlalchemy", lambda: sqlalchemy_steps(ROUTER, "la"), lambda: sqlalchemy_steps(DIRECT, "la")),
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
        print("FAIL ORM models with lookup columns through the router differ from one Postgres")
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
