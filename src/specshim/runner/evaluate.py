"""``specshim eval``: serve the verifier with the trained draft and measure acceptance.

Runs vLLM twice on the same prompts, greedily: once plain and once with the draft through
EAGLE-3 speculative decoding (``"method": "eagle3"`` named: without it vLLM takes the folder
for a plain draft model and fails). Speculative decoding must not change greedy output, so the
two must agree token for token; acceptance comes from vLLM's own metrics
(``vllm:spec_decode_*``). Each run gets its own process: those counters are process-wide, and
so are vLLM's engine settings.

Its files (:data:`WRITES`) go into a folder of their own, recorded in :data:`LEDGER` as each
is written (and claimed there before, so that one a kill left unrecorded is still its own); a
rerun replaces those still as written, and a file of the same name that it did not write
(another tool's, or one changed since) only with ``overwrite``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specshim.runner import files, remote_code

#: What ``evaluate`` writes into its folder: the prompts, each run's output, the result.
WRITES = ("prompts.json", "without_draft.json", "with_draft.json", "eval.json")
#: The record of the files it wrote there (:class:`files.Ledger`).
LEDGER = "specshim_eval_done.jsonl"


@dataclass(frozen=True)
class Acceptance:
    """vLLM's speculative-decoding counters over one run, and what follows from them."""

    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_position: list[int]

    @property
    def rate_per_position(self) -> list[float]:
        """Share of drafts whose first ``i + 1`` tokens were all accepted."""
        return [a / self.drafts for a in self.accepted_per_position] if self.drafts else []

    @property
    def mean_length(self) -> float:
        """Tokens emitted per verifier step: the accepted drafts plus the verifier's own."""
        return 1 + self.accepted / self.drafts if self.drafts else 1.0

    @classmethod
    def from_metrics(cls, metrics: list) -> Acceptance:
        """The counts read from vLLM's speculative-decoding metrics (``LLM.get_metrics()``);
        a metric vLLM did not report counts 0."""
        from vllm.v1.metrics.reader import Counter, Vector

        counters = {m.name: int(m.value) for m in metrics if isinstance(m, Counter)}
        vectors = {m.name: [int(v) for v in m.values] for m in metrics if isinstance(m, Vector)}
        return cls(
            drafts=counters.get("vllm:spec_decode_num_drafts", 0),
            draft_tokens=counters.get("vllm:spec_decode_num_draft_tokens", 0),
            accepted=counters.get("vllm:spec_decode_num_accepted_tokens", 0),
            accepted_per_position=vectors.get("vllm:spec_decode_num_accepted_tokens_per_pos", []),
        )


