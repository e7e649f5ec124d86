"""The optimizers' hyperparameters in plain Python, shared by danastar.optim (torch) and
danastar.optax (JAX), so that both say the same sentences and compute the same decay:

* the defaults of the DANA family and of the paper's weight decay;
* the checks of a hyperparameter, a state dtype and a parameter's dtype, each refusing with one
  sentence (ValueError) that reads the same in either framework;
* the independent, log-time weight decay's multiplier (its one formula, clamped to [0, 1]), how
  much of a weight it removes early in a run, and the warning when a run is too short for it.
* a run continued past its planned length T: the weight decay's rules (`extended_weight_decay`)
  and the LR schedule's (`stretched_schedule`, `reanchored_schedule`, `rewarmed_schedule`, over
  any schedule function, with a ``where`` that jax's ``jnp.where`` can be).

Imports nothing of danastar, torch or jax: each framework hands in its values as numbers, names
and shapes (a torch tensor's or a jax array's value is the framework's to check).
"""

from __future__ import annotations

import numbers
import operator
import os
import sys
import warnings

DEFAULT_DELTA = 8.0  # damping δ of the EMA coefficient a_k = δ / (δ + k)
DEFAULT_KAPPA = 0.85  # log-time exponent κ of the Nesterov factor (1 + k)^(1 - κ)
DEFAULT_CLIPSNR = 2.0  # the SNR clip of the *-mk4 variants

WD_TS_DIVISOR = 10  # the paper's time scale of the decay: wd_ts = ⌊T/10⌋
PAPER_OMEGA = 4.0  # the weight-decay strength ω of the paper's runs (λ = ω / wd_ts)

# A constant decay (wd_ts None) may remove at most this fraction of a weight over its first
# EARLY_STEPS steps at the schedule's peak (s_t = 1), by the decay alone. Why 5% of 100 steps:
# every constant decay an AdamW recipe applies per step (lr·λ: 3e-5 for lr 3e-4 and λ 0.1, 0.3%
# over 100 steps; 5e-4 at most for lr 1e-3 and λ 0.5) stays under it, while every AdamW
# weight_decay typed here, where it is not multiplied by the LR, is far over it: 0.1 removes
# 99.997% in 100 steps, 0.01 63%, even 1e-3 9.5%. The largest constant decay allowed is ≈5.1e-4.
MAX_EARLY_DECAY = 0.05
EARLY_STEPS = 100

# A run is too short for its log-time decay when the decay alone, at the schedule's peak,
# removes more than SHORT_RUN_MAX_SHARE of a weight over its first SHORT_RUN_STEPS steps. With
# the paper's ω = 4 that is a run under 280 steps (wd_ts = T/10 under 28): at T = 300 the
# first five steps remove 48%, at T = 100 85%, and under T = 40 the paper's factor 1 − ω/(wd_ts
# + k) is 0 or less, which the clamp makes 0 (the weight is zeroed, never flipped). Long runs
# remove little early: 18% at T = 1000, 4% at T = 5000.
SHORT_RUN_STEPS = 5
SHORT_RUN_MAX_SHARE = 0.5

# The fix each surface names when a run is too short for its decay (`short_run_warning`).
FIX_PAPER_FORM = "a longer total_steps, a smaller omega, or omega=0 (no decay) for a smoke test"
FIX_EXPLICIT_FORM = ("the paper's form omega=4.0, total_steps=T for a run of T steps (T of 280 "
                     "or more), a smaller weight_decay·wd_ts (the paper's omega), or "
                     "weight_decay=0 for a smoke test")

# The dtypes the optimizers' state may be kept in: float32 (widened to float64 for float64
# parameters), or bfloat16.
STATE_DTYPE_NAMES = ("float32", "bfloat16")


class ShortRunWeightDecayWarning(UserWarning):
    """The log-time weight decay removes a large share of every decaying weight in the first
    steps of a run too short for it (`short_run_warning`)."""


# -- checks --------------------------------------------------------------------------------------

def check(condition: bool, message: str) -> None:
    """Raise ValueError with ``message`` unless ``condition``."""
    if not condition:
        raise ValueError(message)


