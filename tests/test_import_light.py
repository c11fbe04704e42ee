"""`import specshim` stays cheap: no torch, vLLM, transformers or speculators."""

import subprocess
import sys

HEAVY = ("torch", "vllm", "transformers", "speculators")


def test_import_specshim_imports_nothing_heavy() -> None:
    code = (
        "import sys, specshim, specshim.cli, specshim.plugin; "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_status_before_apply_imports_nothing_heavy() -> None:
    code = (
        "import sys, specshim; r = specshim.status(); "
        "assert all(a.state.value == 'not selected' for a in r.adapters); "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
