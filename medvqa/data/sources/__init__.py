"""Dataset sources: one module per dataset, each registering its loader class by subclassing."""
