"""The accelerator, named the way users know it (sm_90 Hopper, sm_100 Blackwell, CPU)."""

from __future__ import annotations

from dataclasses import dataclass

#: Compute capability major -> architecture name.
ARCHITECTURES = {7: "Volta/Turing", 8: "Ampere/Ada", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


@dataclass(frozen=True)
class Accelerator:
    kind: str  # "cuda" or "cpu"
    name: str
    count: int
    compute_capability: str | None  # "sm_90"
    architecture: str | None
    torch_build: str | None  # "cpu", "cu130", ...

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"CPU ({self.name})"
        return f"{self.count} x {self.name} ({self.compute_capability}, {self.architecture})"

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "count": self.count,
            "compute_capability": self.compute_capability,
            "architecture": self.architecture,
            "torch_build": self.torch_build,
        }


def architecture(major: int) -> str:
    return ARCHITECTURES.get(major, f"unknown (sm_{major}x)")


def detect() -> Accelerator:
    """Ask torch what is here; without torch the answer is the CPU."""
    import platform

    cpu = platform.machine()  # the architecture; platform.processor() varies by distribution
    try:
        import torch
    except ImportError:
        return Accelerator("cpu", cpu, 0, None, None, None)
    build = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    if not torch.cuda.is_available():
        return Accelerator("cpu", cpu, 0, None, None, build)
    major, minor = torch.cuda.get_device_capability(0)
    return Accelerator(
        kind="cuda",
        name=torch.cuda.get_device_name(0),
        count=torch.cuda.device_count(),
        compute_capability=f"sm_{major}{minor}",
        architecture=architecture(major),
        torch_build=build,
    )
