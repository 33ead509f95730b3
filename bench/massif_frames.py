#!/usr/bin/env python3
"""Bytes a lock in one snapshot of a massif profile, by the first frame of distlock's code.

A heap profile's tree is deep (tokio, hashbrown, alloc): this walks it from the root and
charges each allocation to the first frame that names a distlock crate, so the table says
which of the project's structures holds the memory. Allocations that never reach such a frame
are listed as <other>.

    valgrind --tool=massif --massif-out-file=m.out \\
        target/release/distlock-bench p10-client --url etcd://127.0.0.1:23790 \\
        --names 100000 --ttl-ms 60000
    python3 bench/massif_frames.py m.out --locks 100000            # the peak
    python3 bench/massif_frames.py m.out --locks 100000 --snapshot 44
"""

import argparse
import collections
import re

NODE = re.compile(r"^\s*n(\d+): (\d+) (.*)$")


def snapshots(lines):
    """Each snapshot: its number, heap bytes, whether it is the peak, and its tree's line."""
    out, cur = [], None
    for i, line in enumerate(lines):
        if line.startswith("snapshot="):
            cur = {"n": int(line.split("=")[1]), "tree": None, "start": None, "heap": 0}
            out.append(cur)
        elif cur is not None and line.startswith("mem_heap_B="):
            cur["heap"] = int(line.split("=")[1])
        elif cur is not None and line.startswith("heap_tree="):
            cur["tree"] = line.split("=")[1]
            cur["start"] = i + 1
    return out


def parse(lines, i):
    """The node at line `i` and its children; the line after them."""
    m = NODE.match(lines[i])
    if m is None:
        raise SystemExit(f"line {i + 1}: not a heap tree node: {lines[i][:80]}")
    children, size, frame = int(m.group(1)), int(m.group(2)), m.group(3)
    node = {"bytes": size, "frame": re.sub(r"^0x[0-9A-F]+: ", "", frame), "children": []}
    i += 1
    for _ in range(children):
        child, i = parse(lines, i)
        node["children"].append(child)
    return node, i


def ours(frame):
    """Whether a frame is distlock's own code (the benchmark's `main` and runtime are not)."""
    name = frame.split(" (")[0]
    return "distlock" in name and not name.startswith("distlock_bench::main")


def charge(node, totals):
    if ours(node["frame"]):
        totals[node["frame"][:140]] += node["bytes"]
    elif not node["children"]:
        totals["<other> " + node["frame"][:120]] += node["bytes"]
    else:
        for child in node["children"]:
            charge(child, totals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--locks", type=int, required=True, help="locks held in the run")
    ap.add_argument("--snapshot", type=int, help="a detailed snapshot's number (default: the peak)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    lines = open(args.profile, encoding="utf-8").read().split("\n")
    detailed = [s for s in snapshots(lines) if s["tree"] in ("peak", "detailed")]
    if args.snapshot is None:
        chosen = [s for s in detailed if s["tree"] == "peak"]
    else:
        chosen = [s for s in detailed if s["n"] == args.snapshot]
    if not chosen:
        numbers = ", ".join(str(s["n"]) for s in detailed)
        raise SystemExit(f"no such detailed snapshot; there are: {numbers}")
    snap = chosen[0]
    root, _ = parse(lines, snap["start"])
    totals = collections.Counter()
    for child in root["children"]:
        charge(child, totals)
    print(f"snapshot {snap['n']} ({snap['tree']}): heap {snap['heap']:,} bytes, "
          f"{snap['heap'] / args.locks:.1f} a lock")
    for frame, size in totals.most_common(args.top):
        print(f"{size / args.locks:8.1f}  {frame}")


if __name__ == "__main__":
    main()
