#!/usr/bin/env bash
# What an INSERT without its key costs against one with it, side by side in one run on a local
# cluster (4 shards on 2 servers, one router): pgbench inserts into `keyed` (the key given,
# random) and into `notes` (a bigserial key left out, given by the router), in each protocol,
# alternating rounds. Prints throughput and the router's CPU per INSERT.
# See docs/benchmarks.md ("Inserts without keys").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF2'
Usage: benches/new_keys.sh [OPTIONS]

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

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-keys.XXXXXX")"
chmod 755 "$tmp"
dir="$tmp/cluster" pids=()
cleanup() {
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [[ ! -f "$dir/cluster.json" ]] || "$root/deploy/local/cluster" down --dir "$dir" >/dev/null 2>&1; then
        rm -rf "$tmp"
    else
        echo "new_keys.sh: cluster down --dir $dir failed; stop it by hand" >&2
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
    psql "$primary" -qc "CREATE TABLE keyed (id bigint PRIMARY KEY, body text); CREATE TABLE notes (id bigserial PRIMARY KEY, body text)" >/dev/null
done <"$tmp/primaries"
cat >>"$dir/shardmap.toml" <<'EOT'

[[tables]]
name = "keyed"
key = "id"
type = "bigint"

[[tables]]
name = "notes"
key = "id"
type = "bigint"
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

printf '\\set id random(1, 4000000000000)\nINSERT INTO keyed (id, body) VALUES (:id, '"'"'x'"'"');\n' >"$tmp/keyed.sql"
printf "INSERT INTO notes (body) VALUES ('x');\n" >"$tmp/notes.sql"

ticks() { awk '{ print $14 + $15 }' "/proc/$router_pid/stat"; }
clk="$(getconf CLK_TCK)"

printf '%-9s %-22s %8s %8s %14s\n' protocol insert round tps "router µs/insert"
for mode in simple extended prepared; do
    for round in $(seq "$rounds"); do
        for kind in keyed notes; do
            t0="$(ticks)"
            out="$(pgbench -n -M "$mode" -c "$clients" -j 2 -T "$seconds" -f "$tmp/$kind.sql" "$url" 2>&1)" ||
                die "pgbench failed: $out"
            t1="$(ticks)"
            tps="$(awk -F'= ' '/^tps/ { split($2, a, " "); printf "%.0f", a[1] }' <<<"$out")"
            n="$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' <<<"$out")"
            us="$(python3 -c "print(f'{($t1 - $t0) / $clk * 1e6 / max($n, 1):.1f}')")"
            label="with its key"; [[ "$kind" == notes ]] && label="key given by router"
            printf '%-9s %-22s %8s %8s %14s\n' "$mode" "$label" "$round" "$tps" "$us"
        done
    done
done
blocks="$(psql "$(head -1 "$tmp/primaries")" -qAtc "SELECT next FROM shardgate.key_blocks WHERE name = 'notes'" 2>/dev/null || true)"
rows=0
while read -r primary; do
    rows=$(( rows + $(psql "$primary" -qAtc "SELECT count(*) FROM notes") ))
done <"$tmp/primaries"
echo "notes: $rows rows; shardgate.key_blocks next = ${blocks:-?} (keys reserved by the router: $(( ${blocks:-1} - 1 )))"
