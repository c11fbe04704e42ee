"""speculators' config classes (pydantic and transformers at once) on transformers 5.

transformers 5 turns every ``PreTrainedConfig`` subclass into a dataclass and, for a subclass
without its own ``__init__``, installs a generated one that sets each field with ``setattr``.
speculators' ``Eagle3SpeculatorConfig`` (and its siblings) relied on inheriting
``SpeculatorModelConfig.__init__``, which initialises pydantic first; with the generated one
pydantic's ``__setattr__`` runs before pydantic is set up and construction fails with
``AttributeError: 'Eagle3SpeculatorConfig' object has no attribute '__pydantic_fields_set__'``.
Training cannot even build its config. Each such subclass gets the nearest ``__init__`` that
speculators wrote, exactly what Python's inheritance gave it before transformers 5.

The same change made ``save_pretrained`` call ``self.validate()``, the validator that
``huggingface_hub``'s ``@strict`` adds to ``PreTrainedConfig``; in speculators' classes pydantic's
deprecated ``BaseModel.validate(value)`` comes first in the MRO, so every checkpoint save fails
with ``TypeError: BaseModel.validate() missing 1 required positional argument: 'value'``.
``SpeculatorModelConfig.validate`` is pointed at transformers' validator.
Applies to the subclasses that exist once speculators' EAGLE-3 config is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from specshim.adapters.kit import module
from specshim.adapters.model import Adapter, Patch, Probe, needed, not_needed
from specshim.adapters.targets import EAGLE3_CONFIG, SPECULATORS_CONFIG


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _written_by_speculators(init: Any) -> bool:
    code = getattr(init, "__code__", None)
    return code is not None and "speculators" in code.co_filename.replace("\\", "/").split("/")


def _speculators_init(cls: type) -> Callable[..., None]:
    """The nearest ``__init__`` in ``cls``'s MRO whose source lives in speculators."""
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is not None and _written_by_speculators(init):
            return init
    raise LookupError(f"{cls.__name__} has no speculators __init__ in its MRO")


def _broken() -> list[type]:
    base = module(SPECULATORS_CONFIG).SpeculatorModelConfig
    return [
        cls
        for cls in _subclasses(base)
        if not _written_by_speculators(cls.__init__)  # type: ignore[misc]  # the class's own
        and cls.__module__.startswith("speculators.")
    ]


def _transformers_validate() -> Any:
    """transformers' own ``validate`` when pydantic's shadows it in speculators' base config."""
    base = module(SPECULATORS_CONFIG).SpeculatorModelConfig
    pretrained = next(
        (
            k
            for k in base.__mro__
            if "validate" in vars(k) and k.__module__.startswith("transformers")
        ),
        None,
    )
    if pretrained is None or base.validate == pretrained.validate:
        return None
    return vars(pretrained)["validate"]


def probe() -> Probe:
    problems = []
    if broken := _broken():
        names = ", ".join(cls.__name__ for cls in broken)
        problems.append(f"transformers replaced the __init__ of {names}")
    if _transformers_validate() is not None:
        problems.append("pydantic's BaseModel.validate shadows transformers' config validate()")
    if not problems:
        return not_needed("speculators' config classes behave as written (transformers 4)")
    return needed("; ".join(problems))


def patches() -> list[Patch]:
    made = [Patch(cls, "__init__", _speculators_init(cls)) for cls in _broken()]
    if (validate := _transformers_validate()) is not None:
        made.append(Patch(module(SPECULATORS_CONFIG).SpeculatorModelConfig, "validate", validate))
    return made


ADAPTER = Adapter(
    name="speculators_config_transformers5",
    targets=(
        f"{EAGLE3_CONFIG}.Eagle3SpeculatorConfig.__init__",
        f"{SPECULATORS_CONFIG}.SpeculatorModelConfig.validate",
    ),
    waits_for=(SPECULATORS_CONFIG, EAGLE3_CONFIG),
    why="transformers 5 replaces the inherited __init__ of speculators' config classes and "
    "adds a validate() that pydantic shadows: the draft config cannot be built or saved",
    upstream="transformers 5.0 PreTrainedConfig.__init_subclass__ (dataclass + "
    "wrap_init_to_accept_kwargs)",
    remove_when="speculators 0.3/0.4 training is no longer supported (0.8.1+ requires "
    "transformers 5 and is built for it)",
    evidence=(
        "tests/e2e/test_train.py::test_training_fails_without[speculators_config_transformers5-__pydantic_fields_set__]",
    ),
    probe=probe,
    patches=patches,
)
