#!/usr/bin/env bash
# A fleet in miniature under faults: 3 routers over 16 shards (4 servers, one with a streaming
# standby), a user-space proxy between the routers and every shard (and, with --delay-us,
# between loadgen and the routers), `loadgen chaos` driving reads, increments, inserts and
# two-phase transfers through all routers at a fixed rate while faults are applied at known
# times, then the invariants checked on the shards and a timeline drawn. See docs/benchmarks.md
# ("Chaos") and `benches/chaos.sh --help`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    cat <<'EOF'
Usage: benches/chaos.sh [OPTIONS]

Starts its own fleet in a private directory: `shardgate-cluster up --no-router` (SHARDS shard
databases on 4 PostgreSQL servers, 2 spare servers for a split), a streaming standby of server 1,
one `loadgen proxy` process with a route per shard (the shard map points the routers at the
proxy), and ROUTERS routers (cross_shard = "two_phase", JSON logs). Then `loadgen chaos` runs
for DURATION at RATE requests a second through all routers while the schedule applies faults:

  full (the default; DURATION at least 170 s), each fault once, about 12 s apart:
    router-kill     router 2 SIGKILLed, restarted 2 s later
    router-drain    router 3 SIGTERMed (drains), restarted when it has exited
    primary-restart server 0 restarted (pg_ctl restart -m fast)
    cut             shard 3's proxy route drops its connections and refuses new ones for 5 s
    blackhole       shard 7's route holds all traffic for 5 s (a link that went down)
    slow            shard 11's route adds 20 ms each way for 10 s
    pause           PAUSE shard 5's range on every router for 2 s, then RESUME
    failover        server 1 stopped, its standby promoted, the map pointed at the standby,
                    every router reloaded (SIGHUP)
    split           shard 2 split online into the two spare servers (shardgate reshard run,
                    then cleanup --delete-moved)
  short: router-kill, primary-restart, cut, slow, failover (DURATION at least 80 s; for CI)
  soak: the repeatable faults (all but failover and split, which happen once, in the first
    cycle) again every CYCLE seconds until the end; router 1 is never restarted, so its RSS
    over the run is the leak check

While it runs, every 10 s each router's RSS, open files and backend connections (from /metrics)
go to OUT/samples.csv. At the end: loadgen's report (per fault: errors by SQLSTATE, timeouts,
p50/p99/max, time to recover; the invariants), OUT/chaos.svg (the timeline), OUT/resources.svg
and a summary of samples.csv (RSS slope of router 1 over the last half, or last hour when longer).
Exit status 0 when every invariant held and every fault was applied.

Options:
  -n, --shards N        shard databases (at least 12)                      [default: 16]
      --routers R       routers (at least 3)                               [default: 3]
  -r, --rate R          requests a second, all connections                 [default: 600]
  -T, --duration S      seconds of load                                    [default: 200]
  -c, --connections C   loadgen connections                                [default: 24]
      --schedule NAME   full, short or soak                                [default: full]
      --cycle S         soak: seconds between cycles of faults (>= 210)    [default: 300]
      --delay-us US     delay each way on every hop (loadgen->router, router->shard), in
                        microseconds: 500 is a cross-AZ round trip of 1 ms [default: 0]
      --bin-dir DIR     shardgate, loadgen and shardgate-cluster from here (default: build them
                        with cargo build --release)
      --out DIR         results directory (default: a new /tmp/shardgate-chaos-XXXX)
  -h, --help            this text
EOF
}

# --- fault actions: `chaos.sh act STATE ACTION [ARG]`, run by loadgen chaos at their times -----

# Starts router K (setsid: a fault's shell ending must not take it along) and waits until it
# accepts connections.
start_router() {
    local k=$1
    setsid "$bin_dir/shardgate" --config "$state/router-$k.toml" >>"$state/router-$k.log" 2>&1 </dev/null &
    echo $! >"$state/router-$k.pid"
    # Not this shell's job any more: its SIGKILL by a fault is not reported here.
    disown $!
    for _ in $(seq 100); do
        _port_listens "${router_ports[$((k - 1))]}" && return 0
        sleep 0.1
    done
    echo "router $k did not start listening; see $state/router-$k.log" >&2
    return 1
}

