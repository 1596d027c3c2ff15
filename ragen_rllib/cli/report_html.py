"""report.html: the curves and a trajectory browser in one self-contained file.

The page loads nothing from the network. Its data sits in one
``<script type="application/json" id="ragen-data">`` block (``<``, ``>`` and
``&`` written as JSON escapes, so no text in it can close the block), and the
page's script puts every piece of model or env text into the page with
``textContent``, never as markup: an answer that holds HTML or script shows as
text. The browser filters by trial, iteration, env, group and success, lists
the matches a page at a time (so thousands of trajectories stay quick), and
shows a chosen trajectory turn by turn: the grid in monospace, the think text,
the answer, the reward and the advantage, coloured by sign and size.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path
from typing import Any

THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)
ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def split_answer(text: str) -> tuple[str, str]:
    """(think text, answer text) of a response; unparsable text is all "answer"."""
    think, answer = THINK.search(text), ANSWER.search(text)
    if think is None and answer is None:
        return "", text
    return (think.group(1).strip() if think else ""), (answer.group(1).strip() if answer else "")


def collect_trajectories(trial: Path, label: str, limit: int) -> list[dict[str, Any]]:
    """The trial's dumped trajectories for the browser (at most ``limit``, spread
    evenly over the dumps when there are more)."""
    folder = trial / "rollouts"
    if not folder.is_dir() or not any(folder.glob("iter_*.parquet")):
        return []
    from ragen_rllib.algorithms.starpo.rollout_dump import read_rollouts

    rows = read_rollouts(folder).to_pylist()
    by_traj: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in rows:
        by_traj.setdefault((row["iteration"], row["trajectory"]), []).append(row)
    keys = sorted(by_traj)
    if len(keys) > limit:
        step = len(keys) / limit
        keys = [keys[int(i * step)] for i in range(limit)]
    out = []
    for key in keys:
        turns = sorted(by_traj[key], key=lambda r: r["turn"])
        first = turns[0]
        out.append(
            {
                "trial": label,
                "iteration": first["iteration"],
                "env": first["env_id"],
                "group": first["group"],
                "seed": first["seed"],
                "success": bool(first["success"]),
                "reward": first["total_reward"],
                "end": first["end_reason"],
                "kept": bool(first["kept"]),
                "turns": [
                    [
                        t["observation"],
                        *split_answer(t["response"] or ""),
                        t["reward"],
                        t["advantage"],
                        t["valid"],
                    ]
                    for t in turns
                ],  # fmt: skip
            }
        )
    return out


def _finite(data: Any) -> Any:
    """``data`` with NaN and infinities as null (JSON has no spelling for them)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def embed_json(data: Any) -> str:
    """``data`` as JSON that is safe inside a script element."""
    text = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _summary(labels: list[str], results: list[list[dict]]) -> str:
    cells = []
    for label, rows in zip(labels, results, strict=True):
        last = rows[-1] if rows else {}
        rollout = last.get("rollout", {})
        ev = [r.get("evaluation", {}).get("success_rate") for r in rows]
        ev = [v for v in ev if isinstance(v, int | float) and v == v]
        warn = [r.get("collapse", {}).get("warning", 0) for r in rows]
        warn = [w for w in warn if isinstance(w, int | float) and w > 0]
        values = (
            label,
            last.get("training_iteration", ""),
            _fmt(rollout.get("success_rate")),
            _fmt(ev[-1] if ev else None),
            int(warn[0]) if warn else "none",
        )
        cells.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in values) + "</tr>")
    return "".join(cells)


#: The settings the report's table shows for each trial (its params.json).
SETTINGS = (
    "env", "llm", "advantage_estimator", "env_groups", "group_size", "max_turns",
    "max_new_tokens", "context_window", "prompt_style", "prefill", "lr",
    "filter_strategy", "filter_keep_ratio", "clip_low", "clip_high", "kl_coeff",
    "entropy_coeff", "lora_rank", "async_rollouts", "seed",
)  # fmt: skip


