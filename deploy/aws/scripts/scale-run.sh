#!/usr/bin/env bash
# The scale run on the fleet: starts `loadgen run` on every load generator at one agreed time
# (through SSM), waits for them, downloads their JSON reports from S3 and merges them into the
# fleet's report and chart with `loadgen merge`. Run from the deploy/aws directory after
# `terraform apply`, with the AWS CLI logged in and a local loadgen binary on PATH.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/scale-run.sh [--rate-per-shard R] [--duration D] [--rows N] [--connections C] [--lead SECONDS] [--out DIR]

  --rate-per-shard R   requests a second per shard, all load generators together [default: 231000]
  --duration D         measured window, e.g. 16m                                  [default: 16m]
  --rows N             rows per shard (loadgen 0 loads them first)                [default: 1000000]
  --connections C      connections per load generator (spread over the NLB)       [default: 512]
  --lead SECONDS       start this long after the command is sent                  [default: 120]
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

fleet="$(terraform output -raw reports_uri)"
name="$(terraform output -json | python3 -c 'import json,sys; print(json.load(sys.stdin)["shardmap_uri"]["value"].split("/")[3])')"
mapfile -t ids < <(aws ec2 describe-instances \
    --filters "Name=tag:Role,Values=loadgen" "Name=tag:Fleet,Values=$name" "Name=instance-state-name,Values=running" \
    --query 'Reservations[].Instances[].InstanceId' --output text | tr '\t' '\n' | sed '/^$/d')
[[ ${#ids[@]} -gt 0 ]] || { echo "scale-run.sh: no running load generators tagged Fleet=$name" >&2; exit 1; }
per_host="$(python3 -c "print($rate / ${#ids[@]})")"
run="run-$(date -u +%Y%m%dT%H%M%SZ)"
start_at="$(date -u -d "+$lead seconds" +%Y-%m-%dT%H:%M:%SZ)"
out="${out:-./scale-run-$run}"
echo "$run: ${#ids[@]} load generators x ${per_host}/s per shard, $duration from $start_at"

# Loading the rows (loadgen 0) happens before the start; give it the lead time it needs.
command_id="$(aws ssm send-command --document-name AWS-RunShellScript \
    --instance-ids "${ids[@]}" --timeout-seconds 7200 \
    --parameters "commands=[\"/usr/local/bin/shardgate-scale-run $start_at $per_host $duration $rows $run $conns\"]" \
    --query Command.CommandId --output text)"
echo "SSM command $command_id sent; waiting for every load generator ..."
for id in "${ids[@]}"; do
    while :; do
        status="$(aws ssm get-command-invocation --command-id "$command_id" --instance-id "$id" --query Status --output text 2>/dev/null || echo Pending)"
        case "$status" in
            Success) break ;;
            Failed|Cancelled|TimedOut) echo "scale-run.sh: $id: $status (aws ssm get-command-invocation --command-id $command_id --instance-id $id)" >&2; exit 1 ;;
            *) sleep 15 ;;
        esac
    done
done

mkdir -p "$out"
aws s3 cp --recursive "$fleet/$run/" "$out/"
loadgen merge "$out"/loadgen-*.json --json "$out/fleet.json" --chart "$out/fleet.svg" | tee "$out/fleet.txt"
echo "merged report: $out/fleet.txt, $out/fleet.json; chart: $out/fleet.svg"