# Sends one command to the proxy's control port; fails unless it answers ok.
proxy_ctl() {
    local reply
    exec 3<>"/dev/tcp/127.0.0.1/$proxy_control"
    echo "$*" >&3
    read -r reply <&3
    exec 3>&-
    [[ "$reply" == ok* ]] || { echo "proxy: $*: $reply" >&2; return 1; }
}

admin_all() {
    local k
    for ((k = 1; k <= routers; k++)); do
        psql "postgres://app:app@127.0.0.1:${router_ports[$((k - 1))]}/shardgate" -X -q -At -c "$1"
    done
}

shard_range() { sed -n "$(($1 + 1))p" "$state/ranges"; }

act() {
    state=$1
    # shellcheck source=/dev/null
    source "$state/state.env"
    local action=$2 arg=${3:-}
    case "$action" in
        router-kill)
            kill -KILL "$(cat "$state/router-$arg.pid")"
            sleep 2
            start_router "$arg" ;;
        router-drain)
            local pid
            pid="$(cat "$state/router-$arg.pid")"
            kill -TERM "$pid"
            # alive, not kill -0: a router a fault's shell started is nobody's child once that
            # shell ends, and may stay a zombie.
            for _ in $(seq 600); do alive "$pid" || break; sleep 0.1; done
            if alive "$pid"; then
                echo "router $arg had not exited 60 s after SIGTERM: killed" >&2
                kill -KILL "$pid"
                sleep 0.5
                start_router "$arg"
                return 1
            fi
            start_router "$arg" ;;
        primary-restart)
            as_pg "$PG_BINDIR/pg_ctl" restart -m fast -w -D "${data_dirs[$arg]}" -l "${server_logs[$arg]}" ;;
        cut | blackhole)
            proxy_ctl "$action ${shard_proxy_ports[$arg]}"
            sleep 5
            proxy_ctl "heal ${shard_proxy_ports[$arg]}" ;;
        slow)
            proxy_ctl "delay ${shard_proxy_ports[$arg]} 20000"
            sleep 10
            proxy_ctl "delay ${shard_proxy_ports[$arg]} $delay_us" ;;
        pause)
            admin_all "PAUSE '$(shard_range "$arg")'"
            sleep 2
            admin_all "RESUME '$(shard_range "$arg")'" ;;
        failover) failover ;;
        split) split "$arg" ;;
        *) echo "unknown action $action" >&2; return 2 ;;
    esac
}

# Server 1 fenced (stopped), its standby promoted, the shards of server 1 pointed at the
# standby's proxy routes in a new map version, every router reloaded.
failover() {
    as_pg "$PG_BINDIR/pg_ctl" stop -m fast -w -D "${data_dirs[1]}"
    as_pg "$PG_BINDIR/pg_ctl" promote -w -D "$standby_dir"
    python3 - "$state/shardmap.toml" "$state/failover.txt" <<'PY'
import re, sys
path, moves = sys.argv[1], [l.split() for l in open(sys.argv[2]) if l.strip()]
text = open(path).read()
for old, new in moves:
    text, n = re.subn(rf"127\.0\.0\.1:{old}/", f"127.0.0.1:{new}/", text)
    assert n == 1, (old, n)
v = int(re.search(r"^version = (\d+)", text, re.M).group(1))
text = re.sub(r"^version = \d+", f"version = {v + 1}", text, count=1, flags=re.M)
open(path + ".new", "w").write(text)
PY
    mv "$state/shardmap.toml.new" "$state/shardmap.toml"
    local k
    for ((k = 1; k <= routers; k++)); do kill -HUP "$(cat "$state/router-$k.pid")"; done
}

