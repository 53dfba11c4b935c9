#!/usr/bin/env bash
# Client CPU per query: loadgen vs pgbench against the same target, in one run.
#
# Both clients run closed loop (as fast as they can) with the same connections and the same
# point select (`SELECT v FROM kv WHERE id = $1`, prepared), one after the other, for the same
# time. Each client's CPU (user + sys) is measured from outside with /usr/bin/time, so both
# are counted the same way; QPS comes from each tool's own output. See docs/loadgen.md.
#
# usage: benches/loadgen_vs_pgbench.sh [--url postgres://...] [--connections C] [--seconds T]
#                                      [--rows N] [--threads J] [--pipeline K]
#   --url          a database to load kv into and query (default: a throw-away Postgres
#                  started here with initdb, stopped and deleted at the end)
#   --connections  client connections of both tools (default 4)
#   --seconds      length of each run (default 10)
#   --rows         rows of kv (default 100000)
#   --threads      pgbench -j and loadgen --threads (default 1)
#   --pipeline     loadgen's --pipeline (default 1: one query in flight per connection, as
#                  pgbench); a second loadgen run with this depth is added when it is not 1
set -euo pipefail

URL=""
CONNS=4
SECS=10
ROWS=100000
THREADS=1
PIPELINE=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --url) URL="$2"; shift 2 ;;
    --connections) CONNS="$2"; shift 2 ;;
    --seconds) SECS="$2"; shift 2 ;;
    --rows) ROWS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --pipeline) PIPELINE="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PGBIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
PGBENCH="${PGBENCH:-$PGBIN/pgbench}"
[[ -x "$PGBENCH" ]] || PGBENCH="$(command -v pgbench)"
[[ -x /usr/bin/time ]] || { echo "needs /usr/bin/time (GNU time)" >&2; exit 1; }

echo "building loadgen (release)..." >&2
cargo build --release -q -p loadgen
LOADGEN="$ROOT/target/release/loadgen"

