"""Run configuration: nested dataclasses merged from defaults ← YAML ← flags ← dotted overrides.

One root `TrainConfig` holds a section per component. `load_config(argv)` parses the command
line of `danastar train` and returns the merged, validated config:

    defaults (the dataclasses of `schema`: the paper's launcher defaults)
      ← the YAML file given by --config; without --config, the CPU preset
        configs/cpu_shakespeare.yaml unless both --heads and --dataset are given (so that
        `danastar train` alone is a few-minute CPU run, `--heads 2` or `--iterations 50` a
        smaller or shorter one, while `danastar train --heads 12 --dataset fineweb ...` plans a
        paper-style run from the launcher defaults)
      ← command-line flags (the original release's names: --heads, --lr, --batch_size, ...)
      ← dotted `section.key=value` overrides, last.

Unknown keys anywhere are errors that name the closest valid key, unknown flags name the closest
flag, and values written as text (YAML files, dotted overrides) are read by their field's type
with YAML 1.2 rules. `validate` then refuses every value training could not honour, with one
sentence naming the fix, so that a dry run refuses what training would. Values left as `None`
are filled in later from the scaling plan (`--heads` → dimensions, LR, weight decay, iterations).

The modules by job: `schema` (sections, flags), `read` (argv, YAML, dotted overrides, the merge),
`validate`, `plan` (batch layout, run plan) and `naming` (run directories).
"""

from danastar.config.naming import (
    check_run_dir,
    default_run_dir,
    fit_name,
    name_too_long,
    run_directory,
)
from danastar.config.plan import (
    BatchLayout,
    batch_layout,
    epochs_text,
    make_run_plan,
    model_config,
    repetition_warning,
)
from danastar.config.read import build_parser, load_config, merge, save_yaml
from danastar.config.schema import (
    FLAGS,
    SWITCHES,
    CheckpointSection,
    DataSection,
    LoggingSection,
    ModelSection,
    MoESection,
    OptimSection,
    ParallelSection,
    TrainConfig,
    TrainSection,
    all_keys,
)
from danastar.config.validate import MODEL_MOE_FIELDS, config_notes, schedule_options, validate

__all__ = [
    "FLAGS", "MODEL_MOE_FIELDS", "SWITCHES", "BatchLayout", "CheckpointSection", "DataSection",
    "LoggingSection", "ModelSection", "MoESection", "OptimSection", "ParallelSection",
    "TrainConfig", "TrainSection", "all_keys", "batch_layout", "build_parser", "check_run_dir",
    "config_notes", "default_run_dir", "epochs_text", "fit_name", "load_config", "make_run_plan",
    "merge", "model_config", "name_too_long", "repetition_warning", "run_directory", "save_yaml",
    "schedule_options", "validate",
]
