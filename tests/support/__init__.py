"""Test plumbing shared by the tests, the demo and the benchmark (not shipped with the package)."""
