"""Model families: one module per VLM architecture (`base.ModelFamily`), found, never listed."""
