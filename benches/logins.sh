#!/usr/bin/env bash
# Logins against the router (issue 30): a reconnect storm of N clients logging in at the same
# instant, in plain TCP and again in TLS, then a slowloris (silent TCP connections held and
# renewed from 127.0.0.2) with a bystander logging in every 200 ms; during each storm, steady
# clients logged in beforehand run point selects (what a storm does to them). Everything is
# measured by `loadgen storm` and `loadgen run` (docs/loadgen.md); this script sets up a
# throw-away Postgres 15 and a router in front of it, runs the phases, prints each result and
# cleans up.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/logins.sh [OPTIONS]

Starts a throw-away PostgreSQL 15 (initdb in a temp dir, on a free port) with database `app`, a
shard map with it as the only shard, and a shardgate router in front of it (SCRAM-SHA-256 for
user app/app, [tls] mode = "allow" with a certificate signed by a CA made here with openssl).
Then, with `loadgen storm --router-pid`:

  1. storm, plain TCP:  --logins N (all at the same instant, each runs SELECT 1 and stays
                        connected until all have logged in)
  2. storm, TLS:        the same, verifying the router's certificate against the CA
  3. slowloris:         --silent 1500 --silent-from 127.0.0.2 --bystander-every-ms 200
                        --duration-s D (silent connections renewed whenever the router closes
                        them; a bystander logs in every 200 ms from 127.0.0.1)
  4. slowloris, TLS:    the same, the bystander logging in with TLS

and, with --steady (on by default), `loadgen run` of point selects from 4 clients logged in
before: alone for 5 s, then during each storm (the clients already in, as a storm meets them).

and prints loadgen's summary of each (logged in, refused by SQLSTATE, other errors, time to the
last login, login latency, the router's CPU per login and peak RSS; for the slowloris, how often
the router closed the silent connections and the bystander's failures and latency), then one
PASS/FAIL line per phase. Everything it starts is stopped and deleted on exit, also on Ctrl-C.

Options:
  -n N                  storm clients                                  [default: 10000]
      --duration S      slowloris seconds                              [default: 30]
      --silent M        silent connections of the slowloris            [default: 1500]
      --quick           -n 2000 and --duration 10 (unless given)
      --bin PATH        run this router binary instead of building shardgate (only loadgen is
                        built then)
      --extra-limits 'LINES'
                        settings appended to the router's [limits] section; "\n" separates
                        lines, e.g. 'max_logins = 20000\nlogin_timeout_ms = 5000'
      --keep            keep the temp dir (configs, logs, JSON reports) and print its path
      --key rsa|ecdsa   the router certificate's key: RSA 2048 or ECDSA P-256   [default: ecdsa]
      --steady R        during each storm, 4 clients logged in beforehand run point selects
                        at R a second in all (`loadgen run --rate R`, open loop) and their
                        latency is printed: what a storm does to the clients already in
                        (0: none)                                      [default: 500]
      --auth scram|trust
                        how clients log in: SCRAM-SHA-256 (a PBKDF2 on the client's side per
                        login, so the clients' CPU limits a storm here) or trust (the router's
                        own work is then what limits it)               [default: scram]
      --pin             the router on CPU 0 with one worker thread, every loadgen on CPU 1:
                        a router saturated by a storm from clients that have CPUs of their own
  -h, --help            this text

Needs: PostgreSQL 15 server binaries (/usr/lib/postgresql/15/bin), psql, openssl, cargo; as root,
PostgreSQL runs as user `postgres`. Exit status 0 when every phase passed, 1 otherwise. The
machine running it is also the one measured: loadgen's own CPU (SCRAM costs the client a
PBKDF2 per login) is in each summary; read it before blaming the router.
EOF
}

n="" duration="" silent=1500 quick=0 bin="" extra_limits="" keep=0 key=ecdsa steady=500 auth=scram pin=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n) n="${2:?-n needs a number}"; shift 2 ;;
        --duration) duration="${2:?--duration needs seconds}"; shift 2 ;;
        --silent) silent="${2:?--silent needs a number}"; shift 2 ;;
        --quick) quick=1; shift ;;
        --bin) bin="${2:?--bin needs a path}"; shift 2 ;;
        --extra-limits) extra_limits="${2?--extra-limits needs lines}"; shift 2 ;;
        --keep) keep=1; shift ;;
        --key) key="${2:?--key needs rsa or ecdsa}"; shift 2 ;;
        --steady) steady="${2:?--steady needs a rate}"; shift 2 ;;
        --auth) auth="${2:?--auth needs scram or trust}"; shift 2 ;;
        --pin) pin=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done
if ((quick)); then
    n="${n:-2000}" duration="${duration:-10}"
fi
n="${n:-10000}" duration="${duration:-30}"
for v in n duration silent; do
    [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -gt 0 ]] || die "${v} must be a whole number above 0, not '${!v}'"
done
case "$auth" in
    scram) auth_method=scram-sha-256 ;;
    trust) auth_method=trust ;;
    *) die "--auth must be scram or trust, not '$auth'" ;;
