"""A tiny report builder: sections, paragraphs, tables and matplotlib figures.

``Report.write(dir)`` writes ``report.html`` (self-contained: PNGs embedded as data URIs, no scripts,
no external resources), ``report.md`` (figures saved under ``figures/``) and ``report.blocks.json`` (the blocks,
figures by file name) atomically, so a report can be rebuilt or combined later without re-running
anything (:func:`load_report`, :mod:`originlens.report.combine`).  When the directory is a run directory
(``config.json`` / ``environment.json`` present), a "Run record" section with the configuration, package
versions, seeds, data hashes and git commit is appended.  Every figure takes a one-sentence caption
saying what it shows.  Figures use a colour-blind-safe palette (Okabe–Ito) and the non-interactive Agg
backend, so reports build on headless machines.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..storage import atomic_write_bytes, atomic_write_json, atomic_write_text

REPORT_FORMAT = 1

# the page's element styles; "{S}" is the scope prefix (empty for report.html, the wrapper in a notebook)
_STYLE = "".join(
    "{S}" + rule
    for rule in (
        "table{border-collapse:collapse;margin:.5em 0}",
        "td,{S}th{border:1px solid #bbb;padding:2px 8px;text-align:left}",
        "th{background:#eee}",
        "figure{margin:1em 0}",
        "figcaption{color:#333;font-size:.9em}",
        "img{max-width:100%}",
        "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}",
    )
)

OKABE_ITO = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def setup_matplotlib():
    """Import pyplot with the Agg backend and the project's style; returns ``plt``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from cycler import cycler

    plt.rcParams.update(
        {
            "axes.prop_cycle": cycler(color=OKABE_ITO),
            "figure.dpi": 100,
            "savefig.dpi": 110,
            "font.size": 9,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "figure.constrained_layout.use": True,
        }
    )
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

    def section(self, title: str) -> Report:
        self.blocks.append(("h2", title))
        return self

    def text(self, text: str) -> Report:
        self.blocks.append(("p", text))
        return self

    def code(self, text: str) -> Report:
        self.blocks.append(("pre", text))
        return self

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "") -> Report:
        self.blocks.append(("table", (list(header), [list(r) for r in rows], caption)))
        return self

    def figure(self, fig_or_png: Any, caption: str, name: str | None = None) -> Report:
        png = fig_or_png if isinstance(fig_or_png, bytes) else savefig_png(fig_or_png)
        self._n_fig += 1
        self.blocks.append(("fig", (png, caption, name or f"figure-{self._n_fig:02d}.png")))
        return self

    def figure_row(self, items: Sequence[tuple[bytes, str, str]], caption: str) -> Report:
        """Several figures side by side: ``items`` = [(png, label, file name)], one caption for the row."""
        self.blocks.append(("figrow", ([(png, label, name) for png, label, name in items], caption)))
        return self

    # -- rendering ----------------------------------------------------------------------------
    def to_html(self, extra: Sequence[tuple[str, Any]] = ()) -> str:
        e = html.escape
        parts = [
            f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{e(self.title)}</title>",
            "<style>body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;"
            "color:#111}" + _STYLE.replace("{S}", "") + "</style></head><body>",
            *self._body(extra),
            "</body></html>",
        ]
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        """The report inline in a Jupyter notebook: the page's body in a ``div``, its styles scoped to it."""
        scoped = _STYLE.replace("{S}", ".originlens-report ")
        return "\n".join(["<div class='originlens-report'>", f"<style>{scoped}</style>", *self._body(), "</div>"])

    def __repr__(self) -> str:
        return f"Report({self.title!r}, {len(self.blocks)} blocks)"

    def _body(self, extra: Sequence[tuple[str, Any]] = ()) -> list[str]:
        e = html.escape
        parts = [f"<h1>{e(self.title)}</h1>"]
        for kind, val in [*self.blocks, *extra]:
            if kind == "h2":
                parts.append(f"<h2>{e(val)}</h2>")
            elif kind == "h3":
                parts.append(f"<h3>{e(val)}</h3>")
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
                parts.append(
                    f"<figure><img alt='{e(caption)}' src='data:image/png;base64,{b64}'>"
                    f"<figcaption>{e(caption)}</figcaption></figure>"
                )
            elif kind == "figrow":
                items, caption = val
                cells = "".join(
                    f"<div style='flex:1;min-width:0'><img alt='{e(label)}' "
                    f"src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>"
                    f"<div style='font-size:.85em;text-align:center'>{e(label)}</div></div>"
                    for png, label, _ in items
                )
                parts.append(
                    f"<figure><div style='display:flex;gap:.5em'>{cells}</div>"
                    f"<figcaption>{e(caption)}</figcaption></figure>"
                )
        return parts

    def to_markdown(self, extra: Sequence[tuple[str, Any]] = ()) -> str:
        out = [f"# {self.title}", ""]
        for kind, val in [*self.blocks, *extra]:
            if kind == "h2":
                out += [f"## {val}", ""]
            elif kind == "h3":
                out += [f"### {val}", ""]
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
            elif kind == "figrow":
                items, caption = val
                out += [" ".join(f"![{label}](figures/{name})" for _, label, name in items), "", f"*{caption}*", ""]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        """The blocks as JSON (figures by file name under ``figures/``)."""
        blocks: list[dict[str, Any]] = []
        for kind, val in self.blocks:
            if kind == "fig":
                _, caption, name = val
                blocks.append({"kind": kind, "caption": caption, "name": name})
            elif kind == "figrow":
                items, caption = val
                blocks.append(
                    {
                        "kind": kind,
                        "caption": caption,
                        "items": [{"label": label, "name": name} for _, label, name in items],
                    }
                )
            elif kind == "table":
                header, rows, caption = val
                blocks.append(
                    {
                        "kind": kind,
                        "header": header,
                        "rows": [[jsonable(c) for c in r] for r in rows],
                        "caption": caption,
                    }
                )
            else:
                blocks.append({"kind": kind, "value": val})
        return {"format": REPORT_FORMAT, "title": self.title, "blocks": blocks}

    def write(self, directory: str | Path, *, run_record: bool = True) -> Path:
        """Write report.html, report.md, report.blocks.json and figures/; returns the HTML path.

        With ``run_record`` and a run directory (config.json / environment.json), the run record is
        appended to the rendered report (not to ``report.blocks.json``, so rebuilding does not duplicate it).
        """
        d = Path(directory)
        for kind, val in self.blocks:
            if kind == "fig":
                png, _, name = val
                atomic_write_bytes(d / "figures" / name, png)
            elif kind == "figrow":
                for png, _, name in val[0]:
                    atomic_write_bytes(d / "figures" / name, png)
        extra = run_record_blocks(d) if run_record else []
        atomic_write_json(d / "report.blocks.json", self.to_json())
        atomic_write_text(d / "report.md", self.to_markdown(extra))
        return atomic_write_text(d / "report.html", self.to_html(extra))


def jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    try:
        import numpy as np

        if isinstance(v, np.generic):
            return v.item()
    except ImportError:  # pragma: no cover
        pass
    return str(v)


def read_report_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def run_record_blocks(directory: str | Path) -> list[tuple[str, Any]]:
    """Blocks describing the run in ``directory``: config, versions, seeds, data hashes, git commit."""
    d = Path(directory)
    config, env = read_report_json(d / "config.json"), read_report_json(d / "environment.json")
    if config is None and env is None:
        return []
    blocks: list[tuple[str, Any]] = [("h2", "Run record")]
    if isinstance(config, dict):
        rows = [[k, json.dumps(v) if isinstance(v, (list, dict)) else jsonable(v)] for k, v in flatten(config).items()]
        blocks.append(("table", (["config key", "value"], rows, "Configuration of this run (config.json).")))
    if isinstance(env, dict):
        versions = env.get("versions") or {}
        blocks.append(
            (
                "table",
                (["package", "version"], [[k, v] for k, v in versions.items()], "Package versions (environment.json)."),
            )
        )
        facts = [
            ["git commit", env.get("git_commit") or "unknown"],
            ["started", env.get("time", "")],
            ["command", " ".join(map(str, env.get("argv") or []))],
        ]
        facts += [[f"seed: {k}", v] for k, v in (env.get("seeds") or {}).items()]
        facts += [[f"data: {k}", v] for k, v in (env.get("data_hashes") or {}).items()]
        blocks.append(
            ("table", (["fact", "value"], facts, "Provenance: commit, command, seeds and sha256 of every input file."))
        )
    return blocks


def load_report(directory: str | Path) -> Report:
    """Rebuild the :class:`Report` saved in ``directory`` (``report.blocks.json`` + ``figures/``)."""
    d = Path(directory)
    data = read_report_json(d / "report.blocks.json")
    if not isinstance(data, dict) or "blocks" not in data:
        raise InputError(
            f"{d} has no readable report.blocks.json",
            "pass a run directory written by originlens (re-run the command that made it)",
        )
    if data.get("format", 0) > REPORT_FORMAT:
        raise InputError(
            f"{d}/report.blocks.json has format {data.get('format')}, newer than this originlens ({REPORT_FORMAT})",
            "upgrade originlens",
        )

    def png(name: str) -> bytes:
        p = d / "figures" / name
        try:
            return p.read_bytes()
        except OSError:
            raise InputError(f"figure {p} of the report is missing", "re-run the command that made the run") from None

    rep = Report(str(data.get("title", d.name)))
    for b in data["blocks"]:
        kind = b.get("kind")
        if kind == "fig":
            rep.blocks.append(("fig", (png(b["name"]), b["caption"], b["name"])))
        elif kind == "figrow":
            rep.blocks.append(("figrow", ([(png(i["name"]), i["label"], i["name"]) for i in b["items"]], b["caption"])))
        elif kind == "table":
            rep.blocks.append(("table", (b["header"], b["rows"], b.get("caption", ""))))
        elif kind in ("h2", "h3", "p", "pre"):
            rep.blocks.append((kind, b["value"]))
    rep._n_fig = sum(1 for k, _ in rep.blocks if k == "fig")
    return rep
