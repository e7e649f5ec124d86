import pytest
from fake_runs import write_run

SIZES = (4, 6, 8)
LR_RATIOS = (0.25, 0.5, 1.0, 2.0, 4.0)


@pytest.fixture(scope="session")
def sweep(tmp_path_factory):
    """2 optimizers x 3 sizes x 5 LRs, two seeds at the law's LR, and one partial run."""
    root = tmp_path_factory.mktemp("sweep")
    for opt in ("adamw", "dana-star-mk4"):
        for heads in SIZES:
            for ratio in LR_RATIOS:
                for seed in (0, 1) if ratio == 1.0 else (0,):
                    write_run(root, opt, heads, lr_ratio=ratio, seed=seed, noise=0.002)
    write_run(root, "adamw", 4, lr_ratio=8.0, stop_at=4000)
    return root
