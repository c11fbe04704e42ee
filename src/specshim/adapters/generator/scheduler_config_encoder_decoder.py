"""Tell ``SchedulerConfig`` the model is not an encoder-decoder (required after 0.11.1).

``SchedulerConfig`` gained an init-only field ``is_encoder_decoder`` in 0.11.1 that became
required in 0.12.0 (the recorded snapshots: 0.11.1 has a default, 0.12.0 none); speculators 0.3.0
builds the config without it and pydantic rejects it (``is_encoder_decoder Field required``).
speculators 0.4 passes ``False``; so does this wrapper, unless the caller passed a value.
The generator only supports decoder-only models (it patches ``model.model.layers``).
"""

from __future__ import annotations

import dataclasses

from specshim.adapters.kit import calls_with_keyword, module, with_keywords
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import GENERATOR, generator_class


def _requires_flag(config_class: type) -> bool:
    init_vars = {
        name: value
        for name, value in vars(config_class).get("__annotations__", {}).items()
        if name == "is_encoder_decoder"
    }
    if not init_vars:
        return False
    default = getattr(config_class, "is_encoder_decoder", dataclasses.MISSING)
    return default is dataclasses.MISSING or isinstance(default, dataclasses.Field)


def probe() -> Probe:
    config_class = vars(module(GENERATOR))["SchedulerConfig"]
    if calls_with_keyword(
        generator_class()._create_vllm_config, "SchedulerConfig", "is_encoder_decoder"
    ):
        return not_needed("the generator passes is_encoder_decoder")
    if not _requires_flag(config_class):
        return not_needed("SchedulerConfig does not require is_encoder_decoder")
    return needed("SchedulerConfig requires is_encoder_decoder; the generator omits it")


def patches() -> list[Patch]:
    generator = module(GENERATOR)
    return [with_keywords(generator, "SchedulerConfig", default={"is_encoder_decoder": False})]


ADAPTER = Adapter(
    name="scheduler_config_encoder_decoder",
    targets=(f"{GENERATOR}.SchedulerConfig",),
    waits_for=(GENERATOR,),
    why="SchedulerConfig requires is_encoder_decoder (vLLM 0.12); speculators 0.3.0 omits it",
    upstream="vLLM 0.12.0 vllm/config/scheduler.py (is_encoder_decoder: InitVar[bool])",
    remove_when="speculators 0.3.0 is no longer supported",
    left_out=(LeftOut("0.3.0", raises="ValidationError", text="is_encoder_decoder"),),
    facts=facts("fields", "vllm.config:SchedulerConfig"),
    probe=probe,
    patches=patches,
)
