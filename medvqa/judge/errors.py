"""The judge's configuration error, in a module of its own so that every judge module (the
backends, the key rules) can raise it without importing one another."""

from __future__ import annotations

__all__ = ["JudgeConfigError"]


class JudgeConfigError(ValueError):
    """The judge cannot work as configured (wrong mode for a server, bad model or key): every
    item would fail the same way, so the run stops instead of recording thousands of failures."""
