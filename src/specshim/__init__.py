"""specshim: run speculators' EAGLE-3 data generation and training on newer vLLM releases.

    import specshim
    report = specshim.apply()      # patch what the installed vLLM needs, nothing more
    ...                            # use speculators as usual
    specshim.revert()              # put every original back

Importing this package imports neither torch, vLLM, transformers nor speculators.
"""

from specshim.engine import AdapterError, Report, State, apply, revert, status

__all__ = ["AdapterError", "Report", "State", "__version__", "apply", "revert", "status"]
__version__ = "0.1.0"
