"""What a command imports before it trains: planning a run (every `danastar train`, its dry run,
a refusal, a sweep's plan) builds its model on the meta device to count parameters, which must
not import torch's compiler or DTensor (together 1 to 2.5 s at the start of each process); a
training run imports them anyway once it builds its optimizer (torch's own add_param_group)."""

import subprocess
import sys

PLAN_ONLY = """
import sys
from danastar.models import ModelConfig
from danastar.models.meta import build_meta_model
from danastar.scaling import make_plan
import danastar.train.loop, danastar.train.weights, danastar.cli
for arch in ("enoki", "llama", "qwen3", "qwen3next"):
    make_plan(arch, "adana", heads=2)
    build_meta_model(ModelConfig.from_heads(arch, 2, vocab_size=300, max_seq_len=64))
print(sorted(m for m in ("torch._dynamo", "torch.distributed.tensor",
                         "torch.distributed.checkpoint") if m in sys.modules))
"""


def test_planning_a_run_imports_neither_the_compiler_nor_dtensor():
    result = subprocess.run([sys.executable, "-c", PLAN_ONLY], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout
