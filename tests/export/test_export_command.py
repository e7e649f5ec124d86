"""`danastar export` on real runs of every architecture: the directory loads with
`AutoModelForCausalLM` and `AutoTokenizer`, computes danastar's logits, and its model card says
how the model was trained. Single-file and sharded (DCP) checkpoints export alike."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from danastar.cli import main  # noqa: E402
from danastar.data.tokenizers import load_tokenizer  # noqa: E402
from danastar.export import read_export  # noqa: E402
from danastar.models import build_model  # noqa: E402
from danastar.train.weights import load_weights  # noqa: E402

from export_helpers import ARCHS, TINY, danastar, environment  # noqa: E402

NATIVE = {"enoki": False, "llama": True, "qwen3": True, "qwen3next": True}


def danastar_logits(path, ids):
    weights = load_weights(path)
    model = build_model(weights.model_config)
    model.load_state_dict(weights.state_dict)
    with torch.no_grad():
        return model.eval()(ids)[..., :weights.model_config.vocab_size]


def exported_logits(out, ids, vocab):
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                 dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(ids).logits[..., :vocab]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_a_run_exports_loads_and_computes_its_logits(arch, runs, corpus, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(runs[arch]), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"exported step 3 to {out}" in said and "logits equal danastar's" in said
    native = (out / "modeling_danastar.py").is_file() is False
    assert native == NATIVE[arch]
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "README.md", "danastar_export.json"} <= files

    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    difference = danastar_logits(runs[arch], ids) - exported_logits(out, ids, 300)
    assert difference.abs().max().item() <= 1e-5

    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "the cat sat on a mat, and the dog ran to the tree"
    assert tokenizer(text)["input_ids"] == load_tokenizer(str(corpus)).encode(text)

    card = (out / "README.md").read_text()
    val_loss = [json.loads(line) for line in (runs[arch] / "metrics.jsonl").read_text()
                .splitlines() if "val_loss" in line][-1]["val_loss"]
    for fact in ("| optimizer | adana |", "| step | 3 |", "| training tokens | 384 |",
                 f"| validation loss | {val_loss:.4f} |", f"| dataset | {corpus} |",
                 "trust_remote_code=True" if not native else "from_pretrained(path)"):
        assert fact in card, fact
    provenance = json.loads((out / "danastar_export.json").read_text())
    assert provenance["step"] == 3 and provenance["run_dir"] == str(runs[arch].resolve())

    # read back: the run's model config and its tensors (Qwen3-Next's norms: w - 1 + 1)
    config, state = read_export(out)
    weights = load_weights(runs[arch])
    assert config == weights.model_config and set(state) == set(weights.state_dict)
    for name, tensor in weights.state_dict.items():
        assert (state[name] - tensor).abs().max().item() <= 1e-6, name


@pytest.mark.slow
def test_a_sharded_checkpoint_exports_as_the_single_file_one_does(corpus, tmp_path):
    """The same three steps trained by two FSDP processes (DCP shards) and by one process (one
    file) export to models that agree to FSDP's rounding, and the sharded export computes its
    own checkpoint's logits to 1e-5."""
    args = ["train", "--dataset", corpus, *ARCHS["enoki"], *TINY]
    danastar(*args, "--distributed_backend", "fsdp", "--run_dir", tmp_path / "fsdp", torchrun=2)
    danastar(*args, "--run_dir", tmp_path / "single")
    (checkpoint,) = (tmp_path / "fsdp" / "checkpoints").iterdir()
    assert json.loads((checkpoint / "meta.json").read_text())["layout"] == "dcp"

    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    logits = {}
    for name, path in (("fsdp", checkpoint), ("single", tmp_path / "single")):
        assert main(["export", str(path), "--out", str(tmp_path / f"hf-{name}")]) == 0
        logits[name] = exported_logits(tmp_path / f"hf-{name}", ids, 300)
    assert (logits["fsdp"] - danastar_logits(checkpoint, ids)).abs().max().item() <= 1e-5
    assert (logits["fsdp"] - logits["single"]).abs().max().item() <= 1e-3


def refusal(capsys, *args) -> str:
    capsys.readouterr()
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("danastar export: "), err
    return err[0]


def test_a_path_that_is_no_run_is_one_sentence(tmp_path, capsys):
    assert "is neither a run directory" in refusal(capsys, str(tmp_path), "--out",
                                                   str(tmp_path / "out"))


@pytest.mark.slow
def test_an_out_directory_with_files_is_refused(runs, tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("mine")
    said = refusal(capsys, str(runs["llama"]), "--out", str(tmp_path / "taken"))
    assert f"--out {tmp_path / 'taken'} exists and is not empty" in said
    assert (tmp_path / "taken" / "file").read_text() == "mine"


def read_only_folder(tmp_path):
    """A folder that takes no new files: chmod for a user, a read-only file system for root."""
    if os.geteuid() != 0:
        (tmp_path / "locked").mkdir(mode=0o555)
        return tmp_path / "locked"
    locked = os.path.realpath("/proc/sys")
    if not os.path.isdir(locked) or os.access(locked, os.W_OK):
        pytest.skip("running as root and no read-only file system to write into")
    return Path(locked)


@pytest.fixture
def no_export_work(monkeypatch):
    """The export's work (reading the checkpoint) must not begin: the --out checks come first."""
    def load_weights(*args, **kwargs):
        raise AssertionError("the export read the checkpoint before checking --out")
    monkeypatch.setattr("danastar.train.weights.load_weights", load_weights)


def test_an_out_under_a_file_is_one_sentence_before_any_work(tmp_path, capsys, no_export_work):
    # Before: FileExistsError from mkdir, after the whole export had been computed.
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    said = refusal(capsys, str(tmp_path), "--out", str(a_file / "hf"))
    assert said == (f"danastar export: --out {a_file / 'hf'} cannot be written: {a_file} is a "
                    "file, not a folder; give --out a path in a writable folder.")
    said = refusal(capsys, str(tmp_path), "--out", str(a_file))
    assert said == (f"danastar export: --out {a_file} is a file; give --out a new or empty "
                    "directory.")
    assert a_file.read_text() == "kept"


def test_an_out_in_a_read_only_folder_is_refused_before_any_work(tmp_path, capsys,
                                                                  no_export_work):
    # Before: refused by the system only after the whole export (a PermissionError traceback).
    locked = read_only_folder(tmp_path)
    said = refusal(capsys, str(tmp_path), "--out", os.path.join(locked, "hf"))
    assert said.startswith(f"danastar export: --out {os.path.join(locked, 'hf')} cannot be "
                           f"written: {locked} does not take new files (")
    assert said.endswith("); give --out a path in a writable folder.")


def test_without_the_extra_it_says_which_to_install(tmp_path):
    code = ("import sys\nsys.modules['transformers'] = None\nfrom danastar.cli import main\n"
            f"raise SystemExit(main(['export', {str(tmp_path)!r}, '--out', 'x']))")
    (tmp_path / "config.yaml").write_text("{}\n")
    result = subprocess.run([sys.executable, "-c", code], env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("danastar export needs the 'export' extra: pip install "
                                     "'danastar[export]'")
