"""bf16 optimizer state against float32 state: the CPU study's 3-head best-LR runs again.

    nice -n 10 python studies/bf16-state/study.py run --runs /work/runs-bf16   # train (resumes)
    python studies/bf16-state/study.py report                                  # the table

`run` trains the three sweeps of `sweeps/` one run at a time, one thread each (AdamW, ADana and
Dana-Star-MK4 at their best LR of the CPU study, seeds 0, 1 and 2, with
``optim.state_dtype: bfloat16``), and copies each run's small files into `records/`. `report`
pairs each with the float32-state run of the same optimizer and seed in
`studies/cpu-shakespeare/records/` (`report.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import common  # noqa: E402  (studies/common.py)

SWEEPS = sorted((HERE / "sweeps").glob("bf16-h3-*.yaml"))
RECORDS = HERE / "records"


def main() -> None:
    parser = common.driver_parser(__doc__.split("\n\n")[0], ("all", "run", "report"),
                                  "runs at a time (default 1: the runs are timed too)")
    parser.set_defaults(parallel=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.what in ("all", "run"):
        for path in SWEEPS:
            name = yaml.safe_load(path.read_text())["name"]
            common.run_sweep(path, name, args.runs, args.parallel, RECORDS)
    if args.what in ("all", "report"):
        from report import report  # noqa: PLC0415 (beside this file)

        report()


if __name__ == "__main__":
    main()
