"""The one shell of the self-contained HTML reports the CLI writes (``eval --html``, ``policy
replay --html``): inline CSS, images as ``data:`` URIs, no script, and a Content-Security-Policy
that allows nothing else, so a report opened from disk fetches nothing. Every value that came from
a tenant or a server (rule names, ids, samples) goes through :func:`escape`."""

from __future__ import annotations

import base64
import html
from typing import Any

STYLE = """body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
code { font-size: 12px; }
pre { background: #f8f8f8; padding: 8px; overflow-x: auto; }
.note { background: #fff8e1; padding: 8px; }"""


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def png_img(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def page(title: str, body: str) -> str:
    """A whole page: ``title`` escaped here, ``body`` already HTML (its values escaped by the caller)."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>{escape(title)}</title>
<style>
{STYLE}
</style></head><body>
{body}
</body></html>
"""