def is_number(value) -> bool:
    """A real number fixed in Python (int, float, a NumPy scalar), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_array(value) -> bool:
    """A torch tensor or a jax/NumPy array (or a tracer of one): its value is the framework's to
    check (a tensor LR, a hyperparameter `optax.inject_hyperparams` passes)."""
    return hasattr(value, "shape") and hasattr(value, "dtype")


def shown(value) -> str:
    """A value as a refusal shows it: a number as Python prints it, anything else as its repr."""
    return str(float(value) if isinstance(value, float) else value) if is_number(value) \
        else repr(value)


def require(name: str, value, ok, rule: str) -> None:
    """Refuse ``value`` unless it is a number for which ``ok(value)`` holds (an array is left to
    the framework): "<name> must be <rule>, got <value>"."""
    if is_array(value) and not is_number(value):
        return
    if not is_number(value):
        rule += " (a number)"
    check(is_number(value) and ok(value), f"{name} must be {rule}, got {shown(value)}")


def check_lr(lr) -> None:
    """The learning rate: a number >= 0 (torch.optim's rule; a tensor is the caller's)."""
    require("lr", lr, lambda v: v >= 0, ">= 0")


def check_non_negative(**values) -> None:
    for name, value in values.items():
        require(name, value, lambda v: v >= 0, ">= 0")


def check_positive_or_none(**values) -> None:
    for name, value in values.items():
        if value is not None:
            require(name, value, lambda v: v > 0, "None or > 0")


def check_betas(betas) -> None:
    ok = isinstance(betas, (tuple, list)) and all(
        is_array(b) and not is_number(b) or is_number(b) and 0 <= b < 1 for b in betas)
    check(ok, f"betas must each be in [0, 1), got {shown(betas)}")


def check_dana(delta, kappa, clipsnr, eps) -> None:
    """The DANA family's own hyperparameters."""
    require("delta", delta, lambda v: v > 0, f"> 0 (default {DEFAULT_DELTA:g})")
    require("kappa", kappa, lambda v: 0 < v <= 1, f"in (0, 1] (default {DEFAULT_KAPPA})")
    check_positive_or_none(clipsnr=clipsnr)
    check_non_negative(eps=eps)


def check_paper_form(omega, total_steps) -> None:
    """The paper's weight decay: omega >= 0 and total_steps a whole number of steps >= 1."""
    require("omega", omega, lambda v: v >= 0, ">= 0 (the paper uses 4.0)")
    require("total_steps", total_steps, lambda v: v >= 1 and int(v) == v,
            "a whole number of optimizer steps >= 1")


def state_dtype_name(name: str | None, given) -> str:
    """The state dtype's name, ``name`` being what the framework calls ``given`` (None when it
    is not a dtype at all); refuses any but float32 and bfloat16."""
    check(name in STATE_DTYPE_NAMES,
          f"state_dtype must be one of float32, bfloat16 (a dtype or its name), got {given!r}")
    return name


def check_parameter_dtype(dtype_name: str, shape, kind: str) -> None:
    """Refuse a parameter the update would get wrong; ``kind`` is "floating", "complex" or
    anything else (integer, boolean ...), ``dtype_name`` as NumPy names it ("int32")."""
    where = f"a parameter of dtype {dtype_name} and shape {tuple(shape)}"
    check(kind != "complex",
          f"{where}: danastar's optimizers update real parameters only (a complex one would get "
          "a wrong update); keep it as a real parameter with a last axis of 2 (real and "
          "imaginary parts) and view it as complex where the model uses it "
          "(torch.view_as_complex, or jax.lax.complex of its two halves)")
    check(kind == "floating",
          f"{where}: danastar's optimizers update floating-point parameters only (the update of "
          "an integer or boolean one would be truncated); make it a floating-point parameter or "
          "leave it out of the optimizer")


# -- the independent, log-time weight decay ------------------------------------------------------

