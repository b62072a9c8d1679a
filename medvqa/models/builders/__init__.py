"""Offline model builders: make small VLMs and judges from configs or shipped weights, cached."""
