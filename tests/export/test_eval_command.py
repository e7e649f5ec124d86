"""`danastar eval`: lm-evaluation-harness on a run's export over a local task, the scores in
`<run_dir>/eval/<step>.json` and a table; an unknown task, data that cannot be fetched, a run
without tokenizer and a missing extra each end in one sentence."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval")

from danastar.cli import main  # noqa: E402
from danastar.data.tokenizers import load_tokenizer  # noqa: E402
from danastar.models import build_model  # noqa: E402
from danastar.train.weights import load_weights  # noqa: E402

from export_helpers import TINY, danastar, environment, write_task  # noqa: E402

ROWS = [{"question": "the cat sat on the", "choices": ["mat", "sky", "ran"], "answer": 0},
        {"question": "the dog ran to the", "choices": ["tree", "blue"], "answer": 1},
        {"question": "red blue sun", "choices": ["moon", "cat", "a"], "answer": 2},
        {"question": "a star in the", "choices": ["sky", "on"], "answer": 0}]


def expected_accuracy(run_dir, corpus) -> float:
    """The task's accuracy computed here from danastar's own model: the choice (after lm-eval's
    default delimiter, a space) of largest summed log-likelihood after the question, as
    lm-eval's `acc` scores it."""
    weights = load_weights(run_dir)
    model = build_model(weights.model_config)
    model.load_state_dict(weights.state_dict)
    model.eval()
    tokenizer = load_tokenizer(str(corpus))
    right = 0
    for row in ROWS:
        context = tokenizer.encode(row["question"])
        scores = []
        for choice in row["choices"]:
            continuation = tokenizer.encode(f"{row['question']} {choice}")[len(context):]
            ids = torch.tensor([context + continuation])
            with torch.no_grad():
                logits = model(ids)[0, :, :weights.model_config.vocab_size].log_softmax(-1)
            targets = ids[0, len(context):]
            scores.append(logits[len(context) - 1:-1].gather(1, targets[:, None]).sum().item())
        right += max(range(len(scores)), key=scores.__getitem__) == row["answer"]
    return right / len(ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["enoki", "llama", "qwen3", "qwen3next"])
