"""The rule of `tests/conftest.py` that sorts tests into the in-process layer and `process`."""

import importlib.util
from pathlib import Path

import pytest


def test_every_cuda_test_is_a_process_test(request):
    """On a GPU, compiling for the device starts torch's compile workers and `ptxas`: a `cuda`
    test is a `process` test, so the guard of the in-process layer never fails it (the marker
    is set at collection, with or without a GPU)."""
    cuda = [item for item in request.session.items if item.get_closest_marker("cuda")]
    if not cuda:
        pytest.skip("no `cuda` test was collected in this session (run it with the whole suite)")
    assert all(item.get_closest_marker("process") for item in cuda), \
        [item.nodeid for item in cuda if not item.get_closest_marker("process")]


def test_the_rule_marks_a_cuda_test_that_starts_nothing_itself():
    """The capture tests reach `torch.compile` only through danastar's `impl="compiled"`, which
    no reading of their code can see; the `cuda` marker alone decides."""
    # by its path: under xdist `import conftest` may find another folder's conftest.py
    spec = importlib.util.spec_from_file_location("tests_root_conftest",
                                                  Path(__file__).with_name("conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    class Item:
        nodeid = "tests/optim/test_example.py::test_on_a_gpu"
        obj = staticmethod(lambda: None)
        fixturenames = ()

        def get_closest_marker(self, name):
            return pytest.mark.cuda if name == "cuda" else None

    assert conftest._is_process_test(Item())
