#!/usr/bin/env bash
# Point selects with pgbench, side by side in one run: (a) direct to a shard, (b) through
# shardgate as configured by default (its autocommit statements pipelined over a few shared
# backend connections), (c) through shardgate with sharing off (`[pool] shared_connections = 0`:
# a pooled connection per statement in flight), (d) through PgBouncer (transaction pooling) in
# front of the same shard, and optionally (e) through another build of shardgate (--baseline
# REV: an older commit, built side by side). Prints throughput, the proxy's CPU time per
# statement (user and system, read from /proc by `cluster cpu`), the tail at a fixed rate, the
# ratios, and whether the goals of docs/benchmarks.md are met. See docs/benchmarks.md.
#
# Why one 1-shard cluster: through the router every key goes to the shard that owns it, so a
# fair comparison needs all three paths to end at the same database with the same rows.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/compare.sh [OPTIONS]

Starts its own 1-shard local cluster (deploy/local/cluster) with a shardgate router in a temp
dir, loads ROWS rows into kv, starts PgBouncer (transaction pooling) in front of the same shard,
and runs the same pgbench point-select script against each target, mode by mode:

    \set id random(1, ROWS)
    SELECT v FROM kv WHERE id = :id;

Everything it starts is stopped and deleted on exit, also on Ctrl-C.

Options:
  -T, --duration SECONDS  measured seconds per run                       [default: 10]
  -c, --clients N         pgbench clients (connections)                  [default: 16]
      --also-clients N    then everything again with N clients (0: not)  [default: 200]
  -j, --jobs N            pgbench threads                                [default: min(clients, 2)]
  -r, --rows N            rows in kv (ids 1..N)                          [default: 100000]
  -m, --modes LIST        pgbench -M modes, comma-separated:
                          simple,extended,prepared                       [default: all three]
  -t, --targets LIST      comma-separated: direct,shardgate,pooled,pgbouncer,baseline,
                          relay-epoll,relay-uring
                          (shardgate: the default configuration; pooled: a second process of
                          the same build and config with [pool] shared_connections = 0;
                          relay-epoll, relay-uring: a byte relay that parses nothing, on one
                          thread, waiting on its sockets with tokio (epoll) or io_uring: the
                          floor of any proxy's cost, benches/relay/main.rs)
                                                 [default: direct,shardgate,pooled,pgbouncer,
                                                  and baseline when --baseline is given]
      --baseline REV      also run a shardgate built from git revision REV (e.g. HEAD~3, a tag)
                          in front of the same shard, with the same config: "baseline" in the
                          tables, and sg/base ratios. Built in a git worktree under the temp dir
                          (a release build: minutes on 2 cores)
      --baseline-bin PATH the same with an already built shardgate binary
      --warmup SECONDS    unmeasured run through each target first       [default: 2]
      --rounds N          measure every mode N times, the targets taking turns within each
                          round, and take each figure's median (closed loop and open loop):
                          a single run moves by tens of percent on a shared machine  [default: 1]
      --router-threads N  worker threads of shardgate (--threads)        [default: its own, 1 per core]
      --pool-size N       backend connections per pool, for shardgate and PgBouncer alike
                                                                         [default: 20]
      --syscalls SECONDS  after each mode's runs, count the proxies' system calls per statement
                          over a SECONDS run under `strace -c -f` (0: not; needs strace)
                                                                         [default: 5]
      --open-loop-fraction F  after each client count's runs, the same point select at a
                          fixed rate (open loop, loadgen) through each target, mode by mode:
                          F times PgBouncer's simple-mode TPS at that client count in this run
                          (its closed-loop maximum); p50, p99 and max latency from each
                          request's scheduled time, errors and timeouts (0: not) [default: 0.5]
      --open-loop RATE    a fixed rate in requests a second instead (0: use the fraction)
                                                                         [default: 0]
      --keep              keep the temp dir (logs, configs) and print its path; the cluster
                          and PgBouncer are still stopped
  -h, --help              this text

Needs: pgbench and psql (PostgreSQL client), the PostgreSQL server binaries, cargo, and
pgbouncer (installed with `apt-get install -y pgbouncer` when missing; this needs root).

Reading the output: TPS is pgbench's "tps" (without connection time). "user us/stmt" and
"sys us/stmt" are the proxy process's CPU time over the measured run divided by the statements
pgbench completed; "direct" has no proxy. "backends" is the number of the target's connections to
the shard's server halfway through the run (pgbench's own for direct, the proxy's otherwise).
"syscalls per statement" counts every system call of the proxy process (all threads) over a
short extra run under strace. The open-loop table is loadgen's (docs/loadgen.md): latency
counts from when each request was due, so a proxy that falls behind shows it. "busy" is the
whole machine's CPU use during the run: near 100% means the machine, not the proxy, is the
limit. The last table ("goals") checks the default shardgate against PgBouncer as
docs/benchmarks.md sets the goals. The machine is shared and noisy: compare ratios within one
run, and repeat before believing a small difference.
EOF
}

