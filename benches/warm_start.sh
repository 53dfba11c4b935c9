#!/usr/bin/env bash
# The first seconds after a router starts, with and without warm start ([pool] warm_connections,
# and sharing, [pool] shared_connections, on or off):
# a local cluster of many shards, the router started afresh, loadgen at a fixed rate per shard
# through it from the moment /ready says 200. Prints time to ready and, per run, throughput,
# p50/p99/max and errors of the first DURATION seconds, and the backend connections open at
# ready, and the same window again on the warm router (the steady state). See docs/benchmarks.md
# ("Warm start").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/warm_start.sh [OPTIONS]

  -n, --shards N          shards (on 4 servers)                       [default: 512]
  -r, --rate R            requests a second per shard                  [default: 20]
  -T, --duration SECONDS  measured seconds from ready                  [default: 10]
      --warm LIST         warm_connections values to compare           [default: 0,1]
      --shared LIST       shared_connections values to compare, each with every warm value
                          ("-" = the router's default)                 [default: -]
      --threads N         router worker threads                        [default: 2]
  -h, --help              this text
EOF
}

shards=512 rate=20 duration=10 warm_list=0,1 shared_list=- threads=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--shards) shards="$2"; shift 2 ;;
        -r|--rate) rate="$2"; shift 2 ;;
        -T|--duration) duration="$2"; shift 2 ;;
        --warm) warm_list="$2"; shift 2 ;;
        --shared) shared_list="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
need_tools psql python3 cargo curl
# Every (shared, warm) pair, checked before anything starts.
cases=()
IFS=, read -r -a shareds <<<"$shared_list"
IFS=, read -r -a warms <<<"$warm_list"
for shared in "${shareds[@]}"; do
    [[ "$shared" == - || "$shared" =~ ^[0-9]+$ ]] || die "--shared takes numbers or -, not '$shared'"
    for warm in "${warms[@]}"; do
        [[ "$warm" =~ ^[0-9]+$ ]] || die "--warm takes numbers, not '$warm'"
        cases+=("$shared $warm")
    done
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-warm.XXXXXX")"
chmod 755 "$tmp"
dir="$tmp/cluster" router_pid=""
cleanup() {
    trap - EXIT INT TERM
    [[ -n "$router_pid" ]] && { kill -TERM "$router_pid" 2>/dev/null || true; wait "$router_pid" 2>/dev/null || true; }
    if [[ ! -f "$dir/cluster.json" ]] || "$root/deploy/local/cluster" down --dir "$dir" >/dev/null 2>&1; then
        rm -rf "$tmp"
    else
        echo "warm_start.sh: cluster down --dir $dir failed; stop it by hand" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building (release) ..." >&2
(cd "$root" && cargo build --release -q -p loadgen -p shardgate -p shardgate-cluster)
bin="$(release_dir)"
free_port http_port
echo "cluster up: $shards shards on 4 servers ..." >&2
"$root/deploy/local/cluster" up --shards "$shards" --servers 4 --http-port "$http_port" --dir "$dir" \
    >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; die "cluster up failed"; }
url="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["router"]["url"])' "$dir/cluster.json")"
pid="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["router"]["pid"])' "$dir/cluster.json")"
# The cluster's router goes (each run starts its own from the same config plus
# warm_connections), then the rows are loaded.
kill -TERM "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
"$bin/loadgen" prepare --shardmap "$dir/shardmap.toml" --rows-per-shard 100 --quiet >"$tmp/prepare.log" 2>&1 ||
    { cat "$tmp/prepare.log" >&2; die "loadgen prepare failed"; }

rows=()
for case_ in "${cases[@]}"; do
    read -r shared warm <<<"$case_"
    pool="warm_connections = $warm"
    [[ "$shared" == - ]] || pool="$pool\nshared_connections = $shared"
    case_="$shared-$warm"  # names the files
    config="$dir/router-$case_.toml"
    sed "s/^\[pool\]$/[pool]\n$pool/" "$dir/router.toml" >"$config"
    started="$(date +%s.%N)"
    "$bin/shardgate" --config "$config" --threads "$threads" >"$tmp/router-$case_.log" 2>&1 &
    router_pid=$!
    for _ in $(seq 600); do
        [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/ready")" == 200 ]] && break
        kill -0 "$router_pid" 2>/dev/null || die "the router exited: $(tail -5 "$tmp/router-$case_.log")"
        sleep 0.05
    done
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/ready")" == 200 ]] ||
        die "the router was not ready after 30 s: $(tail -5 "$tmp/router-$case_.log")"
    ready="$(date +%s.%N)"
    conns="$(for p in $(python3 -c 'import json,sys; print(" ".join(str(s["port"]) for s in json.load(open(sys.argv[1]))["servers"]))' "$dir/cluster.json"); do
        psql "postgres://postgres:postgres@127.0.0.1:$p/postgres" -qAtc "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'shardgate'"
    done | python3 -c 'import sys; print(sum(int(l) for l in sys.stdin if l.strip()))')"
    # The first window from ready, then the same again on the now warm router (the steady state
    # the first is compared with).
    for run in first next; do
        "$bin/loadgen" run --shardmap "$dir/shardmap.toml" --target "$url" --rows-per-shard 100 \
            --rate-per-shard "$rate" --connections 16 --duration "${duration}s" --timeout 10s --quiet \
            --json "$tmp/run-$case_-$run.json" >"$tmp/run-$case_-$run.log" 2>&1 ||
            { cat "$tmp/run-$case_-$run.log" >&2; die "loadgen failed"; }
        rows+=("$(python3 - "$tmp/run-$case_-$run.json" "$shared" "$warm" "$run" "$started" "$ready" "$conns" <<'PY'
import json, sys
path, shared, warm, run, started, ready, conns = sys.argv[1:]
r = json.load(open(path)); l = r["latency_us"]
first = r["series"][0]["qps"] if r["series"] else 0
ready = round(float(ready) - float(started), 2) if run == "first" else "-"
conns = conns if run == "first" else "-"
print(shared, warm, run, ready, conns, round(r["qps"], 1), round(first, 1),
      l["p50"] / 1000, l["p99"] / 1000, l["max"] / 1000, r["errors"] + r["timeouts"])
PY
)")
    done
    kill -TERM "$router_pid"; wait "$router_pid" 2>/dev/null || true; router_pid=""
done

echo
echo "$shards shards on 4 servers, router with $threads workers, loadgen ${rate}/s per shard ($((shards * rate))/s) for ${duration} s from /ready"
printf '%6s %5s %6s %9s %11s %10s %12s %9s %9s %9s %7s\n' shared warm window "ready s" "backends" "qps" "1st s qps" "p50 ms" "p99 ms" "max ms" errors
for row in "${rows[@]}"; do
    read -r sh w run rs c q f p50 p99 mx e <<<"$row"
    printf '%6s %5s %6s %9s %11s %10s %12s %9.2f %9.2f %9.1f %7s\n' "$sh" "$w" "$run" "$rs" "$c" "$q" "$f" "$p50" "$p99" "$mx" "$e"
done
