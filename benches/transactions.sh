#!/usr/bin/env bash
# What a transaction across shards costs, side by side in one run on a local cluster (4 shards on
# 2 servers): the latency of a transaction of two UPDATEs on one shard and on two shards, through
# a router in cross_shard = "multi" mode, one in "two_phase" mode, and directly on one Postgres;
# asyncpg executemany of ROWS rows over every shard (keys in random order, and grouped by
# shard) through the router vs directly; one INSERT ... SELECT * FROM unnest of those rows; and
# reading them back through an asyncpg cursor (a portal run with a row limit, in a transaction).
# See docs/benchmarks.md ("Transactions across shards").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF2'
Usage: benches/transactions.sh [OPTIONS]

  -n, --transactions N    transactions per kind, one client, one after another  [default: 2000]
      --rows N            rows of the executemany                                [default: 10000]
      --threads N         router worker threads                                  [default: 2]
  -h, --help              this text

Needs the Python venv with asyncpg that router/tests/drivers/install.sh makes
(SHARDGATE_DRIVERS_CACHE, else XDG_CACHE_HOME or ~/.cache, /shardgate-drivers/venv).
EOF2
}

transactions=2000 rows=10000 threads=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--transactions) transactions="$2"; shift 2 ;;
        --rows) rows="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
need_tools psql python3 cargo curl
cache="${SHARDGATE_DRIVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardgate-drivers}"
python="$cache/venv/bin/python"
"$python" -c 'import asyncpg' 2>/dev/null || die "no asyncpg in $cache/venv: run router/tests/drivers/install.sh"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-tx.XXXXXX")"
chmod 755 "$tmp"
dir="$tmp/cluster" pids=()
cleanup() {
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [[ ! -f "$dir/cluster.json" ]] || "$root/deploy/local/cluster" down --dir "$dir" >/dev/null 2>&1; then
        rm -rf "$tmp"
    else
        echo "transactions.sh: cluster down --dir $dir failed; stop it by hand" >&2
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
server0="$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["servers"][0]; print(s["port"])' "$dir/cluster.json")"
direct="postgres://postgres:postgres@127.0.0.1:$server0/bench_direct"
psql "postgres://postgres:postgres@127.0.0.1:$server0/postgres" -qc "CREATE DATABASE bench_direct" >/dev/null
psql "$direct" -qc "CREATE TABLE kv (id bigint PRIMARY KEY, v text NOT NULL)" >/dev/null

urls=()
for mode in multi two_phase; do
    free_port port
    config="$dir/router-$mode.toml"
    cat >"$config" <<EOT
listen = "127.0.0.1:$port"
shardmap = "$dir/shardmap.toml"
database = "app"
auth = "trust"

[backend]
user = "postgres"
password = "postgres"

[transactions]
cross_shard = "$mode"
EOT
    "$bin/shardgate" --config "$config" --threads "$threads" >"$tmp/router-$mode.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do
        psql "postgres://app@127.0.0.1:$port/app" -qAtc "SELECT 1" >/dev/null 2>&1 && break
        kill -0 "${pids[-1]}" 2>/dev/null || die "the $mode router exited: $(tail -5 "$tmp/router-$mode.log")"
        sleep 0.1
    done
    urls+=("postgres://app@127.0.0.1:$port/app")
done

# Keys of each shard, by the shards' own placement predicates.
keys="$tmp/keys.json"
for s in 0 1 2 3; do
    pred="$("$bin/shardgate" shardmap predicate --shardmap "$dir/shardmap.toml" --table kv | python3 -c "
import sys
lines = [l for l in sys.stdin if l.strip()]
print(lines[$s].split('\t', 1)[1].strip())")"
    psql "$direct" -qAtc "SELECT id FROM generate_series(1, 200000) AS id WHERE $pred LIMIT $(( rows / 2 ))" >"$tmp/keys-$s.txt"
done
python3 - "$tmp" >"$keys" <<'PY'
import json, sys
print(json.dumps([[int(l) for l in open(f"{sys.argv[1]}/keys-{s}.txt") if l.strip()] for s in range(4)]))
PY

"$python" "$root/benches/transactions.py" --keys "$keys" --transactions "$transactions" --rows "$rows" \
    --multi "${urls[0]}" --two-phase "${urls[1]}" --direct "$direct"
