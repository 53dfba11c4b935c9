#!/usr/bin/env bash
# Carries a shard map to every router of the fleet: uploads it to the fleet's S3 location and
# has every router fetch it (through SSM) without reloading. The `--publish-command` of
# `shardgate reshard cutover`, which then reloads each router over its admin console and checks
# it; with --reload it also reloads (a map change outside a split).
#   shardgate reshard cutover ... --shardmap ./shardmap.toml \
#       --publish-command 'deploy/aws/scripts/publish-shardmap.sh "$SHARDGATE_SHARDMAP"'
set -euo pipefail
map="${1:?usage: publish-shardmap.sh SHARDMAP_FILE [--reload]}"
reload="${2:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
uri="$(terraform -chdir="$here" output -raw shardmap_uri)"
name="$(echo "$uri" | cut -d/ -f4)"
aws s3 cp "$map" "$uri"
mapfile -t ids < <(aws ec2 describe-instances \
    --filters "Name=tag:Role,Values=router" "Name=tag:Fleet,Values=$name" "Name=instance-state-name,Values=running" \
    --query 'Reservations[].Instances[].InstanceId' --output text | tr '\t' '\n' | sed '/^$/d')
[[ ${#ids[@]} -gt 0 ]] || { echo "publish-shardmap.sh: no running routers tagged Fleet=$name" >&2; exit 1; }
cmd="/usr/local/bin/shardgate-fetch-map"
[[ "$reload" == "--reload" ]] && cmd="$cmd && systemctl reload shardgate"
command_id="$(aws ssm send-command --document-name AWS-RunShellScript --instance-ids "${ids[@]}" \
    --parameters "commands=[\"$cmd\"]" --query Command.CommandId --output text)"
for id in "${ids[@]}"; do
    aws ssm wait command-executed --command-id "$command_id" --instance-id "$id" ||
        { echo "publish-shardmap.sh: router $id did not fetch the map" >&2; exit 1; }
done
echo "shard map on ${#ids[@]} routers"
