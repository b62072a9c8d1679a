"""Offline model builders that train: the tiny VLMs and the SmolLM2-LLaVA, pre-trained on
synthetic captions before they are cached. They sit above `medvqa.training` (they fit with its
Lightning module); the builders that only load or convert live in `medvqa.models.builders`."""
