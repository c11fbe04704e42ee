"""``import speculators`` under transformers 5: make ``torch`` resolvable for pydantic.

transformers 5 turned ``PreTrainedConfig`` into a dataclass whose annotations name ``torch``,
which ``configuration_utils`` imports only under ``TYPE_CHECKING``. speculators 0.3/0.4 build
pydantic models on top of it at import time (``reload_and_populate_configs``), pydantic
evaluates those annotations, and the import dies with ``PydanticUndefinedAnnotation: name
'torch' is not defined``. Putting the real ``torch`` module in that namespace is enough.

Applies as soon as transformers' config module is imported, which is before speculators'
``__init__`` rebuilds its models.
"""

from __future__ import annotations

import importlib.util

from specshim.adapters.kit import module
from specshim.adapters.model import (
    Adapter,
    LeftOut,
    Patch,
    Probe,
    needed,
    not_applicable,
    not_needed,
)
from specshim.adapters.targets import CONFIG_UTILS


def _config_class():
    utils = module(CONFIG_UTILS)
    return utils, getattr(utils, "PreTrainedConfig", None) or utils.PretrainedConfig


def probe() -> Probe:
    if importlib.util.find_spec("speculators") is None:
        return not_applicable("speculators is not installed")
    utils, config = _config_class()
    annotations = " ".join(str(a) for a in getattr(config, "__annotations__", {}).values())
    if "torch" not in annotations:
        return not_needed("PreTrainedConfig's annotations do not name torch (transformers 4)")
    if hasattr(utils, "torch"):
        return not_needed("transformers.configuration_utils already imports torch")
    return needed("PreTrainedConfig annotates with torch, imported there only for type checking")


def patches() -> list[Patch]:
    import torch

    utils, _ = _config_class()
    return [Patch(utils, "torch", torch)]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut("0.3.0", raises="PydanticUndefinedAnnotation", text="name 'torch' is not defined")


ADAPTER = Adapter(
    name="transformers_annotations",
    targets=(f"{CONFIG_UTILS}.torch",),
    waits_for=(CONFIG_UTILS,),
    why="transformers 5 config annotations name torch, so `import speculators` (pydantic) fails",
    upstream="transformers 5.0: PreTrainedConfig became a dataclass (configuration_utils.py)",
    remove_when="speculators rebuilds its configs without evaluating transformers' annotations, "
    "or transformers imports torch at runtime in configuration_utils",
    left_out=(
        WITHOUT,
        WITHOUT.also(speculators="0.4.0.1"),
    ),
    probe=probe,
    patches=patches,
)
