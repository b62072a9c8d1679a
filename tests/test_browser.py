"""The pages people open, in a real browser: the rater page and report.html in headless
Chromium, driven by selenium (Debian: `apt-get install chromium chromium-driver`; `.ci/run`
installs them). Without a browser, its driver or selenium, the tests skip and say which is
missing. The rater page is also checked without a browser, against a DOM stand-in
(tests/test_rater.py)."""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from medvqa.analysis.aggregate import collect
from medvqa.analysis.rater.analysis import read_items, read_ratings
from medvqa.analysis.rater.export import export
from medvqa.analysis.rater.study import SHEET_HTML
from medvqa.analysis.report import build_report
from tests.test_rater import _predictions
from tests.test_report import headline, write_record

# A normal laptop's screen: the report's tables must fit it.
WIDTH, HEIGHT = 1280, 800
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Model output that is markup: the rater page must show it as text, never run or render it.
MARKUP = 'left "lobe", </script><b>x</b>'


@pytest.fixture
def downloads(tmp_path: Path) -> Path:
    path = tmp_path / "downloads"
    path.mkdir()
    return path


@pytest.fixture
def browser(downloads: Path) -> Iterator[Any]:
    """Headless Chromium at `WIDTH` x `HEIGHT` that saves downloads to `downloads`."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')"
    )
    from selenium.webdriver.chrome.service import Service

    binary = next(filter(None, map(shutil.which, BROWSERS)), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        missing = " and ".join(
            name for name, path in (("chromium", binary), ("chromedriver", driver)) if not path
        )
        pytest.skip(f"no {missing} on PATH (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={WIDTH},{HEIGHT}",
    ):
        options.add_argument(arg)
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    try:
        chrome.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
        )
        yield chrome
    finally:
        chrome.quit()


def wait_for_file(path: Path, timeout: float = 20.0) -> Path:
    """`path` once the browser has finished writing it (no `.crdownload` beside it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and not list(path.parent.glob("*.crdownload")):
            return path
        time.sleep(0.1)
    there = sorted(p.name for p in path.parent.iterdir())
    raise AssertionError(f"no download {path.name} after {timeout:.0f} s; the folder holds {there}")


@pytest.mark.heavy
def test_the_rater_page_counts_the_picks_and_downloads_them_as_a_ratings_file(
    browser: Any, downloads: Path, tmp_path: Path
) -> None:
    """Scores picked in the page update its counter and mark the item; the download is a
    ratings file `read_ratings` accepts with those scores; a prediction holding markup is
    shown as text (no element made of it), and travels to the CSV as it was."""
    from selenium.webdriver.common.by import By

    preds = _predictions(tmp_path / "p.jsonl", n=20)
    preds.loc[1, "prediction"] = MARKUP
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in preds.to_dict("records"))
    )
    study = tmp_path / "study"
    export(tmp_path / "p.jsonl", study, n=50, seed=0, text_metrics=False)
    ids = list(read_items(study).index)
    assert "r001" in ids and len(ids) >= 5

    browser.get((study / SHEET_HTML).as_uri())
    progress = browser.find_element(By.ID, "progress")
    assert progress.text == f"0 of {len(ids)} rated"
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('#items .item')).map(d => "
        "[d.children[0].textContent, d.children[3].lastChild.textContent])"
    )
    assert [head for head, _ in shown] == [f"#{i + 1} ({rid})" for i, rid in enumerate(ids)]
    assert MARKUP in [prediction for _, prediction in shown]
    assert not browser.find_elements(By.CSS_SELECTOR, "#items b")  # not interpreted

    browser.find_element(By.ID, "rater").send_keys("Dr X")
    picks = {rid: 1 + i % 5 for i, rid in enumerate(ids)}

    def pick(i: int, score: int) -> None:
        browser.find_element(By.CSS_SELECTOR, f"input[name='s{i}'][value='{score}']").click()

    pick(0, 5)  # changed below: a second pick of an item replaces the first
    for i, rid in enumerate(ids[:-1]):
        pick(i, picks[rid])
        assert progress.text == f"{i + 1} of {len(ids)} rated"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#items .item.done")) == len(ids) - 1

    browser.find_element(By.ID, "download").click()  # one item unrated: the page asks first
    alert = browser.switch_to.alert
    assert alert.text.startswith("1 item(s) are not rated yet")
    alert.dismiss()
    pick(len(ids) - 1, picks[ids[-1]])
    assert progress.text == f"{len(ids)} of {len(ids)} rated"
    browser.find_element(By.ID, "download").click()

    filled = wait_for_file(downloads / "ratings_Dr_X.csv")
    assert read_ratings(filled, ids).to_dict() == picks
    assert MARKUP in set(pd.read_csv(filled)["prediction"])


