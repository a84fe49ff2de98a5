"""The process: the composition root and its entry points.

- ``gateway``: ``Gateway``, which builds every part around a set of adapters and starts/stops them;
- ``wiring``: the adapters the config enables; ``cli``: ``gateway run|chat|db|doctor|...``;
- ``doctor``: ``gateway doctor`` (config, database, model, platforms, isolation);
- ``startup_errors``: one-line, secret-free start-up failures.
"""
