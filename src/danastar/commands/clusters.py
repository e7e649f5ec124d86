"""`danastar clusters`: list the cluster profiles; `--check` asks each for its capacity now.

    danastar clusters
    danastar clusters --check
    danastar clusters --clusters my_clusters.yaml --check

See docs/clusters.md for the registry's format.
"""

from __future__ import annotations

import argparse

from danastar.launch import clusters


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="danastar clusters",
                                     description="List the cluster profiles (--check: capacity).")
    parser.add_argument("--clusters", help="the registry (default $DANASTAR_CLUSTERS or "
                        "~/.config/danastar/clusters.yaml)")
    parser.add_argument("--check", action="store_true",
                        help="ask each enabled cluster for idle nodes and free GPUs")
    parser.add_argument("--timeout", type=float, default=clusters.QUERY_TIMEOUT_S,
                        help="seconds to wait for each cluster's answer")
    args = parser.parse_args(argv)
    registry = clusters.load_registry(args.clusters)
    rows = [("priority", "name", "login", "partition", "gpus", "enabled",
             *(("capacity",) if args.check else ()))]
    for profile in registry.by_priority():
        row = (str(profile.priority), profile.name, profile.login or "(here)",
               profile.partition or "(default)",
               f"{profile.gpus_per_node}x{profile.gpu_type or 'gpu'}" if profile.gpus_per_node
               else "-", "yes" if profile.enabled else "no")
        if args.check:
            capacity = "skipped (disabled)"
            if profile.enabled:
                capacity = clusters.describe(clusters.query_capacity(
                    profile, profile.gpus_per_node > 0, args.timeout))
            row += (capacity,)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(f"(registry: {registry.source}; fallback for --cluster auto: {registry.fallback})")
    return 0
