#!/usr/bin/env bash
# The differential test at scale: random statements through a router over 4 shards and on one
# Postgres with the same rows (router/tests/differential.rs, built in release mode: the
# router's own speed is not what is compared), over several seeds, with the
# totals at the end: the same, refused (by reason), mismatched (must be 0).
# See docs/architecture.md ("Compared with one Postgres: the differential test").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF2'
Usage: benches/differential.sh [OPTIONS]

  --statements N   statements in all                      [default: 1000000]
  --per-seed N     statements per seed (each seed starts a fresh cluster)  [default: 50000]
  --seed N         the first seed; the others follow it    [default: a random one, printed]
  -h, --help       this text

Prints each seed's summary as it finishes, then the totals. A mismatch stops the run and
prints the seed and the statement (rerun one seed with SHARDGATE_DIFF_SEED=S
SHARDGATE_DIFF_STATEMENTS=N cargo test -p shardgate --test differential -- --nocapture).
Needs the PostgreSQL 15 server binaries and cargo.
EOF2
}

total=1000000 per_seed=50000 seed=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --statements) total="$2"; shift 2 ;;
        --per-seed) per_seed="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
[[ "$total" =~ ^[0-9]+$ && "$per_seed" =~ ^[1-9][0-9]*$ ]] || die "--statements and --per-seed take positive numbers"
[[ -n "$seed" ]] || seed=$((RANDOM * 32768 + RANDOM))
[[ "$seed" =~ ^[0-9]+$ ]] || die "--seed takes a number"
need_tools cargo

cd "$root"
cargo test -q --release -p shardgate --test differential --no-run >/dev/null 2>&1 || die "the differential test does not build"
log="$(mktemp -t shardgate-differential.XXXXXX)"
echo "differential: $total statements, $per_seed per seed, seeds from $seed (log: $log)"
same=0 refused=0 mismatched=0 done_statements=0
while (( done_statements < total )); do
    n=$(( total - done_statements < per_seed ? total - done_statements : per_seed ))
    if ! SHARDGATE_DIFF_SEED="$seed" SHARDGATE_DIFF_STATEMENTS="$n" \
        cargo test -q --release -p shardgate --test differential -- --nocapture >"$log.seed" 2>&1; then
        cat "$log.seed" >>"$log"
        grep -A4 "answered differently" "$log.seed" | head -20 >&2 || true
        die "seed $seed: the router answered differently from one Postgres (full output in $log)"
    fi
    cat "$log.seed" >>"$log"
    line="$(grep -m1 "the same, " "$log.seed")"
    read -r s r m <<<"$(sed -E 's/.*: ([0-9]+) the same, ([0-9]+) refused, ([0-9]+) mismatched.*/\1 \2 \3/' <<<"$line")"
    same=$((same + s)) refused=$((refused + r)) mismatched=$((mismatched + m))
    done_statements=$((done_statements + n))
    echo "seed $seed: $line"
    seed=$((seed + 1))
done
rm -f "$log.seed"
answered=$((same + refused + mismatched))
echo "total: $answered answers ($done_statements generated statements, plus table comparisons): $same the same, $refused refused ($(( refused * 1000 / (answered > 0 ? answered : 1) ))‰), $mismatched mismatched"
echo "refused, by reason (summed over seeds):"
grep -E "^  refused +[0-9]+:" "$log" | sed -E 's/^  refused +([0-9]+): (.*)$/\1\t\2/' |
    awk -F'\t' '{n[$2] += $1} END {for (r in n) printf "%8d  %s\n", n[r], r}' | sort -rn
