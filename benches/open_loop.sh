#!/usr/bin/env bash
# Open-loop latency at a fixed rate per shard: loadgen beside pgbench's own open loop (the
# reference), straight to the shards and through shardgate, in one run; optionally also an
# older loadgen build (before/after). Ends with `loadgen compare` of direct vs through the
# router: the router's cost as users see it. See docs/loadgen.md and docs/benchmarks.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/open_loop.sh [OPTIONS]

Starts its own local cluster (deploy/local/cluster: N shards with a shardgate router) in a temp
dir, loads ROWS rows per shard, and at RATE requests a second per shard runs, one after the other
and for the same time, the same prepared point select (SELECT v FROM kv WHERE id = $1):

  pgbench direct    one pgbench --rate RATE per shard, all at once, straight to its primary
  loadgen direct    loadgen run --shardmap (straight to every primary) --rate-per-shard RATE
  loadgen router    the same through the router
  pgbench router    one pgbench --rate N*RATE through the router

Latency is from each request's scheduled time for both tools (pgbench's per-transaction log
includes its schedule lag, loadgen's send lag is reported beside it). Everything it starts is
stopped and deleted on exit.

Options:
  -n, --shards N             shards (and servers, up to 4)              [default: 4]
  -r, --rate R               requests a second per shard                [default: 500]
  -T, --duration SECONDS     measured seconds per run                   [default: 10]
  -c, --connections C        connections per shard, both tools          [default: 2]
      --rows N               rows per shard                             [default: 100000]
      --baseline-bin PATH    also run this (older) loadgen binary, direct and through the
                             router: "before" rows in the table, and a compare of each
      --out DIR              keep the JSON reports, the charts and the compare tables here
  -h, --help                 this text
EOF
}

shards=4 rate=500 duration=10 conns=2 rows=100000 baseline_bin="" out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--shards) shards="$2"; shift 2 ;;
        -r|--rate) rate="$2"; shift 2 ;;
        -T|--duration) duration="$2"; shift 2 ;;
        -c|--connections) conns="$2"; shift 2 ;;
        --rows) rows="$2"; shift 2 ;;
        --baseline-bin) baseline_bin="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
for n in shards duration conns rows; do
    [[ "${!n}" =~ ^[0-9]+$ && "${!n}" -gt 0 ]] || die "--${n} must be a whole number above 0, not '${!n}'"
