"""Torch datasets and the Lightning DataModule over the splits of one (dataset, shift).

Training order is a function of (seed, epoch) alone, and the training loader knows where it stands
in its epoch: a run resumed from a mid-epoch checkpoint (`ckpt_path=last`, e.g. a requeued SLURM
job) trains the rest of that epoch's batches, in the order an uninterrupted run would have, with
the same dropout masks (tests/test_resume.py).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from itertools import islice
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.data.shifts import seen_image, seen_key
from medvqa.distributed import host_sum
from medvqa.models.prompting import PLAIN, PromptTemplate, encode, labelled_tokens, pad_batch
from medvqa.training.spec import IMAGE_MODES, PARTNER_MODES, DataSchema

log = logging.getLogger(__name__)

META_KEY = "record_ids"
# Set by the training loader on each micro-batch: the label tokens of its whole optimiser step,
# over every micro-batch of the accumulation and every rank (VQAModule divides by it).
STEP_TOKENS_KEY = "step_label_tokens"
# The draw of `shuffled_partners`: a constant, so every run and method pairs a split's rows with
# the same images (their answers compare row by row).
SHUFFLE_SEED = 0
# `data.num_workers=null` gives a GPU rank at most this many loader processes (one core each).
MAX_AUTO_WORKERS = 8


def shuffled_partners(
    frame: pd.DataFrame, seed: int = SHUFFLE_SEED, by: str = R.CASE_ID
) -> dict[str, int]:
    """For each row id of `frame`, the position in `frame` of the row whose image it is shown in
    the `shuffled` image mode: a row drawn at random (seeded) among the rows of other cases, so
    the image is real and from the same split but never of the question's own case (a case's
    rows often share an image or a patient). `by`: the column the other row must differ in (the
    `mismatched` mode: another modality). Drawn with replacement; a split with one value of
    `by` has no such row, an error says so."""
    if frame.empty:
        return {}
    if by not in frame.columns:
        raise ValueError(
            f"the image of a row of another {by!r} needs the column {by!r}; the rows have "
            f"{sorted(map(str, frame.columns))}. Set data.mismatch_field to one of them."
        )
    cases = frame[by].astype(str).to_numpy()
    order = np.argsort(cases, kind="stable")  # each case's rows are one block of `order`
    sorted_cases = cases[order]
    starts = np.searchsorted(sorted_cases, sorted_cases, side="left")
    ends = np.searchsorted(sorted_cases, sorted_cases, side="right")
    others = len(frame) - (ends - starts)
    if (others == 0).any():
        raise ValueError(
            f"the image of a row of another {by!r} needs rows of at least two values of it; "
            f"these {len(frame)} rows all have {sorted_cases[0]!r}. Drop that image mode from "
            "data.extra_eval_images."
        )
    draws = np.random.default_rng(seed).integers(0, others)  # among the rows of other cases
    picked = np.where(draws < starts, draws, draws + (ends - starts))
    ids = frame[R.ID].astype(str).to_numpy()
    return {ids[order[k]]: int(order[picked[k]]) for k in range(len(frame))}


def check_partners(
    frames: Mapping[str, pd.DataFrame], modes: Iterable[str], mismatch_field: str
) -> None:
    """Before any training: every row of every split can be shown a partner's image in each of
    `modes` that needs one (`shuffled`: another case of its split; `mismatched`: another value
    of `mismatch_field` among all of `frames`, as generation draws them). The error names the
    split, the mode and the field's values."""
    for mode in dict.fromkeys(m for m in modes if m in PARTNER_MODES):
        if mode == "mismatched":
            pools = {"the test splits together": pd.concat(list(frames.values()))}
            by = mismatch_field
        else:
            pools, by = dict(frames), R.CASE_ID
        for split, pool in pools.items():
            try:
                shuffled_partners(pool, by=by)
            except ValueError as err:
                values = sorted(map(str, pool[by].unique())) if by in pool else []
                raise ValueError(
                    f"image mode {mode!r} on {split} ({len(pool)} rows; {by}: {values[:10]}): {err}"
                ) from None