# Shard K split in two onto the spare servers, online (the cut-over pauses the range on every
# router), then the moved rows deleted from the source.
split() {
    local plan="$state/split.toml" admin=() k
    for ((k = 1; k <= routers; k++)); do admin+=(--router "postgres://app:app@127.0.0.1:${router_ports[$((k - 1))]}/shardgate"); done
    "$bin_dir/shardgate" reshard plan --shardmap "$state/shardmap.toml" --range "$(shard_range "$1")" \
        --into "${spares[0]}" --into "${spares[1]}" --out "$plan"
    "$bin_dir/shardgate" reshard run --plan "$plan" "${admin[@]}" --shardmap "$state/shardmap.toml"
    "$bin_dir/shardgate" reshard cleanup --plan "$plan" --delete-moved
}

if [[ "${1:-}" == act ]]; then
    shift
    act "$@"
    exit
fi

# --- options -------------------------------------------------------------------------------------
shards=16 routers=3 rate=600 duration=200 conns=24 schedule=full cycle=300 delay_us=0 bin_dir="" out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--shards) shards="$2"; shift 2 ;;
        --routers) routers="$2"; shift 2 ;;
        -r|--rate) rate="$2"; shift 2 ;;
        -T|--duration) duration="$2"; shift 2 ;;
        -c|--connections) conns="$2"; shift 2 ;;
        --schedule) schedule="$2"; shift 2 ;;
        --cycle) cycle="$2"; shift 2 ;;
        --delay-us) delay_us="$2"; shift 2 ;;
        --bin-dir) bin_dir="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; echo "chaos.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
for n in shards routers rate duration conns cycle; do
    [[ "${!n}" =~ ^[0-9]+$ && "${!n}" -gt 0 ]] || { echo "chaos.sh: --${n} must be a whole number above 0, not '${!n}'" >&2; exit 2; }
done
[[ "$delay_us" =~ ^[0-9]+$ ]] || { echo "chaos.sh: --delay-us must be a whole number" >&2; exit 2; }
((shards >= 12)) || { echo "chaos.sh: --shards must be at least 12 (faults use shards 2, 3, 5, 7 and 11)" >&2; exit 2; }
((routers >= 3)) || { echo "chaos.sh: --routers must be at least 3 (routers 2 and 3 are restarted)" >&2; exit 2; }
case "$schedule" in
    full) min=170 ;; short) min=80 ;; soak) min=$((cycle + 60)) ;;
    *) echo "chaos.sh: --schedule is full, short or soak, not '$schedule'" >&2; exit 2 ;;
esac
# A soak cycle holds seven faults in its first 125 s, and the first one the failover (150 s)
# and the split (175 s): a shorter cycle would overlap them.
((cycle >= 210)) || { echo "chaos.sh: --cycle must be at least 210 s" >&2; exit 2; }
((duration >= min)) || { echo "chaos.sh: --schedule $schedule needs --duration of at least $min s" >&2; exit 2; }

# The server binaries as pgharness (the cluster tool) finds them, exported so both use the same.
if [[ -z "${PG_BINDIR:-}" ]]; then
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV) "$(pg_config --bindir 2>/dev/null)"; do
        if [[ -x "$d/postgres" && -x "$d/pg_ctl" ]]; then PG_BINDIR="$d"; break; fi
    done
fi
[[ -x "${PG_BINDIR:-}/pg_ctl" ]] || die "no PostgreSQL server binaries (apt-get install postgresql, or set PG_BINDIR)"
export PG_BINDIR
need_tools psql python3 curl setsid
bin_dir="$(fleet_bins "$bin_dir")"
if [[ -z "$out" ]]; then
    out="$(mktemp -d "${TMPDIR:-/tmp}/shardgate-chaos-XXXX")"
else
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
fi
chmod 755 "$out"
state="$out/fleet"
mkdir -p "$state"
chmod 755 "$state"

