"""The example pipelines' producers, ground truths and resets: used by the tests, the scripts and the README's
commands (run from the repository root). Not installed: the wheel ships only what the example DAGs run."""