WORK="$(mktemp -d /tmp/loadgen-vs-pgbench.XXXXXX)"
chmod 755 "$WORK"
cleanup() {
  if [[ -n "${PGDATA_DIR:-}" ]]; then
    $AS_PG "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -z "$URL" ]]; then
  AS_PG=""
  if [[ $(id -u) -eq 0 ]]; then AS_PG="runuser -u postgres --"; fi
  PGDATA_DIR="$WORK/data"
  mkdir -p "$PGDATA_DIR"
  [[ -n "$AS_PG" ]] && chown -R postgres "$WORK"
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  echo "starting a throw-away Postgres on port $PORT..." >&2
  printf 'postgres\n' > "$WORK/pw"
  [[ -n "$AS_PG" ]] && chown postgres "$WORK/pw"
  $AS_PG "$PGBIN/initdb" -D "$PGDATA_DIR" -U postgres --pwfile="$WORK/pw" -A scram-sha-256 >/dev/null
  $AS_PG "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$WORK/pg.log" -w \
    -o "-p $PORT -k $WORK -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=128MB -c fsync=off" start >/dev/null
  URL="postgres://postgres:postgres@127.0.0.1:$PORT/postgres"
fi

echo "preparing $ROWS rows..." >&2
"$LOADGEN" prepare --target "$URL" --rows-per-shard "$ROWS" --quiet

# Keys 1..ROWS: with one database (no shard map) loadgen loads exactly those.
cat > "$WORK/select.sql" <<SQL
\set id random(1, $ROWS)
SELECT v FROM kv WHERE id = :id;
SQL

cpu_of() { # file written by /usr/bin/time -f "%U %S" -> "user sys"
  tail -1 "$1"
}

echo "pgbench: $CONNS connections, -j $THREADS, $SECS s, -M prepared..." >&2
/usr/bin/time -f "%U %S" -o "$WORK/pgbench.time" \
  "$PGBENCH" -n -M prepared -f "$WORK/select.sql" -c "$CONNS" -j "$THREADS" -T "$SECS" "$URL" > "$WORK/pgbench.out" 2>&1
PG_TX=$(awk '/number of transactions actually processed/ {split($0,a,": "); split(a[2],b,"/"); print b[1]}' "$WORK/pgbench.out")
PG_QPS=$(awk '/^tps = / {print $3; exit}' "$WORK/pgbench.out")
read -r PG_USER PG_SYS < <(cpu_of "$WORK/pgbench.time")

run_loadgen() { # $1 = pipeline depth, $2 = name
  /usr/bin/time -f "%U %S" -o "$WORK/$2.time" \
    "$LOADGEN" run --target "$URL" --rows-per-shard "$ROWS" --rate max --protocol prepared \
    --connections "$CONNS" --pipeline "$1" --threads "$THREADS" --duration "${SECS}s" --quiet \
    --json "$WORK/$2.json" > "$WORK/$2.out" 2>&1
  python3 - "$WORK/$2.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(r["requests"], r["qps"], r["counts"]["errors"] if "counts" in r else r["errors"])
PY
}

echo "loadgen: $CONNS connections, --threads $THREADS, $SECS s, --rate max --protocol prepared --pipeline 1..." >&2
read -r LG_REQ LG_QPS LG_ERR < <(run_loadgen 1 loadgen)
read -r LG_USER LG_SYS < <(cpu_of "$WORK/loadgen.time")
if [[ "$PIPELINE" != 1 ]]; then
  echo "loadgen: same, --pipeline $PIPELINE..." >&2
  read -r LP_REQ LP_QPS LP_ERR < <(run_loadgen "$PIPELINE" loadgen_p)
  read -r LP_USER LP_SYS < <(cpu_of "$WORK/loadgen_p.time")
fi

python3 - "$PG_TX" "$PG_QPS" "$PG_USER" "$PG_SYS" "$LG_REQ" "$LG_QPS" "$LG_USER" "$LG_SYS" "$LG_ERR" \
  "${LP_REQ:-}" "${LP_QPS:-}" "${LP_USER:-}" "${LP_SYS:-}" "$PIPELINE" "$CONNS" "$SECS" "$THREADS" <<'PY'
import sys
a = sys.argv[1:]
pg_tx, pg_qps, pg_u, pg_s = int(a[0]), float(a[1]), float(a[2]), float(a[3])
lg_req, lg_qps, lg_u, lg_s, lg_err = int(a[4]), float(a[5]), float(a[6]), float(a[7]), a[8]
pipeline, conns, secs, threads = a[13], a[14], a[15], a[16]
pg_us = (pg_u + pg_s) * 1e6 / max(pg_tx, 1)
lg_us = (lg_u + lg_s) * 1e6 / max(lg_req, 1)
print(f"client CPU per query, {conns} connections, {secs} s closed loop, {threads} client thread(s), prepared point selects")
print(f"{'client':<22} {'queries':>10} {'qps':>10} {'user s':>8} {'sys s':>8} {'cpu us/query':>13}")
print(f"{'pgbench':<22} {pg_tx:>10} {pg_qps:>10.0f} {pg_u:>8.2f} {pg_s:>8.2f} {pg_us:>13.2f}")
print(f"{'loadgen (pipeline 1)':<22} {lg_req:>10} {lg_qps:>10.0f} {lg_u:>8.2f} {lg_s:>8.2f} {lg_us:>13.2f}")
if a[9]:
    lp_req, lp_qps, lp_u, lp_s = int(a[9]), float(a[10]), float(a[11]), float(a[12])
    lp_us = (lp_u + lp_s) * 1e6 / max(lp_req, 1)
    name = f"loadgen (pipeline {pipeline})"
    print(f"{name:<22} {lp_req:>10} {lp_qps:>10.0f} {lp_u:>8.2f} {lp_s:>8.2f} {lp_us:>13.2f}")
print(f"ratio loadgen/pgbench CPU per query (pipeline 1): {lg_us / pg_us:.2f}  (goal <= 0.5)")
if a[9]:
    print(f"ratio loadgen/pgbench CPU per query (pipeline {pipeline}): {lp_us / pg_us:.2f}")
PY
