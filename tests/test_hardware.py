"""Naming the GPU through NVML (``hardware._nvml_gpu``): where its answer is CUDA's, and where
torch must answer instead. NVML needs an NVIDIA driver, which this machine lacks, so a fake
``pynvml`` module stands in for it (``FakeNvml``); on a GPU, tests/gpu/test_hardware_cuda.py
compares the real answer with torch's."""

from __future__ import annotations

import sys
import types

import pytest

from specshim import hardware

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
A10 = ("NVIDIA A10", (8, 6))


class FakeNvml(types.ModuleType):
    """The few NVML calls ``_nvml_gpu`` makes, over a list of (name, capability) GPUs in NVML's
    (PCI) order; ``fails`` makes every call raise NVML's error."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[str, tuple[int, int]]], fails: bool = False) -> None:
        super().__init__("pynvml")
        self.gpus, self.fails, self.open = gpus, fails, 0

    def _check(self) -> None:
        if self.fails:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlInit(self) -> None:
        self._check()
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.gpus[handle][0].encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self.gpus[handle][1]


@pytest.fixture
def nvml(monkeypatch):
    """Install a :class:`FakeNvml` of the given GPUs as ``pynvml``; CUDA's variables unset."""
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)

    def install(gpus: list[tuple[str, tuple[int, int]]], fails: bool = False) -> FakeNvml:
        fake = FakeNvml(gpus, fails)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, ("NVIDIA H100 80GB HBM3", 4, (9, 0))),
        ("2,3", ("NVIDIA H100 80GB HBM3", 2, (9, 0))),
        (" 1 ", ("NVIDIA H100 80GB HBM3", 1, (9, 0))),
    ],
)
def test_visible_gpus_named_and_counted_as_cuda_sees_them(nvml, monkeypatch, visible, expected):
    fake = nvml([H100] * 4)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert hardware._nvml_gpu() == expected
    assert fake.open == 0  # NVML shut down again


@pytest.mark.parametrize(
    "visible",
    ["", "-1", "0,-1", "0,0", "0,5", "GPU-5e0f1c2a", "MIG-5e0f1c2a/1/0", "0abc"],
)
def test_torch_answers_where_the_variable_is_not_plain_distinct_indices(nvml, monkeypatch, visible):
    """CUDA reads these by rules of its own (a -1 ends the list, a repeat empties it, a UUID
    or MIG instance names a device NVML numbers otherwise): torch is asked instead."""
    nvml([H100] * 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert hardware._nvml_gpu() is None


def test_mixed_gpus_are_named_by_nvml_only_in_pci_order(nvml, monkeypatch) -> None:
    """NVML numbers GPUs in PCI order, CUDA fastest first unless CUDA_DEVICE_ORDER says
    PCI_BUS_ID: with two kinds of GPU the first may differ, so torch is asked."""
    nvml([A10, H100])
    assert hardware._nvml_gpu() is None
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert hardware._nvml_gpu() == ("NVIDIA A10", 2, (8, 6))


def test_no_driver_or_no_gpu_leaves_the_answer_to_torch(nvml) -> None:
    nvml([H100], fails=True)
    assert hardware._nvml_gpu() is None
    nvml([])
    assert hardware._nvml_gpu() is None


def test_torchs_checks_go_through_nvml_unless_the_user_chose() -> None:
    environ: dict[str, str] = {}
    hardware.keep_forks_able_to_use_cuda(environ)
    assert environ == {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    chosen = {"PYTORCH_NVML_BASED_CUDA_CHECK": "0"}
    hardware.keep_forks_able_to_use_cuda(chosen)
    assert chosen == {"PYTORCH_NVML_BASED_CUDA_CHECK": "0"}
