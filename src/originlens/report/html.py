"""A tiny report builder: sections, paragraphs, tables and matplotlib figures.

``Report.write(dir)`` writes ``report.html`` (self-contained: PNGs embedded as data URIs, no scripts,
no external resources) and ``report.md`` (figures saved under ``figures/``), atomically.  Every figure
takes a one-sentence caption saying what it shows.  Figures use a colour-blind-safe palette (Okabe–Ito)
and the non-interactive Agg backend, so reports build on headless machines.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Sequence

from ..storage import atomic_write_bytes, atomic_write_text

OKABE_ITO = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def setup_matplotlib():
    """Import pyplot with the Agg backend and the project's style; returns ``plt``."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from cycler import cycler
    plt.rcParams.update({"axes.prop_cycle": cycler(color=OKABE_ITO), "figure.dpi": 100,
                         "savefig.dpi": 110, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
                         "figure.constrained_layout.use": True})
    return plt


def savefig_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return buf.getvalue()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


class Report:
    """Accumulates blocks and writes HTML + Markdown."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.blocks: list[tuple[str, Any]] = []
        self._n_fig = 0

    def section(self, title: str) -> "Report":
        self.blocks.append(("h2", title))
        return self

    def text(self, text: str) -> "Report":
        self.blocks.append(("p", text))
        return self

    def code(self, text: str) -> "Report":
        self.blocks.append(("pre", text))
        return self

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "") -> "Report":
        self.blocks.append(("table", (list(header), [list(r) for r in rows], caption)))
        return self

    def figure(self, fig_or_png: Any, caption: str, name: str | None = None) -> "Report":
        png = fig_or_png if isinstance(fig_or_png, bytes) else savefig_png(fig_or_png)
        self._n_fig += 1
        self.blocks.append(("fig", (png, caption, name or f"figure-{self._n_fig:02d}.png")))
        return self

    # -- rendering ----------------------------------------------------------------------------
    def to_html(self) -> str:
        e = html.escape
        parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{e(self.title)}</title>",
                 "<style>body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;"
                 "color:#111}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;"
                 "padding:2px 8px;text-align:left}th{background:#eee}figure{margin:1em 0}figcaption{color:#333;"
                 "font-size:.9em}img{max-width:100%}pre{background:#f4f4f4;padding:.5em;overflow-x:auto}</style>"
                 "</head><body>", f"<h1>{e(self.title)}</h1>"]
        for kind, val in self.blocks:
            if kind == "h2":
                parts.append(f"<h2>{e(val)}</h2>")
            elif kind == "p":
                parts.append(f"<p>{e(val)}</p>")
            elif kind == "pre":
                parts.append(f"<pre>{e(val)}</pre>")
            elif kind == "table":
                header, rows, caption = val
                t = ["<table>"]
                if caption:
                    t.append(f"<caption>{e(caption)}</caption>")
                t.append("<tr>" + "".join(f"<th>{e(str(h))}</th>" for h in header) + "</tr>")
                for r in rows:
                    t.append("<tr>" + "".join(f"<td>{e(_fmt(c))}</td>" for c in r) + "</tr>")
                t.append("</table>")
                parts.append("".join(t))
            elif kind == "fig":
                png, caption, name = val
                b64 = base64.b64encode(png).decode("ascii")
                parts.append(f"<figure><img alt='{e(caption)}' src='data:image/png;base64,{b64}'>"
                             f"<figcaption>{e(caption)}</figcaption></figure>")
        parts.append("</body></html>")
        return "\n".join(parts)

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, val in self.blocks:
            if kind == "h2":
                out += [f"## {val}", ""]
            elif kind == "p":
                out += [val, ""]
            elif kind == "pre":
                out += ["```", val, "```", ""]
            elif kind == "table":
                header, rows, caption = val
                if caption:
                    out += [f"*{caption}*", ""]
                out.append("| " + " | ".join(str(h) for h in header) + " |")
                out.append("|" + "---|" * len(header))
                for r in rows:
                    out.append("| " + " | ".join(_fmt(c).replace("|", "\\|") for c in r) + " |")
                out.append("")
            elif kind == "fig":
                _, caption, name = val
                out += [f"![{caption}](figures/{name})", "", f"*{caption}*", ""]
        return "\n".join(out)

    def write(self, directory: str | Path) -> Path:
        """Write report.html, report.md and figures/; returns the HTML path."""
        d = Path(directory)
        for kind, val in self.blocks:
            if kind == "fig":
                png, _, name = val
                atomic_write_bytes(d / "figures" / name, png)
        atomic_write_text(d / "report.md", self.to_markdown())
        return atomic_write_text(d / "report.html", self.to_html())
