"""Parts of ``scripts/benchmark.py`` in modules of their own (imported by it: ``scripts/`` is its first path)."""
