"""One module per upstream change, in a sub-package per phase (``imports``, ``training``,
``generator``, ``executor``, ``worker``); ``registry`` chains the phases in the order they act.
``model`` is what an adapter is (the applier's data model), ``kit`` the helpers for writing one,
``targets`` the speculators modules adapted."""
