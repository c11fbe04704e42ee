"""One module per upstream change. See ``registry`` for the order they apply in."""
