#!/usr/bin/env bash
# The scale run in miniature on one machine: several routers in front of N shards, several
# loadgen processes started at one agreed time (--start-at) against all routers, and one merged
# report (per shard, per router, per loadgen host). With --shards 4,16,64, the same run at
# several shard counts with a fixed rate per shard, to show how throughput and p99 scale.
# See docs/benchmarks.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/fleet_local.sh [OPTIONS]

For each shard count: starts its own local cluster (deploy/local/cluster up --servers 4
--routers ROUTERS: every router on the same shard map, each on its own port), loads ROWS rows per
shard, then starts LOADGENS loadgen processes that begin at the same
wall-clock time (--start-at, 3 s ahead), each sending RATE/LOADGENS per shard through all
routers, and merges their JSON reports (loadgen merge). Prints the merged report of the
last run and a scaling table. Everything it starts is stopped and deleted on exit, also on
failure or Ctrl-C (a cluster `down` cannot stop is left with its directory, and said so).

Options:
  -n, --shards LIST          shard counts, comma-separated             [default: 64]
      --routers R            router processes                          [default: 3]
      --loadgens L           loadgen processes                         [default: 2]
  -r, --rate-per-shard R     requests a second per shard, all loadgens together [default: 50]
  -T, --duration SECONDS     measured seconds                          [default: 20]
      --warmup SECONDS       unmeasured seconds before                 [default: 5]
      --connections C        connections per loadgen                   [default: 12]
      --rows N               rows per shard                            [default: 1000]
      --out DIR              keep every report and the charts here
  -h, --help                 this text
EOF
}

shard_list=64 routers=3 loadgens=2 rate=50 duration=20 warmup=5 conns=12 rows=1000 out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--shards) shard_list="$2"; shift 2 ;;
        --routers) routers="$2"; shift 2 ;;
        --loadgens) loadgens="$2"; shift 2 ;;
        -r|--rate-per-shard) rate="$2"; shift 2 ;;
        -T|--duration) duration="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --connections) conns="$2"; shift 2 ;;
        --rows) rows="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
for n in routers loadgens duration conns rows; do
    [[ "${!n}" =~ ^[0-9]+$ && "${!n}" -gt 0 ]] || die "--${n} must be a whole number above 0, not '${!n}'"
