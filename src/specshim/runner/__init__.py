"""The thin runner: extraction, vocabulary mapping and training through the patched speculators."""
