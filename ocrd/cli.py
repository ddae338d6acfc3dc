"""Command line: parses arguments and calls into the modules, nothing else."""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocrd import __version__
from ocrd.config import listen, secrets, source
from ocrd.config.engine import ENGINES
from ocrd.config.folders import check_folders
from ocrd.config.load import load_config, parse_config
from ocrd.config.settings import Config, ConfigError
from ocrd.errors import REASONS, ExitCode, exit_code_for
from ocrd.names import number, printable, shown
from ocrd.outputs.records import iso, local_time
from ocrd.service import owner

if TYPE_CHECKING:
    from ocrd.pipeline.progress import Progress

EPILOG = """\
run, status, retry and check-config read -c FILE, else $OCRD_CONFIG, else
/etc/ocrd/config.yaml.

exit codes of `ocrd convert`: 0 all converted, 1 failures of several kinds,
2 usage or configuration error, 3 bad input (empty, truncated, damaged, unsupported, unreadable),
4 encrypted, 5 over a limit (pages, size), 6 engine failed, 7 an output not written (not
writable, or an output asked for with --pdf or --hocr could not be made), 130
interrupted.
"""


CONFIG_HELP = "YAML config file (default: $OCRD_CONFIG, else /etc/ocrd/config.yaml)"
# `ocrd retry` when no failed file matches, whichever way they were asked for
NOTHING_TO_RETRY = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ocrd", description="OCR daemon: inbox folders → Markdown "
        "(DeepSeek-OCR-2 on vLLM, or tesseract on the CPU).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"ocrd {__version__} ({owner.DISTRIBUTION})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, summary: str, description: str,
                epilog: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=textwrap.fill(description, 80),
                              epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)

    run = command("run", "run the daemon in the foreground (what systemd runs)",
                  "Run the daemon in the foreground: watch the configured inboxes and "
                  "convert every file dropped there, until stopped (SIGTERM: pages in "
                  "flight finish first; SIGHUP: re-read the inbox settings). This is what "
                  "ocrd.service runs.")
    run.add_argument("-c", "--config", type=Path, help=CONFIG_HELP)

    conv = command("convert", "convert files once and exit (exit 0 only if every file "
                   "converted)", "Convert files once with the same pipeline as the daemon "
                   "and exit: NAME.md, NAME.json (and NAME.assets/) in the output folder. "
                   "No daemon and no state are needed.", EPILOG.split("\n\n", 1)[1])
    conv.add_argument("files", nargs="+", type=Path, metavar="FILE",
                      help="a document, or a folder: every document in it and its "
                      "subfolders (skipping what an inbox skips)")
    conv.add_argument("-o", "--output", required=True, type=Path, metavar="DIR",
                      help="folder for NAME.md, NAME.json and NAME.assets/ (a folder's "
                      "subfolders mirrored)")
    conv.add_argument("-c", "--config", type=Path,
                      help="config file for engine/render/limits settings (optional)")
    conv.add_argument("--engine", metavar="KIND",
                      help="override engine.kind: auto, " + ", ".join(ENGINES) +
                      ", or an engine's class path package.module:Class")
    conv.add_argument("--prompt", choices=["markdown", "text"], default="markdown",
                      help="what to ask the model for (vllm/remote only)")
    conv.add_argument("--pdf", action="store_true",
                      help="also write NAME.pdf: the original, searchable (an invisible text "
                      "layer; NAME.ocr.pdf for a PDF converted into its own folder)")
    conv.add_argument("--hocr", action="store_true",
                      help="also write NAME.hocr: every word with its box and confidence "
                      "(hOCR, as OCRmyPDF and proofreading tools read it)")
    conv.add_argument("--pdf-text-layer", choices=["replace", "add", "skip_if_text"],
                      default="skip_if_text", help="on pages that have text already: "
                      "replace it, add the layer anyway, or keep them as they are "
                      "(default)")
    conv.add_argument("-l", "--language", action="append", metavar="LANG",
                      help="tesseract language(s): -l eng+deu, or -l eng -l deu (default: "
                      "engine.tesseract.lang, eng); the DeepSeek-OCR-2 engines need none")
    conv.add_argument("-j", "--jobs", type=_positive, metavar="N",
                      help="processes that render pages and run tesseract (default: one "
                      "per CPU core)")
    conv.add_argument("-q", "--quiet", action="store_true",
                      help="no progress; only failed files and errors")
    conv.add_argument("-v", "--verbose", action="count", default=0,
                      help="log events too, on their own lines: -v info, -vv debug")

    check = command("check-config", "validate a config file, its folders and its engine",
                    "Check a config file as the daemon's start would, everything but the "
                    "GPU: the keys, the folders it names (a missing outbox, failed or "
                    "archive folder, a required mount with nothing mounted), the engine "
                    "(tesseract's languages installed, vLLM installed where engine.kind "
                    "asks for it, the remote servers' URLs), token and key files, the "
                    "listen addresses. Every problem is reported at once, one line each, "
                    "naming the key and its value. Exit 0 when the daemon could start "
                    "with it.")
    check.add_argument("-c", "--config", type=Path, help=CONFIG_HELP)

    status = command("status", "queue, counts by state, recent failures, and the files "
                     "waiting or converting by name",
                     "Show the files by state and the recent failures from the journal, "
                     "the queue and pages in flight when the daemon answers on "
                     "metrics.listen, and the files waiting or converting, by name, when "
                     "its console answers on web.listen.",
                     "--json: `counts` are the journal's files by state now (`failed`: "
                     "in a failed folder now, not retried or dismissed); `daemon` holds "
                     "the running daemon's numbers, its counters since it started "
                     "(`files_failed_since_start` counts every failure of this run, also "
                     "of files retried since); null when it does not answer.")
    status.add_argument("-c", "--config", type=Path, help=CONFIG_HELP)
    status.add_argument("--json", action="store_true",
                        help="machine-readable output (times in ISO 8601, UTC)")
    status.add_argument("-n", type=int, default=10, help="recent failures to show")

    retry = command(
        "retry", "put failed originals back into their inbox, to be converted again",
        "Put failed originals back into their inbox, where the daemon takes them in "
        "again. Works whether or not the daemon runs; run it as the daemon's user "
        "(sudo -u ocrd).",
        "exit codes: 0 every file asked for was put back, 1 nothing to retry (no failed "
        "file matches: a FILE, --reason or --all alike) or a file could not be put back, "
        "2 usage or configuration error (a reason that does not exist).")
    retry.add_argument("-c", "--config", type=Path, help=CONFIG_HELP)
    which = retry.add_mutually_exclusive_group(required=True)
    which.add_argument("files", nargs="*", default=[], metavar="FILE",
                       help="a failed file: its path in the failed folder, its path "
                       "relative to the inbox, or its id in the console")
    which.add_argument("--all", action="store_true", help="every failed file")
    which.add_argument("--reason", metavar="REASON",
                       help="every file that failed for REASON (e.g. engine_failed)")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`ocrd status | head -3`): stop quietly, as `cat` does.
        # Python flushes stdout once more at exit; point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            parser.print_help()
            return ExitCode.USAGE
        if args.command == "run":
            return cmd_run(args)
        if args.command == "convert":
            return cmd_convert(args)
        if args.command == "check-config":
            return cmd_check(args)
        if args.command == "status":
            return cmd_status(args)
        if args.command == "retry":
            return cmd_retry(args)
    except ConfigError as e:
        for problem in e.problems or [str(e)]:
            print(f"ocrd: configuration error: {printable(problem)}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    return ExitCode.USAGE


def cmd_run(args: argparse.Namespace) -> int:
    import structlog

    from ocrd.service import daemon as service
    from ocrd.service import log

    found = source.find(args.config)
    cfg = source.load(found)
    secrets.api_key(cfg.engine.remote)  # a missing key file stops the start, not a page
    _tls_files(cfg)
    log.setup(cfg.log.level, cfg.log.format)
    structlog.get_logger("ocrd.cli").info("config_read", path=str(found.path),
                                          origin=found.origin)
    return service.run(found.path)


def cmd_check(args: argparse.Namespace) -> int:
    found = source.find(args.config)
    checked = source.read(found)
    problems = list(checked.problems)
    if checked.listed == 0:
        problems.append("inboxes: no inbox is configured; the daemon would have nothing to do")
    cfg = checked.config
    engine = ""
    if cfg is not None:
        problems += check_folders(cfg, checked.numbers) + _check_secrets_and_listen(cfg)
        try:
            engine = _engine_chosen(cfg)
        except ConfigError as e:
            problems += e.problems
        problems += _engine_preflight(cfg)
    problems = list(dict.fromkeys(problems))
    for note in checked.notes:
        print(printable(f"ocrd: note: {note}"), file=sys.stderr)
    for problem in source.noted(ConfigError(*problems), found).problems:
        print(f"ocrd: {printable(problem)}", file=sys.stderr)
    if problems or cfg is None:
        return ExitCode.USAGE
    print(printable(f"{found}: OK ({len(cfg.inboxes)} inbox(es), engine {engine})"))
    return ExitCode.OK


def _engine_chosen(cfg: Config) -> str:
    """The engine `run` would start, and why; ConfigError: a key the vLLM layout cannot
    take."""
    from ocrd.engines import choose_kind
    from ocrd.engines.vllm.profile import with_profile

    kind, why = choose_kind(cfg.engine)
    if kind == "vllm":
        vllm = with_profile(cfg.engine).vllm
        why += f"; vLLM {vllm.mode}, profile {cfg.engine.vllm.profile}"
    return f"{kind}: {why}"


def _engine_preflight(cfg: Config) -> list[str]:
    """What the daemon's start would find wrong with the engine (service/daemon.py asks
    the same), without a GPU: a tesseract language without its data, vLLM missing."""
    from ocrd.engines import preflight

    return preflight(cfg.engine)


def _check_secrets_and_listen(cfg: Config) -> list[str]:
    from ocrd.web.auth import load_token

    problems = []
    try:
        load_token(cfg.web)  # a token file that is set must be readable and long enough
    except ConfigError as e:
        problems += e.problems
    name = cfg.engine.remote.api_key_credential
    if name is not None and secrets.credential_path(name) is None:
        print(printable(f"ocrd: note: engine.remote.api_key_credential = {name!r} is read from "
                        "$CREDENTIALS_DIRECTORY, which only the service has; not checked "
                        "here"))
    else:
        try:
            secrets.api_key(cfg.engine.remote)
        except ConfigError as e:
            problems += e.problems
    try:
        _tls_files(cfg)
    except ConfigError as e:
        problems += e.problems
    for key, value in (("metrics.listen", cfg.metrics.listen), ("web.listen", cfg.web.listen)):
        if value is not None:
            problem = listen.bind_problem(listen.parse(value))
            if problem:
                problems.append(f"{key} = {value!r}: {problem}")
    return problems


def _tls_files(cfg: Config) -> None:
    """ConfigError unless the engine's CA bundle and client certificate (when set) load."""
    remote = cfg.engine.remote
    if remote.tls_ca_file is not None or remote.tls_cert_file is not None:
        from ocrd.engines.http import tls_context

        tls_context(remote)


def cmd_status(args: argparse.Namespace) -> int:
    from ocrd.service.status import console_status, daemon_metrics, file_lines
    from ocrd.work.journal import Journal

    found = source.find(args.config)
    cfg = source.load(found)
    if not args.json:
        print(printable(f"config: {found}"))
    path = cfg.state_dir / "journal.sqlite3"
    if not path.exists():
        print(printable(f"no journal at {path}: the daemon has not run with this config "
                        "yet"))
        return ExitCode.OK
    journal = Journal(path, readonly=True)
    counts = journal.counts()
    failures = journal.recent_failures(args.n)
    queued = [j for j in journal.open_jobs() if j.state in ("claiming", "claimed")]
    journal.close()
    live = daemon_metrics(cfg.metrics.listen) if cfg.metrics.listen else None
    console = console_status(cfg.web)
    if args.json:
        print(json.dumps({
            "config": {"path": str(found.path), "origin": found.origin},
            "counts": counts, "daemon": live,
            "waiting": console.get("waiting") if console else None,
            "converting": console.get("converting") if console else None,
            "problems": console.get("problems") if console else None,
            "queued": [shown(j.relpath) for j in queued],
            "recent_failures": [{"file": shown(j.relpath), "reason": j.reason,
                                 "message": j.message, "moved_to": shown(j.output or ""),
                                 "finished": iso(j.finished)}
                                for j in failures]}, indent=2))
        return ExitCode.OK
    if live is None:
        print("daemon: not reachable (stopped, or metrics turned off); from the journal:")
    else:
        print(f"daemon: {'ready' if live.get('ready') else 'NOT READY'}, queue "
              f"{live.get('queue', 0)}, converting {live.get('active', 0)} file(s), "
              f"{live.get('in_flight', 0)} page(s) in flight, "
              f"{live.get('pages_ok_since_start', 0)} pages done since start")
        for paused in live.get("paused_inboxes", []):
            print(printable(f"inbox {paused['inbox']}: PAUSED, {paused['why']}"))
        if console is None:  # else its banners below say it, with a file's name
            for unread in live.get("unread_in_subfolders", []):
                print(printable(f"inbox {unread['inbox']}: {unread['files']} file(s) in its "
                                "subfolders are not read (the inbox is not recursive)"))
    order = ["claimed", "converting", "finishing", "done", "failed"]
    print("files: " + ", ".join(f"{s} {counts.get(s, 0)}" for s in order))
    if console is not None:
        lines = file_lines(console)
        print("files by name:" if lines else "no file waiting or converting")
        for line in lines:
            print(printable(line))
    elif cfg.web.listen:
        print("files by name: the console does not answer (web.listen)")
    for j in queued[:args.n]:
        print(printable(f"  queued      {shown(j.relpath)}  [{shown(j.inbox)}]"))
    if len(queued) > args.n:
        print(f"  … and {len(queued) - args.n} more queued")
    if failures:
        print("recent failures:")
        for j in failures:
            when = local_time(j.finished, seconds=False)
            print(f"  {when}  {printable(j.relpath)}  [{printable(j.reason or '')}] "
                  f"{printable(j.message or '')}")
    return ExitCode.OK


def cmd_retry(args: argparse.Namespace) -> int:
    from ocrd.service import log
    from ocrd.work.journal import Journal
    from ocrd.work.retry import RetryError, retry_job, select

    if args.reason is not None and args.reason not in REASONS:
        close = difflib.get_close_matches(args.reason, REASONS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"ocrd: no file fails for the reason {args.reason!r}{hint}; the reasons are: "
              f"{', '.join(REASONS)}", file=sys.stderr)
        return ExitCode.USAGE
    cfg = source.load(source.find(args.config))
    log.setup("warning", cfg.log.format)  # one line per file below says what happened
    path = cfg.state_dir / "journal.sqlite3"
    if not path.exists():
        print(printable(f"ocrd: nothing to retry: no journal at {path} (the daemon has not "
                        "run with this config yet)"), file=sys.stderr)
        return NOTHING_TO_RETRY
    journal = Journal(path)
    try:
        ids = [n for f in args.files if (n := number(f)) is not None]
        jobs = select(journal, ids=ids, paths=[f for f in args.files if number(f) is None],
                      reason=args.reason, everything=args.all)
        if not jobs:
            what = (f"no failed file has the reason {args.reason!r}" if args.reason
                    else "no file has failed" if args.all else "no failed file matches")
            print(f"ocrd: nothing to retry: {what}", file=sys.stderr)
            return NOTHING_TO_RETRY
        problems = 0
        for job in jobs:
            try:
                dest = retry_job(cfg, journal, job)
            except RetryError as e:
                problems += 1
                print(f"ocrd: {printable(str(e))}", file=sys.stderr)
                continue
            print(f"{printable(job.relpath)} [{printable(job.reason or '')}] → "
                  f"{printable(str(dest))}")
    finally:
        journal.close()
    return 1 if problems else ExitCode.OK


def _positive(text: str) -> int:
    n = number(text)
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more, got {text!r}")
    return n


def _convert_config(args: argparse.Namespace) -> Config:
    """The config for one `ocrd convert`: the file's (or the defaults), with what the
    command line says on top."""
    # convert keeps no state and serves no metrics: state_dir may be left out
    unused = {"state_dir": ".", "metrics": {"listen": None}}
    if args.config:
        cfg = load_config(args.config, defaults=unused)
    else:
        cfg = parse_config(unused, Path.cwd())
    engine = cfg.engine.model_dump()
    if args.engine:
        engine["kind"] = args.engine
    if args.language:
        engine["tesseract"]["lang"] = "+".join(args.language)
    render = cfg.render.model_dump()
    if args.jobs:
        engine["tesseract"]["workers"] = render["workers"] = args.jobs
    return cfg.model_copy(update={"engine": type(cfg.engine).model_validate(engine),
                                  "render": type(cfg.render).model_validate(render)})


def cmd_convert(args: argparse.Namespace) -> int:
    from ocrd.pipeline.batch import jobs_for, summary
    from ocrd.pipeline.progress import Progress
    from ocrd.service import log

    cfg = _convert_config(args)
    missing = [f for f in args.files if not f.exists()]
    for f in missing:
        print(f"ocrd: {f}: no such file", file=sys.stderr)
    if missing:
        return ExitCode.USAGE
    jobs = jobs_for(args.files, args.output)
    if not jobs:
        print("ocrd: no files to convert (the folders given hold none)", file=sys.stderr)
        return ExitCode.OK
    progress = Progress(len(jobs), enabled=not args.quiet)
    level = "error" if args.quiet else ("warning", "info", "debug")[min(args.verbose, 2)]
    # Log events in the same words as the progress, unless JSON is asked for by name.
    log.setup(level, "json" if cfg.log.format == "json" else "console",
              stream=progress.lines())
    try:
        outcomes = asyncio.run(_convert(cfg, args, jobs, progress))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    finally:
        progress.finish()
    failures = [o.error for o in outcomes if o.error is not None]
    if not args.quiet or failures:
        print(summary(outcomes), file=sys.stderr)
    return exit_code_for(failures)


async def _convert(cfg: Config, args: argparse.Namespace, jobs: list[Any],
                   progress: Progress) -> list[Any]:
    from ocrd import errors
    from ocrd.engines import create_engine
    from ocrd.pipeline.batch import Batch, Outcome
    from ocrd.pipeline.document import Converter
    from ocrd.render.pool import RenderPool

    engine = create_engine(cfg.engine)
    try:
        await engine.start()
    except errors.EngineDead as e:
        print(f"ocrd: the engine cannot start: {e}", file=sys.stderr)
        return [Outcome(job, errors.EngineFailed(str(e))) for job in jobs]
    pool = RenderPool(cfg.render.workers)
    converter = Converter(cfg, engine, pool)  # as the daemon's (service/wiring.py)
    progress.start()
    try:
        args.output.mkdir(parents=True, exist_ok=True)
        return await Batch(cfg, args, converter, progress).run(jobs)
    finally:
        await engine.close()
        await pool.close()


if __name__ == "__main__":
    sys.exit(main())
