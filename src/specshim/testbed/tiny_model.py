"""Build tiny, real Hugging Face models on disk: config, seeded random weights, a trained tokenizer.

Nothing is downloaded. The models are small enough that vLLM on the CPU starts in seconds,
and shaped the way vLLM's CPU attention accepts (head_dim of at least 32).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "A draft model proposes tokens and the verifier accepts or rejects them.",
    "Speculative decoding makes large language models faster at the same quality.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "What is two plus two? Two plus two is four.",
    "Hidden states from the middle layers teach the draft what the verifier thinks.",
    "user: hello there. assistant: hello, how can I help you today?",
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>")

#: Architectures we build, with the config class and its keyword arguments.
ARCHITECTURES = ("llama", "qwen3")


def build_tokenizer(
    out: Path, vocab_size: int = 384, texts: Iterable[str] = CORPUS * 4, add_bos: bool = False
):
    """Train a byte-level BPE tokenizer on ``texts`` and save it as a fast tokenizer.

    ``add_bos`` makes encoding start with ``<s>`` (as a model trained with it expects; vLLM
    encodes text prompts with the tokenizer's own special tokens).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if add_bos:
        bos = ("<s>", tokenizer.token_to_id("<s>"))
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[bos]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    _readable_by_transformers_4(Path(out) / "tokenizer_config.json")
    return fast


def _readable_by_transformers_4(config: Path) -> None:
    """Name the tokenizer class both transformers 4 and 5 load.

    transformers 5 saves ``TokenizersBackend``, a class 4.x does not have, so a model built
    here could not be read by ``specshim extract`` in an environment of vLLM before 0.24
    (transformers 4.57); ``PreTrainedTokenizerFast`` is the same tokenizer in both (the same
    ids, the same chat template)."""
    settings = json.loads(config.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.write_text(json.dumps(settings, indent=2))


def model_class(architecture: str) -> Any:
    import transformers

    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    return {"llama": transformers.LlamaForCausalLM, "qwen3": transformers.Qwen3ForCausalLM}[
        architecture
    ]


def model_config(
    architecture: str,
    tokenizer: Any,
    num_layers: int,
    hidden_size: int,
    ffn_factor: int = 2,
    head_dim: int = 32,
    kv_heads: int | None = None,
) -> Any:
    """A config of heads of ``head_dim`` dimensions (vLLM's CPU attention needs at least 32),
    with ``kv_heads`` key-value heads (default: half the query heads)."""
    import transformers

    heads = hidden_size // head_dim

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * ffn_factor,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or max(1, heads // 2),
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model_class(architecture)  # validates the name
    if architecture == "llama":
        return transformers.LlamaConfig(**common)
    return transformers.Qwen3Config(**common, head_dim=head_dim)


def save(model: Any, out: Path) -> Path:
    """Save ``model`` in float32 and say so in its config (vLLM picks its dtype from there)."""
    model.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text())
    saved["torch_dtype"] = saved["dtype"] = "float32"
    config_path.write_text(json.dumps(saved, indent=2))
    return out


def build(
    out: str | Path,
    architecture: str = "llama",
    num_layers: int = 8,
    hidden_size: int = 128,
    seed: int = 0,
    head_dim: int = 32,
    kv_heads: int | None = None,
) -> Path:
    """Write a tiny ``architecture`` model with random weights to ``out`` and return its path.

    Rebuilding with the same arguments gives the same weights (fixed seed); ``head_dim`` and
    ``kv_heads`` as in :func:`model_config` (a benchmark builds real shapes with them).
    """
    import torch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = model_config(
        architecture, build_tokenizer(out), num_layers, hidden_size,
        head_dim=head_dim, kv_heads=kv_heads,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = model_class(architecture)(config).to(torch.float32)
    # Larger than default init so that layers differ visibly from one another.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.05)
    return save(model, out)