duration=10 clients=16 also_clients=200 jobs="" rows=100000 modes="simple,extended,prepared"
targets="" warmup=2 router_threads="" pool_size=20 keep=0 baseline_rev="" baseline_bin="" syscall_seconds=5
open_loop=0 open_loop_fraction=0.5 rounds=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        -T|--duration) duration="${2:?}"; shift 2 ;;
        -c|--clients) clients="${2:?}"; shift 2 ;;
        --also-clients) also_clients="${2:?}"; shift 2 ;;
        --syscalls) syscall_seconds="${2:?}"; shift 2 ;;
        --open-loop) open_loop="${2:?}"; shift 2 ;;
        --open-loop-fraction) open_loop_fraction="${2:?}"; shift 2 ;;
        -j|--jobs) jobs="${2:?}"; shift 2 ;;
        -r|--rows) rows="${2:?}"; shift 2 ;;
        -m|--modes) modes="${2:?}"; shift 2 ;;
        -t|--targets) targets="${2:?}"; shift 2 ;;
        --warmup) warmup="${2:?}"; shift 2 ;;
        --rounds) rounds="${2:?}"; shift 2 ;;
        --router-threads) router_threads="${2:?}"; shift 2 ;;
        --pool-size) pool_size="${2:?}"; shift 2 ;;
        --keep) keep=1; shift ;;
        --baseline) baseline_rev="${2:?}"; shift 2 ;;
        --baseline-bin) baseline_bin="${2:?}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done
for n in duration clients also_clients syscall_seconds open_loop rows warmup pool_size rounds ${jobs:+jobs} ${router_threads:+router_threads}; do
    [[ "${!n}" =~ ^[0-9]+$ ]] || die "--${n//_/-} must be a whole number, not '${!n}'"