def _settings(labels: list[str], params: list[dict[str, Any]], most: int = 8) -> str:
    """A table of :data:`SETTINGS`: a row per setting, a column per trial (the first
    ``most``), every value escaped."""
    shown = list(zip(labels, params, strict=True))[:most]
    head = "<tr><th>setting</th>" + "".join(f"<th>{html.escape(lab)}</th>" for lab, _ in shown)
    rows = [head + "</tr>"]
    for key in SETTINGS:
        if all(key not in p for _, p in shown):
            continue
        cells = "".join(f"<td>{html.escape(json.dumps(p.get(key)))}</td>" for _, p in shown)
        rows.append(f"<tr><th>{html.escape(key)}</th>{cells}</tr>")
    return "".join(rows)


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) and value == value else "-"


def render_html(
    title: str,
    labels: list[str],
    results: list[list[dict]],
    png: bytes,
    trajectories: list[dict[str, Any]],
    params: list[dict[str, Any]] | None = None,
) -> str:
    data = embed_json({"trajectories": trajectories})
    image = base64.b64encode(png).decode("ascii")
    return (
        PAGE.replace("@@TITLE@@", html.escape(title))
        .replace("@@SUMMARY@@", _summary(labels, results))
        .replace("@@SETTINGS@@", _settings(labels, params or [{} for _ in labels]))
        .replace("@@IMAGE@@", image)
        .replace("@@COUNT@@", str(len(trajectories)))
        .replace("@@DATA@@", data)
    )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>ragen-rllib report: @@TITLE@@</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em} h2{font-size:1.1em;margin-top:1.4em}
table.sum td,table.sum th{padding:2px 10px;border-bottom:1px solid #ddd;text-align:left;
 overflow-wrap:anywhere}
select{max-width:22em}
img.curves{max-width:100%;border:1px solid #ddd}
#filters label{margin-right:1em} #filters select{margin-left:.3em}
#browser{display:flex;gap:1.2em;align-items:flex-start}
#listbox{flex:0 1 30em;max-width:40%;max-height:80vh;overflow:auto}
#detail{flex:1 1 0;min-width:20em}
#list{font-size:.9em;border-collapse:collapse}
#list td{padding:2px 8px;cursor:pointer;max-width:14em;overflow:hidden;text-overflow:ellipsis;
 white-space:nowrap}
