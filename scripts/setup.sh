#!/usr/bin/env bash
# Sets up danastar in ./.venv, then prints how to run its commands.
#
# torch policy: a torch that Python can already import (a CUDA build, say) is reused and never
# replaced: .venv is then made with --system-site-packages, so that it sees that torch. On a
# machine without one, .venv sees none of the system's packages (nothing of theirs for pip to
# weigh or to report on) and the CPU build of torch is installed in it (a few hundred MB instead
# of several GB of CUDA packages). An existing .venv is kept as it is.
#
# pip's report of broken requirements is kept to what danastar needs (scripts/check_requirements.py):
# a venv that sees the system's packages sees their conflicts too (awscli's pins, say), which
# are neither danastar's nor the setup's doing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# The 'train' extra always (what `danastar train` needs); DANASTAR_EXTRAS adds more, e.g. dev.
EXTRAS="train${DANASTAR_EXTRAS:+,${DANASTAR_EXTRAS}}"
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

# What it installs and for how long (measured from nothing on a busy 2-core machine: the CPU
# torch and train in 4 minutes, with dev, every test's dependencies, in 9; a second run in 1).
case ",${EXTRAS}," in
    ,train,) DURATION="about 4 minutes" ;;
    *,dev,* | *,all,*) DURATION="about 10 minutes" ;;
    *) DURATION="4 to 10 minutes" ;;
esac
echo "setup: installing danastar from this checkout (editable) with the extras ${EXTRAS}, into .venv,"
echo "       and the CPU build of torch ${TORCH_VERSION} if Python has no torch; the first time this"
echo "       takes ${DURATION} (pip downloads quietly), later runs about a minute."

if [ ! -x .venv/bin/python ]; then
    if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
        "$PYTHON" -m venv --system-site-packages .venv
    else
        "$PYTHON" -m venv .venv
    fi
fi
PY=.venv/bin/python

if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: using the installed torch $("$PY" -c "import torch; print(torch.__version__)") (never replaced)"
else
    echo "setup: no torch found; installing the CPU build of torch ${TORCH_VERSION}"
    # A local wheel or mirror that carries the +cpu build is used first; otherwise PyTorch's CPU index.
    "$PY" -m pip install -q --no-warn-conflicts "torch==${TORCH_VERSION}+cpu" 2>/dev/null \
        || "$PY" -m pip install -q --no-warn-conflicts --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
fi

echo "setup: installing danastar[${EXTRAS}] and its requirements"
"$PY" -m pip install -q --no-warn-conflicts -e ".[${EXTRAS}]"
"$PY" scripts/check_requirements.py "${EXTRAS}"
"$PY" -c "import torch, danastar; print(f'setup: danastar {danastar.__version__} with torch {torch.__version__}')"
# The commands are in .venv/bin: say how to reach them (the docs write `danastar ...`, `python ...`).
cat <<'EOF'
setup: done. The docs' commands (`danastar ...`, `python ...`) run in this environment:
         source .venv/bin/activate          (once per shell), then e.g.  danastar train
       or, without activating it:           .venv/bin/danastar train
EOF
