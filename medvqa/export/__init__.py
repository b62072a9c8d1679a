"""A run's trained weights in the formats other tools load: a peft adapter folder or a whole
transformers checkpoint (`weights`), with a model card written from the run's record (`card`),
for one run folder whole or not at all (`job`). `medvqa-export` and `task=export` use it;
docs/export.md."""
