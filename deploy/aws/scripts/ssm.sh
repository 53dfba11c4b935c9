# Sourced by the scripts here: the fleet's name from `terraform output`, and running a command
# on every instance of a role through SSM (by tags, so any number of instances; SendCommand
# takes at most 50 instance ids).

# The fleet's name: the second part of the shard map's S3 key (s3://BUCKET/NAME/shardmap.toml).
fleet_name() {
    terraform -chdir="$(dirname "${BASH_SOURCE[0]}")/.." output -raw shardmap_uri | cut -d/ -f4
}

# ssm_run NAME TAG_KEY TAG_VALUE TIMEOUT_S COMMAND: runs COMMAND on every running instance of the
# fleet NAME with that tag, waits for all, fails (naming the instances) if any did not succeed.
ssm_run() {
    local name="$1" key="$2" value="$3" timeout="$4" command="$5" id total ok bad
    id="$(aws ssm send-command --document-name AWS-RunShellScript \
        --targets "Key=tag:$key,Values=$value" "Key=tag:Fleet,Values=$name" \
        --max-concurrency 100% --max-errors 0 --timeout-seconds 600 \
        --parameters "$(python3 -c 'import json,sys; print(json.dumps({"commands": [sys.argv[1]], "executionTimeout": [sys.argv[2]]}))' "$command" "$timeout")" \
        --query Command.CommandId --output text)"
    echo "SSM command $id on tag:$key=$value: $command" >&2
    while :; do
        sleep 10
        read -r total ok bad < <(aws ssm list-command-invocations --command-id "$id" \
            --query '[length(CommandInvocations), length(CommandInvocations[?Status==`Success`]), length(CommandInvocations[?contains([`Failed`, `TimedOut`, `Cancelled`], Status)])]' \
            --output text)
        if [[ "$bad" -gt 0 ]]; then
            echo "SSM command $id failed on $bad of $total instances:" >&2
            aws ssm list-command-invocations --command-id "$id" \
                --query 'CommandInvocations[?Status!=`Success`].[InstanceId, Status]' --output text >&2
            return 1
        fi
        if [[ "$total" -gt 0 && "$ok" -eq "$total" ]]; then
            echo "$total" # instances that ran it
            return 0
        fi
    done
}