done
((duration > 0 && clients > 0 && rows > 0 && pool_size > 0 && rounds > 0)) || die "--duration, --clients, --rows, --pool-size and --rounds must be more than 0"
[[ "$open_loop_fraction" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--open-loop-fraction must be a number, not '$open_loop_fraction'"
jobs_given="$jobs"
jobs="${jobs_given:-$((clients < 2 ? clients : 2))}"
if ((syscall_seconds > 0)) && ! command -v strace >/dev/null; then
    echo "compare.sh: strace is not installed: no system call counts (apt-get install strace)" >&2
    syscall_seconds=0
fi
[[ -z "$baseline_rev" || -z "$baseline_bin" ]] || die "--baseline and --baseline-bin exclude each other"
if [[ -z "$targets" ]]; then
    targets="direct,shardgate,pooled,pgbouncer"
    [[ -z "$baseline_rev$baseline_bin" ]] || targets+=",baseline"
fi
IFS=, read -r -a mode_list <<<"$modes"
IFS=, read -r -a target_list <<<"$targets"
for m in "${mode_list[@]}"; do [[ "$m" =~ ^(simple|extended|prepared)$ ]] || die "unknown mode '$m'"; done
for t in "${target_list[@]}"; do [[ "$t" =~ ^(direct|shardgate|pooled|pgbouncer|baseline|relay-epoll|relay-uring)$ ]] || die "unknown target '$t'"; done
wants() { [[ ",$targets," == *",$1,"* ]]; }
if wants baseline && [[ -z "$baseline_rev$baseline_bin" ]]; then die "target baseline needs --baseline REV or --baseline-bin PATH"; fi
[[ -z "$baseline_bin" || -x "$baseline_bin" ]] || die "--baseline-bin $baseline_bin is not an executable"

need_tools pgbench psql ss cargo git

# --- PgBouncer --------------------------------------------------------------------------------
pgbouncer_bin=""
if wants pgbouncer; then
    pgbouncer_bin="$(command -v pgbouncer || true)"
    [[ -z "$pgbouncer_bin" && -x /usr/sbin/pgbouncer ]] && pgbouncer_bin=/usr/sbin/pgbouncer
    if [[ -z "$pgbouncer_bin" ]]; then
        [[ $EUID -eq 0 ]] || die "pgbouncer is not installed; install it (sudo apt-get install -y pgbouncer) or pass --targets direct,shardgate"
        echo "pgbouncer is not installed; running: apt-get install -y pgbouncer"
        # The package list may be stale or empty in a fresh container: update once and retry.
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer; then
            echo "running: apt-get update, then apt-get install -y pgbouncer again"
            apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer
        fi
        pgbouncer_bin=/usr/sbin/pgbouncer
        [[ -x "$pgbouncer_bin" ]] || die "apt-get installed pgbouncer, but $pgbouncer_bin is missing"
    fi
    pgbouncer_version="$("$pgbouncer_bin" --version | head -1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1)"
fi
# PgBouncer tracks protocol-level prepared statements in transaction mode only from 1.21 on
# (max_prepared_statements); before that `-M prepared` through it fails by design.
pgbouncer_prepared=0
if [[ -n "$pgbouncer_bin" ]]; then
    IFS=. read -r pgb_major pgb_minor _ <<<"$pgbouncer_version"
    if ((pgb_major > 1 || (pgb_major == 1 && pgb_minor >= 21))); then pgbouncer_prepared=1; fi
fi

# --- temp dir, ports, cleanup -----------------------------------------------------------------
tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-bench.XXXXXX")"
# As root PostgreSQL and PgBouncer run as `postgres`, which must be able to enter this dir.
chmod 755 "$tmp"
pgbouncer_pid="" baseline_pid="" baseline_tree="" pooled_pid="" relay_epoll_pid="" relay_uring_pid=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    stop "$baseline_pid"
    [[ -z "$baseline_tree" ]] || git -C "$root" worktree remove --force "$baseline_tree" >/dev/null 2>&1
    stop "$pooled_pid"
    stop "$pgbouncer_pid"
    stop "$relay_epoll_pid"
    stop "$relay_uring_pid"
    if [[ -f "$tmp/cluster/cluster.json" ]]; then
        "$root/deploy/local/cluster" down --dir "$tmp/cluster" >/dev/null 2>&1 ||
            echo "compare.sh: cluster down --dir $tmp/cluster failed; run it by hand" >&2
    fi
    if ((keep)); then echo "kept $tmp"; else rm -rf "$tmp"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port pg_port
free_port router_port
free_port pgbouncer_port
free_port baseline_port
free_port pooled_port
free_port relay_epoll_port
free_port relay_uring_port

# --- the baseline build (an older shardgate, side by side) ---------------------------------------
if [[ -n "$baseline_rev" ]]; then
    baseline_tree="$tmp/baseline-tree"
    echo "building shardgate at $baseline_rev (release) in $baseline_tree ..."
    git -C "$root" worktree add --detach "$baseline_tree" "$baseline_rev" >/dev/null 2>&1 ||
        die "git worktree add $baseline_rev failed"
    (cd "$baseline_tree" && CARGO_TARGET_DIR="$tmp/baseline-target" cargo build --release -q -p shardgate) ||
        die "building shardgate at $baseline_rev failed"
    baseline_bin="$tmp/baseline-target/release/shardgate"
fi

# --- cluster (builds shardgate in release mode) -----------------------------------------------
echo "building (release) and starting a 1-shard cluster with a router in $tmp/cluster ..."
if [[ -n "$router_threads" ]]; then
    # shardgate-cluster has no option for the router's threads: wrap the binary.
    (cd "$root" && cargo build --release -q -p shardgate-cluster -p shardgate)
    printf '#!/bin/sh\nexec %q "$@" --threads %q\n' "$(release_dir)/shardgate" "$router_threads" >"$tmp/shardgate"
    chmod 755 "$tmp/shardgate"
    export SHARDGATE_BIN="$tmp/shardgate"
fi
"$root/deploy/local/cluster" up --shards 1 --servers 1 --dir "$tmp/cluster" \
    --base-port "$pg_port" --router-port "$router_port" --user app --password app \
    --max-connections "$(( (clients > also_clients ? clients : also_clients) + pool_size * (2 * ${router_threads:-$(nproc)} + 1) + 50 ))" \
    >"$tmp/cluster-up.log" 2>&1 || { cat "$tmp/cluster-up.log" >&2; die "cluster up failed"; }
# Whether there is an open-loop phase at all.
open_loop_on() { ((open_loop > 0)) || awk -v f="$open_loop_fraction" 'BEGIN { exit !(f > 0) }'; }
if open_loop_on; then
    (cd "$root" && cargo build --release -q -p loadgen) || die "building loadgen failed"
fi
# Every proxy runs in a session of its own (setsid), as the cluster's router (`cluster up`
# detaches it) and PgBouncer (`-d`) do. With the kernel's autogroup scheduling
# (/proc/sys/kernel/sched_autogroup_enabled) a session is one scheduling group, and a proxy left
# in this script's session would share one group's CPU with pgbench: an A/A run of one binary
# as both shardgate and baseline gave the one in the script's session 1.3-1.6x the CPU per
# statement (docs/benchmarks.md). setsid execs in place here (a background job of a script
# leads no process group), so $! is the proxy. `in_own_session` checks each proxy's session
# against this script's (PgBouncer forks twice: it is in a session of its own, not its leader).
session_of() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $4 }'; }
in_own_session() {
    local pid="$1" what="$2" sid ours
    sid="$(session_of "$pid")" ours="$(session_of $$)"
    [[ -n "$sid" && "$sid" != "$ours" ]] ||
        die "the $what (pid $pid) is not in a session of its own (session '$sid', this script's $ours)"
}

# The router's pid: the first "pid" after "router" in the state file (servers have pids too).
router_pid="$(awk '/"router": *\{/ { r = 1 } r && /"pid":/ { gsub(/[^0-9]/, ""); print; exit }' "$tmp/cluster/cluster.json")"
[[ -n "$router_pid" ]] || die "no router pid in $tmp/cluster/cluster.json"
in_own_session "$router_pid" "cluster's router"
router_log="$tmp/cluster/router.log"
release="$(release_dir)"
cluster_bin="$release/shardgate-cluster"
loadgen_bin="$release/loadgen"
clk_tck="$("$cluster_bin" cpu $$ | awk '$1 == "ticks_per_second" { print $2 }')"

# start_router NAME BIN PORT [SED-EXPRESSION...]: another router in front of the same shard, from
# BIN: the cluster's router.toml on PORT, its shard map by full path, edited by the expressions.
# Sets NAME_pid (stopped by cleanup); its log is $tmp/NAME/router.log.
start_router() {
    local name="$1" bin="$2" port="$3" dir="$tmp/$1" edits=() e
    shift 3
    for e in "$@"; do edits+=(-e "$e"); done
    mkdir -p "$dir"
    sed -e "s|^listen = .*|listen = \"127.0.0.1:$port\"|" \
        -e "s|^shardmap = .*|shardmap = \"$tmp/cluster/shardmap.toml\"|" \
        "${edits[@]}" "$tmp/cluster/router.toml" >"$dir/router.toml"
    NO_COLOR=1 setsid "$bin" --config "$dir/router.toml" ${router_threads:+--threads "$router_threads"} \
        >"$dir/router.log" 2>&1 &
    printf -v "${name}_pid" '%s' "$!"
    for _ in $(seq 300); do grep -q "shardgate is ready" "$dir/router.log" && break; sleep 0.1; done
    grep -q "shardgate is ready" "$dir/router.log" || { cat "$dir/router.log" >&2; die "the $name router did not start"; }
    in_own_session "$!" "$name router"
}
# The baseline router, without the settings older builds do not know (they refuse unknown
# settings) and that do not change what is measured: the admin flag of the cluster's user.
if wants baseline; then
    start_router baseline "$baseline_bin" "$baseline_port" "/^admin = /d"
    baseline_log="$tmp/baseline/router.log"
fi
# The pooled router: the same build and config with sharing off, every statement on a pooled
# connection of its own.
if wants pooled; then
    start_router pooled "$release/shardgate" "$pooled_port" \
        "s|^\[pool\]\$|[pool]\nshared_connections = 0|"
    grep -q "^shared_connections = 0" "$tmp/pooled/router.toml" ||
        die "the cluster's router.toml has no [pool] section to add shared_connections to"
    pooled_log="$tmp/pooled/router.log"
fi
# The byte relays (the io_uring experiment): straight to the shard's server, as direct is.
# start_relay MODE: sets relay_MODE_pid; its output is $tmp/relay-MODE.log.
start_relay() {
    local port_var="relay_$1_port" log="$tmp/relay-$1.log"
    setsid "$release/relay" --mode "$1" --listen "127.0.0.1:${!port_var}" --upstream "127.0.0.1:$pg_port" >"$log" 2>&1 &
    printf -v "relay_$1_pid" '%s' "$!"
    for _ in $(seq 100); do grep -q "relay is ready" "$log" && break; sleep 0.1; done
    grep -q "relay is ready" "$log" || { cat "$log" >&2; die "the $1 relay did not start"; }
    in_own_session "$!" "$1 relay"
}
if wants relay-epoll || wants relay-uring; then
    (cd "$root" && cargo build --release -q -p shardgate-benches --bin relay) || die "building the relay failed"
    if wants relay-epoll; then start_relay epoll; fi
    if wants relay-uring; then start_relay uring; fi
fi
shard_db="shard_000"
export PGPASSWORD=postgres # direct and loading; the router and PgBouncer get app/app below
direct=(-h 127.0.0.1 -p "$pg_port" -U postgres "$shard_db")

echo "loading $rows rows into kv on $shard_db ..."
psql -X -q -v ON_ERROR_STOP=1 "${direct[@]}" <<SQL
INSERT INTO kv (id, v) SELECT g, 'value-' || g FROM generate_series(1, $rows) g;
VACUUM ANALYZE kv;
SQL

# --- PgBouncer config -------------------------------------------------------------------------
if [[ -n "$pgbouncer_bin" ]]; then
    mkdir -p "$tmp/pgbouncer"
    cat >"$tmp/pgbouncer/pgbouncer.ini" <<INI
; Generated by benches/compare.sh: same database, pool size and client auth as the router.
[databases]
app = host=127.0.0.1 port=$pg_port dbname=$shard_db user=postgres password=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $pgbouncer_port
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $tmp/pgbouncer/userlist.txt
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 1000
logfile = $tmp/pgbouncer/pgbouncer.log
pidfile = $tmp/pgbouncer/pgbouncer.pid
; pgbench sends this startup parameter; PgBouncer refuses unknown ones otherwise.
ignore_startup_parameters = extra_float_digits
INI
    if ((pgbouncer_prepared)); then
        echo "max_prepared_statements = 200" >>"$tmp/pgbouncer/pgbouncer.ini"
    fi
    echo '"app" "app"' >"$tmp/pgbouncer/userlist.txt"
    # PgBouncer refuses to run as root: run it as postgres then.
    run_as=()
    if [[ $EUID -eq 0 ]]; then
        chown -R postgres: "$tmp/pgbouncer"
        run_as=(runuser -u postgres --)
    fi
    "${run_as[@]}" "$pgbouncer_bin" -d "$tmp/pgbouncer/pgbouncer.ini" >"$tmp/pgbouncer/start.log" 2>&1 ||
        { cat "$tmp/pgbouncer/start.log" "$tmp/pgbouncer/pgbouncer.log" >&2 2>/dev/null; die "pgbouncer did not start"; }
    for _ in $(seq 100); do [[ -s "$tmp/pgbouncer/pgbouncer.pid" ]] && break; sleep 0.1; done
    pgbouncer_pid="$(cat "$tmp/pgbouncer/pgbouncer.pid" 2>/dev/null)" || die "pgbouncer wrote no pid file"
    in_own_session "$pgbouncer_pid" "PgBouncer"
fi

# --- measuring --------------------------------------------------------------------------------
printf '\\set id random(1, %d)\nSELECT v FROM kv WHERE id = :id;\n' "$rows" >"$tmp/point_select.sql"

# utime and stime of a process in clock ticks, as "USER SYS".
cpu_ticks() {
    "$cluster_bin" cpu "$1" | awk 'NR == 1 { print $2, $3 }'
}
# Busy and total jiffies of the whole machine (first line of /proc/stat).
machine_ticks() {
    awk '/^cpu / { idle = $5 + $6; total = 0; for (i = 2; i <= NF; i++) total += $i; print total - idle, total; exit }' /proc/stat
}

# endpoint_of TARGET: "PORT USER DATABASE" of the target (the password is the user's name, but
# for direct: postgres/postgres, straight to the shard's database).
endpoint_of() {
    case "$1" in
        direct) echo "$pg_port postgres $shard_db" ;;
        shardgate) echo "$router_port app app" ;;
        pooled) echo "$pooled_port app app" ;;
        pgbouncer) echo "$pgbouncer_port app app" ;;
        baseline) echo "$baseline_port app app" ;;
        relay-epoll) echo "$relay_epoll_port postgres $shard_db" ;;
        relay-uring) echo "$relay_uring_port postgres $shard_db" ;;
    esac
}
conn_args() { # target -> pgbench connection arguments
    local port user db
    read -r port user db < <(endpoint_of "$1")
    echo "-h 127.0.0.1 -p $port -U $user $db"
}
url_of() { # target -> its postgres:// URL, for loadgen
    local port user db
    read -r port user db < <(endpoint_of "$1")
    echo "postgres://$user:$user@127.0.0.1:$port/$db"
}
password_of() { local user; read -r _ user _ < <(endpoint_of "$1"); echo "$user"; }
pid_of() {
    case "$1" in
        shardgate) echo "$router_pid" ;;
        pooled) echo "$pooled_pid" ;;
        pgbouncer) echo "$pgbouncer_pid" ;;
        baseline) echo "$baseline_pid" ;;
        relay-epoll) echo "$relay_epoll_pid" ;;
        relay-uring) echo "$relay_uring_pid" ;;
        *) echo "" ;;
    esac
}

