"""Human-readable reports: self-contained HTML (figures embedded) plus a Markdown twin."""
from .html import Report, savefig_png, setup_matplotlib

__all__ = ["Report", "savefig_png", "setup_matplotlib"]
