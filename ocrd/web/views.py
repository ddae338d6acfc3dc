"""Journal rows and sidecars as the console shows them (the pages and the JSON API
share these): states in the user's words, readable names, a document's pages in review
order."""

from __future__ import annotations

from dataclasses import dataclass

from ocrd.names import printable, shown
from ocrd.outputs.records import local_time
from ocrd.web.render import split_pages, to_html
from ocrd.web.search import highlight_html
from ocrd.work.journal import Job

STATE_WORDS = {
    "claiming": "queued", "claimed": "queued", "converting": "converting",
    "finishing": "converting", "failed": "failed", "retried": "retried",
    "dismissed": "dismissed",
}

# Failures a second try of the same file can end differently (the engine, the outbox,
# a crashed worker); for every other reason the same bytes fail the same way, and a
# retry helps only once the person has changed something (the file, or a limit).
RETRY_HELPS = frozenset({"engine_failed", "output_failed", "render_failed",
                         "too_many_attempts", "internal_error", "not_claimed", "error"})
CAUSE = {
    "encrypted": "remove the password (e.g. qpdf --decrypt) and drop the new file",
    "empty": "the file has no bytes: drop a complete copy",
    "truncated": "the file is cut short: drop a complete copy",
    "damaged": "the file is damaged: drop a repaired copy",
    "unsupported_format": "ocrd reads PDFs and images only",
    "not_a_regular_file": "put the document itself into the inbox, not a link",
    "too_many_pages": "raise limits.max_pages first",
    "too_large": "raise limits.max_file_bytes first",
    "unreadable": "give ocrd permission to read it first",
}


def retry_helps(reason: str | None) -> bool:
    return reason in RETRY_HELPS


def state_of(job: Job) -> str:
    """queued, converting, done, degraded, failed, retried or dismissed."""
    if job.state == "done":
        return "degraded" if (job.degraded or 0) > 0 else "done"
    return STATE_WORDS.get(job.state, job.state)


def job_facts(job: Job) -> dict:
    """One row as JSON-ready facts (names valid UTF-8 with control characters escaped,
    see ocrd/names.py)."""
    return {
        "id": job.id,
        "file": printable(job.relpath),
        "name": printable(job.relpath.rpartition("/")[2]),
        "inbox": shown(job.inbox),
        "state": state_of(job),
        "journal_state": job.state,
        "size": job.size,
        "pages": job.pages,
        "degraded_pages": job.degraded,
        "attempts": job.attempts,
        "reason": job.reason,
        "message": printable(job.message) if job.message else job.message,
        "retry_helps": retry_helps(job.reason) if job.state == "failed" else None,
        "cause": CAUSE.get(job.reason or "") if job.state == "failed" else None,
        "output": printable(job.output) if job.output else None,
        "created": job.created,
        "started": job.started,
        "finished": job.finished,
    }


def when(t: float | None) -> str:
    """A moment in the server's time zone, the zone named: 2026-12-01 22:59:03 CET."""
    return local_time(t)


def duration(seconds: float | None) -> str:
    """Seconds for a person: 0.42 s, 2.5 s, 42 s, 3 min 20 s, 2 h 05 min."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


# How the page stopped, where that is worth a look (a page that ends normally says "stop").
FINISH_WORDS = {"length": "cut at the length limit", "abort": "aborted"}


def page_facts_text(facts: dict, engine_kind: str | None) -> str:
    """One line about a page in the engine's own words: tesseract reads words, a model
    generates tokens and says why it stopped."""
    parts = []
    count = facts.get("tokens")
    if isinstance(count, int):
        unit = "word" if engine_kind == "tesseract" else "token"
        parts.append(f"{count} {unit}{'s' * (count != 1)}")
    attempts = facts.get("attempts")
    if isinstance(attempts, int) and attempts > 1:
        parts.append(f"{attempts} attempts")
    reason = facts.get("finish_reason")
    if engine_kind != "tesseract" and reason and reason != "stop":
        parts.append(FINISH_WORDS.get(str(reason), f"stopped: {reason}"))
    seconds = facts.get("engine_seconds")
    if isinstance(seconds, int | float):
        parts.append(duration(seconds))
    return " · ".join(parts)


def eta_text(seconds: float | None) -> str:
    """About how long: "about 40 s", "about 3 min"."""
    if seconds is None:
        return ""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 5400:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"


def size_text(n: int | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


@dataclass
class ReviewPage:
    page: int
    status: str  # ok | blank | degraded
    why: str  # for a person: "degraded: length", "empty output" …
    html: str
    facts: dict  # the sidecar's entry for the page
    figures: list[str]
    rotation: int | None = None  # degrees clockwise the page was turned to be read
    hits: int = 0  # search hits marked on the page


def review_pages(markdown: str, meta: dict | None, job_id: int,
                 terms: tuple[str, ...] = ()) -> list[ReviewPage]:
    """The document's pages, degraded and blank ones first (they need a look), each
    with its Markdown as clean HTML and the sidecar's facts."""
    facts = {p.get("page"): p for p in (meta or {}).get("pages", []) if isinstance(p, dict)}
    assets = ((meta or {}).get("outputs") or {}).get("assets")
    out = []
    for text in split_pages(markdown):
        info = facts.get(text.page, {})
        status = str(info.get("status") or ("blank" if text.note == "blank" else
                                              "degraded" if text.note.startswith("degraded")
                                              else "ok"))
        why = ""
        if status == "degraded":
            why = f"degraded: {info.get('degraded') or text.note.partition(': ')[2] or '?'}"
        elif status == "blank":
            why = "blank: the engine returned no text for this page"
        if info.get("malformed_output"):
            why = (why + "; " if why else "") + "the model's tags were cut or broken"
        page_html = to_html(text.markdown, assets, f"/files/{job_id}/assets")
        if terms:
            page_html = highlight_html(page_html, terms)
        rotation = info.get("rotation")
        out.append(ReviewPage(
            page=text.page, status=status, why=why, html=page_html,
            facts={k: v for k, v in info.items() if k not in ("figures",)},
            figures=list(info.get("figures") or []),
            rotation=rotation if isinstance(rotation, int) and rotation % 360 else None,
            hits=page_html.count("<mark>")))
    rank = {"degraded": 0, "blank": 1}
    if terms:  # pages with hits first, then as usual
        out.sort(key=lambda p: (p.hits == 0, rank.get(p.status, 2), p.page))
    else:
        out.sort(key=lambda p: (rank.get(p.status, 2), p.page))
    return out
