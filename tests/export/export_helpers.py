"""What the export tests share: tiny `danastar train` settings per architecture, running the
command line as a process, and a local lm-eval task."""

import json
import os
import subprocess
import sys

ARCHS = {  # a few hundred thousand parameters each; qwen3next is a mixture of experts
    "enoki": ["--arch", "enoki", "--heads", "2"],
    "llama": ["--arch", "llama", "--heads", "2"],
    "qwen3": ["--arch", "qwen3", "--heads", "1"],
    "qwen3next": ["--arch", "qwen3next", "--heads", "1", "--moe_num_experts", "4",
                  "--use_gated_shared_expert", "--mlp_only_layers", "1"],
}
TINY = ["--lr", "3e-3", "--batch_size", "4", "--acc_steps", "1", "--sequence_length", "32",
        "--iterations", "3", "--eval_interval", "3", "--log_interval", "1", "--no_wandb",
        "train.eval_batches=1", "train.final_eval_batches=1", "train.sample_tokens=0",
        "logging.progress=false"]
WORDS = "the cat sat on a mat and dog ran to red blue sun moon star sky tree".split()


def environment() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def danastar(*args, torchrun: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    base = [sys.executable, "-m", "danastar"]
    if torchrun:
        base = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={torchrun}", "-m", "danastar"]
    result = subprocess.run([*base, *map(str, args)], env=environment(), capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def write_task(folder, name="tiny_choice", rows=None, dataset=None) -> None:
    """A multiple-choice lm-eval task over a JSON-lines file (or over hub ``dataset``)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = rows or [{"question": "the cat sat on the", "choices": ["mat", "sky"], "answer": 0},
                    {"question": "the dog ran to the", "choices": ["tree", "blue"], "answer": 0},
                    {"question": "red blue", "choices": ["sun", "cat"], "answer": 1}]
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = (f"dataset_path: {dataset}\n" if dataset else
              f"dataset_path: json\ndataset_kwargs:\n  data_files:\n"
              f"    test: {folder / f'{name}.jsonl'}\n")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\n{source}test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n'
        "    aggregation: mean\n    higher_is_better: true\n")
