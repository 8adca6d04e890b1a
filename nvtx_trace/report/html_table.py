"""HTML pieces every section uses: escaping, a value with its unit, a capped table."""

from __future__ import annotations

import html as _html

import numpy as np
import pandas as pd

from nvtx_trace.units import ms, pct, size

TABLE_ROWS = 25


def esc(x) -> str:
    return _html.escape(str(x), quote=True)


def fmt(key: str, v) -> str:
    if isinstance(v, bool) or v is None:
        return esc(v)
    if isinstance(v, (int, float)):
        if key in ("pid", "worker", "step", "device_id", "tid"):  # identifiers, not quantities: no separators
            return esc(str(int(v)))
        if key.endswith("_ns") or "_ns_" in key:  # fetch_ns_median too: every time carries its unit
            return esc(ms(v))
        if key.endswith(("fraction", "share", "utilization")):
            return esc(pct(v))
        if key.endswith("bytes"):
            return esc(size(v))
        if isinstance(v, float):
            return esc(f"{v:.3g}")
        return esc(f"{v:,}")
    return esc(v)


def source_line(where: str, folder: str | None) -> str:
    """``file:line`` of the user's code as a link that opens the file (named from ``folder``, the folder the program
    ran in, where the report recorded it), else as text."""
    path, _, line = str(where).rpartition(":")
    if not path or not line.isdigit():
        return esc(where)
    # a redacted report's folder is a basename: no link to guess
    full = path if path.startswith("/") else (f"{folder.rstrip('/')}/{path}" if folder and folder.startswith("/")
                                              else None)
    if full is None:
        return f"<code>{esc(where)}</code>"
    from urllib.parse import quote

    return f"<a class='src' href='file://{esc(quote(full))}' title='{esc(full)}:{esc(line)}'><code>{esc(where)}</code></a>"


def table(df: pd.DataFrame | None, title: str, cols: dict[str, str], explain: str = "",
          folder: str | None = None) -> str:
    """A capped table; a ``where`` column (a line of the user's code) is a link to its file."""
    if df is None or not len(df):
        return ""
    cut = df.head(TABLE_ROWS)
    head = "".join(f"<th>{esc(label)}</th>" for label in cols.values())
    rows = []
    for r in cut.to_dict(orient="records"):
        cells = []
        for c in cols:
            v = r.get(c)
            if isinstance(v, np.generic):
                v = v.item()
            numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
            shown = source_line(v, folder) if c == "where" and isinstance(v, str) else fmt(c, v)
            cells.append(f"<td class='{'r' if numeric else 'name'}'>{shown}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p class='muted'>Top {TABLE_ROWS} of {len(df):,} rows; all are in the JSON output.</p>" \
        if len(df) > TABLE_ROWS else ""
    return (f"<h3>{esc(title)}</h3>" + (f"<p class='muted'>{esc(explain)}</p>" if explain else "")
            + f"<table class='data'><tr>{head}</tr>{''.join(rows)}</table>{more}")
