"""The report's heatmaps read at a glance: measured on matplotlib's own artists (no browser).
Every label lies whole inside the figure, no panel's labels or colour bar cover another panel,
and every cell's number contrasts with its cell (WCAG 2's 4.5:1 for text). tests/test_browser.py
looks at the same figures in the report, in Chromium."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from medvqa.analysis import figures as figs
from medvqa.analysis.aggregate import collect
from tests.test_report import headline, write_record

# Long shift names (a study's experiment files) and method labels: what clipped and collided.
TABLES = ("slake_modality", "slake_corruption_high (corruption_high)", "ovqa_body_part_leg")
METHODS = ("No Finetune", "Full Finetune", "Prompt", "LoRA", "(IA)³")
# Variants of one method, labelled by their settings (medvqa.analysis.variants): on one line
# they were wider than a panel, and constrained layout shrank its axes to nothing.
VARIANTS = (
    *METHODS[:3],
    "LoRA [data.limit.train=32, peft.lr=0.0001, peft.target_modules='q_proj,k_proj,v_proj,o_proj']",
    "LoRA [data.limit.train=None, peft.lr=0.0003, peft.target_modules='q_proj,k_proj,v_proj,o_proj']",
    "LoRA [data.limit.train=∅, peft.lr=∅, peft.target_modules=∅]",
    METHODS[4],
)
VALUES = ("abnormality", "modality", "organ", "plane", "presence", "size")


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the report's figure functions save, kept instead of written."""
    kept: list[Figure] = []

    def keep(fig: Figure, out_dir: Path, name: str) -> Path:
        kept.append(fig)
        return out_dir / f"{name}.png"

    monkeypatch.setattr(figs, "save", keep)
    return kept


def luminance(rgba: Any) -> float:
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in to_rgba(rgba)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: Any, b: Any) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def check_readable(fig: Figure) -> int:
    """Assert the figure's heatmap panels are readable (see the module doc); returns how many
    cell numbers were checked."""
    with warnings.catch_warnings():  # "constrained_layout not applied": the panels collapsed
        warnings.simplefilter("error", UserWarning)
        FigureCanvasAgg(fig).draw()  # lays the figure out as it is saved
    renderer = fig.canvas.get_renderer()
    whole = fig.bbox
    panels = []
    for ax in fig.axes:
        if not ax.images:
            continue
        colorbar = ax.images[0].colorbar
        parts = [ax, *([colorbar.ax] if colorbar is not None else [])]
        boxes = [a.get_window_extent(renderer) for a in parts]
        assert boxes[0].width > 100 and boxes[0].height > 50, boxes[0]  # cells to read
        texts = [ax.title, *(t for a in parts for t in a.get_xticklabels() + a.get_yticklabels())]
        boxes += [t.get_window_extent(renderer) for t in texts if t.get_text()]
        panels.append(boxes)
        for box in boxes:  # whole: nothing cut at an edge
            assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1, (box, whole)
            assert whole.y0 - 1 <= box.y0 and box.y1 <= whole.y1 + 1, (box, whole)
    assert panels
    for i, mine in enumerate(panels):
        for theirs in panels[i + 1 :]:
            for a in mine:
                for b in theirs:
                    assert not Bbox.intersection(a, b) or _touching(a, b), (a, b)
    checked = 0
    for ax in fig.axes:
        if not ax.images:
            continue
        image = ax.images[0]
        data = image.get_array()
        for text in ax.texts:
            x, y = (round(v) for v in text.get_position())
            cell = image.cmap(image.norm(data[y, x]))
            assert float(text.get_text()) == pytest.approx(float(data[y, x]), abs=0.051)
            assert contrast(text.get_color(), cell) >= 4.5, (text.get_text(), cell)
            assert text.get_fontsize() >= 8
            checked += 1
    return checked


def _touching(a: Bbox, b: Bbox) -> bool:
    """Boxes that only share an edge (under a pixel of overlap)."""
    overlap = Bbox.intersection(a, b)
    return overlap is not None and min(overlap.width, overlap.height) < 1


@pytest.mark.parametrize("methods", [METHODS, VARIANTS], ids=["methods", "variants"])
def test_the_rank_heatmaps_keep_their_labels_whole(
    methods: tuple[str, ...], drawn: list[Figure], tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for score in ("closed", "open"):
        for method in methods:
            ranks = {t: float(rng.integers(1, 6)) for t in TABLES}
            rows.append({"score": score, "method": method, **ranks})
    rank = pd.DataFrame(rows)
    rank["mean rank"] = rank[list(TABLES)].mean(axis=1)
    figs.rank_figure(rank, tmp_path)
    (fig,) = drawn
    assert check_readable(fig) == 2 * len(methods) * (len(TABLES) + 1)


@pytest.mark.heavy
def test_the_breakdown_heatmaps_do_not_overlap_and_their_numbers_read(
    drawn: list[Figure], tmp_path: Path
) -> None:
    """Four panels (closed and open, OoD and RR) with their colour bars, values from 0 to 12:
    dark and light cells both."""
    rng = np.random.default_rng(1)
    for peft in ("none", "full", "prompt_tuning", "lora", "ia3"):
        metrics = headline(rng)
        for split in ("test_iid", "test_ood"):
            for value in VALUES:
                for score in ("closed_acc", "open_f1"):
                    metrics[f"{split}/question_type={value}/{score}"] = rng.uniform(0.05, 1)
        write_record(tmp_path / "runs", peft, 0, metrics=metrics)
    made = figs.breakdown_heatmaps(collect([tmp_path / "runs"]), tmp_path)
    assert len(made) == 1 and len(drawn) == 1
    assert check_readable(drawn[0]) == 4 * len(METHODS) * len(VALUES)


def test_cell_text_is_black_on_light_cells_and_white_on_dark_ones() -> None:
    assert figs.text_colour((1.0, 1.0, 0.6, 1.0)) == "black"  # magma's light end
    assert figs.text_colour((0.0, 0.0, 0.02, 1.0)) == "white"  # its dark end
    for grey in np.linspace(0, 1, 21):
        colour = figs.text_colour((grey, grey, grey, 1.0))
        assert contrast(colour, (grey, grey, grey)) >= 4.5
