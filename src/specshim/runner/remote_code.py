"""Python code that a model carries: run only when the user passes ``--trust-remote-code``.

A model folder (or hub repository) whose ``config.json`` or tokenizer config has an
``auto_map`` names Python files of its own, and transformers and vLLM import them (running
whatever they hold) when told to trust remote code. specshim reads every model through this
module with the one setting the user gave (:data:`FLAG`, spelled as vLLM and transformers
spell it; off unless passed), hands the same setting to vLLM (:func:`vllm_options`), and
overrides speculators 0.3/0.4, whose generator and data config pass ``trust_remote_code=True``
for every model (:func:`in_speculators`). Without the flag, a model transformers knows by its
``model_type`` is read with transformers' own classes, its files left unrun; one that only its
own code can read is refused with one line (:class:`RemoteCodeRefused`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

FLAG = "--trust-remote-code"

#: Where speculators 0.3/0.4 read a model with transformers' or vLLM's loaders, and the names
#: they call there. Extraction: the generator (its config and vLLM's with
#: ``trust_remote_code=True``, its tokenizer with transformers' default) and the data config it
#: writes (``True``).
EXTRACTION_LOADERS = {
    "speculators.data_generation.vllm_hidden_states_generator": (
        "AutoConfig",
        "AutoTokenizer",
        "ModelConfig",
    ),
    "speculators.data_generation.config_generator": ("AutoConfig",),
}
#: Training: the draft reads its verifier's config (transformers' default, which asks on a
#: terminal where only the model's own code can read it).
TRAINING_LOADERS = {"speculators.models.eagle3.core": ("AutoConfig",)}


class RemoteCodeRefused(ValueError):
    """A model that only its own Python code can read, and no :data:`FLAG`; one line."""


def vllm_options(trust: bool) -> dict[str, Any]:
    """vLLM's keyword (``LLM(...)``, ``ModelConfig``) for the setting."""
    return {"trust_remote_code": trust}


@contextlib.contextmanager
def refusing(model: str) -> Iterator[None]:
    """Inside, transformers' refusal to read ``model`` without its own code becomes
    :class:`RemoteCodeRefused`, saying what to pass; other errors go through unchanged."""
    try:
        yield
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise
        raise RemoteCodeRefused(
            f"{model} is read only by Python code of its own (auto_map in its config), which "
            f"specshim runs only with {FLAG}: pass it if you trust that code"
        ) from None


def config(model: str, trust: bool) -> Any:
    """The model's transformers config, its own code run only with ``trust``."""
    from transformers import AutoConfig

    with refusing(model):
        return AutoConfig.from_pretrained(model, trust_remote_code=trust)


def tokenizer(model: str, trust: bool) -> Any:
    """The model's tokenizer, its own code run only with ``trust``."""
    from transformers import AutoTokenizer

    with refusing(model):
        return AutoTokenizer.from_pretrained(model, trust_remote_code=trust)


class _Loader:
    """``AutoConfig`` or ``AutoTokenizer`` whose ``from_pretrained`` takes ``trust``, whatever
    its caller passes."""

    def __init__(self, auto: Any, trust: bool) -> None:
        self._auto, self._trust = auto, trust

    def from_pretrained(self, *args: Any, **kwargs: Any) -> Any:
        with refusing(str(args[0] if args else kwargs.get("pretrained_model_name_or_path"))):
            return self._auto.from_pretrained(*args, **{**kwargs, **vllm_options(self._trust)})


def _with_setting(make: Callable[..., Any], trust: bool) -> Callable[..., Any]:
    """``make`` (vLLM's ``ModelConfig``) called with ``trust``, whatever its caller passes."""

    def made(*args: Any, **kwargs: Any) -> Any:
        return make(*args, **{**kwargs, **vllm_options(trust)})

    return made


@contextlib.contextmanager
def in_speculators(trust: bool, where: Mapping[str, tuple[str, ...]]) -> Iterator[None]:
    """Inside, speculators 0.3/0.4 read models with ``trust`` in the modules and loaders
    ``where`` names (:data:`EXTRACTION_LOADERS`, :data:`TRAINING_LOADERS`). A loader missing
    from its module is an error: a release that reads the model some other way may pass its
    own ``True``."""
    import importlib

    from specshim import patches  # not at import: the command line builds its parser from here
    from specshim.adapters.model import Patch

    wrappers: list[Patch] = []
    for name, loaders in where.items():
        module = importlib.import_module(name)
        if missing := [loader for loader in loaders if not hasattr(module, loader)]:
            raise RuntimeError(
                f"{name} has no {missing[0]}: specshim cannot give it the {FLAG} setting "
                "(expected speculators 0.3/0.4)"
            )
        for loader in loaders:
            found = getattr(module, loader)
            wrapped = (
                _with_setting(found, trust) if loader == "ModelConfig" else _Loader(found, trust)
            )
            wrappers.append(Patch(module, loader, wrapped))
    with patches.scoped("remote_code_setting", wrappers):
        yield
