import pytest

from train_helpers import assert_ok, run_train


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