@pytest.mark.heavy
def test_the_reports_tables_fit_a_laptop_screen(browser: Any, tmp_path: Path) -> None:
    """report.html at 1280 px: no table wider than the page or its box (nothing to scroll
    sideways), with the long things a study's report holds: variant labels, a failed job's
    sweep folder and error, package versions, judges, fingerprints, the speed table."""
    rng = np.random.default_rng(0)
    provenance = {
        "git": {"commit": "0123456789abcdef0123", "dirty": True},
        "versions": {
            "torch": "2.13.0+cu126",
            "transformers": "5.23.0",
            "peft": "0.21.2",
            "lightning": "2.6.6",
        },
        "data": {"fingerprint": "sha256:" + "ab" * 32},
        "metrics": {
            "judge": {
                "judge_id": "openai:mistralai/Mistral-7B-Instruct-v0.2:generate",
                "rubrics": {"closed": "c" * 16, "open": "o" * 16},
            }
        },
        "device": "NVIDIA H100 80GB HBM3",
    }
    perf = {
        "perf/fit/seconds": 812.5,
        "perf/fit/samples_per_s": 30.1,
        "perf/fit/steady_samples_per_s": 31.2,
        "perf/fit/steady_mfu": 0.31,
        "perf/fit/peak_allocated_gib": 61.7,
        "plan/train_gib": 64.0,
        "perf/generate/test_iid/rows": 1000,
        "perf/generate/test_iid/seconds": 50.0,
    }
    runs = tmp_path / "runs"
    for peft in ("none", "full", "prompt_tuning", "lora", "ia3"):
        for seed in (0, 1):
            extra = {"perf": perf, "provenance": provenance}
            write_record(runs, peft, seed, metrics=headline(rng), extra=extra)
    for lr, limit in ((1e-4, 32), (3e-4, None)):  # variants of LoRA: labelled by their settings
        path = write_record(runs / f"lr={lr}", "lora", 0, metrics=headline(rng))
        record = json.loads(path.read_text())
        record["config"]["peft"].update(lr=lr, target_modules="q_proj,k_proj,v_proj,o_proj")
        record["config"]["data"]["limit"] = {"train": limit}
        path.write_text(json.dumps(record))
    job = "data.limit.train=32,judge.model=Mistral-7B-Instruct-v0.2,metric=[traditional,judge]"
    error = (
        "FileNotFoundError: /scratch/users/researcher/medvqa_cache/hf_hub/models--mistralai--"
        "Mistral-7B-Instruct-v0.2/snapshots/0123456789abcdef0123456789abcdef01234567/"
        "model-00001-of-00003.safetensors"
    )
    failed = write_record(
        runs / "logs/multiruns/2025-01-01/12-00-00" / job,
        "lora",
        3,
        status="failed",
        label="<b>LoRA</b> & co",  # markup in a label is text in the page
        extra={"error": error},
    )
    report = build_report(collect([runs]), tmp_path / "out")
    assert not report.issues.empty and not report.perf.empty and not report.provenance.empty

    browser.get(report.files["html"].as_uri())
    assert browser.execute_script("return window.innerWidth") == WIDTH
    page = browser.execute_script(
        "const d = document.documentElement; return [d.scrollWidth, d.clientWidth]"
    )
    assert page[0] <= page[1], f"the page scrolls sideways: {page[0]} px wide in {page[1]} px"
    tables = browser.execute_script(
        """return Array.from(document.querySelectorAll('table')).map(t => {
            const box = t.parentElement;
            let h = t; while (h && !/^H[23]$/.test(h.tagName)) {
              h = h.previousElementSibling || h.parentElement; }
            return {heading: h ? h.textContent : '?', header: t.querySelector('th').textContent,
                    width: Math.ceil(t.getBoundingClientRect().width),
                    box: box.clientWidth, scroll: box.scrollWidth};
        })"""
    )
    assert len(tables) >= 4  # results, issues, speed, provenance
    for table in tables:
        assert table["width"] <= table["box"] and table["scroll"] <= table["box"], table
        assert table["header"], f"{table}: an empty first header cell (pandas' axis name)"
    # What wraps is only shown wrapped: the cells' text is the record's, character for character.
    cells = browser.execute_script(
        "return Array.from(document.querySelectorAll('td')).map(td => td.innerText)"
    )
    assert str(failed) in cells
    assert error in cells
    assert "<b>LoRA</b> & co" in cells
    assert not browser.execute_script("return document.querySelectorAll('td b').length")


