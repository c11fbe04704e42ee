"""Enable the test bed's Model Runner V2 set-up at interpreter start, when asked to.

On ``PYTHONPATH`` only for test processes (``specshim.testbed.model_runner_v2.environment``),
so that vLLM's spawned workers get it before they import vLLM.
"""

import os

if os.environ.get("SPECSHIM_TESTBED_MODEL_RUNNER_V2") == "1":
    from specshim.testbed import model_runner_v2

    model_runner_v2.enable()