def test_a_run_is_scored_on_a_local_task(arch, runs, corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    run_dir = tmp_path / "run"
    shutil.copytree(runs[arch], run_dir)
    write_task(tmp_path / "tasks", rows=ROWS)
    write_task(tmp_path / "tasks", name="second_task")
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--tasks", "tiny_choice", "--include_path",
                 str(tmp_path / "tasks"), "--batch_size", "2"]) == 0
    out = capsys.readouterr().out
    record = json.loads((run_dir / "eval" / "3.json").read_text())
    accuracy = record["tasks"]["tiny_choice"]["acc"]
    assert accuracy == expected_accuracy(run_dir, corpus)
    assert record["step"] == 3 and record["samples"] == {"tiny_choice": 4}
    assert f"tiny_choice  acc     {accuracy:.4f}" in out
    assert f"written to {run_dir / 'eval' / '3.json'}" in out
    if arch != "enoki":
        return  # what follows is the same for every architecture

    # another task at the same step joins the same file; --limit caps its examples
    assert main(["eval", str(run_dir), "--tasks", "second_task", "--limit", "2",
                 "--include_path", str(tmp_path / "tasks")]) == 0
    record = json.loads((run_dir / "eval" / "3.json").read_text())
    assert set(record["tasks"]) == {"tiny_choice", "second_task"}
    assert record["samples"] == {"second_task": 2} and record["limit"] == 2

    # `danastar results` reads the file the real command wrote: a column per task metric
    capsys.readouterr()
    assert main(["results", str(run_dir), "--json", "-"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["tiny_choice acc"] == accuracy
    assert row["second_task acc"] == record["tasks"]["second_task"]["acc"]


@pytest.mark.slow
def test_an_export_is_scored_into_its_run(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    run_dir = tmp_path / "run"
    shutil.copytree(runs["llama"], run_dir)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    write_task(tmp_path / "tasks")
    assert main(["eval", str(tmp_path / "hf"), "--tasks", "tiny_choice", "--include_path",
                 str(tmp_path / "tasks")]) == 0
    assert "tiny_choice" in json.loads((run_dir / "eval" / "3.json").read_text())["tasks"]


def test_tasks_all_in_the_include_path_are_indexed_there_alone(tmp_path):
    """lm-eval's own thousands of tasks are indexed only where a task asked for is not in
    --include_path (tens of seconds per command before)."""
    from danastar.export.evaluate import task_manager

    write_task(tmp_path / "tasks")
    write_task(tmp_path / "tasks", name="second_task")
    assert sorted(task_manager(["tiny_choice"], tmp_path / "tasks").all_tasks) == [
        "second_task", "tiny_choice"]


def refusal(capsys, *args) -> str:
    capsys.readouterr()
    assert main(["eval", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("danastar eval: "), err
    return err[0]


@pytest.mark.slow  # lm-eval indexes its thousands of tasks first
def test_an_unknown_task_is_one_sentence_with_the_near_names(tmp_path, capsys):
    write_task(tmp_path / "tasks")
    said = refusal(capsys, str(tmp_path), "--tasks", "tiny_choise", "--include_path",
                   str(tmp_path / "tasks"))
    assert "lm-eval knows no task 'tiny_choise'; did you mean tiny_choice" in said


@pytest.mark.slow
def test_a_task_whose_data_cannot_be_fetched_is_one_sentence(runs, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    write_task(tmp_path / "tasks", name="hub_task", dataset="nobody/no-such-dataset")
    run_dir = tmp_path / "run"
    shutil.copytree(runs["llama"], run_dir)
    said = refusal(capsys, str(run_dir), "--tasks", "hub_task", "--include_path",
                   str(tmp_path / "tasks"))
    assert "the data of task(s) hub_task cannot be fetched" in said
    assert "run once with internet to cache it" in said


@pytest.mark.slow
def test_a_run_without_tokenizer_is_refused(tmp_path, capsys):
    danastar("train", "--dataset", "synthetic", "--arch", "llama", "--heads", "2", *TINY,
             "--run_dir", tmp_path / "run")
    write_task(tmp_path / "tasks")
    said = refusal(capsys, str(tmp_path / "run"), "--tasks", "tiny_choice", "--include_path",
                   str(tmp_path / "tasks"))
    assert "has no tokenizer (tokenizer.json), and lm-eval's tasks are text" in said


def test_bad_flags_are_one_sentence(tmp_path, capsys):
    assert "--limit 0 must be at least 1." in refusal(capsys, str(tmp_path), "--tasks", "x",
                                                      "--limit", "0")
    assert "--tasks names no task" in refusal(capsys, str(tmp_path), "--tasks", ",")
    assert "--include_path" in refusal(capsys, str(tmp_path), "--tasks", "x", "--include_path",
                                       str(tmp_path / "nowhere"))


def test_a_device_this_machine_has_not_is_one_sentence_before_any_work(tmp_path, capsys,
                                                                      monkeypatch):
    # Before: --device cuda exported the run, then lm-eval failed with "Torch not compiled with
    # CUDA enabled" (a traceback); an unknown name ran on the CPU without a word.
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.backends.mps.is_available", lambda: False)
    args = (str(tmp_path), "--tasks", "x", "--device")
    assert refusal(capsys, *args, "cuda") == ("danastar eval: --device cuda asks for a GPU, but "
                                              "no CUDA device is visible; use --device cpu.")
    assert "--device cuda:1 asks for a GPU" in refusal(capsys, *args, "cuda:1")
    assert refusal(capsys, *args, "gpu") == ("danastar eval: --device 'gpu' is not known; use "
                                             "cpu, cuda or cuda:N.")
    assert "--device mps asks for Apple's GPU" in refusal(capsys, *args, "mps")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    assert refusal(capsys, *args, "cuda:1") == (
        "danastar eval: --device cuda:1: 1 CUDA device(s) are visible (cuda:0 to cuda:0); name "
        "one of them.")


def test_without_the_extra_it_says_which_to_install(tmp_path):
    code = ("import sys\nsys.modules['lm_eval'] = None\nfrom danastar.cli import main\n"
            f"raise SystemExit(main(['eval', {str(tmp_path)!r}, '--tasks', 'x']))")
    result = subprocess.run([sys.executable, "-c", code], env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("danastar eval needs the 'eval' extra: pip install "
                                     "'danastar[eval]'")
