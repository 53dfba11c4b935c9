#!/bin/bash
# The memory abuse cases of issue 13 against one router binary: peak and retained RSS.
#
#   benches/memory_abuse.sh BIN CASE [LIMITS]
#
# BIN: a shardgate binary; CASE: group1 | group3 | cache | query100 | query60; LIMITS: extra
# `[limits]` lines, e.g. 'max_merge_bytes = 1073741824\nmerge_memory_bytes = 4294967296'.
# Prints the router's VmRSS after a warm-up (base), VmHWM (peak) and VmRSS 2 s after the case
# (retained), in MB, and the first client error.
#
# Needs a cluster on ports 25433.. with the 200k wide rows (see docs/benchmarks.md, "Memory
# under abuse and the allocator"):
#   cargo run -p shardgate-cluster -- up --shards 4 --servers 4 --dir /tmp/sgc-mem \
#       --base-port 25433 --no-router
#   for i in 0 1 2 3; do psql "postgres://postgres:postgres@127.0.0.1:$((25433+i))/shard_00$i" \
#     -c "INSERT INTO kv (id, v) SELECT g, lpad(g::text, 1000, 'x')
#         FROM generate_series($((i*50000+1)), $(((i+1)*50000))) g"; done
set -euo pipefail
if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then
    cat <<'EOF'
Usage: benches/memory_abuse.sh BIN CASE [LIMITS]

The memory abuse cases against one router binary: its VmRSS after a warm-up (base), VmHWM
(peak) and VmRSS 2 s after the case (retained), in MB, and the first client error.
BIN: a shardgate binary; CASE: group1 | group3 | cache | query100 | query60; LIMITS: extra
[limits] lines. Needs a cluster on ports 25433.. with 200k wide rows: see the comment at the
top of this script and docs/benchmarks.md, "Memory under abuse and the allocator".
EOF
    [[ "${1:-}" == -h || "${1:-}" == --help ]] && exit 0
    exit 2
fi
BIN=$1; CASE=$2; EXTRA=${3:-}
DIR=${DIR:-/tmp/sgc-mem}
W=$DIR/abuse; mkdir -p "$W/big5"; cp "$DIR/shardmap.toml" "$W/"
cd "$W"
cat > cfg.toml <<TOML
listen = "127.0.0.1:26432"
shardmap = "shardmap.toml"
database = "app"
auth = "trust"

[[users]]
name = "app"
password = "app"

[backend]
user = "postgres"
password = "postgres"

[limits]
$(printf "$EXTRA")
TOML
[ -f big5/100.sql ] || python3 - <<'PY'
x = "x" * (5 << 20)
for i in range(1, 101):
    open(f"big5/{i}.sql", "w").write(f"SELECT 1 /* {i} {x} */;\n")
open("q100.sql", "w").write("SELECT 1 /* " + "y" * (100 << 20) + " */;\n")
open("q60.sql", "w").write("SELECT 1 /* " + "y" * (60 << 20) + " */;\n")
PY
"$BIN" --config cfg.toml > router.log 2>&1 & PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
URL=postgres://app@127.0.0.1:26432/app
for _ in $(seq 50); do psql "$URL" -Atc "SELECT 1" > /dev/null 2>&1 && break; sleep 0.2; done
psql "$URL" -Atc "SELECT count(*) FROM kv WHERE id = 1" > /dev/null
rss() { awk '/^'"$1"':/{print int($2/1024)}' /proc/$PID/status; }
BASE=$(rss VmRSS)
three() { local pids=""; for j in 1 2 3; do (psql "$URL" -At "$@" 2>&1 >/dev/null | head -c 200 > out$j.txt) & pids="$pids $!"; done; wait $pids || true; cp out1.txt out.txt; }
case $CASE in
  group1) psql "$URL" -Atc "SELECT v, count(*) FROM kv GROUP BY v" 2>&1 >/dev/null | head -c 200 > out.txt || true ;;
  group3) three -c "SELECT v, count(*) FROM kv GROUP BY v" ;;
  cache) for i in $(seq 100); do psql "$URL" -Atf big5/$i.sql 2>&1 >/dev/null | head -c 200; done > out.txt || true ;;
  query100) three -f q100.sql ;;
  query60) three -f q60.sql ;;
esac
sleep 2
echo "$CASE base=$(echo $BASE)MB peak=$(rss VmHWM)MB retained=$(rss VmRSS)MB error=[$(tr '\n' ' ' < out.txt | head -c 160)]"
