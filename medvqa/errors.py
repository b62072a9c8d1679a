"""Errors shared by several layers, in a leaf module every layer may import."""


class DataError(ValueError):
    """Bad or missing input data; the message names the file/row/key and the fix."""


class ConfigError(ValueError):
    """A composed config that cannot run; the message names the key, the value and the fix."""
