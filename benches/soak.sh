#!/usr/bin/env bash
# Soak: a local 4-shard cluster under steady loadgen load plus churn, for a long time, while the
# router's RSS, open fds and backend connections are sampled every 10 s. Issue 13, point 6.
# See docs/benchmarks.md ("Soak") and `benches/soak.sh --help`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/soak.sh [options]

Starts its own local cluster (shardgate-cluster up, N shards on N servers, free ports, a private
dir) with a shardgate router, loads kv with `loadgen prepare`, and for DURATION runs:

  - steady load through the router: `loadgen run` open loop at --rate-per-shard (mix
    read=90,update=5,insert=5, prepared protocol, 8 connections), JSON report and chart;
  - churn from bash: logins and disconnects (psql -c, pgbench -C with protocol-level named
    statements), SQL PREPARE/EXECUTE/DEALLOCATE with fresh names, SET/RESET, failing statements
    (22012 division by zero, 23505 unique violation, 42601, 42P01, an error inside a
    transaction), cancels (statement_timeout, SIGINT to psql = CancelRequest, SIGKILL of psql
    = client vanishing mid-statement), scatter reads (SELECT count(*) FROM kv);
  - one PostgreSQL server restarted every --restart-every (pg_ctl restart -m fast), in turn.

Every 10 s it samples the router: VmRSS, open fds, backend connections (sum of
shardgate_pool_open_connections from its /metrics) and loadgen's errors+timeouts so far, into
OUT/samples.csv (time_s,rss_kb,fds,backend_conns,errors_so_far). At the end it draws
OUT/soak.svg (RSS and fds over time, restarts marked) and prints a summary: RSS first/last/min/max
and its least-squares slope in KB per hour over the second half of the run, fd and connection
ranges, loadgen's totals (statements, errors, errors per million, p50/p99/max latency), churn
counts, restarts.

The cluster is always torn down on exit (the results stay in OUT). Exit status: 0 when the run
completed and the router stayed alive, 1 when the router died (or the setup failed), 2 on usage
errors.

Options:
  --duration D          how long the load runs: 30s, 10m, 1h, or seconds (default 5m)
  --bin-dir DIR         directory holding shardgate, loadgen and shardgate-cluster (default: build
                        them with `cargo build --release -p shardgate -p loadgen -p
                        shardgate-cluster`, honouring CARGO_TARGET_DIR, and use its release dir)
  --out DIR             results directory (default: a new /tmp/shardgate-soak-<date>-XXXX)
  --shards N            shard databases, one server each (default 4)
  --rate-per-shard R    loadgen open-loop rate per shard, requests/s (default 200)
  --connections N       loadgen connections (default 8)
  --rows-per-shard N    rows loaded per shard (default 10000)
  --restart-every D     restart one server this often (default 2m; 0 = never)
  --timeout D           loadgen's per-request timeout (default 15s: longer than the router's
                        [failover] hold_ms, so a held statement is latency, not a timeout)
  --help                this text

