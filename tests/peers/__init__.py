"""Fixture writers and scorers copied from peer projects, so tests compare with their real code."""
