// The row explorer (medvqa/analysis/explorer.py writes the data, explorer/rows.js). Every value
// comes from run folders, so it is only ever set as text (textContent, option labels) and an
// image is shown only from the page's own thumbnail folder.
"use strict";
(function () {
  const PAGE = 50;
  const THUMB = /^explorer\/thumbs\/[0-9a-f]+\.png$/;
  const $ = (id) => document.getElementById(id);
  const D = window.MEDVQA_EXPLORER;
  if (!D || !Array.isArray(D.rows)) {
    $("count").textContent = "No rows: explorer/rows.js is missing or unreadable beside this page.";
    return;
  }
  const runs = D.runs;
  const rows = D.rows;
  const maxValues = D.maxFilterValues || 50;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function fill(select, items) {
    select.replaceChildren();
    for (const [value, label] of items) {
      const o = el("option", label);
      o.value = value;
      select.appendChild(o);
    }
  }
  const fmt = (v) => (v === null || v === undefined ? "—" : String(v));
  const said = (v) => (v === "" ? "(empty answer)" : fmt(v)); // a model's answer may be empty
  const runLabel = (r) => `${r.name} · ${r.table} · seed ${fmt(r.seed)}`;
  const key = (x) => `${x.s}\u0000${x.id}`;

  // Per run: where each pass, field and juror sits in its rows' arrays.
  const passAt = runs.map((r) => new Map(r.passes.map((p, i) => [p.key, i])));
  const fieldAt = runs.map((r) => new Map(r.fields.map((f, i) => [f, i])));
  const passLabels = new Map();
  for (const r of runs) for (const p of r.passes) if (!passLabels.has(p.key)) passLabels.set(p.key, p.label);
  const byRun = runs.map(() => new Map());
  rows.forEach((x) => byRun[x.r].set(key(x), x));

  // The values a select offers, in first-seen order.
  function distinct(get) {
    const seen = new Map();
    for (const x of rows) {
      const v = get(x);
      if (v !== null && v !== undefined && !seen.has(String(v))) seen.set(String(v), true);
    }
    return [...seen.keys()];
  }
  const fieldValues = new Map();
  for (const r of runs) {
    for (const f of r.fields) {
      if (fieldValues.has(f)) continue;
      const values = distinct((x) => {
        const i = fieldAt[x.r].get(f);
        return i === undefined ? null : x.m[i];
      });
      if (values.length > 1 && values.length <= maxValues) fieldValues.set(f, values.sort());
    }
  }

  fill($("run"), [["", `all runs (${runs.length})`], ...runs.map((r, i) => [String(i), runLabel(r)])]);
  fill($("split"), [["", "all"], ...distinct((x) => x.s).map((s) => [s, s])]);
  fill($("group"), [["", "all"], ...distinct((x) => x.g).sort().map((g) => [g, g])]);
  fill($("pass"), [["", "—"], ...[...passLabels].map(([k, label]) => [k, label])]);
  fill($("field"), [["", "—"], ...[...fieldValues.keys()].map((f) => [f, f])]);
  fill($("other"), [["", "—"], ...runs.map((r, i) => [String(i), runLabel(r)])]);
  function fillValues() {
    const values = fieldValues.get($("field").value) || [];
    fill($("value"), [["", "any"], ...values.map((v) => [v, v])]);
  }
  fillValues();

  function haystack(x) {
    if (x._h === undefined) {
      const parts = [x.id, x.q, x.ref, x.a, x.g, ...x.m, ...x.p.map((p) => p[0])];
      x._h = parts.filter((p) => p !== null && p !== undefined).join("\n").toLowerCase();
    }
    return x._h;
  }

  let shown = [];
  let page = 0;
  let state = {};

  function read() {
    return {
      run: $("run").value,
      split: $("split").value,
      group: $("group").value,
      correct: $("correct").value,
      pass: $("pass").value,
      passWhen: $("passWhen").value,
      disagree: $("disagree").checked,
      field: $("field").value,
      value: $("value").value,
      search: $("search").value.trim().toLowerCase(),
      other: $("run").value !== "" ? $("other").value : "",
      otherWhen: $("otherWhen").value,
      sort: $("sort").value,
    };
  }

  function keep(x, f) {
    if (f.run !== "" && String(x.r) !== f.run) return false;
    if (f.split !== "" && x.s !== f.split) return false;
    if (f.group !== "" && String(x.g) !== f.group) return false;
    if (f.correct === "?" ? x.c !== null : f.correct !== "" && String(x.c) !== f.correct) return false;
    if (f.pass !== "") {
      const i = passAt[x.r].get(f.pass);
      const changed = i === undefined ? null : x.p[i][1];
      if (changed === null || changed !== (f.passWhen === "changed" ? 1 : 0)) return false;
    }
    if (f.disagree && x.jd !== 1) return false;
    if (f.field !== "" && f.value !== "") {
      const i = fieldAt[x.r].get(f.field);
      if (i === undefined || String(x.m[i]) !== f.value) return false;
    }
    if (f.search !== "" && !haystack(x).includes(f.search)) return false;
    if (f.other !== "") {
      const b = byRun[Number(f.other)].get(key(x));
      if (!b) return false;
      if (f.otherWhen === "a" && !(x.c === 1 && b.c === 0)) return false;
      if (f.otherWhen === "b" && !(x.c === 0 && b.c === 1)) return false;
      if (f.otherWhen === "differ" && !((x.c === 1 && b.c === 0) || (x.c === 0 && b.c === 1))) return false;
    }
    return true;
  }

  function sortRows(list, how) {
    if (!how) return list;
    const desc = how.startsWith("-");
    const field = desc ? how.slice(1) : how;
    const missing = (v) => v === null || v === undefined;
    return list.sort((a, b) => {
      const va = field === "score" ? a.sc : a[field];
      const vb = field === "score" ? b.sc : b[field];
      if (missing(va) || missing(vb)) return missing(va) - missing(vb);
      const order = typeof va === "number" && typeof vb === "number" ? va - vb : String(va).localeCompare(String(vb), undefined, { numeric: true });
      return desc ? -order : order;
    });
  }

  function apply() {
    state = read();
    $("otherWhen").disabled = $("other").disabled = state.run === "";
    shown = sortRows(rows.filter((x) => keep(x, state)), state.sort);
    page = 0;
    render();
  }

  function verdictCell(tr, value) {
    const td = el("td", value === 1 ? "right" : value === 0 ? "wrong" : fmt(value));
    if (value === 1) td.className = "right";
    else if (value === 0) td.className = "wrong";
    tr.appendChild(td);
    return td;
  }

  function render() {
    const visibleRuns = state.run === "" ? runs.map((_, i) => i) : [Number(state.run)];
    const passes = [];
    const jurors = [];
    for (const i of visibleRuns) {
      for (const p of runs[i].passes) if (!passes.includes(p.key)) passes.push(p.key);
      for (const j of runs[i].jurors) if (!jurors.includes(j)) jurors.push(j);
    }
    const other = state.other !== "" ? runs[Number(state.other)] : null;
    const heads = ["image", ...(visibleRuns.length > 1 ? ["run"] : []), "split", "OoD group", "id",
      "question", "reference", "answer", "score", "right?",
      ...(other ? [`answer of ${runLabel(other)}`, "right?"] : []),
      ...passes.map((p) => `answer under ${passLabels.get(p)}`),
      ...(jurors.length ? [...jurors.map((j) => `juror ${j}`), "jury"] : []), "metadata"];
    const head = el("tr");
    for (const h of heads) head.appendChild(el("th", h));
    $("rows").tHead.replaceChildren(head);

    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    page = Math.min(Math.max(page, 0), pages - 1);
    const body = document.createDocumentFragment();
    for (const x of shown.slice(page * PAGE, (page + 1) * PAGE)) {
      const run = runs[x.r];
      const tr = el("tr");
      const cell = el("td");
      if (typeof x.img === "string" && THUMB.test(x.img)) {
        const link = el("a");
        link.href = x.img;
        link.target = "_blank";
        const img = el("img", null, "thumb");
        img.loading = "lazy";
        img.alt = `image of ${x.id}`;
        img.src = x.img;
        link.appendChild(img);
        cell.appendChild(link);
      } else {
        cell.textContent = "no image";
        cell.className = "missing";
      }
      tr.appendChild(cell);
      if (visibleRuns.length > 1) tr.appendChild(el("td", runLabel(run)));
      for (const v of [x.s, x.g, x.id]) tr.appendChild(el("td", fmt(v)));
      tr.appendChild(el("td", fmt(x.q), "q"));
      tr.appendChild(el("td", fmt(x.ref)));
      tr.appendChild(el("td", said(x.a)));
      tr.appendChild(el("td", fmt(x.sc)));
      verdictCell(tr, x.c);
      if (other) {
        const b = byRun[Number(state.other)].get(key(x));
        tr.appendChild(el("td", b ? said(b.a) : "—"));
        verdictCell(tr, b ? b.c : null);
      }
      for (const p of passes) {
        const i = passAt[x.r].get(p);
        const got = i === undefined ? null : x.p[i];
        const td = el("td", got ? said(got[0]) : "—");
        if (got && got[1] === 1) td.className = "changed";
        if (!got) td.className = "missing";
        tr.appendChild(td);
      }
      if (jurors.length) {
        for (const j of jurors) {
          const i = run.jurors.indexOf(j);
          tr.appendChild(el("td", i < 0 ? "—" : fmt(x.j[i])));
        }
        tr.appendChild(el("td", fmt(x.jv)));
      }
      tr.appendChild(el("td", run.fields.map((f, i) => `${f}: ${fmt(x.m[i])}`).join(" · "), "meta"));
      body.appendChild(tr);
    }
    $("rows").tBodies[0].replaceChildren(body);
    $("count").textContent = `${shown.length} of ${rows.length} rows`;
    $("page").textContent = `page ${page + 1} of ${pages}`;
    $("prev").disabled = page === 0;
    $("next").disabled = page >= pages - 1;
  }

  const runList = el("ul", null, "runs");
  runs.forEach((r) => {
    const li = el("li", `${runLabel(r)} — ${r.folder}; passes: ${r.passes.map((p) => p.label).join(", ") || "none"}; shown the ${r.imageMode} image`);
    for (const n of r.notes) li.appendChild(el("div", n, "note"));
    runList.appendChild(li);
  });
  $("runs").replaceChildren(runList);

  for (const id of ["run", "split", "group", "correct", "pass", "passWhen", "disagree", "value", "other", "otherWhen", "sort"]) {
    $(id).addEventListener("change", apply);
  }
  $("field").addEventListener("change", () => { fillValues(); apply(); });
  let typing = null;
  $("search").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(apply, 150); });
  $("prev").addEventListener("click", () => { page -= 1; render(); });
  $("next").addEventListener("click", () => { page += 1; render(); });
  $("clear").addEventListener("click", () => { clearTimeout(typing); $("controls").reset(); fillValues(); apply(); });
  apply();
})();
