"""Scores for answers: the one pipeline (`pipeline.py`), relative robustness, the model-free
baselines, and the metric families, one module each in `metrics/`."""
