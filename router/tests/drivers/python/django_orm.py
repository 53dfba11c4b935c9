"""Django's ORM over psycopg 3 (Django's defaults: autocommit, client-side binding; then again
with server-side binding), the way an application uses it: bulk_create (which Django 5 sends
as INSERT ... SELECT * FROM UNNEST(...)), filter/delete by lists of keys, atomic blocks over
several shards, counts, ordered slices, and .iterator() (a server-side cursor: WITH HOLD in
autocommit, a plain one inside atomic). The same steps run through the router (SHARDGATE_URL)
and directly on one Postgres with the same schema (SHARDGATE_DIRECT_URL); what each step saw
must be the same.

Environment: SHARDGATE_URL, SHARDGATE_DIRECT_URL, SHARDGATE_KEY_BASE.
Prints each step's observation; exits 1 with "FAIL ..." on a difference, else prints PASS.
"""

import os
import sys
import urllib.parse

import django
from django.conf import settings


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
BASE = int(os.environ["SHARDGATE_KEY_BASE"])

settings.configure(
    DATABASES={
        "default": database(DIRECT, False),
        "router": database(ROUTER, False),
        "direct": database(DIRECT, False),
        "router_ssb": database(ROUTER, True),
        "direct_ssb": database(DIRECT, True),
    },
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()

from django.db import IntegrityError, models, transaction  # noqa: E402


class Kv(models.Model):
    id = models.BigIntegerField(primary_key=True)
    v = models.TextField()

    class Meta:
        app_label = "shardgate_test"
        db_table = "kv"
        managed = False


def steps(db, base):
    """The application's steps on database alias `db`, keys from `base`; returns what it saw."""
    seen = []
    objects = Kv.objects.using(db)
    mine = objects.filter(id__gte=base, id__lt=base + 1000)

    def ids(qs):
        return [k.id - base for k in qs]

    # bulk_create: one INSERT ... SELECT * FROM UNNEST over every shard.
    made = objects.bulk_create([Kv(id=base + i, v=f"dj{i}") for i in range(40)])
    seen.append(("bulk_create", len(made), mine.count()))
    # One duplicate key among new rows: nothing of the batch remains anywhere.
    try:
        objects.bulk_create([Kv(id=base + i, v="again") for i in (100, 101, 5, 102)])
        seen.append(("bulk_create duplicate", "no error"))
    except IntegrityError as e:
        seen.append(("bulk_create duplicate", e.__cause__.sqlstate))
    seen.append(("after duplicate", mine.filter(id__gte=base + 100).count()))
    # Reads: ordered slices, counts, key lists.
    seen.append(("order_by desc [:3]", ids(mine.order_by("-id")[:3])))
    seen.append(("order_by v [5:8]", [k.v for k in mine.order_by("v")[5:8]]))
    seen.append(("in_bulk", sorted(k - base for k in objects.in_bulk([base + 1, base + 17, base + 33]))))
    # .iterator() in autocommit: a WITH HOLD cursor over every shard, fetched in chunks.
    seen.append(("iterator", ids(mine.order_by("id").iterator(chunk_size=7))))
    seen.append(("iterator values", sorted(v for v in mine.values_list("v", flat=True).iterator(chunk_size=9))))
    # An atomic block over several shards: updates, a read of its own writes, then commit.
    with transaction.atomic(using=db):
        objects.filter(id__in=[base + 1, base + 2, base + 3]).update(v="upd")
        objects.filter(id=base + 4).update(v="one")
        seen.append(("atomic sees own writes", sorted(mine.filter(v="upd").values_list("id", flat=True))))
        # .iterator() inside atomic: a cursor without HOLD, inside the transaction.
        seen.append(("atomic iterator", ids(mine.filter(v__in=["upd", "one"]).order_by("-id").iterator(chunk_size=2))))
        # One key: the cursor lives on that key's shard.
        seen.append(("atomic iterator one key", ids(objects.filter(id=base + 4).iterator(chunk_size=1))))
    seen.append(("after atomic", sorted(k.v for k in mine.filter(id__lte=base + 4))))
    # An atomic block that fails: nothing of it remains, on any shard.
    try:
        with transaction.atomic(using=db):
            objects.filter(id__in=[base + 10, base + 11, base + 12]).delete()
            Kv(id=base + 200, v="x").save(using=db, force_insert=True)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    seen.append(("after rollback", mine.count(), mine.filter(id=base + 200).exists()))
    # filter(id__in=...).delete(): Django collects inside atomic, then deletes.
    deleted, _ = objects.filter(id__in=[base + i for i in range(0, 40, 3)]).delete()
    seen.append(("delete in", deleted, mine.count()))
    seen.append(("delete all of mine", mine.delete()[0], mine.count()))
    return seen


def main():
    failed = False
    for binding, (router, direct) in (("client-side", ("router", "direct")), ("server-side", ("router_ssb", "direct_ssb"))):
        base = BASE + (0 if binding == "client-side" else 10_000)
        through = steps(router, base)
        plain = steps(direct, base)
        for a, b in zip(through, plain):
            mark = "ok  " if a == b else "DIFF"
            print(f"{mark} {binding}: {a}" + ("" if a == b else f"  (direct: {b})"))
            failed |= a != b
        if len(through) != len(plain):
            print(f"DIFF {binding}: {len(through)} steps through the router, {len(plain)} directly")
            failed = True
    if failed:
        print("FAIL Django through the router differs from one Postgres")
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
