"""What runs inside vLLM's processes during ``specshim extract``: the capture, the connector,
the writers and the protocol they share with the calling process.

Nothing here imports :mod:`specshim.runner.extraction` (an import-linter contract): vLLM's
workers load these modules by name, without the caller's machinery.
"""