esac
router_cmd=() client_cmd=()
if ((pin)); then
    need_tools taskset
    router_cmd=(taskset -c 0) client_cmd=(taskset -c 1)
fi
[[ "$steady" =~ ^[0-9]+$ ]] || die "--steady must be a whole number (0: none), not '$steady'"
[[ -z "$bin" || -x "$bin" ]] || die "--bin $bin is not an executable"

pgbin=/usr/lib/postgresql/15/bin
[[ -x "$pgbin/initdb" && -x "$pgbin/pg_ctl" ]] || die "PostgreSQL 15 server binaries are not in $pgbin (apt-get install postgresql-15)"
need_tools psql openssl cargo

# --- build -------------------------------------------------------------------------------------
if [[ -n "$bin" ]]; then
    echo "building loadgen (release) ..."
    (cd "$root" && cargo build --release -q -p loadgen) || die "building loadgen failed"
    router_bin="$bin"
else
    echo "building shardgate and loadgen (release) ..."
    (cd "$root" && cargo build --release -q -p shardgate -p loadgen) || die "building failed"
    router_bin="$(release_dir)/shardgate"
fi
loadgen="$(release_dir)/loadgen"

# --- temp dir, cleanup -------------------------------------------------------------------------
tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-logins.XXXXXX")"
# As root PostgreSQL runs as `postgres`, which must be able to enter this dir.
chmod 755 "$tmp"
as_pg=()
[[ $EUID -eq 0 ]] && as_pg=(runuser -u postgres --)
router_pid="" pg_started=0
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    stop "$router_pid"
    if ((pg_started)) && [[ -f "$tmp/pg/data/postmaster.pid" ]]; then
        "${as_pg[@]}" "$pgbin/pg_ctl" -D "$tmp/pg/data" -m immediate -w stop >/dev/null 2>&1 ||
            echo "logins.sh: pg_ctl stop -D $tmp/pg/data failed; stop it by hand" >&2
    fi
    if ((keep)); then echo "kept $tmp"; else rm -rf "$tmp"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

pg_port="" router_port="" # set by free_port
free_port pg_port
free_port router_port

# --- PostgreSQL --------------------------------------------------------------------------------
# $tmp/pg (data, log, socket) belongs to the user PostgreSQL runs as.
echo "starting PostgreSQL 15 on 127.0.0.1:$pg_port in $tmp/pg ..."
mkdir -p "$tmp/pg"
echo postgres >"$tmp/pg/password"
[[ $EUID -eq 0 ]] && chown -R postgres: "$tmp/pg"
"${as_pg[@]}" "$pgbin/initdb" -D "$tmp/pg/data" -U postgres --pwfile="$tmp/pg/password" \
    -A scram-sha-256 >"$tmp/initdb.log" 2>&1 || { cat "$tmp/initdb.log" >&2; die "initdb failed"; }
pg_started=1
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$tmp/pg/data" -l "$tmp/pg/postgres.log" -w \
    -o "-p $pg_port -k $tmp/pg -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" \
    start >/dev/null || { cat "$tmp/pg/postgres.log" >&2; die "PostgreSQL did not start"; }
export PGPASSWORD=postgres
psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres postgres \
    -c "CREATE DATABASE app" >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres app \
    -f "$root/deploy/local/schema.sql" >/dev/null

# --- certificates: a CA and the router's certificate for 127.0.0.1 and localhost --------------
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=logins.sh test CA" \
    -keyout "$tmp/ca.key" -out "$tmp/ca.pem" >"$tmp/openssl.log" 2>&1 ||
    { cat "$tmp/openssl.log" >&2; die "openssl could not make the CA"; }
case "$key" in
    rsa) newkey=(-newkey rsa:2048) ;;
    ecdsa) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256) ;;
    *) die "--key must be rsa or ecdsa, not '$key'" ;;
esac
openssl req "${newkey[@]}" -nodes -subj "/CN=localhost" \
    -keyout "$tmp/router.key" -out "$tmp/router.csr" >>"$tmp/openssl.log" 2>&1 ||
    { cat "$tmp/openssl.log" >&2; die "openssl could not make the router's key"; }
printf 'subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\n' >"$tmp/router.ext"
openssl x509 -req -in "$tmp/router.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days 2 -extfile "$tmp/router.ext" -out "$tmp/router.pem" >>"$tmp/openssl.log" 2>&1 ||
    { cat "$tmp/openssl.log" >&2; die "openssl could not sign the router's certificate"; }

# --- the router --------------------------------------------------------------------------------
cat >"$tmp/shardmap.toml" <<TOML
# Generated by benches/logins.sh: one Postgres holds the whole keyspace.
version = 1

[[tables]]
name = "kv"
key = "id"
type = "bigint"

[[shards]]
range = "-"
primary = "postgres://postgres:postgres@127.0.0.1:$pg_port/app"
TOML
cat >"$tmp/router.toml" <<TOML
# Generated by benches/logins.sh.
listen = "127.0.0.1:$router_port"
shardmap = "shardmap.toml"
database = "app"
auth = "$auth_method"

[[users]]
name = "app"
password = "app"

