"""The local operator's tooling: ``tba up`` (the launcher: its supervisor, the lifetime guard, the live
console and the run's report), ``tba eval`` and the helper that builds ``tba`` command lines.

The top of the shared package: it may import the services' contracts, models, tasks and (through
``tba/cli.py``, the composition root) start the services as processes, but no service imports it.
"""
