"""The GPU suite runs only where this interpreter's torch sees a CUDA device (the H200 with
the bundle of ../shared/gpu, through scripts/gpu_test.sh); everywhere else it is skipped."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (run scripts/gpu_test.sh on a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