Needs: psql, pgbench and pg_ctl (PostgreSQL client and server binaries; PG_BINDIR or the
highest /usr/lib/postgresql/*/bin), python3, curl. As root the servers run as `postgres`.
EOF
}

duration_s=300 bin_dir="" out="" shards=4 rate_per_shard=200 connections=8 rows=10000
restart_every_s=120 timeout_arg=15s

to_seconds() {
    # 30s, 10m, 1h, 90 (seconds)
    local v=$1
    case "$v" in
        *h) echo $((${v%h} * 3600)) ;;
        *m) echo $((${v%m} * 60)) ;;
        *s) echo $((${v%s})) ;;
        *) echo $((v)) ;;
    esac
}

while (($#)); do
    case "$1" in
        --duration) duration_s="$(to_seconds "${2:?}")"; shift 2 ;;
        --bin-dir) bin_dir="${2:?}"; shift 2 ;;
        --out) out="${2:?}"; shift 2 ;;
        --shards) shards="${2:?}"; shift 2 ;;
        --rate-per-shard) rate_per_shard="${2:?}"; shift 2 ;;
        --connections) connections="${2:?}"; shift 2 ;;
        --rows-per-shard) rows="${2:?}"; shift 2 ;;
        --restart-every) restart_every_s="$(to_seconds "${2:?}")"; shift 2 ;;
        --timeout) timeout_arg="${2:?}"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
((duration_s >= 30)) || { echo "soak.sh: --duration must be at least 30s" >&2; exit 2; }

# --- tools ----------------------------------------------------------------------------------------
if [[ -z "${PG_BINDIR:-}" ]]; then
    PG_BINDIR="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
fi
export PG_BINDIR
export PATH="$PATH:$PG_BINDIR"
need_tools psql pgbench pg_ctl python3 curl timeout

bin_dir="$(fleet_bins "$bin_dir")"

# --- results dir, ports, cleanup -----------------------------------------------------------------
if [[ -z "$out" ]]; then
    out="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-soak-$(date -u +%Y%m%d-%H%M%S)-XXXX")"
else
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
fi
# As root PostgreSQL runs as `postgres`, which must be able to enter the cluster dir.
chmod 755 "$out"
cdir="$out/cluster"
stop="$out/.stop"
rm -f "$stop"

# The servers take base .. base+shards-1: a block that is free as a whole.
free_port base_port "$shards"
free_port router_port
free_port http_port

bg_pids=() loadgen_pid="" router_pid="" cluster_started=0
cleanup() {
    local rc=$?
    # Ignore further INT/TERM: a second Ctrl-C must not skip the teardown.
    trap - EXIT
    trap '' INT TERM
    set +e
    touch "$stop"
    for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
    if [[ -n "$loadgen_pid" ]]; then
        kill -TERM "$loadgen_pid" 2>/dev/null
        for _ in $(seq 50); do alive "$loadgen_pid" || break; sleep 0.1; done
        alive "$loadgen_pid" && kill -KILL "$loadgen_pid" 2>/dev/null
    fi
    for p in "${bg_pids[@]}" $loadgen_pid; do wait "$p" 2>/dev/null; done
    if ((cluster_started)) && [[ -f "$cdir/cluster.json" ]]; then
        SHARDGATE_REPO="$root" SHARDGATE_BIN="$bin_dir/shardgate" \
            "$bin_dir/shardgate-cluster" down --dir "$cdir" >"$out/cluster-down.log" 2>&1 ||
            echo "soak.sh: cluster down --dir $cdir failed (see $out/cluster-down.log); run it by hand" >&2
    fi
    echo "results in $out"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- cluster ---------------------------------------------------------------------------------------
echo "soak: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); results in $out"
echo "binaries: $bin_dir (shardgate built $(date -u -r "$bin_dir/shardgate" +%FT%TZ)); tree $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"
echo "starting a $shards-shard cluster in $cdir (servers $base_port.., router $router_port, http $http_port) ..."
cluster_started=1
SHARDGATE_REPO="$root" SHARDGATE_BIN="$bin_dir/shardgate" "$bin_dir/shardgate-cluster" up \
    --shards "$shards" --servers "$shards" --dir "$cdir" --base-port "$base_port" \
    --router-port "$router_port" --http-port "$http_port" --user app --password app \
    >"$out/cluster-up.log" 2>&1 || { cat "$out/cluster-up.log" >&2; die "cluster up failed"; }

json() { python3 -c "import json,sys; s=json.load(open('$cdir/cluster.json')); print($1)"; }
router_pid="$(json "s['router']['pid']")"
mapfile -t data_dirs < <(json "'\n'.join(str(x['data_dir']) for x in s['servers'])")
mapfile -t server_logs < <(json "'\n'.join(str(x['log_file']) for x in s['servers'])")
url="postgres://app:app@127.0.0.1:$router_port/app"
metrics_url="http://127.0.0.1:$http_port/metrics"
echo "router pid $router_pid, $url"

# --- data ------------------------------------------------------------------------------------------
echo "loading $rows rows per shard (loadgen prepare, straight into the shards) ..."
"$bin_dir/loadgen" prepare --shardmap "$cdir/shardmap.toml" --rows-per-shard "$rows" --quiet \
    >"$out/prepare.log" 2>&1 || { cat "$out/prepare.log" >&2; die "loadgen prepare failed"; }

alive "$router_pid" || die "the router (pid $router_pid) is not running"

# --- churn -----------------------------------------------------------------------------------------
# Each worker loops until the stop file appears and appends one line per problem to churn.err
# ("time_s worker message") and one line per round to churn.log ("worker ok|fail"). Expected
# errors (the SQLSTATEs a worker provokes) are counted as ok.
t0=$(date +%s.%N)
now_s() { local n; n=$(date +%s.%N); awk -v a="$n" -v b="$t0" 'BEGIN{printf "%.1f", a-b}'; }
export PGCONNECT_TIMEOUT=10
PSQL=(psql "$url" -X -q -At -v VERBOSITY=sqlstate)

# Runs psql with stdin as the script; expected SQLSTATEs in $1 (a regex); logs the rest.
churn_psql() {
    local worker=$1 expected=$2 outf rc bad
    outf="$(mktemp "$out/.churn-$worker.XXXX")"
    shift 2
    "$@" >"$outf" 2>&1 && rc=0 || rc=$?
    # Error lines: "psql:<stdin>:N: ERROR:  22012" or "ERROR:  22012", plus connection failures.
    bad="$(grep -E 'ERROR|FATAL|error:|server closed|connection to server|lost|could not|abort' "$outf" |
        grep -vE "ERROR: +($expected)\$" || true)"
    if [[ -n "$bad" ]]; then
        echo "$worker fail" >>"$out/churn.log"
        while IFS= read -r l; do echo "$(now_s) $worker rc=$rc $l" >>"$out/churn.err"; done <<<"$bad"
    else
        echo "$worker ok" >>"$out/churn.log"
    fi
    rm -f "$outf"
}

key() { echo $((1 + RANDOM % rows)); } # ids 1.. exist (loadgen prepare loads the low ids)

w_login() {
    while [[ ! -e "$stop" ]]; do
        churn_psql login '' "${PSQL[@]}" -c "SELECT v FROM kv WHERE id = $(key)"
        sleep 0.2
    done
}

w_prepared() {
    local i=0 n
    while [[ ! -e "$stop" ]]; do
        i=$((i + 1))
        {
            echo "SET application_name = 'soak_$i';"
            echo "SET work_mem = '$((4 + i % 8))MB';"
            echo "SET statement_timeout = '5s';"
            for n in $(seq 1 20); do
                echo "PREPARE p_${i}_$n (bigint) AS SELECT v FROM kv WHERE id = \$1;"
                echo "EXECUTE p_${i}_$n ($(key));"
            done
            for n in $(seq 1 10); do echo "DEALLOCATE p_${i}_$n;"; done
            echo "SHOW work_mem;"
            echo "RESET work_mem;"
            echo "PREPARE u_$i (bigint, text) AS UPDATE kv SET v = \$2 WHERE id = \$1;"
            echo "EXECUTE u_$i ($(key), 'soak $i');"
            echo "RESET ALL;"
            if ((i % 2)); then echo "DEALLOCATE ALL;"; fi # the other half leave 10 names to the disconnect
        } | churn_psql prepared '' "${PSQL[@]}" -f -
        sleep 0.5
    done
}

w_pgbench() {
    # Protocol-level named statements (-M prepared) on a new connection per transaction (-C).
    local f="$out/.pgbench.sql"
    printf '\\set id random(1, %d)\nSELECT v FROM kv WHERE id = :id;\n' "$rows" >"$f"
    while [[ ! -e "$stop" ]]; do
        churn_psql pgbench '' pgbench -n -M prepared -C -c 2 -j 1 -T 10 -R 10 -f "$f" "$url"
    done
}

w_errors() {
    while [[ ! -e "$stop" ]]; do
        {
            echo "SELECT 1/0;"
            echo "INSERT INTO kv (id, v) VALUES (1, 'dup');"
            echo "SELEC 1;"
            echo "SELECT * FROM no_such_table WHERE id = 1;"
            echo "BEGIN;"
            echo "SELECT v FROM kv WHERE id = $(key);"
            echo "SELECT 1/0;"
            echo "ROLLBACK;"
            echo "SELECT v FROM kv WHERE id = $(key);"
        } | churn_psql errors '22012|23505|42601|42P01' "${PSQL[@]}" -f -
        sleep 0.5
    done
}

w_cancel() {
    local i=0
    while [[ ! -e "$stop" ]]; do
        i=$((i + 1))
        case $((i % 3)) in
            0) # server-side cancel by statement_timeout
                printf "SET statement_timeout = '200ms';\nSELECT pg_sleep(2);\nRESET statement_timeout;\nSELECT 1;\n" |
                    churn_psql cancel_timeout '57014' "${PSQL[@]}" -f - ;;
            1) # psql sends a CancelRequest on SIGINT
                churn_psql cancel_request '57014' timeout -s INT 0.5 "${PSQL[@]}" -c "SELECT pg_sleep(3)" ;;
            2) # the client vanishes mid-statement
                timeout --foreground -s KILL 0.5 "${PSQL[@]}" -c "SELECT pg_sleep(3)" >/dev/null 2>&1 || true
                echo "cancel_kill ok" >>"$out/churn.log" ;;
        esac
        sleep 1
    done
}

w_scatter() {
    local c
    while [[ ! -e "$stop" ]]; do
        c="$("${PSQL[@]}" -c "SELECT count(*) FROM kv" 2>&1 || true)"
        if [[ "$c" =~ ^[0-9]+$ ]] && ((c >= rows * shards)); then
            echo "scatter ok" >>"$out/churn.log"
        else
            echo "scatter fail" >>"$out/churn.log"
            echo "$(now_s) scatter $(tr '\n' ' ' <<<"$c")" >>"$out/churn.err"
        fi
        sleep 1
    done
}

w_restarts() {
    # One server restarted every restart_every_s, in turn; the first after one interval.
    local k=0 s e rc next
    ((restart_every_s > 0)) || return 0
    next=$restart_every_s
    echo "time_s,server,duration_ms,rc" >"$out/restarts.csv"
    while [[ ! -e "$stop" ]]; do
        if (($(printf '%.0f' "$(now_s)") >= next)) && ((next + 20 < duration_s)); then
            local idx=$((k % shards))
            s=$(date +%s%N)
            as_pg "$PG_BINDIR/pg_ctl" -D "${data_dirs[$idx]}" -l "${server_logs[$idx]}" \
                restart -m fast -w -t 60 >>"$out/restarts.log" 2>&1 </dev/null && rc=0 || rc=$?
            e=$(date +%s%N)
            echo "$(now_s),$idx,$(((e - s) / 1000000)),$rc" >>"$out/restarts.csv"
            k=$((k + 1))
            next=$((next + restart_every_s))
        fi
        sleep 1
    done
}

# --- sampling --------------------------------------------------------------------------------------
loadgen_errors() {
    # Sum of the errors and timeouts in loadgen's progress lines (one a second; warmup excluded).
    [[ -s "$out/loadgen.progress" ]] || { echo 0; return; }
    awk '/^\[ *[0-9]+s\]/ { for (i = 1; i < NF; i++) if ($i == "errors" || $i == "timeouts") s += $(i + 1) }
         END { print s + 0 }' "$out/loadgen.progress"
}
backend_conns() {
    curl -s --max-time 5 "$metrics_url" 2>/dev/null |
        awk '/^shardgate_pool_open_connections[{ ]/ { s += $NF; n++ } END { if (n) print s; else print "" }'
}
sample() {
    local rss fds conns
    rss="$(awk '/^VmRSS:/ { print $2 }' "/proc/$router_pid/status" 2>/dev/null)"
    fds="$(ls "/proc/$router_pid/fd" 2>/dev/null | wc -l)"
    conns="$(backend_conns)"
    echo "$(now_s),$rss,$fds,$conns,$(loadgen_errors)" >>"$out/samples.csv"
    # 1-minute load; share of the last 10 s in which all tasks stalled on memory (PSI "full").
    echo "$(now_s) $(cut -d' ' -f1 /proc/loadavg) $(awk '/^full/ { sub("avg10=", "", $2); print $2 }' /proc/pressure/memory 2>/dev/null || echo -)" \
        >>"$out/loadavg.txt"
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$router_pid/stat" 2>/dev/null || echo 0; }

# --- run -------------------------------------------------------------------------------------------
echo "time_s,rss_kb,fds,backend_conns,errors_so_far" >"$out/samples.csv"
: >"$out/churn.log"
: >"$out/churn.err"
cpu0="$(cpu_ticks)"
curl -s --max-time 5 "$metrics_url" >"$out/metrics-start.txt" 2>/dev/null || true
echo "load: loadgen run, $rate_per_shard/s per shard, $connections connections, ${duration_s}s; churn and restarts alongside"
t0=$(date +%s.%N)
sample
"$bin_dir/loadgen" run --shardmap "$cdir/shardmap.toml" --target "$url" --rows-per-shard "$rows" \
    --rate-per-shard "$rate_per_shard" --connections "$connections" --duration "${duration_s}s" \
    --mix read=90,update=5,insert=5 --protocol prepared --timeout "$timeout_arg" \
    --json "$out/loadgen.json" --chart "$out/loadgen.svg" \
    >"$out/loadgen.txt" 2>"$out/loadgen.progress" &
loadgen_pid=$!
for w in w_login w_prepared w_pgbench w_errors w_cancel w_scatter w_restarts; do
    "$w" &
    bg_pids+=($!)
done

router_died=0
next_sample=10
while kill -0 "$loadgen_pid" 2>/dev/null; do
    if ! alive "$router_pid"; then
        router_died=1
        echo "soak: the router (pid $router_pid) died at $(now_s) s" | tee -a "$out/churn.err" >&2
        # No point loading a dead router for the rest of the run; loadgen has no graceful stop,
        # so its JSON report is lost, but samples.csv has its errors so far.
        kill -TERM "$loadgen_pid" 2>/dev/null
        break
    fi
    if (($(printf '%.0f' "$(now_s)") >= next_sample)); then
        sample
        next_sample=$((next_sample + 10))
    fi
    sleep 1
done
touch "$stop"
loadgen_rc=0
wait "$loadgen_pid" 2>/dev/null || loadgen_rc=$?
loadgen_pid=""
if alive "$router_pid"; then sample; else router_died=1; fi
cpu1="$(cpu_ticks)"
curl -s --max-time 5 "$metrics_url" >"$out/metrics-end.txt" 2>/dev/null || true
echo "waiting for the churn workers to finish their round ..."
for p in "${bg_pids[@]}"; do wait "$p" 2>/dev/null || true; done
bg_pids=()
cp "$cdir/router.log" "$out/router.log" 2>/dev/null || true

# --- report ----------------------------------------------------------------------------------------
python3 - "$out" "$router_died" "$loadgen_rc" "$((cpu1 - cpu0))" "$(getconf CLK_TCK)" <<'PY'
import csv, json, os, re, sys
from collections import Counter

out, died, loadgen_rc, cpu_ticks, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

rows = []
with open(os.path.join(out, "samples.csv")) as f:
    for r in csv.DictReader(f):
        try:
            rows.append({
                "t": float(r["time_s"]), "rss": int(r["rss_kb"]), "fds": int(r["fds"]),
                "conns": int(r["backend_conns"]) if r["backend_conns"] else None,
                "err": int(r["errors_so_far"] or 0),
            })
        except ValueError:
            pass
restarts = []
try:
    with open(os.path.join(out, "restarts.csv")) as f:
        restarts = [(float(r["time_s"]), int(r["server"]), int(r["duration_ms"]), int(r["rc"])) for r in csv.DictReader(f)]
except FileNotFoundError:
    pass

def slope_kb_per_h(pts):
    n = len(pts)
    if n < 3:
        return float("nan")
    mx = sum(t for t, _ in pts) / n
    my = sum(v for _, v in pts) / n
    sxx = sum((t - mx) ** 2 for t, _ in pts)
    sxy = sum((t - mx) * (v - my) for t, v in pts)
    return sxy / sxx * 3600 if sxx else float("nan")

print()
print("=== soak summary ===")
if rows:
    tend = rows[-1]["t"]
    half = [r for r in rows if r["t"] >= tend / 2]
    s_half = slope_kb_per_h([(r["t"], r["rss"]) for r in half])
    s_all = slope_kb_per_h([(r["t"], r["rss"]) for r in rows])
    rss = [r["rss"] for r in rows]
    print(f"samples          {len(rows)} over {tend:.0f} s (every 10 s)")
    print(f"RSS KB           first {rss[0]}  last {rss[-1]}  min {min(rss)}  max {max(rss)}  "
          f"second half: min {min(r['rss'] for r in half)} max {max(r['rss'] for r in half)}")
    print(f"RSS slope        {s_half:+.0f} KB/h over the second half ({len(half)} samples, least squares); "
          f"{s_all:+.0f} KB/h over the whole run")
    fds = [r["fds"] for r in rows]
    print(f"open fds         min {min(fds)}  max {max(fds)}  first {fds[0]}  last {fds[-1]}")
    conns = [r["conns"] for r in rows if r["conns"] is not None]
    if conns:
        print(f"backend conns    min {min(conns)}  max {max(conns)}  first {conns[0]}  last {conns[-1]}")
try:
    lines = [l.split() for l in open(os.path.join(out, "loadavg.txt")) if l.strip()]
    la = [float(p[1]) for p in lines]
    print(f"load average     mean {sum(la)/len(la):.2f}  max {max(la):.2f} (1-minute, {os.cpu_count()} cores)")
    mem = [(float(p[0]), float(p[2])) for p in lines if len(p) > 2 and p[2] != "-"]
    stalls = [f"t={t:.0f}s {v:.0f}%" for t, v in mem if v >= 5]
    if stalls:
        print("memory stalls    (PSI memory full avg10 >= 5%: the whole machine stalled) " + ", ".join(stalls))
except Exception:
    pass
if len(rows) > 1:
    gaps = [(a["t"], b["t"]) for a, b in zip(rows, rows[1:]) if b["t"] - a["t"] > 15]
    if gaps:
        print("sampler gaps     (the 10 s sampler itself was late: the machine stalled) " +
              ", ".join(f"{a:.0f}-{b:.0f}s" for a, b in gaps))

rep = None
try:
    rep = json.load(open(os.path.join(out, "loadgen.json")))
except Exception as e:
    print(f"loadgen          no JSON report ({e}); exit status {loadgen_rc}")
if rep:
    c = rep
    lat = rep["latency_us"]
    print(f"loadgen          {rep['requests']} statements in {rep['duration_s']:.0f} s ({rep['qps']:.1f} qps, target "
          f"{rep.get('target_qps') or 0:.0f}): ok {c.get('ok')}  errors {c.get('errors')}  timeouts {c.get('timeouts')}  "
          f"unsent {rep.get('unsent')}")
    print(f"                 errors per million {rep['errors_per_million']:.1f}, timeouts per million "
          f"{rep['timeouts_per_million']:.1f}; by SQLSTATE {dict(rep['errors_by_sqlstate']) or '-'}")
    print(f"latency ms       p50 {lat['p50']/1000:.3f}  p90 {lat['p90']/1000:.3f}  p99 {lat['p99']/1000:.3f}  "
          f"p99.9 {lat['p999']/1000:.3f}  max {lat['max']/1000:.3f}")
    bad = [s for s in rep.get("series", []) if s.get("errors") or s.get("timeouts") or s["max_us"] > 1_000_000]
    if bad:
        print("loadgen seconds with errors, timeouts or a latency over 1 s:")
        for s in bad[:40]:
            print(f"  t={s['t']:>5}s  ok {s.get('ok')}  errors {s.get('errors')}  "
                  f"timeouts {s.get('timeouts')}  max {s['max_us']/1000:.0f} ms")
    if rep.get("warnings"):
        print("loadgen warnings: " + "; ".join(rep["warnings"]))
    if rep["requests"]:
        print(f"router CPU       {cpu_ticks / hz:.1f} s over the run, {cpu_ticks / hz * 1e6 / rep['requests']:.0f} us per "
              f"loadgen statement (churn included)")

print(f"restarts         {len(restarts)}" + "".join(
    f"\n  t={t:.0f}s server {s}: {d} ms{'' if rc == 0 else f' (pg_ctl exit {rc})'}" for t, s, d, rc in restarts))

churn = Counter()
for l in open(os.path.join(out, "churn.log")):
    p = l.split()
    if len(p) == 2:
        churn[tuple(p)] += 1
workers = sorted({w for w, _ in churn})
print("churn rounds     " + ", ".join(f"{w} {churn[(w, 'ok')]} ok/{churn[(w, 'fail')]} fail" for w in workers))
errs = [l.rstrip("\n") for l in open(os.path.join(out, "churn.err"))]
if errs:
    print(f"churn problems   {len(errs)} lines (churn.err); first ones:")
    for l in errs[:15]:
        print("  " + l[:200])

try:
    log = open(os.path.join(out, "router.log"), errors="replace").read().splitlines()
    lv = Counter()
    for l in log:
        m = re.search(r"\b(ERROR|WARN|INFO|DEBUG)\b", l)
        if m:
            lv[m.group(1)] += 1
    print(f"router log       {len(log)} lines; " + ", ".join(f"{k} {v}" for k, v in sorted(lv.items())))
    # WARN/ERROR lines by kind: the message without timestamp, numbers and key=value details.
    kinds = Counter()
    for l in log:
        m = re.search(r"\b(ERROR|WARN)\b\s+(.*)", l)
        if m or "panic" in l:
            msg = m.group(2) if m else l
            msg = re.split(r" \w+=", msg)[0]
            kinds[(m.group(1) if m else "PANIC", re.sub(r"\d+", "N", msg)[:120])] += 1
    for (lvl, msg), n in kinds.most_common(12):
        print(f"  {n:6d} x {lvl} {msg}")
except FileNotFoundError:
    pass

# --- SVG: RSS and fds over time, restarts marked ---
if rows:
    W, H, L, R, T, B, gap = 900, 520, 80, 20, 30, 40, 50
    ph = (H - T - B - gap) / 2
    tmax = max(rows[-1]["t"], 1)
    def panel(y0, key, label, color, scale=1.0):
        vals = [r[key] / scale for r in rows]
        lo, hi = min(vals), max(vals)
        pad = max((hi - lo) * 0.1, hi * 0.01, 1)
        lo, hi = max(0, lo - pad), hi + pad
        X = lambda t: L + (W - L - R) * t / tmax
        Y = lambda v: y0 + ph - ph * (v - lo) / (hi - lo)
        s = [f'<rect x="{L}" y="{y0}" width="{W-L-R}" height="{ph}" fill="none" stroke="#999"/>',
             f'<text x="{L}" y="{y0-8}" font-size="13">{label}</text>']
        for i in range(5):
            v = lo + (hi - lo) * i / 4
            s.append(f'<text x="{L-6}" y="{Y(v)+4:.1f}" font-size="11" text-anchor="end">{v:.1f}</text>')
            s.append(f'<line x1="{L}" x2="{W-R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#eee"/>')
        for t, srv, d, rc in restarts:
            s.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{y0}" y2="{y0+ph}" stroke="#d62728" stroke-dasharray="4,3"/>')
        pts = " ".join(f"{X(r['t']):.1f},{Y(v):.1f}" for r, v in zip(rows, vals))
        s.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        return s, X
    s1, X = panel(T, "rss", "router RSS (MB); dashed: a server restarted", "#1f77b4", 1024)
    s2, _ = panel(T + ph + gap, "fds", "router open fds", "#2ca02c")
    axis = []
    for i in range(6):
        t = tmax * i / 5
        axis.append(f'<text x="{X(t):.1f}" y="{H-B+18}" font-size="11" text-anchor="middle">{t:.0f}</text>')
    axis.append(f'<text x="{(W+L)/2}" y="{H-6}" font-size="12" text-anchor="middle">seconds</text>')
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>'] + s1 + s2 + axis + ["</svg>"]
    open(os.path.join(out, "soak.svg"), "w").write("\n".join(svg) + "\n")
    print(f"files            {out}/samples.csv, soak.svg, loadgen.json, loadgen.svg, churn.log, churn.err, restarts.csv, router.log")
if died:
    print("THE ROUTER DIED")
PY

if ((router_died)); then
    echo "soak: FAILED: the router died" >&2
    exit 1
fi
exit 0
