"""Who owns the `ocrd` import package: this program's distribution, alone.

OCR-D's framework is published as `ocrd` too, with an `ocrd` package and command of its
own; pip installs both into one environment without a word, file over file, and the
result is neither program. ocrd checks its environment's metadata before it starts.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "ocr-inbox-daemon"
PACKAGE = "ocrd"
# The summary this program's distribution had while it was called `ocrd` (0.1.0).
OLD_SUMMARY = "OCR daemon: watched inbox folders"


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _owns_package(dist: metadata.Distribution) -> bool:
    """Whether `dist` installed files into the `ocrd/` package (its RECORD), or declares
    `ocrd` as a top-level name (top_level.txt of an egg or editable install)."""
    top = dist.read_text("top_level.txt")
    if top is not None and PACKAGE in top.split():
        return True
    # The RECORD as text: torch's lists 15,000 files, too many to parse at every start.
    record = dist.read_text("RECORD") or ""
    prefix = PACKAGE + "/"
    return record.startswith(prefix) or "\n" + prefix in record


def other_owners(path: list[str] | None = None) -> list[str]:
    """`name version (summary)` of every distribution on `path` (sys.path by default),
    other than ocrd's own, that owns the `ocrd` import package."""
    found = []
    for dist in metadata.distributions(**({"path": path} if path is not None else {})):
        if not _owns_package(dist):  # first: reading every METADATA costs more
            continue
        name = dist.metadata["Name"] or ""
        if _normal(name) == DISTRIBUTION:
            continue
        summary = dist.metadata["Summary"] or "no summary"
        found.append(f"{name} {dist.version} ({summary})")
    return sorted(set(found))


def refusal(path: list[str] | None = None) -> str | None:
    """Why ocrd must not start in this environment, or None."""
    others = other_owners(path)
    if not others:
        return None
    if all(o.startswith("ocrd 0.") and OLD_SUMMARY in o for o in others):
        return ("this program is also installed here under its old distribution name "
                f"'ocrd': remove that with `pip uninstall ocrd`, then reinstall with "
                f"`pip install --force-reinstall {DISTRIBUTION}` (or from its folder)")
    return (f"the Python package 'ocrd' in this environment also belongs to "
            f"{', '.join(others)}: its files and ours overwrite each other, so neither "
            f"works. Install ocrd ({DISTRIBUTION}) into a virtual environment of its own, "
            f"e.g. python3 -m venv /opt/ocrd && /opt/ocrd/bin/pip install {DISTRIBUTION}")
