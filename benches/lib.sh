# Helpers the bench scripts share. Each script sources it right after `set -euo pipefail`:
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# It sets `root` (the repository root) and defines die, need_tools, free_port, release_dir,
# fleet_bins, as_pg, alive and stop.
# shellcheck shell=bash

# The repository root.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# die MESSAGE...: prints "SCRIPT: MESSAGE" (SCRIPT is the script's file name, e.g. compare.sh)
# on stderr and exits 1.
die() {
    echo "$(basename "$0"): $*" >&2
    exit 1
}

# need_tools TOOL...: dies ("TOOL is not installed") unless every TOOL is on PATH.
need_tools() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || die "$tool is not installed"
    done
}

# free_port VAR [N]: sets VAR to a port P such that P .. P+N-1 (N: 1 unless given) are free on
# 127.0.0.1: nothing accepts connections there, and no earlier free_port of this script handed
# them out. Call it as a command, not in $(...): a command substitution runs in a subshell,
# which could not remember the ports it handed out. P is picked at random in 20000-32767, below
# Linux's ephemeral ports (32768 up), which the kernel hands to outgoing connections.
_free_ports_taken=" "
free_port() {
    local _fp_var="$1" _fp_n="${2:-1}" _fp_p _fp_k _fp_ok
    [[ "$_fp_n" =~ ^[0-9]+$ && "$_fp_n" -ge 1 && "$_fp_n" -le 1000 ]] ||
        die "free_port: N must be 1 to 1000, not '$_fp_n'"
    for _ in $(seq 500); do
        _fp_p=$((20000 + RANDOM % (12768 - _fp_n + 1)))
        _fp_ok=1
        for ((_fp_k = 0; _fp_k < _fp_n; _fp_k++)); do
            if [[ "$_free_ports_taken" == *" $((_fp_p + _fp_k)) "* ]] || _port_listens $((_fp_p + _fp_k)); then
                _fp_ok=0
                break
            fi
        done
        if ((_fp_ok)); then
            for ((_fp_k = 0; _fp_k < _fp_n; _fp_k++)); do _free_ports_taken+="$((_fp_p + _fp_k)) "; done
            printf -v "$_fp_var" '%s' "$_fp_p"
            return 0
        fi
    done
    if ((_fp_n == 1)); then die "found no free port"; fi
    die "found no free block of $_fp_n ports"
}

# _port_listens PORT: whether something accepts TCP connections on 127.0.0.1:PORT.
_port_listens() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# release_dir: prints cargo's release directory of this repository: $CARGO_TARGET_DIR/release
# (a relative CARGO_TARGET_DIR is taken from the repository root, where the scripts run cargo),
# else target/release.
release_dir() {
    local dir="${CARGO_TARGET_DIR:-$root/target}"
    case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
    echo "$dir/release"
}

# fleet_bins DIR: prints the absolute path of DIR, which must hold shardgate, loadgen and
# shardgate-cluster; with DIR empty, builds the three (release) and prints cargo's release dir.
# Use as `bin_dir="$(fleet_bins "$bin_dir")"`: a failure exits the script.
fleet_bins() {
    local dir="$1" b
    if [[ -z "$dir" ]]; then
        echo "building shardgate, loadgen, shardgate-cluster (release) ..." >&2
        (cd "$root" && cargo build --release -q -p shardgate -p loadgen -p shardgate-cluster) >&2 || die "build failed"
        dir="$(release_dir)"
    fi
    dir="$(cd "$dir" && pwd)" || die "no directory $1"
    for b in shardgate loadgen shardgate-cluster; do
        [[ -x "$dir/$b" ]] || die "$dir/$b is missing (build it, or pass --bin-dir)"
    done
    echo "$dir"
}

# as_pg COMMAND...: runs COMMAND as the user postgres when root (pg_ctl and the server refuse
# to run as root), as is otherwise.
as_pg() { if ((EUID == 0)); then runuser -u postgres -- "$@"; else "$@"; fi; }

# alive PID: whether process PID runs; a zombie does not (a process whose parent has ended may
# stay one where PID 1 does not reap).
alive() { [[ -r /proc/$1/status ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# stop PID: TERM, up to 5 s to end, then KILL (nothing when PID is empty or gone).
stop() {
    [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null || return 0
    kill -TERM "$1"
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null
}