def _select(browser: Any, element_id: str, value: str) -> None:
    """Pick `value` in a select as a user does (fires its change event)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, element_id)).select_by_value(value)


def shown_images(browser: Any, timeout: float = 20.0) -> list[tuple[str, int]]:
    """(src, natural width) of each image of the explorer's table, once those in view have
    loaded: 0 for one in view that did not load, -1 for one out of view (lazy, it loads as it
    comes near)."""
    deadline = time.monotonic() + timeout
    while True:
        images = browser.execute_script(
            "return Array.from(document.querySelectorAll('#rows img')).map(i => "
            "[i.getAttribute('src'), i.getBoundingClientRect().top < innerHeight ? "
            "(i.complete ? i.naturalWidth : 0) : -1])"
        )
        if all(width != 0 for _, width in images) or time.monotonic() > deadline:
            return [(src, width) for src, width in images]
        time.sleep(0.1)


def _count(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, "count").text


@pytest.mark.heavy
def test_the_explorer_filters_a_reports_rows_and_shows_what_the_model_saw(
    browser: Any, tmp_path: Path
) -> None:
    """From report.html's link to explorer.html: each filter a user clicks changes the count
    to the rows it should keep, two runs side by side keep the rows one got right and the
    other wrong, the thumbnails load from disk, and markup in the data stays text."""
    from selenium.webdriver.common.by import By

    from tests.test_explorer import MARKUP, explorer_run

    explorer_run(tmp_path / "runs", tmp_path / "data", peft="lora")
    explorer_run(tmp_path / "runs", tmp_path / "data", peft="full", wrong=(0, 1))
    report = build_report(collect([tmp_path / "runs"]), tmp_path / "out")

    browser.get(report.files["html"].as_uri())
    browser.find_element(By.ID, "explorer").click()
    assert browser.current_url.endswith("/explorer.html")
    assert _count(browser) == "12 of 12 rows"
    assert [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#run option")][1:] == [
        "Full Finetune · synthetic_modality · seed 0",
        "LoRA · synthetic_modality · seed 0",
    ]
    _select(browser, "run", "1")  # LoRA: wrong on q1 and q4
    assert _count(browser) == "6 of 12 rows"
    _select(browser, "correct", "0")
    assert _count(browser) == "2 of 12 rows"
    _select(browser, "correct", "")
    _select(browser, "pass", "blank")  # its "yes" answers change under a blank image
    assert _count(browser) == "3 of 12 rows"
    _select(browser, "passWhen", "same")  # the same answer without the image
    assert _count(browser) == "3 of 12 rows"
    _select(browser, "pass", "")
    browser.find_element(By.ID, "disagree").click()
    assert _count(browser) == "3 of 12 rows"
    browser.find_element(By.ID, "disagree").click()
    _select(browser, "group", "x-ray")  # the OoD group
    assert _count(browser) == "3 of 12 rows"
    _select(browser, "group", "")
    _select(browser, "field", "modality")
    _select(browser, "value", "ct")
    assert _count(browser) == "2 of 12 rows"
    _select(browser, "field", "")
    _select(browser, "other", "0")  # Full Finetune, wrong on q0 and q1
    assert _count(browser) == "2 of 12 rows"  # q0 (LoRA right), q4 (Full right)
    _select(browser, "otherWhen", "a")
    assert _count(browser) == "1 of 12 rows"
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('#rows tbody td')).map(td => td.innerText)"
    )
    assert "q0" in shown
    _select(browser, "other", "")
    search = browser.find_element(By.ID, "search")
    search.send_keys("LESION")
    deadline = time.monotonic() + 5
    while _count(browser) != "1 of 12 rows" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _count(browser) == "1 of 12 rows"
    search.clear()
    browser.find_element(By.ID, "clear").click()
    assert _count(browser) == "12 of 12 rows"
    _select(browser, "sort", "score")
    scores = browser.execute_script(
        """const heads = Array.from(document.querySelectorAll('#rows th'));
        const i = heads.findIndex(th => th.textContent === 'score');
        return Array.from(document.querySelectorAll('#rows tbody tr'))
            .map(tr => tr.children[i].textContent)"""
    )
    assert scores == ["0"] * 4 + ["1"] * 8
    _select(browser, "sort", "")

    cells = browser.execute_script(
        "return Array.from(document.querySelectorAll('#rows tbody td')).map(td => td.innerText)"
    )
    assert MARKUP in cells  # shown as the text it is
    assert not browser.execute_script("return document.querySelectorAll('td b').length")
    images = shown_images(browser)
    assert len(images) == 12 and all(width != 0 for _, width in images), images
    assert any(width > 0 for _, width in images)
    assert all((tmp_path / "out" / src).is_file() for src, _ in images)
    assert all(src.startswith("explorer/thumbs/") for src, _ in images)


@pytest.mark.heavy
def test_the_explorer_pages_20000_rows_and_filters_them_at_once(
    browser: Any, tmp_path: Path
) -> None:
    """A study's worth of rows: the page shows one page of them, a filter clicked updates the
    count (a generous sanity bound on the time, not a benchmark), and the pager walks on."""
    from selenium.webdriver.common.by import By

    from medvqa.analysis.explorer import (
        ASSETS,
        HTML_FILE,
        ROWS_JS,
        RunView,
        explorer_data,
        page_html,
        rows_script,
        run_rows,
    )

    n = 20_000
    rng = np.random.default_rng(0)
    truth = rng.choice(["yes", "no"], n)
    main = pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "split": np.where(np.arange(n) % 2, "test_ood", "test_iid"),
            "question": [f"question {i} about the lesion" for i in range(n)],
            "answer": truth,
            "answer_type": "closed",
            "prediction": rng.choice(["yes", "no"], n),
            "modality": rng.choice(["ct", "mri", "x-ray"], n),
        }
    )
    main["closed_correct"] = (main["prediction"] == main["answer"]).astype(float)
    blank = main.assign(prediction="no")
    rows = run_rows({"": main, "blank/": blank}, ["closed_acc"], {}, "modality")
    view = RunView("LoRA", "t", 0, "runs/x", rows, {"blank": "blank"}, [], ["modality"],
                   "modality", "image")  # fmt: skip
    (tmp_path / ASSETS).mkdir()
    data = explorer_data([(view, None, "not needed here")], lambda source, row: None)
    (tmp_path / ASSETS / ROWS_JS).write_text(rows_script(data))
    (tmp_path / HTML_FILE).write_text(page_html("20k rows"))

    browser.get((tmp_path / HTML_FILE).as_uri())
    assert _count(browser) == f"{n} of {n} rows"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#rows tbody tr")) == 50
    wrong = int((main["closed_correct"] == 0).sum())
    start = time.monotonic()
    _select(browser, "correct", "0")
    assert _count(browser) == f"{wrong} of {n} rows"
    assert time.monotonic() - start < 5, "a filter over 20,000 rows took seconds"
    _select(browser, "pass", "blank")
    changed = int(((main["closed_correct"] == 0) & (main["prediction"] == "yes")).sum())
    assert _count(browser) == f"{changed} of {n} rows"
    browser.find_element(By.ID, "next").click()
    assert browser.find_element(By.ID, "page").text.startswith("page 2 of ")


@pytest.mark.heavy
def test_the_reports_heatmaps_are_shown_whole_and_apart(browser: Any, tmp_path: Path) -> None:
    """report.html at 1280 px, screenshot taken: every figure loaded, inside the page's width,
    no two figures' boxes overlap, and the heatmaps are shown near their own size (their cell
    numbers legible; tests/test_figures.py checks the artists inside them)."""
    rng = np.random.default_rng(0)
    runs = tmp_path / "runs"
    for shift in ("modality", "corruption_high"):
        for peft in ("none", "full", "lora"):
            metrics = headline(rng)
            for split in ("test_iid", "test_ood"):
                for value in ("abnormality", "modality", "organ", "plane", "size"):
                    metrics[f"{split}/question_type={value}/closed_acc"] = rng.uniform(0, 1)
                    metrics[f"{split}/question_type={value}/open_f1"] = rng.uniform(0, 1)
            write_record(runs, peft, 0, metrics=metrics, shift=shift)
    report = build_report(collect([runs]), tmp_path / "out")
    assert "method_rank_by_rr" in report.figures
    assert any(name.startswith("breakdown_") for name in report.figures)

    browser.get(report.files["html"].as_uri())
    assert browser.get_screenshot_as_png()[:4] == b"\x89PNG"
    boxes = browser.execute_script(
        """return Array.from(document.querySelectorAll('img')).map(i => {
            const r = i.getBoundingClientRect();
            return {name: i.alt, loaded: i.complete && i.naturalWidth > 0, natural: i.naturalWidth,
                    left: r.left, right: r.right, top: r.top + scrollY, bottom: r.bottom + scrollY,
                    page: document.documentElement.clientWidth};
        })"""
    )
    assert {png.stem for png in report.figures.values()} <= {box["name"] for box in boxes}
    for box in boxes:
        assert box["loaded"] and box["left"] >= 0 and box["right"] <= box["page"], box
    for a, b in itertools.combinations(boxes, 2):
        apart = a["bottom"] <= b["top"] or b["bottom"] <= a["top"]
        assert apart or a["right"] <= b["left"] or b["right"] <= a["left"], (a, b)
    for box in boxes:
        if box["name"].startswith(("method_rank_by_rr", "breakdown_")):
            shown = (box["right"] - box["left"]) / box["natural"]
            assert shown >= 0.75, f"{box['name']} is shown at {shown:.0%} of its size"
