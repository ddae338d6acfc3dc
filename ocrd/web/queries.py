"""What the console's pages and its JSON API both ask for: the files waiting in the
inboxes, full-text search results with their files' facts, the states the Files page
filters by."""

from __future__ import annotations

import sqlite3
from urllib.parse import urlencode

from ocrd.live import Live
from ocrd.web.context import Context
from ocrd.web.search import Query
from ocrd.web.views import job_facts
from ocrd.work.journal import FILTER_STATES

# what the Files page filters by: the journal's states, and files not yet claimed
LIST_STATES = ["waiting", *FILTER_STATES]


def waiting_list(live: Live | None) -> list[dict]:
    """Files seen in the inboxes and not yet claimed, with their inbox."""
    if live is None:
        return []
    return [{"inbox": box.path, **f.__dict__} for box in live.inboxes for f in box.files]


def search_results(ctx: Context, text: str, limit: int, offset: int
                   ) -> tuple[list[dict], int, str | None]:
    """(hits with their file's facts, total, a sentence when nothing could be asked)."""
    if not ctx.cfg.web.search:
        return [], 0, "Search is turned off (web.search: false)."
    query = Query.parse(text)
    if not query.match:
        return [], 0, "Type one or more words to find." if text else None
    try:
        found = ctx.store.search(query, limit, offset)
    except sqlite3.DatabaseError:  # damaged: the indexer removes and rebuilds it
        return [], 0, "The search index is being rebuilt; try again in a while."
    if found is None:
        return [], 0, "The search index is being built; try again in a moment."
    hits, total = found
    jobs = ctx.store.journal().names_of(sorted({h.job_id for h in hits}))
    out = []
    for hit in hits:
        job = jobs.get(hit.job_id)
        if job is None:
            continue
        out.append({"file": job_facts(job), "page": hit.page, "snippet": hit.snippet,
                    "review": f"/files/{job.id}?{urlencode({'q': text})}#page-{hit.page}"})
    return out, total, None