[backend]
user = "postgres"
password = "postgres"

[tls]
mode = "allow"
cert = "router.pem"
key = "router.key"

[limits]
$(printf '%b' "$extra_limits")
$([[ "$extra_limits" == *max_clients* ]] || echo "max_clients = $((n + 100))  # the storm and the steady clients")
TOML
echo "starting the router ($router_bin) on 127.0.0.1:$router_port ..."
threads=()
((pin)) && threads=(--threads 1)
NO_COLOR=1 "${router_cmd[@]}" "$router_bin" --config "$tmp/router.toml" "${threads[@]}" >"$tmp/router.log" 2>&1 &
router_pid=$!
for _ in $(seq 300); do
    grep -q "shardgate is ready" "$tmp/router.log" && break
    kill -0 "$router_pid" 2>/dev/null || break
    sleep 0.1
done
grep -q "shardgate is ready" "$tmp/router.log" || { cat "$tmp/router.log" >&2; die "the router did not start"; }
url="postgres://app:app@127.0.0.1:$router_port/app"
PGPASSWORD=app psql -X -q -At "$url" -c "SELECT 1" >/dev/null || die "cannot log in to the router with psql"

# --- the phases --------------------------------------------------------------------------------
# run_phase NAME ARGS...: loadgen storm against the router; records NAME's verdict.
results=()
all_passed=1
run_phase() {
    local name="$1" rc=0
    shift
    echo
    echo "=== $name: loadgen storm $*"
    "${client_cmd[@]}" "$loadgen" storm --target "$url" --router-pid "$router_pid" --json "$tmp/$name.json" "$@" || rc=$?
    if [[ ! -s "$tmp/$name.json" ]]; then
        results+=("$name: ERROR (loadgen exited $rc without a report)")
        all_passed=0
    elif ((rc == 0)); then
        results+=("$name: PASS")
    else
        results+=("$name: FAIL")
        all_passed=0
    fi
    kill -0 "$router_pid" 2>/dev/null || { tail -20 "$tmp/router.log" >&2; die "the router died during $name"; }
    # Let the router see the last phase's connections close.
    sleep 2
}
# steady NAME SECONDS: `loadgen run` of point selects at --steady a second for SECONDS, in the
# background (its pid in steady_pid); its report goes to $tmp/NAME.steady.
steady_pid="" steady_rows=1000
steady() {
    steady_pid=""
    ((steady > 0)) || return 0
    # The storm's own clients take most of this machine's CPU (a PBKDF2 per login): as root the
    # steady clients run at a higher priority, so what they measure is the router's delay, not
    # their own wait for a core.
    local prio=()
    [[ $EUID -eq 0 ]] && prio=(nice -n -10)
    "${client_cmd[@]}" "${prio[@]}" "$loadgen" run --target "$url" --shardmap "$tmp/shardmap.toml" --rows-per-shard "$steady_rows" \
        --protocol extended --rate "$steady" -c 4 --duration "$2s" --quiet --json "$tmp/$1.steady.json" \
        >"$tmp/$1.steady" 2>&1 &
    steady_pid=$!
}
# steady_report NAME: waits for the steady load and prints its latency and errors.
steady_report() {
    [[ -n "$steady_pid" ]] || return 0
    wait "$steady_pid" || echo "  (loadgen run exited $?)"
    echo "--- $1: the steady clients' point selects ($steady/s, 4 connections logged in before)"
    # Its summary lines (not the per-shard and per-target tables, whose rows are its one shard).
    grep -E -i "requests|latency|p50|p99|max|error|timeout" "$tmp/$1.steady" |
        grep -v -E '^ *(shard|target) ' | sed 's/^/  /' | head -12 || true
}
# The steady clients alone, then during each storm (started a second before it and lasting
# past its end).
if ((steady > 0)); then
    "$loadgen" prepare --target "$url" --shardmap "$tmp/shardmap.toml" --rows-per-shard "$steady_rows" \
        >"$tmp/prepare.log" 2>&1 || { cat "$tmp/prepare.log" >&2; die "loadgen prepare failed"; }
    echo
    echo "=== steady: the steady clients alone"
    steady steady-alone 5
    steady_report steady-alone
fi
storm_seconds=$((n / 1000 + 10))
steady storm-plain "$storm_seconds"
((steady > 0)) && sleep 1
run_phase storm-plain --logins "$n"
steady_report storm-plain
steady storm-tls "$storm_seconds"
((steady > 0)) && sleep 1
run_phase storm-tls --logins "$n" --tls-ca "$tmp/ca.pem"
steady_report storm-tls
run_phase slowloris --silent "$silent" --silent-from 127.0.0.2 --bystander-every-ms 200 \
    --duration-s "$duration"
run_phase slowloris-tls --silent "$silent" --silent-from 127.0.0.2 --bystander-every-ms 200 \
    --duration-s "$duration" --tls-ca "$tmp/ca.pem"

echo
echo "=== results (n = $n, slowloris $silent silent connections for $duration s)"
printf '  %s\n' "${results[@]}"
((all_passed)) || exit 1
