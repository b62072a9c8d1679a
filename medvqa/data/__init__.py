"""Datasets and shifts: the record columns, questions and how a reply is read as an answer, one
source per dataset (`sources/`), cleaning, the shift's splits, corruptions and the leakage audit."""
