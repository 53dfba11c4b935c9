#!/usr/bin/env bash
# What a lookup column costs, side by side in one run on a local cluster (4 shards on 2
# servers, one router): pgbench INSERTs into `plain` and into `people` (the same columns;
# `people` routes by its `badge`, so each INSERT also writes a lookup row, usually on another
# shard), then point reads of `people` by its key and by its badge, in each protocol,
# alternating rounds. Prints throughput and the router's CPU per statement.
# See docs/benchmarks.md ("Lookup columns").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF2'
Usage: benches/lookups.sh [OPTIONS]

  -c, --clients N     pgbench clients                    [default: 8]
  -T, --seconds N     seconds per round                  [default: 5]
  -r, --rounds N      rounds of each kind per protocol   [default: 3]
      --threads N     router worker threads              [default: 2]
  -h, --help          this text
EOF2
}

clients=8 seconds=5 rounds=3 threads=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        -c|--clients) clients="$2"; shift 2 ;;
        -T|--seconds) seconds="$2"; shift 2 ;;
        -r|--rounds) rounds="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
need_tools psql pgbench python3 cargo

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-lookups.XXXXXX")"
chmod 755 "$tmp"
dir="$tmp/cluster" pids=()
cleanup() {
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [[ ! -f "$dir/cluster.json" ]] || "$root/deploy/local/cluster" down --dir "$dir" >/dev/null 2>&1; then
        rm -rf "$tmp"
    else
        echo "lookups.sh: cluster down --dir $dir failed; stop it by hand" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building (release) ..." >&2
(cd "$root" && cargo build --release -q -p shardgate -p shardgate-cluster)
bin="$(release_dir)"
echo "cluster up: 4 shards on 2 servers ..." >&2
"$root/deploy/local/cluster" up --shards 4 --servers 2 --no-router --dir "$dir" >"$tmp/up.log" 2>&1 ||
    { cat "$tmp/up.log" >&2; die "cluster up failed"; }
# The two tables on every shard, and in the map.
python3 - "$dir/shardmap.toml" >"$tmp/primaries" <<'PY'
import sys, tomllib
for s in tomllib.load(open(sys.argv[1], "rb"))["shards"]:
    print(s["primary"])
PY
while read -r primary; do
    psql "$primary" -qc "CREATE TABLE plain (id bigint PRIMARY KEY, badge bigint UNIQUE); CREATE TABLE people (id bigint PRIMARY KEY, badge bigint UNIQUE)" >/dev/null
done <"$tmp/primaries"
cat >>"$dir/shardmap.toml" <<'EOT'

[[tables]]
name = "plain"
key = "id"
type = "bigint"

[[tables]]
name = "people"
key = "id"
type = "bigint"
lookup = { badge = "bigint" }
EOT
free_port port
cat >"$dir/router.toml" <<EOT
listen = "127.0.0.1:$port"
shardmap = "$dir/shardmap.toml"
database = "app"
auth = "trust"

[backend]
user = "postgres"
password = "postgres"
EOT
"$bin/shardgate" --config "$dir/router.toml" --threads "$threads" >"$tmp/router.log" 2>&1 &
router_pid=$!
pids+=("$router_pid")
url="postgres://app@127.0.0.1:$port/app"
for _ in $(seq 200); do
    psql "$url" -qAtc "SELECT 1" >/dev/null 2>&1 && break
    kill -0 "$router_pid" 2>/dev/null || die "the router exited: $(tail -5 "$tmp/router.log")"
    sleep 0.1
done

# Each INSERT a fresh key and badge (random: a rare collision fails one INSERT; pgbench's
# variables are numbers, so the lookup column is a bigint); the reads pick among 2,000 rows
# inserted first.
for i in $(seq 1 2000); do echo "INSERT INTO people (id, badge) VALUES ($i, $((i + 7000000)));"; done | psql "$url" -q >/dev/null
printf '\\set id random(10000, 4000000000000)\n\\set b random(10000000, 4000000000000)\nINSERT INTO plain (id, badge) VALUES (:id, :b);\n' >"$tmp/plain.sql"
printf '\\set id random(10000, 4000000000000)\n\\set b random(10000000, 4000000000000)\nINSERT INTO people (id, badge) VALUES (:id, :b);\n' >"$tmp/people.sql"
printf '\\set id random(1, 2000)\nSELECT badge FROM people WHERE id = :id;\n' >"$tmp/by_key.sql"
printf '\\set b random(7000001, 7002000)\nSELECT id FROM people WHERE badge = :b;\n' >"$tmp/by_badge.sql"

ticks() { awk '{ print $14 + $15 }' "/proc/$router_pid/stat"; }
clk="$(getconf CLK_TCK)"

printf '%-9s %-28s %6s %8s %16s\n' protocol statement round tps "router µs/stmt"
for mode in simple extended prepared; do
    for round in $(seq "$rounds"); do
        for kind in plain people by_key by_badge; do
            t0="$(ticks)"
            out="$(pgbench -n -M "$mode" -c "$clients" -j 2 -T "$seconds" -f "$tmp/$kind.sql" "$url" 2>&1)" ||
                die "pgbench failed: $out"
            t1="$(ticks)"
            tps="$(awk -F'= ' '/^tps/ { split($2, a, " "); printf "%.0f", a[1] }' <<<"$out")"
            n="$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' <<<"$out")"
            us="$(python3 -c "print(f'{($t1 - $t0) / $clk * 1e6 / max($n, 1):.1f}')")"
            case "$kind" in
                plain) label="INSERT, no lookup" ;;
                people) label="INSERT, with its lookup row" ;;
                by_key) label="SELECT by key" ;;
                by_badge) label="SELECT by badge (lookup)" ;;
            esac
            printf '%-9s %-28s %6s %8s %16s\n' "$mode" "$label" "$round" "$tps" "$us"
        done
    done
done
