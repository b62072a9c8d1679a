"""Inference: ordering by image, sharding over ranks, resuming, batching, shared image prefixes,
decoding and the answers' log-probabilities, behind one `GenerationSettings` per job.

- `settings`: what a job's generation does, resolved once and recorded;
- `data`: the prompts of a split, each image read and processed once per batch;
- `prefix`: shared image prefixes (the prompt up to the end of an image, run once);
- `decode`: one batch's greedy decode (static or growing cache, compiled on CUDA);
- `logprobs`: the chosen tokens' log-probabilities, recorded while decoding;
- `files`: the predictions file and its per-rank shards;
- `predict`: the Lightning predict loop that ties them together.
"""