# run_pgbench TARGET MODE SECONDS OUTFILE
run_pgbench() {
    # shellcheck disable=SC2046 # conn_args is meant to split into words
    PGPASSWORD="$(password_of "$1")" pgbench -n -M "$2" -c "$clients" -j "$jobs" -T "$3" \
        -f "$tmp/point_select.sql" $(conn_args "$1") >"$4" 2>&1
}

if ((warmup > 0)); then
    echo "warming up: ${warmup}s through each target ..."
    for t in "${target_list[@]}"; do
        run_pgbench "$t" simple "$warmup" "$tmp/warmup-$t.log" ||
            { tail -20 "$tmp/warmup-$t.log" >&2; die "warm-up through $t failed"; }
    done
fi

router_log_lines_before="$(wc -l <"$router_log")"
results="$tmp/results.txt"
: >"$results"

# backends TARGET: the target's open TCP connections to the shard's server now (pgbench's own
# for direct, the proxy's pool otherwise), from `ss -p`.
backends() {
    local who
    case "$1" in
        direct) who='(("pgbench",' ;;
        *) who="pid=$(pid_of "$1")," ;;
    esac
    ss -Htnp state established "( dport = :$pg_port )" | grep -cF "$who" || true
}

# syscalls_per_stmt TARGET MODE: system calls of the proxy per statement, over a short run
# under `strace -c -f` (strace slows the proxy; the count per statement is what is kept).
syscalls_per_stmt() {
    local pid out n calls
    pid="$(pid_of "$1")"
    [[ -n "$pid" ]] || { echo "-"; return; }
    out="$tmp/strace-$1-$2-$clients.txt"
    strace -c -f -q -p "$pid" -o "$out" &
    local strace_pid=$!
    sleep 0.5
    run_pgbench "$1" "$2" "$syscall_seconds" "$out.pgbench" || true
    kill -INT "$strace_pid" 2>/dev/null || true
    wait "$strace_pid" 2>/dev/null || true
    n="$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out.pgbench")"
    calls="$(awk '$NF == "total" { print $4 }' "$out" 2>/dev/null)"
    if [[ -n "$n" && "$n" -gt 0 && -n "$calls" ]]; then
        awk -v c="$calls" -v n="$n" 'BEGIN { printf "%.2f", c / n }'
    else
        echo "-"
    fi
}

