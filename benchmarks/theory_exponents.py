"""Loss exponents of the ODE at large d (deterministic-limit inputs), against the predictions.

    python benchmarks/theory_exponents.py                  # alpha = 1, beta = 0.3, d = 2000, 4000
    python benchmarks/theory_exponents.py --alpha 1.5 --d 1000

For each d the ODE runs SGD, SGD + momentum, DANA-constant and DANA-decaying to T = d^(2 alpha)
and prints the decade slopes of log(R - R_inf) against log t next to the predicted exponents
(the numbers in docs/theory.md), with the time each solve took.
"""

from __future__ import annotations

import argparse
import time

from danastar.theory import figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--beta", type=float, default=0.3)
    parser.add_argument("--d", type=int, nargs="+", default=[2000, 4000])
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    for d in args.d:
        started = time.perf_counter()
        data = figures.exponents_data(alpha=args.alpha, beta=args.beta, d=d, batch=args.batch)
        elapsed = time.perf_counter() - started
        print(f"\nalpha = {args.alpha:g}, beta = {args.beta:g}, d = {d}, v = {data['v']}, "
              f"B = {args.batch}, T = {data['T']:.3g}: {elapsed:.1f} s for 4 methods")
        print(figures.exponents_table(data))


if __name__ == "__main__":
    main()
