#!/usr/bin/env bash
# Long mode of the router's randomized parser tests (router/tests/fuzz_parsers.rs): N cases per target
# (default 1,120,000 for each of the 9 targets = 10.08M inputs), with an optional seed.
#   benches/fuzz.sh [CASES_PER_TARGET] [SEED]
# Prints each target's count and time; a failure prints the seed and case to replay with
# SHARDGATE_FUZZ_SEED=S SHARDGATE_FUZZ_CASE=N cargo test -p shardgate --test fuzz_parsers  (SHARDGATE_FUZZ_PROFILE=release for an optimized build)
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    cat <<'EOF'
Usage: benches/fuzz.sh [CASES_PER_TARGET] [SEED]

The long mode of the router's randomized parser tests (router/tests/fuzz_parsers.rs): CASES_PER_TARGET cases
for each target (default 1120000; 10.08M inputs over the 9 targets), from SEED when given.
SHARDGATE_FUZZ_PROFILE=release runs an optimized build. A failure prints the seed and case to
replay with SHARDGATE_FUZZ_SEED=S SHARDGATE_FUZZ_CASE=N cargo test -p shardgate --test fuzz_parsers
EOF
    exit 0
fi
[[ -z "${1:-}" || "$1" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: CASES_PER_TARGET must be a number, not '$1' (see --help)" >&2; exit 2; }
cd "$(dirname "$0")/.."
export SHARDGATE_FUZZ_CASES="${1:-1120000}"
[ -n "${2:-}" ] && export SHARDGATE_FUZZ_SEED="$2"
exec cargo test -p shardgate ${SHARDGATE_FUZZ_PROFILE:+--profile "$SHARDGATE_FUZZ_PROFILE"} --test fuzz_parsers -- --nocapture --test-threads 2
