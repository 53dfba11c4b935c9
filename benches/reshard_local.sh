#!/usr/bin/env bash
# An online shard split on a local cluster under load: `cluster up` with two spare servers and
# two routers, loadgen driving reads, updates and inserts through both routers at a fixed rate,
# and `shardgate reshard` splitting one shard into the spares in the middle of the run. Prints
# the cut-over's steps and pause, the load's errors and per-second p99/max around the switch,
# and the placement check of every shard of the new map. See docs/resharding.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/reshard_local.sh [OPTIONS]

Starts its own cluster in a temp dir (deleted on exit), loads ROWS rows per shard, runs loadgen
for DURATION seconds at RATE requests a second per shard (70% reads, 20% updates, 10% inserts)
through two routers, and splits shard SHARD into two spare servers while it runs:
plan, start, wait for the copy, cutover (verify inside the pause), cleanup --delete-moved.

Options:
  -n, --shards N          shards of the cluster (on min(N, 4) servers)   [default: 4]
      --split K           the shard to split (its number in the map)     [default: 1]
  -r, --rate R            requests a second per shard                    [default: 200]
  -T, --duration SECONDS  loadgen's measured window                      [default: 30]
      --rows N            rows per shard                                 [default: 100000]
      --out DIR           keep the loadgen report, chart and logs here
  -h, --help              this text
EOF
}

shards=4 split=1 rate=200 duration=30 rows=100000 out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--shards) shards="$2"; shift 2 ;;
        --split) split="$2"; shift 2 ;;
        -r|--rate) rate="$2"; shift 2 ;;
        -T|--duration) duration="$2"; shift 2 ;;
        --rows) rows="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
for n in shards rate duration rows; do
    [[ "${!n}" =~ ^[0-9]+$ && "${!n}" -gt 0 ]] || die "--${n} must be a whole number above 0, not '${!n}'"
