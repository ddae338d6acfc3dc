"""The corpus run of `python -m bench.corpus --batch` (and its `--select` / `--fetch`):
a few hundred real files nobody here chose, through one `ocrd convert` call and
through the daemon, beside OCRmyPDF on the same files.

What it checks (the promises, not speed): `ocrd convert` ends with a documented exit
code and no traceback, with exactly one outcome line per file and a summary that counts
them; the daemon stays up, logs no check_failed or internal_error, and gives every file
exactly one outcome (its Markdown in the outbox, or the file in failed/ with a reason);
convert and daemon agree file by file. What it measures: outcomes by reason for ocrd and
OCRmyPDF, word recall against the truth (pdftotext of born-digital PDFs) for both, and
for files without a truth the share of OCRmyPDF's words that ocrd found. Times are
printed but are no comparison: OCRmyPDF runs file by file after ocrd, not interleaved.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.corpus import ground_truth, recall, timed, words

PDF = (".pdf",)
IMAGES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp", ".bmp", ".ppm", ".pgm",
          ".pbm", ".jp2")

# (source, repository, folder in it, kinds, bytes at most, how many; the PDFs: 3 pages at
# most, or unreadable by pdfinfo). Within a source, files are taken evenly spaced by
# path among those that qualify (identical contents once), so the choice is fixed by
# the rules and the commit, not by anyone's taste.
SOURCES = [
    ("pdfjs", "mozilla/pdf.js", "test/pdfs/", PDF, 1_500_000, 130),
    ("pdfium", "chromium/pdfium", "testing/resources/", PDF, 1_000_000, 60),
    ("qpdf", "qpdf/qpdf", "", PDF, 1_000_000, 30),
    ("pillow", "python-pillow/Pillow", "Tests/images/", IMAGES, 2_000_000, 60),
    ("tesseract", "tesseract-ocr/test", "testing/", IMAGES, 2_000_000, 40),
    ("paperless", "paperless-ngx/paperless-ngx", "src/", PDF + IMAGES, 3_000_000, 50),
]
MAX_PAGES = 3
# OCRmyPDF's exit codes (ocrmypdf.exceptions.ExitCode), for its outcomes
OM_EXIT = {0: "ok", 1: "bad_args", 2: "input_file", 3: "missing_dependency",
           4: "invalid_output_pdf", 5: "file_access_error", 6: "already_done_ocr",
           7: "child_process_error", 8: "encrypted_pdf", 9: "invalid_config",
           10: "pdfa_conversion_failed", 15: "other_error", 130: "interrupted"}
OCRD_EXIT = {0, 1, 3, 4, 5, 6, 7}
OM_TIMEOUT = 600  # seconds for one file (one page takes seconds): stopped as "hung"
_PROGRESS = re.compile(r"^\d+/\d+ (.+?): (?:ok → (\S+) \(|FAILED \[(\w+)\] (.*))")


# -- the list of files ------------------------------------------------------------------


def git_dir(mirrors: Path, repo: str) -> Path:
    base = mirrors / repo.replace("/", "+")
    for cand in (base / "repo", base, mirrors / repo):
        if cand.exists():
            return cand
    raise SystemExit(f"no clone of {repo} under {mirrors}")


def git(gd: Path, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={gd}" if (gd / "HEAD").exists() else
                           f"--git-dir={gd / '.git'}", *args], check=True,
                          capture_output=True).stdout


def _pages(data: bytes) -> int | None:
    """pdfinfo's page count; None when it cannot read the file."""
    with tempfile.NamedTemporaryFile(suffix=".pdf") as f:
        f.write(data)
        f.flush()
        r = subprocess.run(["pdfinfo", f.name], capture_output=True, timeout=60)
    m = re.search(rb"^Pages:\s+(\d+)", r.stdout, re.MULTILINE)
    return int(m.group(1)) if r.returncode == 0 and m else None


