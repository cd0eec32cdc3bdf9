"""Human-readable reports: self-contained HTML (figures embedded) plus a Markdown twin, rebuildable and
combinable across runs."""

from .combine import combine_reports, rebuild_report
from .html import Report, load_report, run_record_blocks, savefig_png, setup_matplotlib

__all__ = [
    "Report",
    "combine_reports",
    "load_report",
    "rebuild_report",
    "run_record_blocks",
    "savefig_png",
    "setup_matplotlib",
]