@dataclass(frozen=True)
class Evaluation:
    """What ``specshim eval`` measured for one draft: its acceptance, whether greedy output
    stayed the verifier's own, and the speed with and without it."""

    draft: str
    acceptance: Acceptance
    identical: bool
    first_difference: str | None
    tokens: int
    tokens_per_second: float
    baseline_tokens_per_second: float

    def table(self) -> str:
        """The evaluation as the lines ``specshim eval`` prints."""
        rates = self.acceptance.rate_per_position
        lines = [
            f"draft {self.draft}",
            "position  accepted  rate",
            *(
                f"{i + 1:>8}  {n:>8}  {r:.3f}"
                for i, (n, r) in enumerate(
                    zip(self.acceptance.accepted_per_position, rates, strict=True)
                )
            ),
            f"drafts {self.acceptance.drafts}, mean acceptance length "
            f"{self.acceptance.mean_length:.2f}",
            f"greedy output identical to the run without the draft: {self.identical}"
            + (f" ({self.first_difference})" if self.first_difference else ""),
            f"{self.tokens} tokens; {self.tokens_per_second:.0f} tok/s with the draft, "
            f"{self.baseline_tokens_per_second:.0f} without",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The evaluation as ``eval.json`` holds it, the derived rates included."""
        data = asdict(self)
        data["acceptance"]["rate_per_position"] = self.acceptance.rate_per_position
        data["acceptance"]["mean_length"] = self.acceptance.mean_length
        return data


def _generate(args: argparse.Namespace) -> None:
    """One configuration, in this process (the child side of :func:`evaluate`)."""
    from specshim import hardware

    hardware.configure_cpu()
    from vllm import LLM, SamplingParams

    options: dict = dict(
        model=args.verifier,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,  # LLM turns stats off by default; get_metrics() needs them
        **remote_code.vllm_options(args.trust_remote_code),
    )
    if args.draft:
        options["speculative_config"] = {
            "model": args.draft,
            "method": "eagle3",
            "num_speculative_tokens": args.k,
        }
    llm = LLM(**options)
    prompts = json.loads(Path(args.prompts).read_text())
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - started
    result = {
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "seconds": seconds,
        "acceptance": asdict(Acceptance.from_metrics(llm.get_metrics())),
    }
    files.save_json(Path(args.out), result)


def _run(
    verifier: str,
    draft: str | None,
    prompts: Path,
    out: Path,
    trust_remote_code: bool = False,
    **options: int,
) -> dict:
    command = [sys.executable, "-m", "specshim.runner.evaluate", verifier, str(prompts), str(out)]
    if draft:
        command += ["--draft", draft]
    if trust_remote_code:
        command.append(remote_code.FLAG)
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    env = {**os.environ}
    env.pop("SPECSHIM_APPLY", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vLLM run failed ({shlex.join(command)}):\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def evaluate(
    verifier: str,
    draft: str,
    prompts: list[str],
    workdir: Path,
    k: int = 3,
    max_tokens: int = 48,
    max_model_len: int = 256,
    trust_remote_code: bool = False,
    overwrite: bool = False,
) -> Evaluation:
    """Greedy runs without and with ``draft`` (a folder vLLM loads: see ``runner.export``),
    their files in ``workdir`` (module doc; another's there is refused unless ``overwrite``);
    vLLM runs the verifier's own code only with ``trust_remote_code``: a verifier only its own
    code reads is refused with one line before vLLM starts and anything is written."""
    if not prompts:
        raise ValueError("specshim eval needs at least one prompt")
    remote_code.config(verifier, trust_remote_code)
    check(workdir, overwrite)
    ledger = files.Ledger(workdir / LEDGER)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in WRITES:
        ledger.claim(name, draft)
    prompt_file = workdir / "prompts.json"
    files.save_json(prompt_file, list(prompts))
    ledger.record(prompt_file, draft)
    options = dict(k=k, max_tokens=max_tokens, max_model_len=max_model_len)
    trust = trust_remote_code
    base = _run(verifier, None, prompt_file, workdir / "without_draft.json", trust, **options)
    ledger.record(workdir / "without_draft.json", draft)
    spec = _run(verifier, draft, prompt_file, workdir / "with_draft.json", trust, **options)
    ledger.record(workdir / "with_draft.json", draft)
    difference = next(
        (
            f"prompt {i}: {a} != {b}"
            for i, (a, b) in enumerate(zip(base["token_ids"], spec["token_ids"], strict=True))
            if a != b
        ),
        None,
    )
    tokens = sum(map(len, spec["token_ids"]))
    result = Evaluation(
        draft=draft,
        acceptance=Acceptance(**spec["acceptance"]),
        identical=difference is None,
        first_difference=difference,
        tokens=tokens,
        tokens_per_second=tokens / spec["seconds"],
        baseline_tokens_per_second=sum(map(len, base["token_ids"])) / base["seconds"],
    )
    files.save_json(workdir / "eval.json", result.to_dict())
    ledger.record(workdir / "eval.json", draft)
    return result


def check_draft(draft: Path) -> None:
    """Refuse, in one line and before anything is made, a ``--draft`` that is no draft vLLM
    can serve: an exported draft is a folder with a ``config.json``."""
    if not (draft / "config.json").is_file():
        what = "does not exist" if not draft.exists() else "has no config.json"
        raise ValueError(
            f"--draft {draft} {what}: give speculators' training folder (with checkpoints/, "
            "and --data) or a draft it exported (with config.json)"
        )


def check(workdir: Path, overwrite: bool) -> None:
    """Refuse, in one line and before anything is written, files in ``workdir`` (``--out``)
    that an evaluation did not write (:func:`not_written_here`), unless ``overwrite``."""
    if not overwrite and (foreign := not_written_here(workdir, files.Ledger(workdir / LEDGER))):
        raise ValueError(files.refusal("--out", workdir, foreign))


def not_written_here(workdir: Path, ledger: files.Ledger) -> list[str]:
    """The files of :data:`WRITES` in ``workdir`` that are not as an evaluation wrote them
    there (the very file ``ledger`` records, or one it claimed and a kill left unrecorded)."""
    return ledger.not_written(WRITES)


def main() -> None:
    """The child process of :func:`evaluate`: one vLLM run, with or without the draft."""
    parser = argparse.ArgumentParser(description="one vLLM run for specshim eval (internal)")
    parser.add_argument("verifier")
    parser.add_argument("prompts")
    parser.add_argument("out")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument(remote_code.FLAG, action="store_true")
    _generate(parser.parse_args())


if __name__ == "__main__":
    main()