def select(mirrors: Path) -> list[str]:
    lines = ["# bench/corpus_sources.txt: the corpus of `python -m bench.corpus --batch`,",
             "# made by `python -m bench.corpus --select --mirrors DIR` (rules: SOURCES in",
             "# bench/corpus_batch.py). source repository commit path sha256"]
    for source, repo, folder, kinds, max_bytes, count in SOURCES:
        gd = git_dir(mirrors, repo)
        commit = git(gd, "rev-parse", "HEAD").decode().strip()
        seen, eligible = set(), []
        listing = git(gd, "ls-tree", "-r", "-l", commit, "--", folder or ".").decode()
        for row in sorted(listing.splitlines(), key=lambda r: r.split("\t", 1)[1]):
            meta, path = row.split("\t", 1)
            _mode, kind, blob, size = meta.split()
            if kind != "blob" or not size.isdigit() or not path.lower().endswith(kinds) \
                    or int(size) > max_bytes or blob in seen:
                continue
            if source == "paperless" and "/tests/samples/" not in path:
                continue
            seen.add(blob)
            eligible.append((path, blob))
        picked = _evenly(eligible, count, gd) if kinds != IMAGES else \
            _spread(eligible, count)
        for path, blob in picked:
            data = git(gd, "cat-file", "blob", blob)
            lines.append(f"{source} {repo} {commit} {path} "
                         f"{hashlib.sha256(data).hexdigest()}")
    return lines


