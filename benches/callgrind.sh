#!/usr/bin/env bash
# The router's user-space work per statement, counted in instructions by valgrind's callgrind:
# the same count for the same binary and inputs however busy the machine is, so a change of a
# few percent shows where wall-clock benchmarks on a shared 2-core machine only show noise.
# Optionally the same for another build (--baseline-bin), side by side. See docs/benchmarks.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/callgrind.sh [OPTIONS]

Starts its own 1-shard local cluster (deploy/local/cluster) in a temp dir with ROWS rows in kv,
then for each mode runs the router (one worker thread) under `valgrind --tool=callgrind`,
warms it up with pgbench, zeroes the counters, runs pgbench -c CLIENTS -t N of

    \set id random(1, ROWS)
    SELECT v FROM kv WHERE id = :id;

and prints the instructions the router executed per statement (its login of the measured
clients included, amortized over their statements). With --profile DIR it keeps the callgrind
files and prints each build's costliest functions per statement (self cost).

Options:
  -m, --modes LIST        pgbench -M modes: simple,extended,prepared     [default: all three]
  -n, --statements N      statements per client in the measured run       [default: 2500]
  -c, --clients N         pgbench clients                                 [default: 4]
  -r, --rows N            rows in kv                                      [default: 10000]
      --shared-connections N  run the routers with [pool] shared_connections = N (the
                          clients' statements pipelined over N backend connections)  [default: 0]
      --baseline-bin PATH the same for this (older) shardgate binary, and the ratios
      --profile DIR       keep the callgrind files in DIR and print the top functions
      --top N             functions listed per build with --profile       [default: 25]
  -h, --help              this text

Needs valgrind (apt-get install valgrind), pgbench and psql, the PostgreSQL server binaries,
cargo. Takes about a minute per mode and build.
EOF
}

modes="simple,extended,prepared" statements=2500 clients=4 rows=10000 baseline_bin="" profile="" top=25
shared=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -m|--modes) modes="$2"; shift 2 ;;
        -n|--statements) statements="$2"; shift 2 ;;
        -c|--clients) clients="$2"; shift 2 ;;
        -r|--rows) rows="$2"; shift 2 ;;
        --baseline-bin) baseline_bin="$2"; shift 2 ;;
        --shared-connections) shared="$2"; shift 2 ;;
        --profile) profile="$2"; shift 2 ;;
        --top) top="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
for n in statements clients rows top; do
    [[ "${!n}" =~ ^[0-9]+$ && "${!n}" -gt 0 ]] || die "--${n} must be a whole number above 0, not '${!n}'"
