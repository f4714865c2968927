"""Arrow, the form in which every write task receives its rows: what a task of any sink does with Arrow batches
beyond handing them to its driver (:mod:`.kept_batches`: batches kept on the executor's disk)."""