done
[[ "$rate" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--rate must be a number, not '$rate'"
[[ -z "$baseline_bin" || -x "$baseline_bin" ]] || die "--baseline-bin $baseline_bin is not an executable"
need_tools pgbench psql python3 cargo

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-open-loop.XXXXXX")"
chmod 755 "$tmp"
cleanup() {
    trap - EXIT INT TERM
    if [[ -f "$tmp/cluster/cluster.json" ]]; then
        "$root/deploy/local/cluster" down --dir "$tmp/cluster" >/dev/null 2>&1 ||
            echo "open_loop.sh: cluster down --dir $tmp/cluster failed; run it by hand" >&2
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

echo "building loadgen and shardgate (release) ..." >&2
(cd "$root" && cargo build --release -q -p loadgen -p shardgate -p shardgate-cluster)
loadgen="$(release_dir)/loadgen"

servers=$((shards < 4 ? shards : 4))
# Servers listen on BASE .. BASE+servers-1: a free block well away from the usual 5433.
free_port base_port "$servers"
free_port router_port
echo "starting $shards shards on $servers servers and a router in $tmp/cluster ..." >&2
"$root/deploy/local/cluster" up --shards "$shards" --servers "$servers" --dir "$tmp/cluster" \
    --base-port "$base_port" --router-port "$router_port" >"$tmp/up.log" 2>&1 ||
    { cat "$tmp/up.log" >&2; die "cluster up failed"; }
map="$tmp/cluster/shardmap.toml"
router="postgres://app:app@127.0.0.1:$router_port/app"
mapfile -t primaries < <(sed -n 's/^primary = "\(.*\)"$/\1/p' "$map")
[[ ${#primaries[@]} -eq $shards ]] || die "expected $shards primaries in $map"

echo "loading $rows rows per shard ..." >&2
"$loadgen" prepare --shardmap "$map" --rows-per-shard "$rows" --quiet

# Keys 1..N*ROWS are spread over the shards by hash: a shard's pgbench looks up ids of every
# shard, most of them absent there; an absent key costs the same index probe.
cat >"$tmp/select.sql" <<SQL
\set id random(1, $((rows * shards)))
SELECT v FROM kv WHERE id = :id;
SQL

pgbench_logs() { # prefix -> "p50 p99 p999 max lag_p50 lag_p99" in µs
    # shellcheck disable=SC2086 # $1 is a glob
    cat "$tmp"/$1.* | python3 -c '
import sys
rows = [l.split() for l in sys.stdin if l.strip()]
lat = sorted(int(r[2]) for r in rows)
lag = sorted(int(r[6]) for r in rows if len(r) > 6)
q = lambda v, p: v[min(len(v) - 1, int(p * len(v)))] if v else 0
print(q(lat, .5), q(lat, .99), q(lat, .999), lat[-1] if lat else 0, q(lag, .5), q(lag, .99))'
}

run_pgbench_direct() {
    local i=0 pids=()
    for url in "${primaries[@]}"; do
        (cd "$tmp" && pgbench -n -M prepared -f "$tmp/select.sql" -c "$conns" -j 1 -T "$duration" \
            --rate "$rate" -l --log-prefix="log-direct-$i" "$url" >"$tmp/pgb-direct-$i.out" 2>&1) &
        pids+=($!)
        i=$((i + 1))
    done
    for p in "${pids[@]}"; do wait "$p" || die "pgbench direct failed: $(cat "$tmp"/pgb-direct-*.out)"; done
    pgbench_logs "log-direct-*"
}

run_pgbench_router() {
    local total
    total="$(python3 -c "print($rate * $shards)")"
    (cd "$tmp" && pgbench -n -M prepared -f "$tmp/select.sql" -c "$((conns * shards))" -j 2 \
        -T "$duration" --rate "$total" -l --log-prefix=log-router "$router" >"$tmp/pgb-router.out" 2>&1) ||
        die "pgbench through the router failed: $(cat "$tmp/pgb-router.out")"
    pgbench_logs "log-router"
}

run_loadgen() { # binary name [--target URL] -> "p50 p99 p999 max lag_p50 lag_p99"
    local bin="$1" name="$2"
    shift 2
    "$bin" run --shardmap "$map" "$@" --rows-per-shard "$rows" --rate-per-shard "$rate" \
        --connections "$((conns * shards))" --duration "${duration}s" --quiet \
        --json "$tmp/$name.json" >"$tmp/$name.out" 2>&1 || die "$name failed: $(cat "$tmp/$name.out")"
    python3 - "$tmp/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l, g = r["latency_us"], r.get("send_lag_us") or {}
print(l["p50"], l["p99"], l["p999"], l["max"], g.get("p50", "-"), g.get("p99", "-"))
PY
}

declare -A result
echo "pgbench direct ($shards x --rate $rate) ..." >&2
result[pgbench_direct]="$(run_pgbench_direct)"
echo "loadgen direct ..." >&2
result[loadgen_direct]="$(run_loadgen "$loadgen" loadgen-direct)"
echo "loadgen through the router ..." >&2
result[loadgen_router]="$(run_loadgen "$loadgen" loadgen-router --target "$router")"
echo "pgbench through the router ..." >&2
result[pgbench_router]="$(run_pgbench_router)"
order=(pgbench_direct loadgen_direct loadgen_router pgbench_router)
if [[ -n "$baseline_bin" ]]; then
    echo "baseline loadgen ($baseline_bin) direct and through the router ..." >&2
    result[baseline_direct]="$(run_loadgen "$baseline_bin" baseline-direct)"
    result[baseline_router]="$(run_loadgen "$baseline_bin" baseline-router --target "$router")"
    order+=(baseline_direct baseline_router)
fi

echo
echo "open loop, $rate/s per shard x $shards shards, $conns connections per shard, ${duration} s each, prepared point selects"
echo "latency from the scheduled time; lag = scheduled -> sent (pgbench: its schedule lag)"
printf '%-18s %9s %9s %9s %9s %11s %11s\n' "client, path" "p50 ms" "p99 ms" "p99.9 ms" "max ms" "lag p50 µs" "lag p99 µs"
for k in "${order[@]}"; do
    read -r p50 p99 p999 max g50 g99 <<<"${result[$k]}"
    python3 -c "
ms = lambda v: '%.3f' % (int(v) / 1000)
print('%-18s %9s %9s %9s %9s %11s %11s' % ('${k/_/ }', ms($p50), ms($p99), ms($p999), ms($max), '$g50', '$g99'))"
done
echo
echo "loadgen compare: direct (before) vs through the router (after)"
"$loadgen" compare "$tmp/loadgen-direct.json" "$tmp/loadgen-router.json" --shards 8 \
    --chart "$tmp/compare.svg" 2>/dev/null
if [[ -n "$baseline_bin" ]]; then
    for path in direct router; do
        echo
        echo "loadgen compare: baseline loadgen (before) vs this loadgen (after), $path"
        "$loadgen" compare "$tmp/baseline-$path.json" "$tmp/loadgen-$path.json" --shards 0 2>/dev/null
    done
fi
if [[ -n "$out" ]]; then
    mkdir -p "$out"
    "$loadgen" merge "$tmp/loadgen-router.json" --chart "$tmp/router.svg" >/dev/null 2>&1
    cp "$tmp"/*.json "$tmp"/*.svg "$out"/
    echo
    echo "reports and charts in $out"
fi
