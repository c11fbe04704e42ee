"""The new EAGLE-3 draft a run trains, built as the installed speculators release builds it."""

from __future__ import annotations

from typing import Any

from specshim.runner import remote_code


def draft_layer_config(verifier: str, num_layers: int, trust_remote_code: bool = False) -> Any:
    """A Llama decoder config with the verifier's sizes, as speculators' own script builds it
    (the verifier's own code run only with ``trust_remote_code``)."""
    from transformers import LlamaConfig

    config = remote_code.config(verifier, trust_remote_code)
    config = getattr(config, "text_config", config)
    layer = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        head_dim=getattr(config, "head_dim", None),
        tie_word_embeddings=False,
    )
    import speculators.models.eagle3.attention  # noqa: F401  (registers simple_flex_attention)

    layer._attn_implementation = "simple_flex_attention"
    return layer


def build_model(
    verifier: str,
    d2t: Any,
    t2d: Any,
    num_layers: int,
    ttt_steps: int,
    trust_remote_code: bool = False,
) -> Any:
    """A new EAGLE-3 draft of ``num_layers`` layers (:func:`draft_layer_config`) with a draft
    vocabulary the size of ``d2t``: built with ``Eagle3DraftModel.from_training_args`` where
    speculators has it (0.4+), given ``ttt_steps``; else from a typed ``Eagle3SpeculatorConfig``
    whose greedy proposal has ``ttt_steps`` speculative tokens (0.3.0, see the module's
    docstring). The verifier's own code runs only with ``trust_remote_code``, in speculators'
    reading of it too."""
    with remote_code.in_speculators(trust_remote_code, remote_code.TRAINING_LOADERS):
        return _draft(verifier, d2t, t2d, num_layers, ttt_steps, trust_remote_code)


def _draft(
    verifier: str, d2t: Any, t2d: Any, num_layers: int, ttt_steps: int, trust_remote_code: bool
) -> Any:
    """:func:`build_model`'s draft, made by the speculators release installed."""
    from speculators.models.eagle3 import Eagle3DraftModel

    layer = draft_layer_config(verifier, num_layers, trust_remote_code)
    if hasattr(Eagle3DraftModel, "from_training_args"):  # speculators 0.4+
        return Eagle3DraftModel.from_training_args(
            verifier_config=layer,
            draft_vocab_size=d2t.shape[0],
            norm_before_residual=True,
            ttt_steps=ttt_steps,
            verifier_name_or_path=verifier,
            t2d=t2d,
            d2t=d2t,
        )
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=d2t.shape[0],
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[
                GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=ttt_steps)
            ],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=verifier, architectures=["LlamaForCausalLM"]),
        ),
    )
    return Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)