#list tr:hover{background:#eef} #list tr.sel{background:#dde}
.turn{border:1px solid #ccc;margin:.5em 0;padding:.4em .6em;border-radius:4px}
pre{margin:.2em 0;white-space:pre-wrap;word-break:break-all}
pre.grid{font-family:ui-monospace,monospace;font-size:1.05em;background:#f6f6f6;padding:.3em}
.think{color:#555;font-style:italic} .answer{font-weight:600}
.adv{display:inline-block;padding:0 .4em;border-radius:3px;font-family:monospace}
.ok{color:#070} .bad{color:#a00}
</style></head><body>
<h1>ragen-rllib report: @@TITLE@@</h1>
<table class="sum"><tr><th>trial</th><th>iterations</th><th>train success (last)</th>
<th>eval success (last)</th><th>collapse warning</th></tr>@@SUMMARY@@</table>
<details><summary>Settings</summary><table class="sum">@@SETTINGS@@</table></details>
<h2>Curves</h2>
<img class="curves" alt="training curves" src="data:image/png;base64,@@IMAGE@@">
<h2>Trajectories (<span id="total">@@COUNT@@</span> dumped)</h2>
<div id="filters">
<label>trial<select id="f-trial"></select></label>
<label>iteration<select id="f-iteration"></select></label>
<label>env<select id="f-env"></select></label>
<label>group<select id="f-group"></select></label>
<label>success<select id="f-success"><option value="">all</option>
<option value="1">yes</option><option value="0">no</option></select></label>
</div>
<p id="matches"></p>
<div><button id="prev">&larr; previous</button> <span id="page"></span>
<button id="next">next &rarr;</button></div>
<div id="browser"><div id="listbox"><table id="list"></table></div>
<div id="detail"></div></div>
<script type="application/json" id="ragen-data">@@DATA@@</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("ragen-data").textContent);
const TRAJ = DATA.trajectories, PAGE = 50;
const FIELDS = ["trial", "iteration", "env", "group"];
let page = 0, chosen = null;
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}
function fillSelect(field) {
  const sel = document.getElementById("f-" + field);
  const values = [...new Set(TRAJ.map(t => t[field]))].sort((a, b) => a < b ? -1 : a > b ? 1 : 0);
  sel.appendChild(el("option", "all")).value = "";
  for (const v of values) sel.appendChild(el("option", v)).value = String(v);
  sel.addEventListener("change", () => { page = 0; render(); });
}
function matches() {
  const want = {};
  for (const f of FIELDS) want[f] = document.getElementById("f-" + f).value;
  const ok = document.getElementById("f-success").value;
  return TRAJ.filter(t => FIELDS.every(f => want[f] === "" || String(t[f]) === want[f])
    && (ok === "" || (t.success ? "1" : "0") === ok));
}
function num(x) { return x === null || x === undefined ? "-" : x.toFixed(3); }
function advStyle(a, scale) {
  if (a === null || a === undefined) return "background:#eee";
  const x = Math.min(1, Math.abs(a) / (scale || 1));
  const c = a >= 0 ? `rgba(0,150,0,${0.15 + 0.6 * x})` : `rgba(200,0,0,${0.15 + 0.6 * x})`;
  return "background:" + c;
}
function show(t) {
  chosen = t;
  const box = document.getElementById("detail");
  box.replaceChildren();
  box.appendChild(el("h3", `${t.env} seed ${t.seed} (iteration ${t.iteration}, group ${t.group})`));
  box.appendChild(el("p", `reward ${num(t.reward)}, success ${t.success}, ended: ${t.end}` +
    (t.kept ? "" : " (filtered out of the update)")));
  const scale = Math.max(1e-9, ...t.turns.map(u => Math.abs(u[4] || 0)));
  t.turns.forEach((u, i) => {
    const [obs, think, answer, reward, adv, valid] = u;
    const div = el("div", null, "turn");
    const head = el("div");
    head.appendChild(el("b", `turn ${i + 1}`));
    head.appendChild(el("span", `  reward ${num(reward)}  `));
    const a = el("span", adv === null ? "advantage: learner" : `advantage ${num(adv)}`, "adv");
    a.setAttribute("style", advStyle(adv, scale));
    head.appendChild(a);
    if (valid === false) head.appendChild(el("span", "  invalid action", "bad"));
    div.appendChild(head);
    div.appendChild(el("pre", obs, "grid"));
    if (think) div.appendChild(el("pre", think, "think"));
    div.appendChild(el("pre", answer, "answer"));
    box.appendChild(div);
  });
}
function render() {
  const found = matches();
  const pages = Math.max(1, Math.ceil(found.length / PAGE));
  page = Math.min(page, pages - 1);
  document.getElementById("matches").textContent = `${found.length} matching trajectories`;
  document.getElementById("page").textContent = `page ${page + 1} of ${pages}`;
  const table = document.getElementById("list");
  table.replaceChildren();
  const head = el("tr");
  for (const h of ["trial", "iteration", "env", "group", "seed", "turns", "reward", "success"])
    head.appendChild(el("th", h));
  table.appendChild(head);
  for (const t of found.slice(page * PAGE, (page + 1) * PAGE)) {
    const row = el("tr");
    for (const v of [t.trial, t.iteration, t.env, t.group, t.seed, t.turns.length,
                     num(t.reward), t.success ? "yes" : "no"]) {
      const cell = row.appendChild(el("td", v));
      cell.title = String(v);  // the whole text where a long name is cut short
    }
    row.lastChild.className = t.success ? "ok" : "bad";
    if (t === chosen) row.className = "sel";
    row.addEventListener("click", () => { show(t); render(); });
    table.appendChild(row);
  }
}
for (const f of FIELDS) fillSelect(f);
document.getElementById("f-success").addEventListener("change", () => { page = 0; render(); });
document.getElementById("prev").addEventListener("click", () => {
  page = Math.max(0, page - 1); render();
});
document.getElementById("next").addEventListener("click", () => { page += 1; render(); });
render();
if (TRAJ.length) show(matches()[0]);
render();
</script></body></html>
"""
