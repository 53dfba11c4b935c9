#!/usr/bin/env bash
# The scale run on the fleet: loads the rows (load generator 0), starts `loadgen run` on every load
# generator at one agreed time (through SSM), waits for them, downloads their JSON reports from S3
# and merges them into the fleet's report and chart with `loadgen merge`. Run from the deploy/aws directory after
# `terraform apply`, with the AWS CLI logged in and a local loadgen binary on PATH.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/scale-run.sh [--rate-per-shard R] [--duration D] [--rows N] [--connections C] [--lead SECONDS] [--out DIR]

  --rate-per-shard R   requests a second per shard, all load generators together [default: 231000]
  --duration D         measured window, e.g. 16m                                  [default: 16m]
  --rows N             rows per shard (loadgen 0 loads them first)                [default: 1000000]
  --connections C      connections per load generator (spread over the NLB)       [default: 512]
  --lead SECONDS       start this long after the run command is sent              [default: 120]
  --out DIR            where the reports, the merged report and the chart go      [default: ./scale-run-RUN]
USAGE
}

rate=231000 duration=16m rows=1000000 conns=512 lead=120 out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rate-per-shard) rate="$2"; shift 2 ;;
        --duration) duration="$2"; shift 2 ;;
        --rows) rows="$2"; shift 2 ;;
        --connections) conns="$2"; shift 2 ;;
        --lead) lead="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
command -v aws >/dev/null || { echo "scale-run.sh: the AWS CLI is not installed" >&2; exit 1; }
command -v loadgen >/dev/null || { echo "scale-run.sh: loadgen is not on PATH (cargo build --release -p loadgen)" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/ssm.sh"
name="$(fleet_name)"
fleet="$(terraform -chdir="$here/.." output -raw reports_uri)"
hosts="$(aws ec2 describe-instances \
    --filters "Name=tag:Role,Values=loadgen" "Name=tag:Fleet,Values=$name" "Name=instance-state-name,Values=running" \
    --query 'length(Reservations[].Instances[])' --output text)"
[[ "$hosts" -gt 0 ]] || { echo "scale-run.sh: no running load generators tagged Fleet=$name" >&2; exit 1; }
per_host="$(python3 -c "print($rate / $hosts)")"
run="run-$(date -u +%Y%m%dT%H%M%SZ)"
out="${out:-./scale-run-$run}"

# The rows first, from load generator 0 (idempotent; hours for 512 shards x 1M rows at most).
echo "$run: loading $rows rows per shard (load generator 0) ..."
ssm_run "$name" Name "$name-loadgen-0" 14400 "/usr/local/bin/shardgate-prepare $rows" >/dev/null

# Then every load generator at one agreed time.
start_at="$(date -u -d "+$lead seconds" +%Y-%m-%dT%H:%M:%SZ)"
echo "$run: $hosts load generators x ${per_host}/s per shard, $duration from $start_at"
seconds="$(python3 -c "import re,sys; d=sys.argv[1]; m={'s':1,'m':60,'h':3600}; print(int(float(d[:-1])*m[d[-1]]) if d[-1] in m else int(float(d)))" "$duration")"
ssm_run "$name" Role loadgen $((lead + seconds + 1800)) \
    "/usr/local/bin/shardgate-scale-run $start_at $per_host $duration $rows $run $conns" >/dev/null

mkdir -p "$out"
aws s3 cp --recursive "$fleet/$run/" "$out/"
loadgen merge "$out"/loadgen-*.json --json "$out/fleet.json" --chart "$out/fleet.svg" | tee "$out/fleet.txt"
echo "merged report: $out/fleet.txt, $out/fleet.json; chart: $out/fleet.svg"