done
[[ "$split" =~ ^[0-9]+$ && "$split" -lt "$shards" ]] || die "--split must be a shard number below --shards"
[[ "$duration" -ge 15 ]] || die "--duration must be at least 15 s (the split runs in the middle)"
need_tools psql python3 cargo

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-reshard.XXXXXX")"
chmod 755 "$tmp"
dir="$tmp/cluster"
loadgen_pid=""
cleanup() {
    trap - EXIT INT TERM
    [[ -n "$loadgen_pid" ]] && { kill -TERM "$loadgen_pid" 2>/dev/null || true; wait "$loadgen_pid" 2>/dev/null || true; }
    if [[ -n "$out" ]]; then mkdir -p "$out"; cp "$tmp"/*.json "$tmp"/*.svg "$tmp"/*.log "$out"/ 2>/dev/null || true; fi
    if [[ ! -f "$dir/cluster.json" ]] || "$root/deploy/local/cluster" down --dir "$dir" >/dev/null 2>&1; then
        rm -rf "$tmp"
    else
        echo "reshard_local.sh: cluster down --dir $dir failed; stop it by hand" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building loadgen, shardgate and the cluster tool (release) ..." >&2
(cd "$root" && cargo build --release -q -p loadgen -p shardgate -p shardgate-cluster)
bin="$(release_dir)"
loadgen="$bin/loadgen" shardgate="$bin/shardgate"

servers=$((shards < 4 ? shards : 4))
echo "cluster up: $shards shards on $servers servers, 2 spare servers, 2 routers ..." >&2
"$root/deploy/local/cluster" up --shards "$shards" --servers "$servers" --spare 2 --routers 2 \
    --dir "$dir" >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; die "cluster up failed"; }
mapfile -t routers < <(python3 - "$dir/cluster.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for r in [s["router"]] + s.get("more_routers", []):
    print(r["url"])
PY
)
mapfile -t spares < <(python3 -c 'import json,sys; [print(s["url"]) for s in json.load(open(sys.argv[1]))["spares"]]' "$dir/cluster.json")
[[ ${#routers[@]} -eq 2 && ${#spares[@]} -eq 2 ]] || die "expected 2 routers and 2 spares in $dir/cluster.json"
admin=()
for u in "${routers[@]}"; do admin+=(--router "${u%/*}/shardgate"); done
range="$("$shardgate" shardmap predicate --shardmap "$dir/shardmap.toml" --table kv | sed -n "$((split + 1))p" | cut -f1)"
[[ -n "$range" ]] || die "no shard $split in the map"

"$loadgen" prepare --shardmap "$dir/shardmap.toml" --rows-per-shard "$rows" --quiet >"$tmp/prepare.log" 2>&1 ||
    { cat "$tmp/prepare.log" >&2; die "loadgen prepare failed"; }
targets=()
for u in "${routers[@]}"; do targets+=(--target "$u"); done
echo "loadgen: ${rate}/s per shard, read=70 update=20 insert=10, ${duration} s through both routers ..." >&2
"$loadgen" run --shardmap "$dir/shardmap.toml" "${targets[@]}" --rows-per-shard "$rows" \
    --rate-per-shard "$rate" --mix read=70,update=20,insert=10 --connections 8 --timeout 5s \
    --duration "${duration}s" --quiet --json "$tmp/load.json" --chart "$tmp/load.svg" >"$tmp/load.log" 2>&1 &
loadgen_pid=$!
t0="$(date +%s.%N)"
sleep 3

plan="$tmp/split.toml"
echo "reshard: splitting shard $split ($range) into ${spares[0]##*@} and ${spares[1]##*@}" >&2
{
    "$shardgate" reshard plan --shardmap "$dir/shardmap.toml" --range "$range" \
        --into "${spares[0]}" --into "${spares[1]}" --out "$plan"
    "$shardgate" reshard start --plan "$plan"
    for _ in $(seq 600); do
        "$shardgate" reshard status --plan "$plan" >/dev/null && break
        sleep 0.5
    done
    "$shardgate" reshard status --plan "$plan"
    sleep 2
    cut_at="$(date +%s.%N)"
    echo "cutover at t = $(python3 -c "print(round($cut_at - $t0, 1))") s after loadgen started"
    "$shardgate" reshard cutover --plan "$plan" "${admin[@]}" --shardmap "$dir/shardmap.toml"
} 2>&1 | tee "$tmp/reshard.log"
[[ "${PIPESTATUS[0]}" -eq 0 ]] || die "the split failed (see above)"

wait "$loadgen_pid" || { cat "$tmp/load.log" >&2; die "loadgen failed"; }
loadgen_pid=""
"$shardgate" reshard cleanup --plan "$plan" --delete-moved 2>&1 | tee -a "$tmp/reshard.log"

echo
echo "placement of every kv row under the new map (misplaced rows must be 0):"
"$shardgate" shardmap predicate --shardmap "$dir/shardmap.toml" --table kv >"$tmp/predicates"
python3 - "$dir/shardmap.toml" "$tmp/predicates" <<'PY' | while IFS=$'\t' read -r url pred range; do
import sys, tomllib
m = tomllib.load(open(sys.argv[1], "rb"))
preds = dict(l.rstrip("\n").split("\t", 1) for l in open(sys.argv[2]))
for s in m["shards"]:
    print(s["primary"], preds[s["range"]], s["range"], sep="\t")
PY
    n="$(psql "$url" -qAtc "SELECT count(*) FILTER (WHERE NOT ($pred)) || ' misplaced of ' || count(*) FROM kv")"
    printf '  %-36s %s\n' "$range" "$n"
done

echo
python3 - "$tmp/load.json" "$t0" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l = r["latency_us"]
print(f"loadgen: {r['requests']} requests, {r['qps']:.1f}/s, errors {r['errors']}, timeouts {r['timeouts']}, "
      f"p50 {l['p50']/1000:.3f} ms, p99 {l['p99']/1000:.3f} ms, max {l['max']/1000:.1f} ms")
if r["errors_by_sqlstate"]:
    print("errors by SQLSTATE:", r["errors_by_sqlstate"])
print("per second:   t   qps     p99 ms   max ms  errors")
for s in r["series"]:
    print(f"           {s['t']:3d} {s['qps']:7.1f} {s['p99_us']/1000:8.2f} {s['max_us']/1000:8.1f}  {s['errors']}")
PY
