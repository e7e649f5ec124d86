"""`python -m danastar ...` (also what `torchrun -m danastar train ...` runs)."""

from danastar.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