# --- cleanup -------------------------------------------------------------------------------------
loadgen_pid="" sampler_pid="" proxy_pid=""
cleanup() {
    local rc=$?
    trap - EXIT
    trap '' INT TERM
    set +e
    # loadgen leads a process group of its own with the fault commands it runs: all of them go,
    # so no fault acts (restarts a router, say) after the teardown.
    if [[ -n "$loadgen_pid" ]]; then
        kill -TERM -- -"$loadgen_pid" 2>/dev/null
        stop "$loadgen_pid"
        kill -KILL -- -"$loadgen_pid" 2>/dev/null
    fi
    [[ -n "$sampler_pid" ]] && kill "$sampler_pid" 2>/dev/null
    local f
    for f in "$state"/router-*.pid; do [[ -f "$f" ]] && stop "$(cat "$f")"; done
    [[ -d "$state/standby/data" ]] && as_pg "$PG_BINDIR/pg_ctl" stop -m immediate -D "$state/standby/data" >/dev/null 2>&1
    if [[ -f "$state/cluster/cluster.json" ]]; then
        "$bin_dir/shardgate-cluster" down --dir "$state/cluster" >"$state/cluster-down.log" 2>&1 ||
            echo "chaos.sh: cluster down --dir $state/cluster failed (see $state/cluster-down.log)" >&2
    fi
    [[ -n "$proxy_pid" ]] && stop "$proxy_pid"
    rm -rf "$state/standby/data"
    echo "results in $out" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the fleet -----------------------------------------------------------------------------------
free_port base_port 6
free_port standby_port
free_port proxy_base $((2 * shards))
free_port proxy_control
free_port router_base "$routers"
free_port http_base "$routers"
free_port front_base "$routers"
free_port spare_proxy_base 2
echo "chaos: $(date -u +%FT%TZ), $(nproc) cores; $shards shards on 4 servers, $routers routers, schedule $schedule, ${rate}/s for ${duration} s, delay ${delay_us} us each way; results in $out" >&2
"$bin_dir/shardgate-cluster" up --shards "$shards" --servers 4 --spare 2 --no-router \
    --dir "$state/cluster" --base-port "$base_port" --max-connections 400 >"$state/cluster-up.log" 2>&1 ||
    { cat "$state/cluster-up.log" >&2; die "cluster up failed"; }
cjson() { python3 -c "import json,sys; s=json.load(open('$state/cluster/cluster.json')); print($1)"; }
mapfile -t data_dirs < <(cjson "'\n'.join(str(x['data_dir']) for x in s['servers'])")
mapfile -t server_logs < <(cjson "'\n'.join(str(x['log_file']) for x in s['servers'])")
mapfile -t server_socks < <(cjson "'\n'.join(str(x['socket_dir']) for x in s['servers'])")
mapfile -t spare_urls < <(cjson "'\n'.join(x['url'] for x in s['spares'])")

# A streaming standby of server 1, the failover's target.
standby_dir="$state/standby/data"
mkdir -p "$state/standby/sock"
((EUID == 0)) && chown -R postgres "$state/standby"
as_pg "$PG_BINDIR/pg_basebackup" -h "${server_socks[1]}" -p $((base_port + 1)) -U postgres -X stream -R \
    -D "$standby_dir" >"$state/standby/basebackup.log" 2>&1 || { cat "$state/standby/basebackup.log" >&2; die "pg_basebackup failed"; }
printf "port = '%s'\nunix_socket_directories = '%s'\n" "$standby_port" "$state/standby/sock" >>"$standby_dir/postgresql.auto.conf"
as_pg "$PG_BINDIR/pg_ctl" start -w -D "$standby_dir" -l "$state/standby/postgres.log" >/dev/null ||
    die "the standby did not start (see $state/standby/postgres.log)"

# One proxy route per shard (router -> shard), one per shard of server 1 to its standby, one
# per spare (the split's halves: the routers and the split reach them through it too), and
# with a delay one per router (loadgen -> router).
routes=() shard_proxy_ports=() router_ports=() targets=() spares=()
: >"$state/failover.txt"
for ((i = 0; i < shards; i++)); do
    shard_proxy_ports+=($((proxy_base + i)))
    routes+=(--route "127.0.0.1:$((proxy_base + i))=127.0.0.1:$((base_port + i % 4))")
    if ((i % 4 == 1)); then
        routes+=(--route "127.0.0.1:$((proxy_base + shards + i))=127.0.0.1:$standby_port")
        echo "$((proxy_base + i)) $((proxy_base + shards + i))" >>"$state/failover.txt"
    fi
done
for j in 0 1; do
    [[ "${spare_urls[$j]}" =~ ^(.*@127\.0\.0\.1:)([0-9]+)(/.*)$ ]] || die "unexpected spare URL ${spare_urls[$j]}"
    routes+=(--route "127.0.0.1:$((spare_proxy_base + j))=127.0.0.1:${BASH_REMATCH[2]}")
    spares+=("${BASH_REMATCH[1]}$((spare_proxy_base + j))${BASH_REMATCH[3]}")
done
for ((k = 1; k <= routers; k++)); do
    router_ports+=($((router_base + k - 1)))
    if ((delay_us > 0)); then
        routes+=(--route "127.0.0.1:$((front_base + k - 1))=127.0.0.1:$((router_base + k - 1))")
        targets+=(--target "postgres://app:app@127.0.0.1:$((front_base + k - 1))/app")
    else
        targets+=(--target "postgres://app:app@127.0.0.1:$((router_base + k - 1))/app")
    fi
done
setsid "$bin_dir/loadgen" proxy "${routes[@]}" --control "127.0.0.1:$proxy_control" --delay-us "$delay_us" \
    >"$state/proxy.log" 2>&1 </dev/null &
proxy_pid=$!
for _ in $(seq 100); do grep -q "proxy ready" "$state/proxy.log" && break; sleep 0.1; done
grep -q "proxy ready" "$state/proxy.log" || { cat "$state/proxy.log" >&2; die "the proxy did not start"; }

# The routers' map: every shard through its proxy route, plus the chaos tables.
python3 - "$state/cluster/shardmap.toml" "$state/shardmap.toml" "$base_port" "$proxy_base" <<'PY'
import re, sys
src, dst, base, proxy = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
text = open(src).read()
def to_proxy(m):
    shard = int(m.group(2))
    assert int(m.group(1)) == base + shard % 4, m.group(0)
    return f"127.0.0.1:{proxy + shard}/shard_{m.group(2)}"
text, n = re.subn(r"127\.0\.0\.1:(\d+)/shard_(\d+)", to_proxy, text)
assert n > 0
tables = "".join(f'\n[[tables]]\nname = "{t}"\nkey = "id"\ntype = "bigint"\n'
                 for t in ("chaos_accounts", "chaos_counters", "chaos_events"))
text = text.replace("\n[[shards]]", tables + "\n[[shards]]", 1)
open(dst, "w").write(text)
PY
python3 -c 'import sys, tomllib; [print(s["range"]) for s in tomllib.load(open(sys.argv[1], "rb"))["shards"]]' \
    "$state/shardmap.toml" >"$state/ranges"

for ((k = 1; k <= routers; k++)); do
    {
        printf 'listen = "127.0.0.1:%s"\nshardmap = "%s"\ndatabase = "app"\nauth = "scram-sha-256"\nrouter_id = %s\n' \
            "${router_ports[$((k - 1))]}" "$state/shardmap.toml" "$k"
        for ((j = 1; j <= routers; j++)); do
            ((j == k)) || printf '[[peers]]\nid = %s\naddress = "127.0.0.1:%s"\n' "$j" "${router_ports[$((j - 1))]}"
        done
        printf '[[users]]\nname = "app"\npassword = "app"\nadmin = true\n'
        printf '[http]\nlisten = "127.0.0.1:%s"\n' $((http_base + k - 1))
        printf '[backend]\nuser = "postgres"\npassword = "postgres"\n'
        printf '[pool]\nmax_size = 10\nconnect_timeout_ms = 2000\n'
        printf '[transactions]\ncross_shard = "two_phase"\n'
        printf '[log]\nformat = "json"\n'
    } >"$state/router-$k.toml"
done
declare -p bin_dir routers router_ports data_dirs server_logs shard_proxy_ports proxy_control delay_us \
    standby_dir spares PG_BINDIR >"$state/state.env"
# All at once, as an autoscaling group starts them: each creates the two-phase schema at start,
# idempotently under an advisory lock.
starting=()
for ((k = 1; k <= routers; k++)); do
    start_router "$k" &
    starting+=($!)
done
for ((k = 1; k <= routers; k++)); do
    wait "${starting[$((k - 1))]}" || die "router $k did not start (see $state/router-$k.log)"
done

# --- the schedule --------------------------------------------------------------------------------
self="$root/benches/chaos.sh"
fault() { printf '%s %s %q act %q %s %s\n' "$1" "$2" "$self" "$state" "$3" "${4:-}" >>"$out/faults.txt"; }
: >"$out/faults.txt"
case "$schedule" in
    full)
        fault 15 router-kill router-kill 2
        fault 28 router-drain router-drain 3
        fault 41 primary-restart primary-restart 0
        fault 54 cut cut 3
        fault 67 blackhole blackhole 7
        fault 80 slow slow 11
        fault 100 pause pause 5
        fault 115 failover failover
        fault 135 split split 2 ;;
    short)
        fault 10 router-kill router-kill 2
        fault 22 primary-restart primary-restart 0
        fault 34 cut cut 3
        fault 46 slow slow 11
        fault 64 failover failover ;;
    soak)
        restartable=(0 2 3)
        for ((c = 0; c * cycle + 15 < duration - 30; c++)); do
            b=$((c * cycle + 15))
            for f in "0 router-kill 2" "20 router-drain 3" "40 primary-restart ${restartable[$((c % 3))]}" \
                "60 cut 3" "80 blackhole 7" "100 slow 11" "125 pause 5"; do
                read -r off name arg <<<"$f"
                ((b + off < duration - 30)) && fault $((b + off)) "$name" "$name" "$arg"
            done
            if ((c == 0 && b + 175 < duration - 30)); then
                fault $((b + 150)) failover failover
                fault $((b + 175)) split split 2
            fi
        done ;;