# ratio A B and sum A B of two figures, "-" where either is missing.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
sum() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "-" || b == "-") print "-"; else printf "%.2f", a + b }'; }
# total_ratio KEY_A KEY_B: the total (user + sys) CPU per statement of run A over run B's.
total_ratio() { ratio "$(sum "${user_us[$1]:-}" "${sys_us[$1]:-}")" "$(sum "${user_us[$2]:-}" "${sys_us[$2]:-}")"; }

declare -A tps user_us sys_us conns syscalls
# measure_one MODE TARGET KEY LABEL: one closed-loop run of MODE through TARGET; its figures
# under KEY, its row in the table under LABEL.
measure_one() {
    local mode="$1" t="$2" key="$3" label="$4" pid out ok sampler busy n failed t_tps total
    local u0 s0 u1 s1 busy0 total0 busy1 total1
    pid="$(pid_of "$t")"
    [[ -z "$pid" ]] || kill -0 "$pid" 2>/dev/null || die "$t (pid $pid) is not running any more"
    [[ -z "$pid" ]] || read -r u0 s0 < <(cpu_ticks "$pid")
    read -r busy0 total0 < <(machine_ticks)
    out="$tmp/pgbench-$mode-$t-$clients-$round.log"
    ok=1
    (sleep "$(awk -v d="$duration" 'BEGIN { print d / 2 }')"; backends "$t" >"$out.backends" 2>/dev/null) &
    sampler=$!
    run_pgbench "$t" "$mode" "$duration" "$out" || ok=0
    wait "$sampler" 2>/dev/null || true
    conns[$key]="$(cat "$out.backends" 2>/dev/null || echo -)"
    read -r busy1 total1 < <(machine_ticks)
    [[ -z "$pid" ]] || read -r u1 s1 < <(cpu_ticks "$pid")
    busy="$(awk -v b=$((busy1 - busy0)) -v t=$((total1 - total0)) 'BEGIN { printf "%.0f%%", t ? 100 * b / t : 0 }')"
    n="$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")"
    failed="$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$out")"
    t_tps="$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$out")"
    if ((!ok)) || [[ -z "$n" || -z "$t_tps" ]]; then
        printf '%-9s %-11s %10s   pgbench failed; its output ends:\n' "$label" "$t" FAILED | tee -a "$results"
        tail -5 "$out" | sed 's/^/    /' | tee -a "$results"
        return
    fi
    tps[$key]="$t_tps"
    if [[ -n "$pid" && "$n" -gt 0 ]]; then
        user_us[$key]="$(awk -v d=$((u1 - u0)) -v n="$n" -v hz="$clk_tck" 'BEGIN { printf "%.2f", d * 1e6 / hz / n }')"
        sys_us[$key]="$(awk -v d=$((s1 - s0)) -v n="$n" -v hz="$clk_tck" 'BEGIN { printf "%.2f", d * 1e6 / hz / n }')"
        total="$(awk -v a="${user_us[$key]}" -v b="${sys_us[$key]}" 'BEGIN { printf "%.2f", a + b }')"
    else
        user_us[$key]="-" sys_us[$key]="-" total="-"
    fi
    printf '%-9s %-11s %10.0f %8s %13s %12s %14s %6s %9s\n' "$label" "$t" "$t_tps" "${failed:-0}" \
        "${user_us[$key]}" "${sys_us[$key]}" "$total" "$busy" "${conns[$key]}" | tee -a "$results"
}

