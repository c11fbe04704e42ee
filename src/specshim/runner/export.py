"""Export a trained draft in the form vLLM serves for EAGLE-3, with consistent layer ids.

speculators' legacy generator and vLLM's EAGLE-3 serving number layers differently
(:mod:`specshim.runner.layer_ids`): a draft trained on generator ids is served with their vLLM
ids, or it reads every feature one layer early. speculators' checkpoints leave the ids unset, and
vLLM's fallback ``(2, n // 2, n - 3)`` neither matches the generator's default ``[2, n // 2, n - 3,
n - 1]`` nor fits small models (it de-duplicates to fewer than three layers and the draft's input
projection fails).

The export writes the ids from the extraction's ``data_config.json`` (its last id is the
training target, not an input), records both conventions under ``specshim`` in the config, and
keeps only the tensors vLLM's draft model loads. Its files (:data:`WRITES`) are recorded in
:data:`LEDGER` (claimed there before), so that a re-export replaces only its own: a file there
that it did not write (the user's, or one changed since) only with ``overwrite``.
"""

from __future__ import annotations

import json
from pathlib import Path

from specshim.runner import files
from specshim.runner.layer_ids import ascending, vllm_ids
from specshim.runner.train import checkpoints, options

#: Tensors of speculators' checkpoint that vLLM's Eagle3LlamaForCausalLM has no place for.
NOT_SERVED = ("verifier_lm_head.", "verifier_norm.", "t2d")
#: What :func:`export` writes into its folder.
WRITES = ("model.safetensors", "config.json")
#: The record of the files it wrote there (:class:`files.Ledger`).
LEDGER = "specshim_export_done.jsonl"


def generator_layer_ids(data: Path) -> list[int]:
    """The layer ids the extraction captured, from its ``data_config.json``, ascending: the
    order its files hold the layers in, whatever order the file lists them in
    (:mod:`specshim.runner.layer_ids`; speculators 0.3/0.4's generator records its ids as it
    was given them)."""
    config_path = data / "data_config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} is missing: export needs the extraction's folder")
    recorded = json.loads(config_path.read_text())["hidden_states"]["layer_ids"]
    return ascending(list(recorded), f"{config_path} hidden_states.layer_ids")


def serving_layer_ids(generator_ids: list[int], shift: int = 1) -> list[int]:
    """vLLM's aux layer ids for a draft trained on ``generator_ids`` (``shift=0``: the naive
    copy that reads one layer early, kept for comparisons)."""
    if len(generator_ids) != options.AUX_LAYERS + 1:
        raise ValueError(
            f"expected {options.AUX_LAYERS} auxiliary layer ids plus the target layer, "
            f"got {generator_ids}"
        )
    return vllm_ids(generator_ids[:-1], shift)


def latest_checkpoint(draft: Path) -> Path:
    """The newest complete epoch checkpoint under ``draft/checkpoints``;
    ``FileNotFoundError`` naming the folder when there is none."""
    complete = [d for d in checkpoints.epochs(draft / "checkpoints") if checkpoints.is_complete(d)]
    if not complete:
        raise FileNotFoundError(f"no complete checkpoint under {draft / 'checkpoints'}")
    return complete[-1]


def check(out: Path, option: str, overwrite: bool) -> None:
    """Refuse, in one line and before anything is written, files of :data:`WRITES` in ``out``
    (named as ``option``) that an export did not write there, unless ``overwrite``."""
    if not overwrite and (foreign := files.Ledger(out / LEDGER).not_written(WRITES)):
        raise ValueError(files.refusal(option, out, foreign))


def export(draft: Path, data: Path, out: Path, shift: int = 1) -> Path:
    """Write ``out``: the latest complete checkpoint of ``draft``, loadable by vLLM (files of
    another there: see :func:`check`, which the caller runs first)."""
    from safetensors.torch import load_file, save

    checkpoint = latest_checkpoint(draft)
    generator_ids = generator_layer_ids(data)
    config = json.loads((checkpoint / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = serving_layer_ids(generator_ids, shift)
    config["specshim"] = {
        "checkpoint": str(checkpoint),
        "generator_layer_ids": generator_ids,
        "serving_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
        "convention": "serving id = generator id + 1 (both name transformers' hidden_states"
        " index of the same tensor)"
        if shift == 1
        else f"shifted by {shift}: not the serving convention",
    }
    tensors = load_file(str(checkpoint / "model.safetensors"))
    served = {k: v for k, v in tensors.items() if not k.startswith(NOT_SERVED)}
    out.mkdir(parents=True, exist_ok=True)
    ledger = files.Ledger(out / LEDGER)
    for name in WRITES:
        ledger.claim(name, str(checkpoint))
    files.write_atomic(
        out / "model.safetensors", lambda f: f.write(save(served, metadata={"format": "pt"}))
    )
    files.save_json(out / "config.json", config)
    for name in WRITES:
        ledger.record(out / name, str(checkpoint))
    return out
