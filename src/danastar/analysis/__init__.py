"""Analysis of local run directories: records, compute, fits, compute multipliers, LR laws, LR
sensitivity, seed statistics and the paper's figures (docs/analysis.md).

Every function here is pure (numbers in, numbers out) except ``records`` (reads run directories)
and ``plots`` (draws with matplotlib, imported only when a figure is asked for).
"""