def paper_weight_decay(omega: float, total_steps: int,
                       wd_ts: int | None = None) -> tuple[float, int]:
    """The paper's weight decay for a run of ``total_steps`` optimizer steps, as
    ``(weight_decay, wd_ts)``: ``wd_ts = ⌊T/10⌋`` (at least 1, so that runs shorter than 10
    steps stay finite) unless given, and ``weight_decay = ω / wd_ts``. The per-step decay
    ω·s_t/(wd_ts + k) is then about ω/t late in the run: the paper's λ(t) = ω/t with an offset
    that keeps it finite early."""
    if wd_ts is None:
        wd_ts = max(1, total_steps // WD_TS_DIVISOR)
    return omega / wd_ts, wd_ts


def clamp_unit(value):
    """``value`` clamped to [0, 1]: a number, or each element of a torch tensor or jax array."""
    if hasattr(value, "clip"):
        return value.clip(0.0, 1.0)
    return min(max(value, 0.0), 1.0)


def decay_multiplier(weight_decay, schedule_factor, k, wd_ts, divide=operator.truediv):
    """The factor that multiplies a parameter at step ``k``: the independent weight decay
    1 − λ·s_t/(1 + k/wd_ts) (1 − λ·s_t without ``wd_ts``), scaled by the schedule factor s_t but
    not by the peak LR, and clamped to [0, 1].

    The clamp changes nothing where the factor is in [0, 1]; where the decay is stronger than
    the whole weight (the paper's ω = 4 in a run under about 40 steps, whose first factors are
    0 or less), it zeroes the weight rather than flipping its sign. Numbers, torch tensors (the
    capturable path: ``divide`` rounding once) and jax arrays alike.
    """
    if wd_ts is None:
        return clamp_unit(1 - weight_decay * schedule_factor)
    return clamp_unit(1 - divide(weight_decay * schedule_factor, 1 + k / wd_ts))


def fraction_kept(weight_decay: float, wd_ts: float | None, steps: int = EARLY_STEPS) -> float:
    """What is left of a weight after ``steps`` steps of the decay alone at the schedule's peak
    (s_t = 1), by the optimizers' own multiplier."""
    kept = 1.0
    for k in range(1, steps + 1):
        kept *= decay_multiplier(weight_decay, 1.0, k, wd_ts)
    return kept


def largest_constant_weight_decay() -> float:
    """The largest constant ``weight_decay`` (``wd_ts=None``) the optimizers accept."""
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection on fraction_kept, so the bound follows the multiplier
        middle = (low + high) / 2
        low, high = (middle, high) if 1 - fraction_kept(middle, None) <= MAX_EARLY_DECAY \
            else (low, middle)
    return low


def early_decay_share(weight_decay: float, wd_ts: float | None,
                      steps: int = SHORT_RUN_STEPS) -> float:
    """The share of a weight the decay alone removes in the first ``steps`` steps at the
    schedule's peak (s_t = 1, whatever the schedule: the most it can remove)."""
    return 1 - fraction_kept(weight_decay, wd_ts, steps)


def short_run_warning(weight_decay, wd_ts, fix: str) -> str | None:
    """The sentence that says a run is too short for its log-time decay, or None: when the
    decay (``weight_decay`` over ``wd_ts``, the paper's ω being their product) removes more than
    SHORT_RUN_MAX_SHARE of a weight in its first SHORT_RUN_STEPS steps. ``fix`` names what the
    caller's user changes (FIX_PAPER_FORM, FIX_EXPLICIT_FORM, or a command's flags)."""
    if not (is_number(weight_decay) and is_number(wd_ts)) or weight_decay <= 0:
        return None
    share = early_decay_share(weight_decay, wd_ts)
    if share <= SHORT_RUN_MAX_SHARE:
        return None
    amount = "all" if share == 1 else f"{share:.0%}" if share < 0.995 else f"{share:.2%}"
    steps = f"{wd_ts:g} step{'s' if wd_ts != 1 else ''}"
    return (f"the log-time weight decay (omega {weight_decay * wd_ts:g} over wd_ts = {steps}: "
            f"weight_decay {weight_decay:g}) removes {amount} of every decaying weight in "
            f"its first {SHORT_RUN_STEPS} steps at the schedule's peak, more than the "
            f"{SHORT_RUN_MAX_SHARE:.0%} a run can spare there, so this run is too short for it; "
            f"use {fix}")


def warn_short_run(groups, fix: str) -> str | None:
    """Warn (ShortRunWeightDecayWarning) once for ``groups`` (dicts with ``weight_decay`` and
    ``wd_ts``), with the sentence of the group whose decay is strongest early, pointing at the
    first caller outside danastar; returns the sentence."""
    sentences = [(early_decay_share(g["weight_decay"], g["wd_ts"]), sentence) for g in groups
                 if (sentence := short_run_warning(g["weight_decay"], g["wd_ts"], fix))]
    if not sentences:
        return None
    sentence = max(sentences)[1]
    warnings.warn(sentence, ShortRunWeightDecayWarning, stacklevel=outside_stacklevel())
    return sentence


def outside_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by this module's caller name the first
    frame outside the danastar package (the user's code), however deep the call."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1  # the caller, which calls warnings.warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


# -- continuing a run past its planned length T ---------------------------------------------------
# The rules of docs/optimizers.md ("Extending a run past its planned T"). A run planned for T1
# steps is continued from step s (the steps it has taken, s <= T1) to T2 > T1. Step s is the
# first step under the new settings; the optimizers count it as k = s + 1 (1-based).

# The log-time decay λ/(1 + k/wd_ts) = ω/(wd_ts + k), ω = λ·wd_ts, from step s on:
# * "keep": λ and wd_ts as they were: no jump, ω and the time scale T1/10 kept;
# * "reanchor": the time scale of a run planned for T2 (wd_ts = ⌊T2/10⌋) with ω raised so that
#   the decay at step s is unchanged: no jump, a stronger ω;
# * "planned": the decay a run planned for T2 applies at these steps (ω kept, wd_ts = ⌊T2/10⌋):
#   a jump down at s by (wd_ts1 + k)/(wd_ts2 + k).
DECAY_RULES = ("keep", "reanchor", "planned")
WHOLE_STEPS = "a whole number of optimizer steps"


def check_from_step(from_step) -> None:
    """The step a run continues from: the steps it has taken."""
    require("from_step", from_step, lambda v: v >= 0 and int(v) == v, f"{WHOLE_STEPS} >= 0")


def check_extension(total_steps, new_total_steps, from_step) -> None:
    """A run of ``total_steps`` (T1; None where it is not known) continued from step
    ``from_step`` (the steps it has taken) to ``new_total_steps`` (T2)."""
    check_from_step(from_step)
    if total_steps is not None:
        require("total_steps", total_steps, lambda v: v >= 1 and int(v) == v,
                f"{WHOLE_STEPS} >= 1")
        require("new_total_steps", new_total_steps, lambda v: v > total_steps and int(v) == v,
                f"{WHOLE_STEPS} greater than total_steps ({shown(total_steps)}), the planned "
                "length it extends")
        check(from_step <= total_steps,
              f"from_step must be at most total_steps ({shown(total_steps)}): a run continues "
              f"from a step it has reached, got {shown(from_step)}")
    require("new_total_steps", new_total_steps, lambda v: v > from_step and int(v) == v,
            f"{WHOLE_STEPS} greater than from_step ({shown(from_step)}), the step the run "
            "continues from")


def check_decay_rule(decay_rule) -> None:
    check(decay_rule in DECAY_RULES,
          f"decay_rule must be one of {', '.join(DECAY_RULES)}, got {decay_rule!r}")


def extended_weight_decay(weight_decay, wd_ts, new_total_steps: int, from_step: int,
                          decay_rule: str = "keep"):
    """``(weight_decay, wd_ts)`` of the log-time decay for a run continued from step
    ``from_step`` to ``new_total_steps`` under ``decay_rule`` (DECAY_RULES). A decay with no
    time scale (``wd_ts`` None) or none at all depends on no T and is returned as it is, as is
    one already on the new time scale (so that extending twice to the same T2 changes nothing)."""
    check_decay_rule(decay_rule)
    check_extension(None, new_total_steps, from_step)
    new_wd_ts = paper_weight_decay(0.0, int(new_total_steps))[1]
    if decay_rule == "keep" or wd_ts is None or weight_decay == 0 or new_wd_ts == wd_ts:
        return weight_decay, wd_ts
    if decay_rule == "planned":  # ω = λ·wd_ts kept
        return weight_decay * wd_ts / new_wd_ts, new_wd_ts
    # reanchor: λ'/(1 + k/wd_ts') = λ/(1 + k/wd_ts) at the join's k, the form the multiplier uses
    join = from_step + 1
    return weight_decay / (1 + join / wd_ts) * (1 + join / new_wd_ts), new_wd_ts


def extended_coupled_weight_decay(weight_decay, total_steps: int, new_total_steps: int,
                                  decay_rule: str = "keep"):
    """AdamW's coupled decay λ = ω/(γ*·T) (p ← p − γ_t·λ·p) for a run of ``total_steps``
    continued to ``new_total_steps``: "keep" keeps λ (no jump, the only rule without one: λ has
    no time scale); "planned" is the planned run's ω/(γ*·T2) = λ·T1/T2, a jump down at the
    join; "reanchor" has nothing to re-anchor and is refused."""
    check_decay_rule(decay_rule)
    check_extension(total_steps, new_total_steps, total_steps)
    check(decay_rule != "reanchor",
          "a coupled weight decay (AdamW's ω/(γ*·T)) has no time scale to re-anchor: use "
          "decay_rule 'keep' (λ kept, no jump) or 'planned' (λ·T1/T2, the planned run's)")
    if decay_rule == "keep":
        return weight_decay
    return weight_decay * total_steps / new_total_steps


# The LR schedule from the join on, for any schedule function of the 0-based step (danastar's,
# or an optax schedule with ``where=jnp.where``):
# * "stretch": the old schedule's remaining decay stretched over the steps left;
# * "reanchor": the remaining shape of the schedule planned for T2, scaled to start at the
#   current factor;
# * "rewarm": up from the current factor to a peak, then the schedule restarted for the steps
#   left.
LR_RULES = ("stretch", "reanchor", "rewarm")


def python_where(condition, if_true, if_false):
    """``jnp.where`` for Python numbers."""
    return if_true if condition else if_false


def stretched_schedule(schedule, anchor: int, total_steps: int, new_total_steps: int,
                       where=python_where):
    """``schedule`` up to step ``anchor``, then its part from ``anchor`` to ``total_steps``
    stretched over ``anchor`` .. ``new_total_steps``: step n reads the old schedule at
    anchor + (n − anchor)·(T1 − anchor)/(T2 − anchor), so n = T2 reads it exactly at T1."""
    def factor(step):
        # multiplied first: whole numbers stay exact, and step T2 maps to T1 exactly
        old_step = anchor + (step - anchor) * (total_steps - anchor) / (new_total_steps - anchor)
        return where(step <= anchor, schedule(step), schedule(old_step))
    return factor


def reanchored_schedule(schedule, planned, anchor: int, new_total_steps: int,
                        where=python_where):
    """``schedule`` up to step ``anchor``, then ``planned`` (the schedule planned for
    ``new_total_steps``) mapped affinely so that it starts at ``schedule(anchor)`` and still
    ends at its own end factor ``planned(new_total_steps)``."""
    start, end = schedule(anchor), planned(new_total_steps)
    planned_start = planned(anchor)
    if float(start) == float(end):  # the decay is over (cos_inf's floor): it stays there
        return lambda step: where(step <= anchor, schedule(step), end)
    check(float(planned_start) != float(end),
          f"the schedule planned for {new_total_steps} steps has finished its decay by step "
          f"{anchor}, so there is no decay left to re-anchor; use a longer new_total_steps or "
          "the rule 'stretch'")

    def factor(step):
        scaled = end + (start - end) * (planned(step) - end) / (planned_start - end)
        return where(step <= anchor, schedule(step), scaled)
    return factor


def rewarmed_schedule(schedule, restarted, join: int, rewarm_steps: int, peak=1.0,
                      where=python_where):
    """``schedule`` before step ``join``; then linearly from ``schedule(join)`` up to ``peak``
    over ``rewarm_steps`` steps; then ``peak`` times ``restarted`` (the schedule planned for the
    steps left, with a warm-up of ``rewarm_steps``) at the step counted from the join."""
    require("rewarm_steps", rewarm_steps, lambda v: v >= 1 and int(v) == v,
            "a whole number of steps >= 1")
    require("peak", peak, lambda v: v > 0, "> 0 (1 is the run's peak LR)")
    start = schedule(join)

    def factor(step):
        rising = start + (peak - start) * (step - join) / rewarm_steps
        after = where(step < join + rewarm_steps, rising, peak * restarted(step - join))
        return where(step < join, schedule(step), after)
    return factor
