"""One module per upstream change, in a sub-package per phase (``imports``, ``training``,
``generator``, ``executor``, ``worker``); ``registry`` chains the phases in the order they act.
``base`` is the engine's data model and the adapter-writing kit, ``targets`` the speculators
modules adapted."""
