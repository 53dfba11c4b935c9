#!/usr/bin/env bash
# Postgres's own regression tests (pg_regress) through a router in front of ONE shard, beside
# the same tests run directly on that Postgres: the pass rate through the router, and which
# tests fail only through it. A router with one shard routes everything to it, so what fails
# only there is what transaction pooling and the router's own handling change (session state
# across statements, SQL the router refuses or answers itself).
# See docs/compatibility.md ("Postgres's regression tests through one shard").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF2'
Usage: benches/pg_regress.sh [OPTIONS] [TEST ...]

Runs test_setup, then the TESTs (default: a list of core SQL tests: select, aggregates, join,
insert, update, delete, transactions, prepare, portals, copy, ...) with pg_regress, once
through a router (one worker) whose map has one shard, once directly, each in a database of
its own on one throw-away Postgres. Prints both results and the tests that fail only through
the router; keeps the diffs in --out.

  --out DIR      where pg_regress writes results and diffs   [default: a temp dir, printed]
  --full         Postgres's whole parallel_schedule (about 200 tests, in its order, one at
                 a time) instead of the list; TESTs are then ignored
  -h, --help     this text

Needs the PostgreSQL 15 server binaries and server headers (postgresql-server-dev-15, for the
regression tests' C functions), gcc, psql. Downloads PostgreSQL's source from Debian's archive
once (23 MB, kept in ~/.cache/shardgate-pg-regress) for the tests themselves.
EOF2
}

out="" tests=() full=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --full) full=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option $1" ;;
        *) tests+=("$1"); shift ;;
    esac