done
[[ "$shared" =~ ^[0-9]+$ ]] || die "--shared-connections must be a whole number, not '$shared'"
for m in ${modes//,/ }; do [[ "$m" =~ ^(simple|extended|prepared)$ ]] || die "unknown mode '$m'"; done
[[ -z "$baseline_bin" || -x "$baseline_bin" ]] || die "--baseline-bin $baseline_bin is not an executable"
need_tools valgrind callgrind_control pgbench psql python3 cargo

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-callgrind.XXXXXX")"
router_pid=""
cleanup() {
    [[ -z "$router_pid" ]] || kill "$router_pid" 2>/dev/null || true
    "$root/deploy/local/cluster" down --dir "$tmp/cluster" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port pg_port
free_port cluster_router_port
free_port port
echo "building (release) and starting a 1-shard cluster in $tmp/cluster ..."
"$root/deploy/local/cluster" up --shards 1 --servers 1 --dir "$tmp/cluster" \
    --base-port "$pg_port" --router-port "$cluster_router_port" --user app --password app \
    >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; die "cluster up failed"; }
psql -qX "postgres://postgres:postgres@127.0.0.1:$pg_port/shard_000" -c \
    "INSERT INTO kv (id, v) SELECT g, 'v' || g FROM generate_series(1, $rows) g ON CONFLICT DO NOTHING" ||
    die "loading kv failed"
printf '\\set id random(1, %s)\nSELECT v FROM kv WHERE id = :id;\n' "$rows" >"$tmp/select.sql"
# The cluster's router config on another port, without the admin flag (older builds refuse
# settings they do not know).
sed -e "s|^listen = .*|listen = \"127.0.0.1:$port\"|" \
    -e "s|^shardmap = .*|shardmap = \"$tmp/cluster/shardmap.toml\"|" \
    -e "/^admin = /d" "$tmp/cluster/router.toml" >"$tmp/router.toml"
if ((shared > 0)); then
    sed -i "s|^\[pool\]\$|[pool]\nshared_connections = $shared|" "$tmp/router.toml"
    grep -q "^shared_connections = $shared" "$tmp/router.toml" || die "the cluster's router.toml has no [pool] section"
fi
export PGPASSWORD=app

# measure NAME BIN MODE: prints the instructions per statement of BIN in MODE.
measure() {
    local name="$1" bin="$2" mode="$3" dir="$tmp/$1-$3" total
    mkdir -p "$dir"
    NO_COLOR=1 valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
        "$bin" --config "$tmp/router.toml" --threads 1 >"$dir/router.log" 2>&1 &
    router_pid=$!
    for _ in $(seq 600); do grep -q "every shard has answered" "$dir/router.log" && break; sleep 0.2; done
    grep -q "every shard has answered" "$dir/router.log" || { cat "$dir/router.log" >&2; die "$name did not start"; }
    pgbench -n -h 127.0.0.1 -p "$port" -U app -f "$tmp/select.sql" -M "$mode" -c "$clients" -t 300 app \
        >"$dir/warmup.log" 2>&1 || { cat "$dir/warmup.log" >&2; die "the warm-up through $name failed"; }
    callgrind_control -z "$router_pid" >/dev/null 2>&1
    pgbench -n -h 127.0.0.1 -p "$port" -U app -f "$tmp/select.sql" -M "$mode" -c "$clients" \
        -t "$statements" app >"$dir/pgbench.log" 2>&1 || { cat "$dir/pgbench.log" >&2; die "pgbench through $name failed"; }
    grep -q "processed: $((clients * statements))/" "$dir/pgbench.log" || die "pgbench through $name did not finish its statements"
    callgrind_control -d "$router_pid" >/dev/null 2>&1
    kill "$router_pid"
    wait "$router_pid" 2>/dev/null || true
    router_pid=""
    total="$(grep -h '^summary:' "$dir"/cg.out.* | awk '{ s += $2 } END { print s }')"
    echo $((total / (clients * statements)))
    if [[ -n "$profile" ]]; then
        mkdir -p "$profile"
        cp "$dir"/cg.out.* "$profile/$name-$mode.callgrind"
    fi
}

declare -A per_stmt
builds=(shardgate)
[[ -z "$baseline_bin" ]] || builds+=(baseline)
for mode in ${modes//,/ }; do
    for b in "${builds[@]}"; do
        bin="$(release_dir)/shardgate"
        [[ "$b" == baseline ]] && bin="$baseline_bin"
        echo "measuring $b, $mode ..."
        per_stmt[$b,$mode]="$(measure "$b" "$bin" "$mode")"
    done
done

echo
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), callgrind, router with 1 worker thread, shared_connections = $shared, pgbench -c $clients -t $statements"
printf '%-10s %-10s %16s\n' mode build "instr/statement"
for mode in ${modes//,/ }; do
    for b in "${builds[@]}"; do printf '%-10s %-10s %16s\n' "$mode" "$b" "${per_stmt[$b,$mode]}"; done
    if [[ -n "$baseline_bin" ]]; then
        printf '%-10s %-10s %16s\n' "$mode" "sg/base" \
            "$(awk -v a="${per_stmt[shardgate,$mode]}" -v b="${per_stmt[baseline,$mode]}" 'BEGIN { printf "%.3f", a / b }')"
    fi
done

if [[ -n "$profile" ]]; then
    for f in "$profile"/*.callgrind; do
        echo
        echo "$(basename "$f" .callgrind): costliest functions, self instructions per statement"
        python3 "$root/benches/callgrind_self.py" --per $((clients * statements)) --top "$top" "$f"
    done
fi
