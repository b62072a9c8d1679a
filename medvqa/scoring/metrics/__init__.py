"""Metric families: one module per family, each registering its metric class by subclassing."""
