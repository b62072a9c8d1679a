"""Vision-language models: the spec, loading (hub ids and paths are config), adapters, prompting,
processors, saving, rehearsals, FLOPs, FP8; one module per architecture in `families/`."""
