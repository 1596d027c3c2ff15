"""Every figure in docs/curves/ has the rows it was drawn from beside it
(``X.png`` -> ``X.rows.jsonl.gz``), but for those docs/curves/README.md lists as not
kept, each with the run that makes both. The list is kept exact, so it only shrinks."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

CURVES = Path(__file__).resolve().parents[1] / "docs" / "curves"
SUFFIX = ".rows.jsonl.gz"
HEADING = "## Figures whose rows were not kept"


def not_kept() -> dict[str, str]:
    """{figure: the run it came from} of the README's table of figures without rows."""
    text = (CURVES / "README.md").read_text()
    assert HEADING in text, f"docs/curves/README.md has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    listed: dict[str, str] = {}
    for line in section.splitlines():
        row = re.match(r"\| `([^`]+\.png)` \| [^|]+ \| (.+) \|$", line)
        if row:
            assert row.group(1) not in listed, f"{row.group(1)} is listed twice"
            listed[row.group(1)] = row.group(2)
    return listed


def test_every_figure_has_its_rows_or_is_listed_as_not_kept():
    figures = sorted(p.name for p in CURVES.glob("*.png"))
    listed = not_kept()
    missing = [f for f in figures if not (CURVES / (f[:-4] + SUFFIX)).is_file()]
    unlisted = [f for f in missing if f not in listed]
    assert not unlisted, (
        f"docs/curves: {unlisted} have no rows file beside them (X.png -> X{SUFFIX}); "
        "copy the rows the figure tool wrote beside it"
    )
    gained = [f for f in listed if f in figures and f not in missing]
    assert not gained, f"{gained} have their rows now: take them off docs/curves/README.md"
    gone = [f for f in listed if f not in figures]
    assert not gone, f"{gone} are listed in docs/curves/README.md but not in docs/curves/"
    assert all(run.strip() for run in listed.values())  # each names the run that makes it


def test_every_rows_file_is_gzipped_json_rows_beside_its_figure():
    for rows in sorted(CURVES.glob(f"*{SUFFIX}")):
        png = rows.with_name(rows.name[: -len(SUFFIX)] + ".png")
        assert png.is_file(), f"{rows.name} has no figure beside it ({png.name})"
        lines = gzip.decompress(rows.read_bytes()).decode("utf-8").splitlines()
        assert lines, f"{rows.name} holds no rows"
        assert all(isinstance(json.loads(line), dict) for line in lines), rows.name
