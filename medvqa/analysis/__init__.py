"""Across runs: the tidy table of records, SURE-style tables and figures, paired differences, the
family of claims, findings, effective robustness, the card, the explorer and the report."""
