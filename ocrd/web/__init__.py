"""The web console: what ocrd did, every page next to its Markdown, retry what failed —
and the same as a JSON API. Served by the daemon on `web.listen` (ocrd/web/server.py)."""

from ocrd.web.server import Console

__all__ = ["Console"]
