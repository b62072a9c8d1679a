"""Statistics over scored rows: case-clustered bootstrap intervals and paired differences,
agreement between raters, and power (the smallest difference a study can detect)."""
