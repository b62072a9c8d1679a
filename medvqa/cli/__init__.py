"""The console scripts (medvqa-score, medvqa-report, ...): the top layer; nothing imports it."""
