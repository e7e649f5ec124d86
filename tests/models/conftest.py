import pytest


@pytest.fixture(params=["enoki", "qwen3"])
def arch(request) -> str:
    return request.param
