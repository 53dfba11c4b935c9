#!/usr/bin/env python3
"""The fleet's capacity model: from measured costs per point select (costs.json) to the
router, loadgen and primary counts, backend connections and network a target load needs.

    deploy/capacity/model.py                       # the record: 118.5M QPS over 512 shards
    deploy/capacity/model.py --qps 50e6 --shards 256 --costs my-costs.json

Prints a Markdown report (docs/capacity.md holds its output for the checked-in costs). Every
figure is arithmetic on the inputs; the assumptions are printed with it.
"""

import argparse
import json
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def value(costs, key):
    try:
        v = costs[key]
        return float(v["value"] if isinstance(v, dict) else v)
    except (KeyError, TypeError, ValueError) as e:
        sys.exit(f"model.py: costs file has no usable {key!r} ({e})")


def model(a, costs):
    router_us = value(costs, "router_us_per_query")
    pg_us = value(costs, "postgres_us_per_query")
    lg_us = value(costs, "loadgen_us_per_query")
    bytes_q = value(costs, "router_bytes_per_query")
    workers = int(value(costs, "router_workers"))
    per_shard = a.qps / a.shards
    speed = a.speedup  # per-query work of one target vCPU relative to one measured vCPU

    router_vcpus = a.qps * router_us / 1e6 / speed / a.router_util
    routers = math.ceil(router_vcpus / a.router_vcpus)
    lg_vcpus = a.qps * lg_us / 1e6 / speed / a.loadgen_util
    loadgens = math.ceil(lg_vcpus / a.loadgen_vcpus)
    pg_vcpus = per_shard * pg_us / 1e6 / speed
    qps_per_router = a.qps / routers
    gbit = qps_per_router * bytes_q * 8 / 1e9
    # Little's law: statements in progress on a primary = arrival rate x time each holds a
    # backend (its CPU time here; network and queueing add to it on a real fleet).
    busy = per_shard * pg_us / 1e6
    per_thread = routers * workers * int(value(costs, "pool_min_connections_per_worker_and_shard"))
    per_thread_record = a.record_routers * workers
    return {
        "per_shard": per_shard,
        "router_vcpus": router_vcpus,
        "routers": routers,
        "qps_per_router": qps_per_router,
        "gbit": gbit,
        "lg_vcpus": lg_vcpus,
        "loadgens": loadgens,
        "pg_vcpus": pg_vcpus,
        "pg_util": pg_vcpus / a.primary_vcpus,
        "busy": busy,
        "per_thread": per_thread,
        "per_thread_record": per_thread_record,
        "per_router": routers * a.conns_per_router_shard,
        "router_us": router_us,
        "pg_us": pg_us,
        "lg_us": lg_us,
        "bytes_q": bytes_q,
        "workers": workers,
    }


def report(a, costs, m):
    out = []
    w = out.append
    w(f"Capacity for {a.qps / 1e6:g}M point selects a second over {a.shards} shards "
      f"({m['per_shard']:,.0f} per shard), costs from {a.costs} "
      f"(measured on: {costs.get('measured_on', 'unknown')}).")
    w("")
    w("| what | figure | from |")
    w("|---|---|---|")
    w(f"| router vCPUs | {m['router_vcpus']:,.0f} | {m['router_us']} µs/query ÷ speed-up {a.speedup} ÷ {a.router_util:.0%} utilisation |")
    w(f"| routers ({a.router_vcpus}-vCPU instances) | **{m['routers']:,}** | the record ran {a.record_routers} |")
    w(f"| QPS per router | {m['qps_per_router']:,.0f} | |")
    w(f"| network per router (in + out) | {m['gbit']:.1f} Gbit/s | {m['bytes_q']:.0f} bytes/query, both legs, with TCP/IP headers |")
    w(f"| loadgen vCPUs | {m['lg_vcpus']:,.0f} | {m['lg_us']} µs/query ÷ {a.loadgen_util:.0%} utilisation |")
    w(f"| loadgen hosts ({a.loadgen_vcpus}-vCPU instances) | **{m['loadgens']:,}** | |")
    w(f"| primary vCPUs busy per shard | {m['pg_vcpus']:.1f} of {a.primary_vcpus} ({m['pg_util']:.0%}) | {m['pg_us']} µs/query |")
    w(f"| statements in progress per primary (Little's law) | {m['busy']:.0f} | rate × {m['pg_us']} µs held per statement |")
    w(f"| backend connections per primary, sharing off (`shared_connections = 0`) | {m['per_thread']:,} ({m['per_thread_record']:,} with the record's {a.record_routers} routers) | routers × {m['workers']} workers × ≥ 1 connection each |")
    w(f"| backend connections per primary, {a.conns_per_router_shard} shared per router and shard | {m['per_router']:,} | `[pool] shared_connections = {a.conns_per_router_shard}` (the default is 2), plus the connections open transactions hold |")
    w("")
    w("Assumptions:")
    w(f"- one target vCPU does {a.speedup}× the per-query work of one measured vCPU (Graviton4 vs "
      "the measurement machine: check with `benches/compare.sh` on one router instance);")
    w("- costs per query stay constant with load (the router's measured cost is for a busy router; "
      f"a lightly loaded one pays about {value_or(costs, 'router_us_per_query', 'light_load_value')} µs);")
    w(f"- utilisation targets: routers {a.router_util:.0%}, loadgens {a.loadgen_util:.0%} (headroom for "
      "tail latency and for losing an instance);")
    w("- the network figure is the router's own traffic; the NLB and the primaries' NICs each carry "
      "one leg of it;")
    w("- Postgres CPU is that of a 4-shard cluster on the measurement machine; 231k QPS per primary "
      "also needs the working set in shared_buffers and enough backends for the bursts.")
    return "\n".join(out) + "\n"


def value_or(costs, key, sub):
    try:
        return costs[key][sub]
    except (KeyError, TypeError):
        return "?"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--costs", default=None, help="measured costs, JSON [default: deploy/capacity/costs.json]")
    p.add_argument("--qps", type=float, default=118.5e6, help="point selects a second, whole fleet")
    p.add_argument("--shards", type=int, default=512)
    p.add_argument("--router-vcpus", type=int, default=32, help="vCPUs per router instance (r8g.8xlarge: 32)")
    p.add_argument("--loadgen-vcpus", type=int, default=64, help="vCPUs per loadgen instance")
    p.add_argument("--primary-vcpus", type=int, default=64, help="vCPUs per primary (r8g.16xlarge: 64)")
    p.add_argument("--router-util", type=float, default=0.6, help="CPU share routers may use")
    p.add_argument("--loadgen-util", type=float, default=0.5, help="CPU share loadgens may use")
    p.add_argument("--speedup", type=float, default=1.0, help="target vCPU work per measured vCPU")
    p.add_argument("--record-routers", type=int, default=480)
    p.add_argument("--conns-per-router-shard", type=int, default=2)
    a = p.parse_args(argv)
    if a.costs is None:
        a.costs = "deploy/capacity/costs.json"
        path = HERE / "costs.json"
    else:
        path = pathlib.Path(a.costs)
    for name in ("qps", "shards", "router_vcpus", "loadgen_vcpus", "primary_vcpus", "speedup"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be above 0")
    for name in ("router_util", "loadgen_util"):
        if not 0 < getattr(a, name) <= 1:
            p.error(f"--{name.replace('_', '-')} must be in (0, 1]")
    try:
        costs = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"model.py: cannot read {a.costs}: {e}")
    sys.stdout.write(report(a, costs, model(a, costs)))


if __name__ == "__main__":
    main()
