"""`medvqa-list`: what the installation has, read from the registries and the shipped configs
(a plug-in appears by itself: tests/test_plugins.py)."""

from __future__ import annotations

import pytest

from medvqa import plugins
from medvqa.cli.catalog import KINDS, catalog, main
from tests.conftest import CONF


def _names(text: str, kind: str) -> list[str]:
    """The entries listed under `kind`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{kind} ("))
    entries = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        if not line.startswith("   "):  # deeper: a description wrapped under its entry
            entries.append(line.split()[0])
    return entries


def test_every_registered_plugin_and_shipped_option_is_listed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 0
    text = capsys.readouterr().out
    for kind, registry in (
        ("datasets", "dataset"),
        ("metric families", "metric"),
        ("model families", "family"),
    ):
        assert _names(text, kind) == sorted(plugins.registered(registry)), kind
    for kind, group in (
        ("tasks", "task"),
        ("shifts", "shift"),
        ("methods", "peft"),
        ("models", "model"),
        ("experiments", "experiment"),
        ("sweeps", "sweep"),
        ("studies", "study"),
        ("baselines", "baseline"),
    ):
        assert _names(text, kind) == sorted(p.stem for p in (CONF / group).glob("*.yaml")), kind
    assert "image reliance" in text and "option-order flips" in text
    # each line says what the entry is (its module's or file's first sentence)
    assert "SLAKE (English part) in its native layout" in text
    assert "lora" in _names(text, "methods") and "LoRA on every linear layer" in text


def test_whole_first_sentences_not_cut_at_an_abbreviation() -> None:
    """ "i.i.d." and "e.g." end no sentence; a long one wraps whole, under its entry."""
    from medvqa.cli.catalog import WIDTH, _first_sentence

    text = catalog(["shifts", "tasks"])
    flat = " ".join(text.split())
    assert "i.i.d. = age >= 60, OoD = age < 40; ages 40-59 are the gap." in flat
    assert "Evaluate a finished run's trained weights without training." in flat
    assert "..." not in text and all(len(line) <= WIDTH for line in text.splitlines())
    assert _first_sentence("Uses e.g. SLAKE, cf. Fig. 2. Then more.") == (
        "Uses e.g. SLAKE, cf. Fig. 2."
    )
    assert _first_sentence("The i.i.d. split. Then more.") == "The i.i.d. split."


def test_one_kind_and_an_unknown_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert catalog(["sweeps"]).startswith(f"sweeps ({KINDS['sweeps'][0]}): ")
    with pytest.raises(SystemExit) as err:
        main(["nonsense"])
    assert err.value.code == 2 and "invalid choice" in capsys.readouterr().err