def auto_workers(trainer: L.Trainer | None) -> int:
    """Loader processes for one rank when `data.num_workers` is null: none on a CPU trainer (the
    model's own threads use every core), else the cores this rank may use less one for the rank
    itself, at most MAX_AUTO_WORKERS. The cores are the process's CPU affinity (SLURM's
    cpus_per_task, a cgroup or taskset limit) shared by the ranks on this machine."""
    if trainer is None or not is_gpu(trainer):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_rank = min(cores or 1, (os.cpu_count() or 1) // max(1, trainer.num_devices))
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit():
        per_rank = min(per_rank, int(slurm))
    return max(0, min(MAX_AUTO_WORKERS, per_rank - 1))


def is_gpu(trainer: L.Trainer | None) -> bool:
    """Whether the trainer's device is a CUDA GPU (batches then go through pinned memory)."""
    return trainer is not None and trainer.strategy.root_device.type == "cuda"


def loader_options(trainer: L.Trainer | None, num_workers: int | None) -> dict[str, Any]:
    """`make_loader`'s per-machine options for a loader built under `trainer`: the worker count
    (`num_workers`, or `auto_workers` for None) and page-locked batches on a GPU, which the
    host-to-device copy then reads without staging them."""
    workers = auto_workers(trainer) if num_workers is None else int(num_workers)
    return {"num_workers": workers, "pin_memory": is_gpu(trainer)}


class VQADataset(Dataset):
    """Examples of one split, tokenised on access (images are read lazily).

    `with_answer=True` gives training examples (prompt + answer, labels on the answer);
    `False` gives generation prompts. `image_mode`: "image"; "none" (no image and no image
    tokens: the no-image baseline); "blank" (a black image of the same size: the blind test);
    "shuffled" (the image of another case's row, `shuffled_partners`, drawn from `pool`: the
    whole split when `frame` is a shard of it; by default `frame`); "mismatched" (the same, from
    a row of another value of `mismatch_field`, e.g. another modality: generation draws it from
    all of the job's test splits, as an OoD split may hold one modality).
    `prompt`: the protocol's template (system turn, closed options) every row goes through.
    """

    def __init__(
        self,
        frame: pd.DataFrame,
        source: VQASource,
        processor: Any,
        with_answer: bool,
        image_mode: str = DataSchema.train_image,
        prompt: PromptTemplate = PLAIN,
        pool: pd.DataFrame | None = None,
        mismatch_field: str = DataSchema.mismatch_field,
    ) -> None:
        if image_mode not in IMAGE_MODES:
            raise ValueError(f"image_mode must be one of {IMAGE_MODES}, got {image_mode!r}")
        self.frame = frame.reset_index(drop=True)
        self.source = source
        self.processor = processor
        self.with_answer = with_answer
        self.image_mode = image_mode
        self.prompt = prompt
        self.pool = (self.frame if pool is None else pool).reset_index(drop=True)
        by = {"shuffled": R.CASE_ID, "mismatched": mismatch_field}.get(image_mode)
        self.partners = {} if by is None else shuffled_partners(self.pool, by=by)

    def __len__(self) -> int:
        return len(self.frame)

    def _image(self, row: pd.Series) -> Image.Image:
        """The image of `row` as the model sees it (with its transform shift, if any)."""
        return seen_image(self.source, row)

    def image_key(self, i: int) -> str:
        """Which pixels row `i` is shown, from its metadata (no pixels read): rows with one key
        see the same pixels (the image file and what its transform draws from,
        `shifts.seen_key`; "none" without an image)."""
        row = self.frame.iloc[i]
        if self.image_mode == "none":
            return "none"
        if self.image_mode in PARTNER_MODES:
            row = self.pool.iloc[self.partners[str(row[R.ID])]]
        key = seen_key(row)
        return f"blank\0{key}" if self.image_mode == "blank" else key  # a blank keeps the size

    def by_image(self) -> list[int]:
        """The rows' positions ordered by the image they are shown (stable: a fixed order)."""
        keys = [self.image_key(i) for i in range(len(self))]
        return sorted(range(len(self)), key=keys.__getitem__)

    def image(self, i: int) -> Image.Image | None:
        """The image row `i` is shown under `image_mode` (read from disk)."""
        row = self.frame.iloc[i]
        if self.image_mode in PARTNER_MODES:  # another row's image, as its own question saw it
            return self._image(self.pool.iloc[self.partners[str(row[R.ID])]])
        if self.image_mode == "none":
            return None
        image = self._image(row)
        return Image.new("RGB", image.size) if self.image_mode == "blank" else image

    def question(self, i: int) -> str:
        """The user turn's text of row `i`: its question through the protocol's template."""
        row = self.frame.iloc[i]
        return self.prompt.question(row[R.QUESTION], row.get(R.ANSWER_TYPE), row.get(R.CANDIDATES))

    def example(self, i: int, image: Image.Image | None, processor: Any) -> dict[str, Any]:
        """Row `i` tokenised with `image` (`image(i)`) by `processor`, its id beside."""
        row = self.frame.iloc[i]
        features: dict[str, Any] = encode(
            processor,
            self.question(i),
            image,
            answer=row[R.ANSWER] if self.with_answer else None,
            system=self.prompt.system,
        )
        features[META_KEY] = row[R.ID]
        return features

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.example(i, self.image(i), self.processor)


def collate(features: list[dict[str, Any]], pad_token_id: int, padding_side: str) -> dict[str, Any]:
    """Pad a list of examples; record ids travel beside the tensors."""
    ids = [f.pop(META_KEY) for f in features]
    batch: dict[str, Any] = pad_batch(features, pad_token_id, padding_side)
    batch[META_KEY] = ids
    return batch


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of the training rows in `epoch`: a function of (seed, epoch) alone.

    It is the (epoch + 1)-th permutation of a torch.Generator seeded with `seed`, each one after
    the single draw a DataLoader takes from its generator for its workers' base seed: the orders
    an uninterrupted run trained on when the loader shuffled with one generator across epochs
    (with num_workers=0, the default). So weights trained and tiny models cached before keep
    their data order; what changed is that a resumed run's later epochs no longer replay the
    first epochs' orders, and that num_workers no longer changes the order of epochs after the
    first (worker prefetching used to draw one more permutation an epoch).
    """
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(epoch + 1):
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the base-seed draw
        order = torch.randperm(size, generator=generator).tolist()
    return order


class EpochSampler(DistributedSampler):
    """This rank's share of one epoch's training order (`epoch_order`).

    Lightning calls `set_epoch` before every epoch, and leaves a DistributedSampler in place on
    several ranks (a plain shuffled loader gets a DistributedSampler of its own there, whose order
    ignores ours). Rank r takes every `num_replicas`-th row of the epoch's order from the r-th,
    padded to equal shares as DistributedSampler pads, so each rank's shard of epoch e depends on
    (seed, e) alone. `skip` drops the first rows of the next pass only: the ones a resumed run
    trained before its checkpoint.
    """

    def __init__(self, dataset: Dataset, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(len(self.dataset), self.seed, self.epoch)  # type: ignore[arg-type]
        if order:
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
        start, self.skip = self.skip, 0
        return iter(order[self.rank : self.total_size : self.num_replicas][start:])


def label_tokens(batch: Any) -> int:
    """The tokens of a training batch that carry a label (the loss's terms), counted on the
    host as transformers' shifted loss counts them (0 for a batch without labels)."""
    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    return 0 if labels is None else int(labelled_tokens(labels))


def random_state() -> dict[str, torch.Tensor]:
    """The state of the generators training draws from (dropout): torch's CPU generator and this
    rank's GPU's, if CUDA is in use. Data order and worker seeds have generators of their own."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_random_state(state: Mapping[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class ResumableLoader(DataLoader):
    """The training loader: an EpochSampler, and where it stands in its epoch as a state dict.

    Lightning keeps a loader's `state_dict()` in every checkpoint and hands it back through
    `load_state_dict()` when a fit resumes inside an unfinished epoch. A plain DataLoader has no
    such state: Lightning 2.6 then runs the rest of the epoch's batch count from the first batch
    of a fresh iterator, training some rows twice and never the last ones. This one skips the
    batches trained before the checkpoint. The iterator is made at the first batch, not when
    Lightning asks for it, because on a resumed run Lightning asks before it calls `set_epoch`.
    """

    sampler: EpochSampler

    def __init__(self, *args: Any, accumulate: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accumulate = max(1, int(accumulate))  # micro-batches per optimiser step
        self._epoch = self.sampler.epoch
        self._served = 0  # batches of `_epoch` handed out, by this iterator and those before it
        self._resume: dict[str, int] | None = None
        # The generators' state at the checkpoint (VQADataModule.load_state_dict), restored just
        # before the first batch after it, so that dropout continues as if never interrupted.
        self.random_state: Mapping[str, torch.Tensor] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        self._epoch, self._served = self.sampler.epoch, self._resume_at(self.sampler.epoch)
        self.sampler.skip = self._served * int(self.batch_size or 1)
        batches = super().__iter__()
        if self.random_state is not None:
            set_random_state(self.random_state)
            self.random_state = None
        for batch in self._with_step_tokens(batches, self._served):
            self._served += 1
            yield batch

    def _with_step_tokens(self, batches: Iterable[Any], first: int) -> Iterator[Any]:
        """The batches, each with `STEP_TOKENS_KEY`: the label tokens of its optimiser step.

        Steps group the epoch's micro-batches as Lightning steps them: `accumulate` at a time
        from the epoch's first, the last step of an epoch shorter. A step's micro-batches are
        read before its first is trained (they are on the host, labels known), and their counts
        summed over the ranks on the host (`host_sum`): the step's loss is then one token mean
        however the step is split over micro-batches and ranks (VQAModule._loss).
        """
        batches = iter(batches)
        index, total = first, len(self)
        while True:
            rest = self.accumulate - index % self.accumulate  # of this step; less after a resume
            group = list(islice(batches, max(1, min(rest, total - index))))
            if not group:
                return
            tokens = host_sum(sum(label_tokens(b) for b in group))
            for batch in group:
                if isinstance(batch, dict):
                    batch[STEP_TOKENS_KEY] = tokens
                yield batch
            index += len(group)

    def _layout(self) -> dict[str, int]:
        """What fixes the batches of an epoch: a mid-epoch state only fits the same layout."""
        return {
            "seed": int(self.sampler.seed),
            "rows": len(self.sampler.dataset),  # type: ignore[arg-type]
            "ranks": int(self.sampler.num_replicas),
            "batch_size": int(self.batch_size or 1),
        }

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches": self._served, **self._layout()}

    def load_state_dict(self, state_dict: Mapping[str, int]) -> None:
        state = dict(state_dict)
        saved = {k: state.get(k) for k in self._layout()}
        if 0 < state["batches"] < len(self) and saved != self._layout():
            changed = [f"{k} {saved[k]} -> {v}" for k, v in self._layout().items() if saved[k] != v]
            raise ValueError(
                f"the checkpoint stopped after batch {state['batches']} of epoch {state['epoch']}, "
                f"and the training batches changed since ({', '.join(changed)}: ranks are "
                "trainer.devices x trainer.num_nodes, rows the train split after data.limit), so "
                "the rest of that epoch cannot be trained in its order. Resume with the settings "
                "of the interrupted run, or start over without ckpt_path (ckpt_path=null)."
            )
        self._resume = state

    def _resume_at(self, epoch: int) -> int:
        """Batches of `epoch` trained before the checkpoint (0 unless resuming inside it)."""
        resume, self._resume = self._resume, None
        if resume is None or resume["epoch"] != epoch or not 0 < resume["batches"] < len(self):
            return 0
        log.info(
            "resuming epoch %d at batch %d of %d (the batches before it were trained before the "
            "checkpoint, in this order)",
            epoch,
            resume["batches"],
            len(self),
        )
        return resume["batches"]


def make_loader(
    dataset: VQADataset,
    batch_size: int,
    *,
    shuffle: bool,
    padding_side: str,
    num_workers: int = 0,
    pin_memory: bool = False,
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
    accumulate: int = 1,
    collate_fn: Callable[..., dict[str, Any]] = collate,
) -> DataLoader:
    """A loader of padded batches (`collate_fn`, given the pad id and side); `shuffle=True`
    gives the resumable training loader (rank `rank`'s share of `num_replicas`, its batches
    marked with their optimiser step's label tokens for `accumulate` micro-batches per step).

    Every loader seeds its workers from a generator of its own, never from torch's global one,
    which dropout draws from: training's random stream does not depend on how many loaders
    (validation, zero-shot generation, skipped when cached) were iterated before it.
    """
    tokenizer = dataset.processor.tokenizer
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "generator": torch.Generator().manual_seed(seed),
        "num_workers": num_workers,
        "persistent_workers": num_workers > 0,
        "pin_memory": pin_memory,
        "collate_fn": partial(collate_fn, pad_token_id=pad_id, padding_side=padding_side),
    }
    if shuffle:
        sampler = EpochSampler(dataset, seed, num_replicas=num_replicas, rank=rank)
        return ResumableLoader(dataset, sampler=sampler, accumulate=accumulate, **options)
    return DataLoader(dataset, **options)


class VQADataModule(L.LightningDataModule):
    """Train/val loaders for fine-tuning; evaluation builds its own prompt loaders."""

    def __init__(
        self,
        frames: Mapping[str, pd.DataFrame],
        source: VQASource,
        processor: Any,
        batch_size: int = DataSchema.batch_size,
        eval_batch_size: int = DataSchema.eval_batch_size,
        num_workers: int | None = DataSchema.num_workers,
        seed: int = 0,
        image_mode: str = DataSchema.train_image,
        prompt: PromptTemplate = PLAIN,
        mismatch_field: str = DataSchema.mismatch_field,
    ) -> None:
        super().__init__()
        self.frames = dict(frames)
        self.mismatch_field = mismatch_field
        self.source = source
        self.processor = processor
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.image_mode = image_mode
        self.prompt = prompt
        self._train_loader: ResumableLoader | None = None
        self._resume: dict[str, Any] | None = None  # from the checkpoint, for the train loader

    def state_dict(self) -> dict[str, Any]:
        """Where training stands in its epoch, and every rank's generator state, at this
        checkpoint.

        The train loader's position rides here although the loader is stateful itself:
        Lightning restores a loader's state only inside an unfinished epoch, and in 2.6 not at
        all once `configure_optimizers` has asked for `trainer.estimated_stepping_batches` (the
        cosine schedule does), which builds the loader before the checkpoint is read (Lightning
        issue #20550). A DataModule's state comes back on every resume. The generators are
        gathered from every rank (all ranks save a checkpoint together; Lightning requires it):
        dropout draws as many numbers as a rank's batch has tokens, so the ranks' streams drift
        apart and rank 0's alone would not continue rank 1's.
        """
        states = [random_state()]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            states = [{}] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, random_state())
        state: dict[str, Any] = {"random_states": states}
        if self._train_loader is not None:
            state["train_loader"] = self._train_loader.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume = dict(state_dict)
        if self._train_loader is not None:  # built already (see state_dict)
            self._resume_loader(self._train_loader)

    def _resume_loader(self, loader: ResumableLoader) -> None:
        resume, self._resume = self._resume, None
        if resume is None:
            return
        if "train_loader" in resume:
            loader.load_state_dict(resume["train_loader"])
        states = resume.get("random_states", [])
        trainer = self.trainer
        ranks = 1 if trainer is None else trainer.world_size
        rank = 0 if trainer is None else trainer.global_rank
        if len(states) == ranks:
            loader.random_state = states[rank]
        else:
            log.warning(
                "the checkpoint holds the random state of %d ranks and this run has %d: dropout "
                "goes on from a fresh state, not as an uninterrupted run's would",
                len(states),
                ranks,
            )

    def _dataset(self, split: str) -> VQADataset:
        return VQADataset(
            self.frames[split],
            self.source,
            self.processor,
            True,
            self.image_mode,
            self.prompt,
            mismatch_field=self.mismatch_field,
        )

    def train_dataloader(self) -> DataLoader:
        # Each rank's share of the epoch (Lightning leaves an EpochSampler in place).
        shares = self.trainer.distributed_sampler_kwargs if self.trainer is not None else None
        loader = make_loader(
            self._dataset("train"),
            self.batch_size,
            shuffle=True,
            padding_side="right",
            seed=self.seed,
            accumulate=1 if self.trainer is None else int(self.trainer.accumulate_grad_batches),
            **loader_options(self.trainer, self.num_workers),
            **(shares or {}),
        )
        assert isinstance(loader, ResumableLoader)
        self._train_loader = loader
        self._resume_loader(loader)
        return loader

    def val_dataloader(self) -> DataLoader:
        return make_loader(
            self._dataset("val"),
            self.eval_batch_size,
            shuffle=False,
            padding_side="right",
            **loader_options(self.trainer, self.num_workers),
        )
