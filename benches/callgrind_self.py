#!/usr/bin/env python3
"""The self cost of each function in callgrind files, costliest first.

callgrind_annotate attributes a whole thread's cost to its first frame when the counters were
zeroed while the thread ran (as benches/callgrind.sh does after its warm-up); this reads the
files' cost lines itself: the lines under `fn=` are that function's own instructions, the line
after each `calls=` is a callee's inclusive cost and is not counted. Names compressed as
`(id) name` are expanded.

    callgrind_self.py [--per N] [--top K] FILE...
"""

import argparse
import collections
import re


def self_costs(paths):
    names = {}
    cost = collections.Counter()

    def expand(text):
        m = re.match(r"\((\d+)\)(?: (.*))?", text)
        if not m:
            return text
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), text)

    for path in paths:
        current = None
        after_calls = False
        with open(path, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if line.startswith("fn="):
                    current = expand(line[3:])
                elif line.startswith("cfn="):
                    expand(line[4:])
                elif line.startswith("calls="):
                    after_calls = True
                elif line[:1].isdigit() or line[:1] in ("+", "-", "*"):
                    if after_calls:
                        after_calls = False
                        continue
                    parts = line.split()
                    if current and len(parts) >= 2 and parts[1].isdigit():
                        cost[current] += int(parts[1])
    return cost


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per", type=int, default=1, help="divide costs by this (statements)")
    parser.add_argument("--top", type=int, default=25, help="functions to list")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    cost = self_costs(args.files)
    total = sum(cost.values())
    for name, c in cost.most_common(args.top):
        short = re.sub(r"<[^<>]*>", "<>", name)
        print(f"{c / args.per:10.1f} {100 * c / max(total, 1):5.1f}%  {short[:140]}")
    print(f"{total / args.per:10.1f} 100.0%  total")


if __name__ == "__main__":
    main()
