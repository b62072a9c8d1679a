"""The rating page: one self-contained HTML file (inline CSS and JS, no network) with a 1–5
choice per item and a button that downloads the filled sheet as CSV."""

from __future__ import annotations

import html
import json
from typing import Any

import pandas as pd

from medvqa.analysis.rater.study import SHEET_COLUMNS

__all__ = ["rating_page", "script_json"]


def rating_page(sheet: pd.DataFrame, title: str = "medvqa rater study") -> str:
    """A self-contained HTML page: 1–5 per item and a button that downloads the filled CSV.

    The items travel as JSON inside the page (`script_json`) and are put into the DOM with
    ``textContent``, so model output containing markup is shown, never interpreted.
    """
    data = script_json(sheet[list(SHEET_COLUMNS[:-1])].to_dict("records"))
    return _PAGE.replace("__TITLE__", html.escape(title)).replace("__ITEMS__", data)


# Inside <script>, the HTML parser knows nothing of JSON: "</script" ends the element, and
# "<!--" followed by "<script" makes it skip the next "</script>" (the page's own script is
# then swallowed). With no "<", ">" or "&" left in the text, no model output can do either;
# the \u escapes read back as the same characters with JSON.parse and as a JS literal
# (U+2028/2029 too, which older JS engines reject raw in string literals).
_SCRIPT_ESCAPES = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)


def script_json(value: Any) -> str:
    """`value` as JSON that is safe to place inside an HTML ``<script>`` element, whatever
    text it holds."""
    return json.dumps(value).translate(_SCRIPT_ESCAPES)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
.item{border:1px solid #ccc;border-radius:6px;padding:.8rem 1rem;margin:1rem 0}
.item.done{border-color:#3a7}
.label{font-weight:600;color:#555;display:inline-block;min-width:7.5rem}
.scale label{margin-right:1rem;cursor:pointer}
.bar{position:sticky;top:0;background:#fff;padding:.5rem 0;border-bottom:1px solid #ddd}
button{font-size:1rem;padding:.4rem 1rem}
</style></head><body>
<h1>__TITLE__</h1>
<p>Score how well each <b>prediction</b> answers the question, compared with the <b>ground
truth</b>: 1 incorrect, 2 partially correct, 3 mostly correct, 4 correct with minor deviations,
5 perfect match.</p>
<div class="bar">Rater: <input id="rater" placeholder="your name">
<button id="download">Download CSV</button> <span id="progress"></span></div>
<div id="items"></div>
<script type="application/json" id="data">__ITEMS__</script>
<script>
const items = JSON.parse(document.getElementById("data").textContent);
const scores = {};
const box = document.getElementById("items");
function row(label, text) {
  const p = document.createElement("div");
  const l = document.createElement("span"); l.className = "label"; l.textContent = label;
  const t = document.createElement("span"); t.textContent = text;
  p.append(l, t); return p;
}
function progress() {
  const n = Object.keys(scores).length;
  document.getElementById("progress").textContent = n + " of " + items.length + " rated";
}
items.forEach((it, i) => {
  const div = document.createElement("div"); div.className = "item";
  const h = document.createElement("div"); h.className = "label";
  h.textContent = "#" + (i + 1) + " (" + it.id + ")";
  div.append(h, row("Question", it.question), row("Ground truth", it.ground_truth),
             row("Prediction", it.prediction));
  const scale = document.createElement("div"); scale.className = "scale";
  scale.append(Object.assign(document.createElement("span"), {className: "label",
                                                                textContent: "Score"}));
  for (let s = 1; s <= 5; s++) {
    const lab = document.createElement("label");
    const r = document.createElement("input");
    r.type = "radio"; r.name = "s" + i; r.value = s;
    r.addEventListener("change", () => { scores[it.id] = s; div.classList.add("done"); progress(); });
    lab.append(r, " " + s); scale.append(lab);
  }
  div.append(scale); box.append(div);
});
progress();
function cell(v) { v = String(v); return /[",\\r\\n]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; }
document.getElementById("download").addEventListener("click", () => {
  const missing = items.length - Object.keys(scores).length;
  if (missing && !confirm(missing + " item(s) are not rated yet. Download anyway?")) return;
  const lines = ["id,question,ground_truth,prediction,score"];
  items.forEach(it => lines.push([it.id, it.question, it.ground_truth, it.prediction,
                                  scores[it.id] ?? ""].map(cell).join(",")));
  const blob = new Blob([lines.join("\\r\\n") + "\\r\\n"], {type: "text/csv"});
  const a = document.createElement("a");
  const who = document.getElementById("rater").value.trim().replace(/[^A-Za-z0-9_-]+/g, "_");
  a.href = URL.createObjectURL(blob); a.download = "ratings_" + (who || "rater") + ".csv";
  document.body.append(a); a.click(); a.remove();
});
</script></body></html>
"""
