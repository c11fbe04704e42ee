"""``specshim``'s process end (:func:`specshim.cli.run`): the command's result, exit status and
output as :func:`specshim.cli.main` gives them, the exit handlers and other threads done, and
no interpreter teardown after them (seconds once vLLM, torch and transformers are loaded)."""

from __future__ import annotations

import subprocess
import sys

#: A program that runs ``specshim report --no-import`` through ``cli.run`` with, beside it, an
#: exit handler, a thread still writing when the command returns, a thread pool left open (as
#: vLLM 0.28 leaves one), a line left in a buffer, and an object the interpreter's teardown
#: would finalize.
PROGRAM = """
import atexit, concurrent.futures, sys, threading, time
from specshim import cli

class Finalized:
    def __del__(self):
        print("teardown ran", file=sys.stderr, flush=True)

kept = Finalized()
atexit.register(lambda: print("exit handler ran", flush=True))
threading.Thread(target=lambda: (time.sleep(1), print("thread done", flush=True))).start()
pool = concurrent.futures.ThreadPoolExecutor(1)  # its thread waits until the exit stops it
pool.submit(print, "pool ran", flush=True).result()
sys.argv = ["specshim", "report", "--no-import"]
print("buffered", end="")
cli.run()
"""


def test_run_ends_the_process_after_the_exit_handlers_without_teardown() -> None:
    from specshim import cli

    said = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert said.returncode == cli.main(["report", "--no-import", "-q"]), said.stderr[-2000:]
    assert said.stdout.startswith("pool ran\nbuffered") and "specshim" in said.stdout
    assert said.stdout.index("thread done") < said.stdout.index("exit handler ran")
    assert "teardown ran" not in said.stderr
