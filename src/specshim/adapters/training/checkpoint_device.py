"""Resume training where there is no CUDA: load speculators' checkpoints onto the CPU.

speculators' single-device checkpointer loads the saved model and optimizer onto
``"cuda:0"``: written out in 0.3.0, and in 0.4 from ``get_current_device()``, which answers
``"cuda:0"`` when torch sees no accelerator at all. On a CPU-only machine every ``--resume``
fails (``pin_memory=True requires a CUDA or other accelerator backend``, or no CUDA device).
Where torch has no accelerator, the checkpointer's own view of the device becomes ``"cpu"``;
with an accelerator nothing changes.
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.kit import Proxy, module, source, wrap
from specshim.adapters.model import Adapter, Patch, Probe, needed, not_needed
from specshim.adapters.targets import CHECKPOINTER


def _no_accelerator() -> bool:
    import torch

    return torch.accelerator.current_accelerator() is None


def probe() -> Probe:
    if not _no_accelerator():
        return not_needed("torch has an accelerator to load checkpoints onto")
    checkpointer = module(CHECKPOINTER)
    if "get_current_device" in vars(checkpointer):
        return needed("get_current_device() answers cuda:0 without an accelerator")
    if '"cuda:0"' in source(checkpointer.SingleGPUCheckpointer.load_model_state_dict):
        return needed("the checkpointer loads onto a hard-coded cuda:0")
    return not_needed("the checkpointer does not assume CUDA")


def _cpu_device(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    return "cpu" if _no_accelerator() else wrapped(*args, **kwargs)


def _load_on_cpu(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    if _no_accelerator():
        if "map_location" in kwargs:
            kwargs["map_location"] = "cpu"
        elif len(args) > 1:  # load_safetensors_state_dict(path, device)
            args = (args[0], "cpu", *args[2:])
    return wrapped(*args, **kwargs)


def patches() -> list[Patch]:
    checkpointer = module(CHECKPOINTER)
    if "get_current_device" in vars(checkpointer):
        return [wrap(checkpointer, "get_current_device", _cpu_device)]
    import wrapt

    torch = vars(checkpointer)["torch"]
    return [
        wrap(checkpointer, "load_safetensors_state_dict", _load_on_cpu),
        Patch(
            checkpointer,
            "torch",
            Proxy(torch, load=wrapt.FunctionWrapper(torch.load, _load_on_cpu)),
        ),
    ]


ADAPTER = Adapter(
    name="checkpoint_device",
    targets=(
        f"{CHECKPOINTER}.get_current_device",
        f"{CHECKPOINTER}.load_safetensors_state_dict",
        f"{CHECKPOINTER}.torch",
    ),
    waits_for=(CHECKPOINTER,),
    why="speculators' checkpointer loads checkpoints onto cuda:0, so --resume fails on the CPU",
    upstream="speculators 0.3.0/0.4 speculators/train/checkpointer.py (SingleGPUCheckpointer)",
    remove_when="speculators 0.3/0.4 training is no longer supported",
    evidence=("tests/e2e/test_train.py::test_resume_fails_without_checkpoint_device",),
    probe=probe,
    patches=patches,
)