# median VALUES...: the median of the numbers given ("-" when none is).
median() {
    printf '%s\n' "$@" | { grep -E '^[0-9.]+$' || true; } | sort -g |
        awk '{ a[NR] = $1 } END { if (!NR) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# median_of ARRAY KEY: ARRAY[KEY] becomes the median of ARRAY[KEY#1] .. ARRAY[KEY#rounds] ("-"
# when no round has a figure).
median_of() {
    local -n figures="$1"
    local key="$2" r values=()
    for ((r = 1; r <= rounds; r++)); do values+=("${figures[$key#$r]:-}"); done
    figures[$key]="$(median "${values[@]}")"
}

# medians KEY: each closed-loop figure of KEY as the median of its rounds.
medians() {
    local key="$1" a
    for a in tps user_us sys_us; do median_of "$a" "$key"; done
    # (Connections are counted, not measured: the last round's count.)
    conns[$key]="${conns[$key#$rounds]:--}"
    [[ "${tps[$key]}" != "-" ]] || unset "tps[$key]"
}

# pair_ratios A B LABEL: per mode, target A's TPS and CPU per statement over target B's, at
# the current client count, headed "x LABEL".
pair_ratios() {
    local a b mode
    echo | tee -a "$results"
    printf '%-9s %16s %16s %16s %17s\n' ratios "TPS $3" "user/stmt $3" "sys/stmt $3" "total/stmt $3" | tee -a "$results"
    for mode in "${mode_list[@]}"; do
        a="$clients/$mode/$1" b="$clients/$mode/$2"
        printf '%-9s %16s %16s %16s %17s\n' "$mode" \
            "$(ratio "${tps[$a]:-}" "${tps[$b]:-}")" \
            "$(ratio "${user_us[$a]:-}" "${user_us[$b]:-}")" \
            "$(ratio "${sys_us[$a]:-}" "${sys_us[$b]:-}")" \
            "$(total_ratio "$a" "$b")" | tee -a "$results"
    done
}

# measure CLIENTS: every mode through every target with CLIENTS pgbench clients, then ratios.
measure() {
    clients="$1"
    jobs="${jobs_given:-$((clients < 2 ? clients : 2))}"
    printf '\n%s, %s, %d cores, %s; pgbench -c %d -j %d -T %d, %d rows, %s\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -m)" "$(nproc)" "$(psql --version | head -1)" \
        "$clients" "$jobs" "$duration" "$rows" "${pgbouncer_bin:+PgBouncer $pgbouncer_version}" | tee -a "$results"
    header="$(printf '%-9s %-11s %10s %8s %13s %12s %14s %6s %9s' mode target TPS failed 'user us/stmt' 'sys us/stmt' 'total us/stmt' busy backends)"
    echo "$header" | tee -a "$results"

    for mode in "${mode_list[@]}"; do
        for ((round = 1; round <= rounds; round++)); do
            for t in "${target_list[@]}"; do
                if [[ "$t" == pgbouncer && "$mode" == prepared ]] && ((!pgbouncer_prepared)); then
                    ((round == 1)) && printf '%-9s %-11s %10s   (PgBouncer %s has no prepared statements in transaction mode; needs 1.21+)\n' \
                        "$mode" "$t" - "$pgbouncer_version" | tee -a "$results"
                    continue
                fi
                if ((rounds == 1)); then
                    measure_one "$mode" "$t" "$clients/$mode/$t" "$mode"
                else
                    measure_one "$mode" "$t" "$clients/$mode/$t#$round" "$mode/$round"
                fi
            done
        done
        if ((rounds > 1)); then
            for t in "${target_list[@]}"; do
                [[ "$t" == pgbouncer && "$mode" == prepared ]] && ((!pgbouncer_prepared)) && continue
                key="$clients/$mode/$t"
                medians "$key"
                [[ -n "${tps[$key]:-}" ]] || continue
                printf '%-9s %-11s %10.0f %8s %13s %12s %14s %6s %9s\n' "$mode" "$t" "${tps[$key]}" "" \
                    "${user_us[$key]}" "${sys_us[$key]}" "$(sum "${user_us[$key]}" "${sys_us[$key]}")" median "${conns[$key]}" | tee -a "$results"
            done
        fi
        if ((syscall_seconds > 0)); then
            for t in "${target_list[@]}"; do
                [[ -n "$(pid_of "$t")" ]] || continue
                [[ "$t" == pgbouncer && "$mode" == prepared ]] && ((!pgbouncer_prepared)) && continue
                syscalls["$clients/$mode/$t"]="$(syscalls_per_stmt "$t" "$mode")"
            done
        fi
    done

    # Ratios, per mode, where both sides ran.
    echo | tee -a "$results"
    printf '%-9s %-11s %12s %16s %15s %17s %14s\n' ratios proxy 'TPS x/pgb' 'user/stmt x/pgb' 'sys/stmt x/pgb' 'total/stmt x/pgb' 'TPS x/direct' | tee -a "$results"
    for mode in "${mode_list[@]}"; do
        for proxy in shardgate pooled; do
            wants "$proxy" || continue
            sg="$clients/$mode/$proxy" pb="$clients/$mode/pgbouncer" dr="$clients/$mode/direct"
            printf '%-9s %-11s %12s %16s %15s %17s %14s\n' "$mode" "$proxy" \
                "$(ratio "${tps[$sg]:-}" "${tps[$pb]:-}")" \
                "$(ratio "${user_us[$sg]:-}" "${user_us[$pb]:-}")" \
                "$(ratio "${sys_us[$sg]:-}" "${sys_us[$pb]:-}")" \
                "$(total_ratio "$sg" "$pb")" \
                "$(ratio "${tps[$sg]:-}" "${tps[$dr]:-}")" | tee -a "$results"
        done
    done
    if wants baseline; then pair_ratios shardgate baseline sg/base; fi
    if wants relay-epoll && wants relay-uring; then pair_ratios relay-uring relay-epoll ur/ep; fi
    if ((syscall_seconds > 0)); then
        echo | tee -a "$results"
        printf '%-9s %-11s %22s\n' syscalls target "per statement (strace -c)" | tee -a "$results"
        for mode in "${mode_list[@]}"; do
            for t in "${target_list[@]}"; do
                [[ -n "${syscalls["$clients/$mode/$t"]:-}" ]] || continue
                printf '%-9s %-11s %22s\n' "$mode" "$t" "${syscalls["$clients/$mode/$t"]}" | tee -a "$results"
            done
        done
    fi
}

# open_loop_rate CLIENTS: the fixed rate for CLIENTS: --open-loop, or --open-loop-fraction of
# PgBouncer's simple-mode TPS at CLIENTS in this run (empty when neither applies).
open_loop_rate() {
    if ((open_loop > 0)); then echo "$open_loop"; return; fi
    local pgb="${tps["$1/simple/pgbouncer"]:-}"
    [[ -n "$pgb" ]] || return 0
    awk -v t="$pgb" -v f="$open_loop_fraction" 'BEGIN { r = int(t * f); if (r > 0) print r }'
}

# open_loop_one CLIENTS MODE TARGET KEY LABEL RATE: one open-loop run; its p99 and p50 (µs)
# under KEY, its row under LABEL.
open_loop_one() {
    local n="$1" mode="$2" t="$3" key="$4" label="$5" rate="$6" out p q row
    out="$tmp/open-$mode-$t-$n-$round.json"
    if ! "$loadgen_bin" run --target "$(url_of "$t")" --rows-per-shard "$rows" -c "$n" --rate "$rate" \
        --protocol "$mode" -d "${duration}s" --warmup 1s --quiet --json "$out" >"$out.log" 2>&1; then
        printf '%-9s %-11s   loadgen failed; its output ends:\n' "$label" "$t" | tee -a "$results"
        tail -5 "$out.log" | sed 's/^/    /' | tee -a "$results"
        return
    fi
    # loadgen's report: its p99 and p50 in µs on the first line, the table's columns on
    # the second.
    { read -r p q; IFS= read -r row; } < <(python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l = r["latency_us"]
ms = lambda us: f"{us / 1000:8.2f}"
print(l["p99"], l["p50"])
print(f'{r["qps"]:9.0f} {ms(l["p50"])} {ms(l["p99"])} {ms(l["p999"])} {ms(l["max"])} {r["errors"]:7d} {r["timeouts"]:9d}')
PY
    )
    p99[$key]="$p"
    p50[$key]="$q"
    printf '%-9s %-11s %s\n' "$label" "$t" "$row" | tee -a "$results"
}

# open_loop_runs CLIENTS: every mode through every target at the fixed rate over CLIENTS
# connections (loadgen, latency from each request's scheduled time), then the p99 ratios.
declare -A p99 p50 rate_of
open_loop_runs() {
    local n="$1" mode t out row p q key rate
    rate="$(open_loop_rate "$n")"
    if [[ -z "$rate" ]]; then
        echo "open loop at $n clients: skipped (no PgBouncer simple-mode figure to take a fraction of; give --open-loop RATE)" | tee -a "$results"
        return
    fi
    rate_of[$n]="$rate"
    echo | tee -a "$results"
    printf 'open loop: %s requests/s in total (%s) over %d connections, %ds per run (loadgen); latency in ms\n' \
        "$rate" "$( ((open_loop > 0)) && echo "--open-loop" || echo "$open_loop_fraction x PgBouncer's simple TPS")" \
        "$n" "$duration" | tee -a "$results"
    printf '%-9s %-11s %9s %8s %8s %8s %8s %7s %9s\n' mode target QPS p50 p99 p99.9 max errors timeouts | tee -a "$results"
    for mode in "${mode_list[@]}"; do
        for ((round = 1; round <= rounds; round++)); do
            for t in "${target_list[@]}"; do
                [[ "$t" == pgbouncer && "$mode" == prepared ]] && ((!pgbouncer_prepared)) && continue
                if ((rounds == 1)); then
                    open_loop_one "$n" "$mode" "$t" "$n/$mode/$t" "$mode" "$rate"
                else
                    open_loop_one "$n" "$mode" "$t" "$n/$mode/$t#$round" "$mode/$round" "$rate"
                fi
            done
        done
        ((rounds > 1)) || continue
        for t in "${target_list[@]}"; do
            [[ "$t" == pgbouncer && "$mode" == prepared ]] && ((!pgbouncer_prepared)) && continue
            key="$n/$mode/$t"
            median_of p99 "$key"
            median_of p50 "$key"
            [[ "${p99[$key]}" != "-" ]] || { unset "p99[$key]" "p50[$key]"; continue; }
            printf '%-9s %-11s %9s %8.2f %8.2f   (median of %d rounds)\n' "$mode" "$t" "" \
                "$(awk -v v="${p50[$key]}" 'BEGIN { print v / 1000 }')" \
                "$(awk -v v="${p99[$key]}" 'BEGIN { print v / 1000 }')" "$rounds" | tee -a "$results"
        done
    done
    echo | tee -a "$results"
    printf '%-9s %-11s %14s %17s\n' ratios proxy 'p99 x/pgb' 'p99 x/direct' | tee -a "$results"
    for mode in "${mode_list[@]}"; do
        for t in shardgate pooled; do
            wants "$t" || continue
            key="$n/$mode"
            printf '%-9s %-11s %14s %17s\n' "$mode" "$t" "$(ratio "${p99[$key/$t]:-}" "${p99[$key/pgbouncer]:-}")" \
                "$(ratio "${p99[$key/$t]:-}" "${p99[$key/direct]:-}")" | tee -a "$results"
        done
    done
}

# goal WHAT CLIENTS MODE VALUE LIMIT OP: one line of the goals table; OP is <= or >=, VALUE
# "-" when it was not measured.
goal() {
    local verdict
    verdict="$(awk -v v="$4" -v l="$5" -v op="$6" 'BEGIN {
        if (v == "" || v == "-") { print "not measured"; exit }
        ok = (op == "<=") ? (v + 0 <= l + 0) : (v + 0 >= l + 0)
        print ok ? "met" : "NOT MET" }')"
    printf '%-34s %7s %-9s %10s %8s %s\n' "$1" "$2" "$3" "${4:--}" "$6 $5" "$verdict" | tee -a "$results"
}

