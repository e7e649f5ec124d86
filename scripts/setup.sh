#!/usr/bin/env bash
# Sets up danastar in ./.venv, then prints how to run its commands.
#
# torch policy: a torch that Python can already import (a CUDA build, say) is reused through
# --system-site-packages and never replaced; on a machine without one, the CPU build is
# installed (a few hundred MB instead of several GB of CUDA packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# The 'train' extra always (what `danastar train` needs); DANASTAR_EXTRAS adds more, e.g. dev.
EXTRAS="train${DANASTAR_EXTRAS:+,${DANASTAR_EXTRAS}}"

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv --system-site-packages .venv
fi
PY=.venv/bin/python

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    TORCH_VERSION=${TORCH_VERSION:-2.13.0}
    echo "setup: no torch found; installing the CPU build of torch ${TORCH_VERSION}"
    # A local wheel or mirror that carries the +cpu build is used first; otherwise PyTorch's CPU index.
    "$PY" -m pip install -q "torch==${TORCH_VERSION}+cpu" 2>/dev/null \
        || "$PY" -m pip install -q --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
fi

"$PY" -m pip install -q -e ".[${EXTRAS}]"
"$PY" -c "import torch, danastar; print(f'setup: danastar {danastar.__version__} with torch {torch.__version__}')"
# The commands are in .venv/bin: say how to reach them (the docs write `danastar ...`, `python ...`).
cat <<'EOF'
setup: done. The docs' commands (`danastar ...`, `python ...`) run in this environment:
         source .venv/bin/activate          (once per shell), then e.g.  danastar train
       or, without activating it:           .venv/bin/danastar train
EOF
