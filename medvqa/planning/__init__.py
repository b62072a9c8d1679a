"""Pre-flight planning: what a configured run needs on each GPU and on each node's host,
computed before any data or weights are loaded (`task=plan`, and the check `train_eval` runs on
CUDA). The model is built on the meta device from its real architecture config
(`medvqa.models.architectures`), the fine-tuning method applied to it, and the activation bytes
of one decoder layer measured on the CPU for that exact layer type and method
(`medvqa.planning.activations`); `medvqa.planning.memory` turns these into bytes per GPU.
"""
