"""Fine-tuning: the trainer, peft and data specs, the Lightning module and datamodule, strategies
(DDP, DeepSpeed ZeRO-2), checkpoints, the step profile and progress lines."""
