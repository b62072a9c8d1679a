"""One module per `task=` (train_eval, eval from a run, splits, plan, export, the model-free
baselines), and the glue between a job's config and what generation needs."""