done
[[ ${#tests[@]} -gt 0 ]] || tests=(boolean int4 int8 numeric text strings date timestamp
    select select_distinct select_having select_implicit select_into subselect union case join
    aggregates insert insert_conflict update delete namespace prepared_xacts transactions
    prepare portals copy copyselect arrays with returning limit window groupingsets json)
need_tools psql gcc cargo curl
pgbin="$(pg_config --bindir 2>/dev/null || true)"
[[ -x "${pgbin:-}/initdb" ]] || pgbin=/usr/lib/postgresql/15/bin
[[ -x "$pgbin/initdb" ]] || die "no PostgreSQL server binaries (apt-get install postgresql)"
regress_bin="$(dirname "$pgbin")/lib/pgxs/src/test/regress/pg_regress"
[[ -x "$regress_bin" ]] || die "no pg_regress at $regress_bin (apt-get install postgresql-server-dev-15)"
version="$("$pgbin/postgres" --version | awk '{ print $3 }')"

cache="${XDG_CACHE_HOME:-$HOME/.cache}/shardgate-pg-regress"
mkdir -p "$cache"
# The server's own version first; Debian's archive keeps only some source tarballs, and the
# tests of another 15.x minor release serve as well (both runs use the same ones).
src=""
for v in "$version" 15.18; do
    if [[ -d "$cache/postgresql-$v/src/test/regress/sql" ]]; then
        src="$cache/postgresql-$v/src/test/regress"
        break
    fi
    tarball="$cache/postgresql-15_$v.orig.tar.bz2"
    url="http://deb.debian.org/debian/pool/main/p/postgresql-15/postgresql-15_$v.orig.tar.bz2"
    if [[ ! -s "$tarball" ]]; then
        echo "downloading $url ..." >&2
        curl -sfL -o "$tarball" "$url" || { rm -f "$tarball"; continue; }
    fi
    tar -xjf "$tarball" -C "$cache" "postgresql-$v/src/test/regress"
    src="$cache/postgresql-$v/src/test/regress"
    break
done
[[ -n "$src" ]] || die "could not download PostgreSQL's source (its regression tests) from Debian's archive"
echo "regression tests of $(basename "$(dirname "$(dirname "$(dirname "$src")")")"), server $version" >&2

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-regress.XXXXXX")"
chmod 755 "$tmp"
[[ -n "$out" ]] || out="$tmp/results"
mkdir -p "$out"
pids=()
runas=()
[[ "$(id -u)" == 0 ]] && runas=(runuser -u postgres --)
cleanup() {
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    [[ -f "$tmp/data/postmaster.pid" ]] && "${runas[@]}" "$pgbin/pg_ctl" -D "$tmp/data" -m immediate stop >/dev/null 2>&1 || true
    [[ "$out" == "$tmp/results" ]] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building the regression tests' C functions ..." >&2
includes="$(pg_config --includedir-server 2>/dev/null || echo /usr/include/postgresql/15/server)"
[[ -f "$includes/postgres.h" ]] || die "no server headers in $includes (apt-get install postgresql-server-dev-15)"
gcc -shared -fPIC -O1 -I"$includes" \
    -o "$tmp/regress.so" "$src/regress.c" 2>"$tmp/gcc.log" || die "could not build regress.so: $(tail -5 "$tmp/gcc.log")"
cp -r "$src" "$tmp/regress"
[[ "$(id -u)" == 0 ]] && chown -R postgres "$tmp"

echo "building the router (release) ..." >&2
(cd "$root" && cargo build --release -q -p shardgate)
bin="$(release_dir)"

free_port pg_port
"${runas[@]}" "$pgbin/initdb" -D "$tmp/data" -U postgres --auth=trust -E UTF8 --locale=C >"$tmp/initdb.log" 2>&1 ||
    die "initdb failed: $(tail -5 "$tmp/initdb.log")"
cat >>"$tmp/data/postgresql.conf" <<EOT
port = $pg_port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$tmp'
max_prepared_transactions = 10
max_connections = 200
fsync = off
EOT
"${runas[@]}" "$pgbin/pg_ctl" -D "$tmp/data" -l "$tmp/postgres.log" -w start >/dev/null
for db in regression direct; do
    psql "postgres://postgres@127.0.0.1:$pg_port/postgres" -qc "CREATE DATABASE $db" >/dev/null
done

free_port router_port
"$bin/shardgate" shardmap split --shards 1 --primary "postgres://postgres@127.0.0.1:$pg_port/regression" >"$tmp/shardmap.toml"
cat >"$tmp/router.toml" <<EOT
listen = "127.0.0.1:$router_port"
shardmap = "$tmp/shardmap.toml"
database = "regression"
auth = "trust"

[backend]
user = "postgres"
EOT
"$bin/shardgate" --config "$tmp/router.toml" --threads 1 >"$tmp/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
    psql "postgres://postgres@127.0.0.1:$router_port/regression" -qAtc "SELECT 1" >/dev/null 2>&1 && break
    kill -0 "${pids[-1]}" 2>/dev/null || die "the router exited: $(tail -5 "$tmp/router.log")"
    sleep 0.1
done

schedule="$tmp/schedule"
if (( full )); then
    # Every test of the schedule, in its order (its groups run one test at a time here).
    mapfile -t tests < <(sed -nE 's/^test: *//p' "$tmp/regress/parallel_schedule" | tr -s ' ' '\n' | grep -v '^test_setup$')
fi
{ echo "test: test_setup"; for t in "${tests[@]}"; do echo "test: $t"; done; } >"$schedule"

regress() { # NAME PORT DB
    mkdir -p "$out/$1"
    [[ "$(id -u)" == 0 ]] && chown -R postgres "$out"
    (cd "$tmp/regress" && PGUSER=postgres "${runas[@]}" "$regress_bin" --use-existing --host=127.0.0.1 --port="$2" \
        --dbname="$3" --inputdir="$tmp/regress" --outputdir="$out/$1" --bindir="$pgbin" \
        --dlpath="$tmp" --schedule="$schedule" --max-connections=1 >"$out/$1/run.log" 2>&1) || true
    grep -E "^(ok|not ok|test) " "$out/$1/run.log" | sed -E 's/^(ok|not ok) +[0-9]+ +[-+]? *//' || true
}
echo "pg_regress through the router ..." >&2
regress router "$router_port" regression >"$tmp/router.txt"
echo "pg_regress directly ..." >&2
regress direct "$pg_port" direct >"$tmp/direct.txt"

python3 - "$out" "${tests[@]}" <<'PY'
import re, sys
out, tests = sys.argv[1], ["test_setup"] + sys.argv[2:]
def results(name):
    seen = {}
    for line in open(f"{out}/{name}/run.log", errors="replace"):
        m = re.match(r"^(ok|not ok)\s+\d+\s+[-+]?\s*(\S+)", line) or re.match(r"^test (\S+)\s+\.\.\.\s+(ok|FAILED|failed)", line)
        if not m:
            continue
        if m.group(1) in ("ok", "not ok"):
            seen[m.group(2)] = m.group(1) == "ok"
        else:
            seen[m.group(1)] = m.group(2) == "ok"
    return seen
router, direct = results("router"), results("direct")
passed = lambda r: sum(1 for t in tests if r.get(t))
print(f"{'test':22} {'direct':7} router")
for t in tests:
    mark = lambda r: "ok" if r.get(t) else ("FAIL" if t in r else "-")
    flag = "   <- only through the router" if direct.get(t) and not router.get(t) else ""
    print(f"{t:22} {mark(direct):7} {mark(router)}{flag}")
print(f"passed: directly {passed(direct)}/{len(tests)}, through the router {passed(router)}/{len(tests)}")
print(f"diffs: {out}/router/regression.diffs, {out}/direct/regression.diffs")
PY