esac

# --- resources sampler ---------------------------------------------------------------------------
echo "time_s,router,pid,rss_kb,fds,backend_conns" >"$out/samples.csv"
(
    # A failed sample (a router restarting, a slow /metrics) is skipped, not the end of sampling.
    set +e +o pipefail
    t0=$SECONDS
    while sleep 10; do
        for ((k = 1; k <= routers; k++)); do
            pid="$(cat "$state/router-$k.pid" 2>/dev/null)" || continue
            rss="$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null)" || continue
            fds="$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)"
            conns="$(curl -s -m 2 "http://127.0.0.1:$((http_base + k - 1))/metrics" |
                awk '/^shardgate_pool_open_connections/ {s += $NF} END {print s + 0}')"
            echo "$((SECONDS - t0)),$k,$pid,${rss:-},$fds,$conns" >>"$out/samples.csv"
        done
    done
) &
sampler_pid=$!

# --- the run -------------------------------------------------------------------------------------
set +e
setsid "$bin_dir/loadgen" chaos --shardmap "$state/shardmap.toml" "${targets[@]}" --rate "$rate" \
    --duration "$duration" --connections "$conns" --faults "$out/faults.txt" --out "$out" &
loadgen_pid=$!
wait "$loadgen_pid"
chaos_rc=$?
loadgen_pid=""
set -e
kill "$sampler_pid" 2>/dev/null || true
sampler_pid=""
python3 "$root/benches/chaos_resources.py" "$out" "$duration" || true
exit "$chaos_rc"