def _spread(items: list, count: int) -> list:
    if len(items) <= count:
        return items
    return [items[i * len(items) // count] for i in range(count)]


def _evenly(items: list[tuple[str, str]], count: int, gd: Path) -> list[tuple[str, str]]:
    """Evenly spaced PDFs of MAX_PAGES pages at most (or unreadable), `count` of them."""
    picked: list[tuple[str, str]] = []
    step = max(1.0, len(items) / count)
    i = 0.0
    while len(picked) < count and int(i) < len(items):
        for j in range(int(i), min(len(items), int(i + step))):  # the first that fits
            path, blob = items[j]
            pages = _pages(git(gd, "cat-file", "blob", blob))
            if pages is None or pages <= MAX_PAGES:
                picked.append(items[j])
                break
        i += step
    return picked


def fetch(listing: Path, mirrors: Path, folder: Path) -> int:
    n = 0
    for line in listing.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        source, repo, commit, path, sha = line.split(" ", 4)
        data = git(git_dir(mirrors, repo), "show", f"{commit}:{path}")
        if hashlib.sha256(data).hexdigest() != sha:
            raise SystemExit(f"{repo} {path}: not the listed file")
        dest = folder / source / path.replace("/", "__")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        n += 1
    return n


# -- the run ------------------------------------------------------------------------------


@dataclass
class Row:
    path: str  # relative to the corpus folder
    source: str
    truth: str = "none"
    convert: str = ""  # "ok" or the failure reason
    facts: str = ""  # from the sidecar: pages blank, degraded, turned; repaired; PDF rebuilt
    base: str = ""  # --baseline: its outcome, facts and recall
    base_facts: str = ""
    recall_base: float | None = None
    daemon: str = ""
    om: str = ""
    om_note: str = ""
    recall_ocrd: float | None = None
    recall_om: float | None = None
    vs_om: float | None = None  # share of OCRmyPDF's words that ocrd found
    om_seconds: float = 0.0
    messages: dict[str, str] = field(default_factory=dict)


def run_convert(folder: Path, out: Path, jobs: int | None, checkout: Path | None = None,
                lang: str | None = None, tessdata: Path | None = None) -> tuple[dict, dict]:
    """One `ocrd convert` over the folder (with `checkout`'s ocrd: this one by default;
    `lang` for -l; `tessdata` as TESSDATA_PREFIX): (facts, {relpath: (outcome, md or
    message)})."""
    checkout = checkout or Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(checkout), "OCRD_CONFIG": ""}
    if tessdata is not None:
        env["TESSDATA_PREFIX"] = str(tessdata)
    cmd = [sys.executable, "-m", "ocrd", "convert", str(folder), "-o", str(out)]
    if jobs:
        cmd += ["-j", str(jobs)]
    if lang:
        cmd += ["-l", lang]
    rc, wall, cpu, err = timed(cmd, env, out.parent, 24 * 3600)
    got: dict[str, list[tuple[str, str]]] = {}
    for line in err.splitlines():
        m = _PROGRESS.match(line)
        if m:
            rel = str(Path(m.group(1)).relative_to(folder))
            got.setdefault(rel, []).append(("ok", m.group(2)) if m.group(2)
                                           else (m.group(3), m.group(4)))
    lines = err.splitlines()
    facts = {"exit": rc, "wall": round(wall, 1), "cpu": round(cpu, 1),
             "traceback": "Traceback (most recent call last)" in err,
             "summary": lines[-1] if lines else "",
             "files_with_other_than_one_line": sorted(k for k, v in got.items() if len(v) != 1)}
    return facts, {k: v[0] for k, v in got.items()}


def sidecar_facts(md: str) -> str:
    """What the sidecar beside the Markdown says about the file, in a few words."""
    try:
        meta = json.loads(Path(md).with_suffix(".json").read_text())
    except (OSError, ValueError):
        return ""
    pages = meta.get("pages", [])
    blank = sum(p.get("status") == "blank" for p in pages)
    degraded = sum(p.get("status") == "degraded" for p in pages)
    turned = sum(bool(p.get("rotation")) for p in pages)
    parts = [f"{len(pages)}p"] + [f"{n} {what}" for n, what in
                                  ((blank, "blank"), (degraded, "degraded"), (turned, "turned"))
                                  if n]
    if meta.get("repaired"):
        parts.append("repaired")
    if (meta.get("outputs") or {}).get("pdf_rebuilt"):
        parts.append("pdf from pages")
    return ", ".join(parts)


def run_daemon(folder: Path, root: Path, files: list[str], deadline_s: float) -> tuple[dict, dict]:
    """The folder's files copied into a running daemon's inbox at once: (facts,
    {relpath: outcome})."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.daemon_process import DaemonProcess

    inbox, outbox, failed = root / "inbox", root / "outbox", root / "failed"
    for folder in (inbox, outbox, failed, root / "archive"):
        folder.mkdir(parents=True)
    config = {"state_dir": str(root / "state"), "engine": {"kind": "tesseract"},
              "metrics": {"listen": None}, "web": {"listen": None},
              "log": {"level": "info", "format": "json"},
              "inboxes": [{"path": str(inbox), "outbox": str(outbox), "failed": str(failed),
                           "archive": str(root / "archive"), "recursive": True,
                           "quiet_seconds": 1.0}]}
    d = DaemonProcess(root, config, cwd=Path(__file__).resolve().parent.parent)
    t0 = time.monotonic()
    outcomes: dict[str, str] = {}
    with d:
        d.start(timeout=300)
        for rel in files:
            dest = inbox / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / rel, dest)
        while time.monotonic() - t0 < deadline_s and not d.died():
            outcomes = _daemon_outcomes(outbox, failed)
            if len(outcomes) >= len(files):
                break
            time.sleep(2)
        facts = {"wall": round(time.monotonic() - t0, 1), "died": d.died(),
                 "check_failed": len(d.events("check_failed")),
                 "internal_error": len(d.events("internal_error")),
                 "task_failed": len(d.events("task_failed"))}
    outcomes = _daemon_outcomes(outbox, failed)
    facts["without_outcome"] = sorted(set(files) - set(outcomes))
    return facts, outcomes


def _daemon_outcomes(outbox: Path, failed: Path) -> dict[str, str]:
    """relpath → "ok" (a sidecar names it) or the reason in its error file."""
    got: dict[str, str] = {}
    for side in outbox.rglob("*.json"):
        try:
            got[json.loads(side.read_text())["source"]["path"]] = "ok"
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for err in failed.rglob("*.error.json"):
        try:
            body = json.loads(err.read_text())
            got[body["source"]["path"]] = body["reason"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return got


def run_om(path: Path, out: Path, binary: str, jobs: int | None, cache: Path | None) -> dict:
    """OCRmyPDF on one file (as a user runs it; an image without a resolution is given
    --image-dpi 200, which OCRmyPDF otherwise refuses): {ok, outcome, note, text, wall}."""
    data = path.read_bytes()
    key = hashlib.sha256(data).hexdigest()
    if cache is not None and (cache / f"{key}.json").exists():
        return json.loads((cache / f"{key}.json").read_text())
    sidecar = out / "om.txt"
    cmd = [binary, "--force-ocr", "--output-type", "pdf", "--sidecar", str(sidecar),
           "-l", "eng", str(path), str(out / "om.pdf")]
    note = ""
    if path.suffix.lower() != ".pdf" and not _has_dpi(path):
        cmd[1:1] = ["--image-dpi", "200"]
        note = "--image-dpi 200"
    if jobs:
        cmd[1:1] = ["-j", str(jobs)]
    rc, wall, _cpu, err = timed(cmd, {**os.environ, "OMP_THREAD_LIMIT": "1"}, out,
                                OM_TIMEOUT)
    ok = rc == 0 and sidecar.exists()
    last = [line for line in err.splitlines() if line.strip()][-1:] or [""]
    outcome = "ok" if ok else "hung" if wall >= OM_TIMEOUT else OM_EXIT.get(rc, f"exit_{rc}")
    result = {"ok": ok, "outcome": outcome,
              "note": note if ok else f"{note} {last[0][:120]}".strip(),
              "text": sidecar.read_text(errors="replace") if ok else "",
              "wall": round(wall, 1), "traceback": "Traceback (most recent" in err}
    for f in (sidecar, out / "om.pdf"):
        f.unlink(missing_ok=True)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / f"{key}.json").write_text(json.dumps(result))
    return result


def _has_dpi(path: Path) -> bool:
    try:
        from PIL import Image

        with Image.open(path) as im:
            dpi = im.info.get("dpi")
            return bool(dpi and min(dpi) >= 10)
    except Exception:  # noqa: BLE001 - unreadable: OCRmyPDF will say so
        return True


def batch(args: Any) -> None:
    folder: Path = args.folder.resolve()
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                   if p.is_file() and not p.name.startswith("."))
    rows = {rel: Row(rel, rel.split("/", 1)[0]) for rel in files}
    with tempfile.TemporaryDirectory(prefix="ocrd-corpus-") as tmp:
        work = Path(tmp)
        tessdata = _download_like_tessdata(work / "tessdata") if args.tessdata_download \
            else None
        print(f"{len(files)} files; ocrd convert ...", flush=True)
        conv_facts, conv = run_convert(folder, work / "convert", args.jobs, lang=args.lang,
                                       tessdata=tessdata)
        print(f"  {conv_facts}", flush=True)
        base_facts: dict = {}
        base: dict = {}
        if args.baseline:
            print(f"the baseline ({args.baseline}): ocrd convert ...", flush=True)
            base_facts, base = run_convert(folder, work / "baseline", args.jobs,
                                           args.baseline.resolve(), args.lang, tessdata)
            print(f"  {base_facts}", flush=True)
        daemon_facts: dict = {}
        if args.daemon:
            print("the daemon ...", flush=True)
            daemon_facts, daemon = run_daemon(folder, work / "daemon", files, 4 * 3600)
            print(f"  {daemon_facts}", flush=True)
            for rel, outcome in daemon.items():
                if rel in rows:
                    rows[rel].daemon = outcome
        for k, rel in enumerate(files):
            row = rows[rel]
            truth, row.truth = ground_truth(folder / rel)
            outcome, detail = conv.get(rel, ("none", ""))
            row.convert = outcome
            text = ""
            if outcome == "ok":
                text = re.sub(r"<!-- page [^>]*-->", " ",
                              Path(detail).read_text(errors="replace"))
                row.facts = sidecar_facts(detail)
            else:
                row.messages["convert"] = detail[:160]
            if args.baseline:
                b_outcome, b_detail = base.get(rel, ("none", ""))
                row.base = b_outcome
                if b_outcome == "ok":
                    row.base_facts = sidecar_facts(b_detail)
                    b_text = re.sub(r"<!-- page [^>]*-->", " ",
                                    Path(b_detail).read_text(errors="replace"))
                    row.recall_base = recall(truth, words(b_text))
                else:
                    row.messages["baseline"] = b_detail[:160]
                    row.recall_base = 0.0 if truth else None
            om: dict = {}
            if args.ocrmypdf:
                (work / "om").mkdir(exist_ok=True)
                om = run_om(folder / rel, work / "om", args.ocrmypdf, args.jobs, args.om_cache)
                row.om, row.om_note, row.om_seconds = om["outcome"], om["note"], om["wall"]
            row.recall_ocrd = recall(truth, words(text)) if outcome == "ok" else \
                (0.0 if truth else None)
            if om:
                row.recall_om = recall(truth, words(om["text"])) if om["ok"] else \
                    (0.0 if truth else None)
                if om["ok"] and outcome == "ok":
                    row.vs_om = recall(words(om["text"]), words(text))
            print(f"[{k + 1}/{len(files)}] {rel}: ocrd {row.convert}"
                  f"{' / daemon ' + row.daemon if args.daemon else ''}; ocrmypdf {row.om} "
                  f"{row.om_note}", flush=True)
    report(list(rows.values()), conv_facts, daemon_facts, args.daemon)
    if args.baseline:
        compare(list(rows.values()), conv_facts, base_facts)
    if args.results:
        args.results.write_text(json.dumps({"convert": conv_facts, "daemon": daemon_facts,
                                            "baseline": base_facts if args.baseline else None,
                                            "rows": [asdict(r) for r in rows.values()]},
                                           indent=1))


def _download_like_tessdata(folder: Path) -> Path:
    """A tessdata folder as a download of tessdata_best or _fast gives it: the system's
    *.traineddata, and no configs/ folder."""
    out = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True).stdout
    system = Path(re.search(r'"([^"]+)"', out).group(1))  # type: ignore[union-attr]
    folder.mkdir(parents=True, exist_ok=True)
    for data in system.glob("*.traineddata"):
        (folder / data.name).symlink_to(data)
    return folder


def compare(rows: list[Row], conv: dict, base: dict) -> None:
    """This checkout against the baseline, file by file: outcomes, word recall, pages
    blank / degraded / turned, repairs."""
    print("\n## this checkout against the baseline\n")
    print("| outcome | baseline | this checkout |\n|---|---:|---:|")
    kinds = sorted({r.base for r in rows} | {r.convert for r in rows},
                   key=lambda k: (k != "ok", k))
    for kind in kinds:
        print(f"| {kind} | {sum(r.base == kind for r in rows)} | "
              f"{sum(r.convert == kind for r in rows)} |")

    def count(field: str, word: str) -> int:
        return sum(int(m.group(1)) for r in rows
                   for m in re.finditer(rf"(\d+) {word}", getattr(r, field)))

    for word in ("blank", "degraded", "turned"):
        print(f"| pages {word} | {count('base_facts', word)} | {count('facts', word)} |")
    print(f"| files repaired | {sum('repaired' in r.base_facts for r in rows)} | "
          f"{sum('repaired' in r.facts for r in rows)} |")
    truth = [r for r in rows if r.truth != "none"]
    mb = _mean([r.recall_base or 0.0 for r in truth])
    mo = _mean([r.recall_ocrd or 0.0 for r in truth])
    print(f"| word recall, {len(truth)} files with a truth (failed: 0) | {_f(mb)} | {_f(mo)} |")
    print(f"| wall / CPU s, one ocrd convert | {base.get('wall')} / {base.get('cpu')} | "
          f"{conv.get('wall')} / {conv.get('cpu')} |")
    print("\nfiles whose outcome, facts or recall differ (baseline → this checkout):")
    for r in rows:
        if (r.base, r.base_facts) != (r.convert, r.facts) or \
                abs((r.recall_base or 0) - (r.recall_ocrd or 0)) > 0.01:
            print(f"  {r.path}: {r.base} [{r.base_facts}] {_f(r.recall_base)} → {r.convert} "
                  f"[{r.facts}] {_f(r.recall_ocrd)}")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(rows: list[Row], conv: dict, daemon: dict, with_daemon: bool) -> None:
    print(f"\n## {len(rows)} files from {len({r.source for r in rows})} sources\n")
    print("| source | files | ocrd converted | ocrd failed | OCRmyPDF converted | "
          "OCRmyPDF failed |\n|---|---:|---:|---:|---:|---:|")
    for source in sorted({r.source for r in rows}):
        rs = [r for r in rows if r.source == source]
        print(f"| {source} | {len(rs)} | {sum(r.convert == 'ok' for r in rs)} | "
              f"{sum(r.convert != 'ok' for r in rs)} | {sum(r.om == 'ok' for r in rs)} | "
              f"{sum(r.om not in ('ok', '') for r in rs)} |")
    print("\nocrd convert outcomes:", dict(Counter(r.convert for r in rows).most_common()))
    if with_daemon:
        print("ocrd daemon outcomes: ", dict(Counter(r.daemon for r in rows).most_common()))
        differ = [(r.path, r.convert, r.daemon) for r in rows if r.convert != r.daemon]
        print(f"convert and daemon agree on {len(rows) - len(differ)} of {len(rows)}; "
              f"differ: {differ or 'none'}")
    print("OCRmyPDF outcomes:    ", dict(Counter(r.om for r in rows).most_common()))
    print(f"\nocrd convert: {conv}")
    if with_daemon:
        print(f"ocrd daemon: {daemon}")
    both = [r for r in rows if r.truth != "none" and r.convert == "ok" and r.om == "ok"]
    mo = _mean([r.recall_ocrd for r in both if r.recall_ocrd is not None])
    mm = _mean([r.recall_om for r in both if r.recall_om is not None])
    print(f"\nword recall against the truth, {len(both)} files both converted: ocrd "
          f"{_f(mo)}, OCRmyPDF {_f(mm)}" + (f", ratio {mo / mm:.3f}" if mo and mm else ""))
    worse = [(r.path, _f(r.recall_ocrd), _f(r.recall_om)) for r in both
             if (r.recall_ocrd or 0) < (r.recall_om or 0) - 0.02]
    print(f"  ocrd more than 0.02 below OCRmyPDF: {worse or 'none'}")
    no_truth = [r.vs_om for r in rows if r.truth == "none" and r.vs_om is not None]
    print(f"files without a truth, both converted: {len(no_truth)}; share of OCRmyPDF's "
          f"words ocrd found: mean {_f(_mean(no_truth))}")
    print("\nocrd failed, OCRmyPDF converted:")
    for r in rows:
        if r.convert != "ok" and r.om == "ok":
            print(f"  {r.path}: [{r.convert}] {r.messages.get('convert', '')}")
    print("ocrd converted, OCRmyPDF failed:")
    for r in rows:
        if r.convert == "ok" and r.om not in ("ok", ""):
            print(f"  {r.path}: OCRmyPDF {r.om} {r.om_note}")
    print(f"\nOCRmyPDF's time, file by file: {sum(r.om_seconds for r in rows):.0f} s; ocrd "
          f"convert (one call): {conv.get('wall')} s" +
          (f"; the daemon: {daemon.get('wall')} s" if with_daemon else ""))
    problems = []
    if conv.get("exit") not in OCRD_EXIT or conv.get("traceback"):
        problems.append(f"convert exit {conv.get('exit')}, traceback {conv.get('traceback')}")
    missing = [r.path for r in rows if r.convert == "none"]
    if missing or conv.get("files_with_other_than_one_line"):
        problems.append(f"convert: no outcome for {missing}, several for "
                        f"{conv.get('files_with_other_than_one_line')}")
    if with_daemon and (daemon.get("died") or daemon.get("without_outcome")
                        or daemon.get("check_failed") or daemon.get("internal_error")):
        problems.append(f"daemon: {daemon}")
    print(f"\npromises: {problems or 'kept'}")


def main(args: Any) -> None:
    # the interpreter as given (a venv's bin/python, maybe relative): absolute, for the
    # commands that run in other folders
    sys.executable = os.path.abspath(sys.executable)
    if args.select:
        if not args.mirrors:
            raise SystemExit("--select needs --mirrors")
        print("\n".join(select(args.mirrors)))
    elif args.fetch:
        if not (args.mirrors and args.folder):
            raise SystemExit("--fetch needs --mirrors and FOLDER")
        print(f"{fetch(args.fetch, args.mirrors, args.folder)} files in {args.folder}")
    else:
        if args.folder is None:
            raise SystemExit("--batch needs FOLDER")
        batch(args)