done
[[ "$warmup" =~ ^[0-9]+$ ]] || die "--warmup must be a whole number of seconds"
[[ "$rate" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--rate-per-shard must be a number, not '$rate'"
IFS=, read -r -a shard_counts <<<"$shard_list"
for n in "${shard_counts[@]}"; do
    [[ "$n" =~ ^[0-9]+$ && "$n" -gt 0 ]] || die "--shards takes shard counts like 4,16,64, not '$n'"
done
need_tools psql python3 cargo

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-fleet.XXXXXX")"
chmod 755 "$tmp"
loadgen_pids=()
# Stops the loadgens and every cluster under $tmp; returns 1 if a cluster could not be stopped.
stop_all() {
    local p d ok=0
    for p in "${loadgen_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${loadgen_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    loadgen_pids=()
    for d in "$tmp"/c*/; do
        [[ -f "$d/cluster.json" ]] || continue
        if ! "$root/deploy/local/cluster" down --dir "$d" >/dev/null 2>&1; then
            echo "fleet_local.sh: cluster down --dir $d failed; stop it by hand (its files stay)" >&2
            ok=1
        fi
    done
    return $ok
}
cleanup() {
    trap - EXIT INT TERM
    if stop_all; then rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building loadgen and shardgate (release) ..." >&2
(cd "$root" && cargo build --release -q -p loadgen -p shardgate -p shardgate-cluster)
loadgen="$(release_dir)/loadgen"
[[ -x "$loadgen" ]] || die "no loadgen at $loadgen after the build"

# One run at `shards` shards: writes "shards qps p50_us p99_us max_us errors timeouts min max" to
# $tmp/row-$shards and leaves the merged report in $tmp/fleet-$shards.json. Runs in this shell
# (not in a command substitution), so errexit holds and cleanup sees what it started.
run_at() {
    local shards="$1" dir="$tmp/c$1" urls=() base_port router_port servers k
    servers=$((shards < 4 ? shards : 4))
    # One block of free ports: the servers', then the routers'.
    free_port base_port $((servers + routers))
    router_port=$((base_port + servers))
    echo "[$shards shards] cluster up ($servers servers, $routers routers from port $router_port) ..." >&2
    "$root/deploy/local/cluster" up --shards "$shards" --servers "$servers" --dir "$dir" \
        --base-port "$base_port" --router-port "$router_port" --routers "$routers" \
        >"$tmp/up-$shards.log" 2>&1 || { cat "$tmp/up-$shards.log" >&2; die "cluster up failed"; }
    for k in $(seq 0 $((routers - 1))); do
        urls+=("postgres://app:app@127.0.0.1:$((router_port + k))/app")
    done
    for u in "${urls[@]}"; do
        for _ in $(seq 100); do psql "$u" -qAtc 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
        psql "$u" -qAtc 'SELECT 1' >/dev/null || die "router $u does not answer (logs in $dir)"
    done
    "$loadgen" prepare --shardmap "$dir/shardmap.toml" --rows-per-shard "$rows" --quiet \
        >"$tmp/prepare-$shards.log" 2>&1 || { cat "$tmp/prepare-$shards.log" >&2; die "loadgen prepare failed"; }

    local start per_host targets=() i p
    for u in "${urls[@]}"; do targets+=(--target "$u"); done
    per_host="$(python3 -c "print($rate / $loadgens)")"
    start="$(python3 -c 'import time; print(f"{time.time() + 3:.3f}")')"
    echo "[$shards shards] $loadgens loadgens x ${per_host}/s per shard through $routers routers, starting at $start ..." >&2
    for i in $(seq 1 "$loadgens"); do
        "$loadgen" run --shardmap "$dir/shardmap.toml" "${targets[@]}" --rows-per-shard "$rows" \
            --rate-per-shard "$per_host" --connections "$conns" --warmup "${warmup}s" \
            --duration "${duration}s" --start-at "$start" --label "loadgen-$i" --threads 1 --quiet \
            --json "$tmp/lg-$shards-$i.json" >"$tmp/lg-$shards-$i.out" 2>&1 &
        loadgen_pids+=($!)
    done
    for p in "${loadgen_pids[@]}"; do
        wait "$p" || die "a loadgen failed: $(cat "$tmp"/lg-"$shards"-*.out)"
    done
    loadgen_pids=()
    "$loadgen" merge "$tmp"/lg-"$shards"-*.json --json "$tmp/fleet-$shards.json" \
        --chart "$tmp/fleet-$shards.svg" >"$tmp/fleet-$shards.txt" 2>&1 ||
        { cat "$tmp/fleet-$shards.txt" >&2; die "loadgen merge failed"; }
    "$root/deploy/local/cluster" down --dir "$dir" >/dev/null 2>&1 ||
        die "cluster down --dir $dir failed"
    python3 - "$tmp/fleet-$shards.json" "$shards" >"$tmp/row-$shards" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l = r["latency_us"]
print(sys.argv[2], round(r["qps"], 1), l["p50"], l["p99"], l["max"], r["errors"], r["timeouts"],
      round(r["shard_qps"]["min"], 2), round(r["shard_qps"]["max"], 2))
PY
}

rows_out=()
for n in "${shard_counts[@]}"; do
    run_at "$n"
    rows_out+=("$(cat "$tmp/row-$n")")
done

last="${shard_counts[${#shard_counts[@]}-1]}"
echo
echo "merged report, $last shards, $routers routers, $loadgens loadgens:"
cat "$tmp/fleet-$last.txt"
echo
echo "scaling: $rate/s per shard, $routers routers, $loadgens loadgens x $conns connections, ${duration} s after ${warmup} s warmup"
printf '%7s %12s %9s %9s %9s %8s %9s %16s\n' shards "total qps" "p50 ms" "p99 ms" "max ms" errors timeouts "per shard qps"
for row in "${rows_out[@]}"; do
    read -r n qps p50 p99 max errs tos smin smax <<<"$row"
    python3 -c "print('%7s %12s %9.3f %9.3f %9.3f %8s %9s %16s' % ('$n', '$qps', $p50/1000, $p99/1000, $max/1000, '$errs', '$tos', '$smin..$smax'))"
done
if [[ -n "$out" ]]; then
    mkdir -p "$out"
    cp "$tmp"/*.json "$tmp"/*.svg "$out"/
    echo
    echo "reports and charts in $out"
fi
