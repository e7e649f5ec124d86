"""`danastar clusters`: list the cluster profiles; `--check` asks each for its capacity now.

    danastar clusters
    danastar clusters --check
    danastar clusters --clusters my_clusters.yaml --check

See docs/clusters.md for the registry's format.
"""

from __future__ import annotations

import argparse
import math

from danastar.errors import UserError
from danastar.launch import clusters


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="danastar clusters",
                                     description="List the cluster profiles (--check: capacity).")
    parser.add_argument("--clusters", help="the registry (default $DANASTAR_CLUSTERS or "
                        "~/.config/danastar/clusters.yaml)")
    parser.add_argument("--check", action="store_true",
                        help="ask each enabled cluster for idle nodes and free GPUs")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"--check: seconds to wait for each cluster's answer (default "
                             f"{clusters.QUERY_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    if args.timeout is not None and not args.check:
        raise UserError("--timeout is how long --check waits for each cluster; add --check, or "
                        "remove --timeout.")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UserError(f"--timeout {args.timeout:g} must be a number of seconds greater than 0 "
                        f"(default {clusters.QUERY_TIMEOUT_S:g}).")
    timeout = clusters.QUERY_TIMEOUT_S if args.timeout is None else args.timeout
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
                    profile, profile.gpus_per_node > 0, timeout))
            row += (capacity,)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(f"(registry: {registry.source}; fallback for --cluster auto: {registry.fallback})")
    return 0