# goals: the default shardgate against PgBouncer, as docs/benchmarks.md sets the goals.
goals() {
    local n mode sg pb
    wants shardgate && wants pgbouncer || return 0
    echo | tee -a "$results"
    echo "goals: the default shardgate against PgBouncer in this run (docs/benchmarks.md)" | tee -a "$results"
    printf '%-34s %7s %-9s %10s %8s %s\n' goal clients mode value limit verdict | tee -a "$results"
    for n in "$clients_first" ${also_clients/#0/}; do
        for mode in simple extended; do
            [[ ",$modes," == *",$mode,"* ]] || continue
            sg="$n/$mode/shardgate" pb="$n/$mode/pgbouncer"
            goal "total CPU/stmt x PgBouncer" "$n" "$mode" \
                "$(total_ratio "$sg" "$pb")" 1.00 "<="
            goal "user CPU us/stmt" "$n" "$mode" "${user_us[$sg]:--}" 3 "<="
            goal "TPS x PgBouncer" "$n" "$mode" "$(ratio "${tps[$sg]:-}" "${tps[$pb]:-}")" 1.00 ">="
            if [[ -n "${rate_of[$n]:-}" ]]; then
                goal "p99 at ${rate_of[$n]}/s x PgBouncer" "$n" "$mode" "$(ratio "${p99[$sg]:-}" "${p99[$pb]:-}")" 1.00 "<="
                goal "p50 at ${rate_of[$n]}/s - PgBouncer's, us" "$n" "$mode" \
                    "$(awk -v a="${p50[$sg]:-}" -v b="${p50[$pb]:-}" 'BEGIN { if (a == "" || b == "") print "-"; else print a - b }')" 100 "<="
            fi
        done
        if [[ ",$modes," == *",prepared,"* ]]; then
            for mode in simple extended; do
                sg="$n/prepared/shardgate" pb="$n/$mode/shardgate"
                goal "prepared CPU/stmt x $mode's" "$n" prepared \
                    "$(total_ratio "$sg" "$pb")" 1.00 "<="
            done
        fi
        if ((n >= 200)); then
            for mode in "${mode_list[@]}"; do
                goal "backend connections" "$n" "$mode" "${conns[$n/$mode/shardgate]:--}" 4 "<="
            done
        fi
    done
}

clients_first="$clients"
measure "$clients"
if open_loop_on; then open_loop_runs "$clients"; fi
if ((also_clients > 0)); then
    measure "$also_clients"
    if open_loop_on; then open_loop_runs "$also_clients"; fi
fi
goals

# Anything the router complained about during the measured runs is worth a look.
if wants pooled; then
    pooled_lines="$(grep -E ' (WARN|ERROR) ' "$pooled_log" || true)"
    if [[ -n "$pooled_lines" ]]; then
        echo
        echo "shardgate (pooled) logged $(wc -l <<<"$pooled_lines") warnings/errors; the first 20:"
        head -20 <<<"$pooled_lines" | sed 's/^/    /'
    fi
fi
if wants shardgate; then
    new_lines="$(tail -n +"$((router_log_lines_before + 1))" "$router_log" | grep -E ' (WARN|ERROR) ' || true)"
    if [[ -n "$new_lines" ]]; then
        echo
        echo "shardgate logged $(wc -l <<<"$new_lines") warnings/errors during the runs; the first 20:"
        head -20 <<<"$new_lines" | sed 's/^/    /'
    else
        echo
        echo "shardgate logged no warnings or errors during the runs."
    fi
fi
