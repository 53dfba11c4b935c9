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
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/ssm.sh"
name="$(fleet_name)"
uri="$(terraform -chdir="$here/.." output -raw shardmap_uri)"
aws s3 cp "$map" "$uri"
cmd="/usr/local/bin/shardgate-fetch-map"
[[ "$reload" == "--reload" ]] && cmd="$cmd && systemctl reload shardgate"
n="$(ssm_run "$name" Role router 300 "$cmd")"
echo "shard map on $n routers"
