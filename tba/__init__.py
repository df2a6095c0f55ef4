"""Shared package of the TBA services: wire schemas, settings, tasks, model I/O, checkpoints."""

__version__ = "0.1.0"
