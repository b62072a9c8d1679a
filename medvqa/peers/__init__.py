"""Other tools' prediction files read as medvqa's rows (SURE-VQA, lmms-eval, VLMEvalKit, LLaVA,
tables), with the limits that keep a hostile file from costing minutes or memory."""
