import pytest

from train_helpers import (
    STOPPED_RUN,
    assert_ok,
    assert_stopped_with_work_left,
    last_step,
    prepare_words,
    run_train,
)


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory):
    """Uninterrupted runs, computed once per layout and shared by the tests that compare to them."""
    cache = {}

    def get(args: tuple, torchrun: int = 0):
        key = (args, torchrun)
        if key not in cache:
            run_dir = tmp_path_factory.mktemp("reference")
            assert_ok(run_train(list(args), run_dir, torchrun))
            cache[key] = run_dir
        return cache[key]

    return get


@pytest.fixture(scope="session")
def stopped_run(tmp_path_factory):
    """One run stopped at step 4 of 12 (checkpoints at 2 and 4), shared by the cases below: a
    refusal happens before anything is loaded or written, so each case reuses it as it is."""
    root = tmp_path_factory.mktemp("identity")
    data = prepare_words(root, "data", seed=0)
    run_dir = root / "run"
    args = ["--dataset", str(data), *STOPPED_RUN, "--iterations_to_run", "4"]
    assert_stopped_with_work_left(run_train(args, run_dir))
    assert last_step(run_dir) == 4
    return {"root": root, "data": data, "run_dir": run_dir}
