"""Command line: parses arguments and calls into the modules, nothing else."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__, configfile, credentials, listen, owner
from .config import Config, ConfigError, load_config, parse_config
from .errors import ExitCode, OcrdError, exit_code_for
from .layout import check_folders
from .names import shown

if TYPE_CHECKING:
    from .progress import Progress

EPILOG = """\
run, status and check-config read -c FILE, else $OCRD_CONFIG, else /etc/ocrd/config.yaml.

exit codes of `ocrd convert`: 0 all converted, 1 failures of several kinds,
2 usage or configuration error, 3 bad input (empty, truncated, damaged, unsupported, unreadable),
4 encrypted, 5 over a limit (pages, size), 6 engine failed, 7 output not writable,
130 interrupted.
"""


CONFIG_HELP = "YAML config file (default: $OCRD_CONFIG, else /etc/ocrd/config.yaml)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ocrd", description="OCR daemon: inbox folders → Markdown "
        "(DeepSeek-OCR-2 on vLLM, or tesseract on the CPU).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"ocrd {__version__} ({owner.DISTRIBUTION})")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon in the foreground (what systemd runs)")
    run.add_argument("-c", "--config", type=Path, help=CONFIG_HELP)

    conv = sub.add_parser("convert", help="convert files once and exit (exit 0 only if "
                          "every file converted)")
    conv.add_argument("files", nargs="+", type=Path, metavar="FILE")
    conv.add_argument("-o", "--output", required=True, type=Path, metavar="DIR",
                      help="folder for NAME.md, NAME.json and NAME.assets/")
    conv.add_argument("-c", "--config", type=Path,
                      help="config file for engine/render/limits settings (optional)")
    conv.add_argument("--engine", choices=["auto", "vllm", "remote", "tesseract"],
                      help="override engine.kind")
    conv.add_argument("--prompt", choices=["markdown", "text"], default="markdown",
                      help="what to ask the model for (vllm/remote only)")
    conv.add_argument("--pdf", action="store_true",
                      help="also write NAME.pdf: the original, searchable (an invisible text "
                      "layer; NAME.ocr.pdf for a PDF converted into its own folder)")
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

    check = sub.add_parser("check-config", help="validate a config file and its folders")
    check.add_argument("-c", "--config", type=Path, help=CONFIG_HELP)

    status = sub.add_parser("status", help="queue, counts by state, recent failures, and "
                            "the files waiting or converting by name")
    status.add_argument("-c", "--config", type=Path, help=CONFIG_HELP)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("-n", type=int, default=10, help="recent failures to show")

    retry = sub.add_parser(
        "retry", help="put failed originals back into their inbox, to be converted again "
        "(works whether or not the daemon runs)")
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
    args = build_parser().parse_args(argv)
    try:
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
        print(f"ocrd: configuration error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    return ExitCode.USAGE


def cmd_run(args: argparse.Namespace) -> int:
    import structlog

    from . import log, service

    found = configfile.find(args.config)
    cfg = configfile.load(found)
    credentials.api_key(cfg.engine)  # a missing key file stops the start, not a page
    _tls_files(cfg)
    log.setup(cfg.log.level, cfg.log.format)
    structlog.get_logger("ocrd.cli").info("config_read", path=str(found.path),
                                          origin=found.origin)
    return service.run(found.path)


def cmd_check(args: argparse.Namespace) -> int:
    from .web.auth import load_token

    found = configfile.find(args.config)
    cfg = configfile.load(found)
    load_token(cfg.web)  # a token file that is set must be readable and long enough
    problems = check_folders(cfg) + _check_secrets_and_listen(cfg)
    for problem in problems:
        print(f"ocrd: {problem}", file=sys.stderr)
    if problems:
        return ExitCode.USAGE
    from .engines import choose_kind, with_profile

    kind, why = choose_kind(cfg.engine)
    if kind == "vllm":
        vllm = with_profile(cfg.engine).vllm  # ConfigError: a key the layout cannot take
        why += f"; vLLM {vllm.mode}, profile {cfg.engine.vllm.profile}"
    print(f"{found}: OK ({len(cfg.inboxes)} inbox(es), engine {kind}: {why})")
    return ExitCode.OK


def _check_secrets_and_listen(cfg: Config) -> list[str]:
    problems = []
    name = cfg.engine.api_key_credential
    if name is not None and credentials.credential_path(name) is None:
        print(f"ocrd: note: engine.api_key_credential = {name!r} is read from "
              "$CREDENTIALS_DIRECTORY, which only the service has; not checked here")
    else:
        try:
            credentials.api_key(cfg.engine)
        except ConfigError as e:
            problems.append(str(e))
    try:
        _tls_files(cfg)
    except ConfigError as e:
        problems.append(str(e))
    for key, value in (("metrics.listen", cfg.metrics.listen), ("web.listen", cfg.web.listen)):
        if value is not None:
            problem = listen.bind_problem(listen.parse(value))
            if problem:
                problems.append(f"{key} = {value!r}: {problem}")
    return problems


def _tls_files(cfg: Config) -> None:
    """ConfigError unless the engine's CA bundle and client certificate (when set) load."""
    eng = cfg.engine
    if eng.tls_ca_file is not None or eng.tls_cert_file is not None:
        from .engines.http import tls_context

        tls_context(eng)


def cmd_status(args: argparse.Namespace) -> int:
    from .journal import Journal
    from .status import console_status, daemon_metrics, file_lines

    found = configfile.find(args.config)
    cfg = configfile.load(found)
    if not args.json:
        print(f"config: {found}")
    path = cfg.state_dir / "journal.sqlite3"
    if not path.exists():
        print(f"no journal at {path}: the daemon has not run with this config yet")
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
                                 "finished": j.finished}
                                for j in failures]}, indent=2))
        return ExitCode.OK
    if live is None:
        print("daemon: not reachable (stopped, or metrics turned off); from the journal:")
    else:
        print(f"daemon: {'ready' if live.get('ready') else 'NOT READY'}, queue "
              f"{live.get('queue', 0):.0f}, converting {live.get('active', 0):.0f} file(s), "
              f"{live.get('in_flight', 0):.0f} page(s) in flight, "
              f"{live.get('pages_ok', 0):.0f} pages done since start")
    order = ["claimed", "converting", "finishing", "done", "failed"]
    print("files: " + ", ".join(f"{s} {counts.get(s, 0)}" for s in order))
    if console is not None:
        lines = file_lines(console)
        print("files by name:" if lines else "no file waiting or converting")
        for line in lines:
            print(line)
    elif cfg.web.listen:
        print("files by name: the console does not answer (web.listen)")
    for j in queued[:args.n]:
        print(f"  queued      {shown(j.relpath)}  [{shown(j.inbox)}]")
    if len(queued) > args.n:
        print(f"  … and {len(queued) - args.n} more queued")
    if failures:
        print("recent failures:")
        for j in failures:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(j.finished or 0))
            print(f"  {when}  {shown(j.relpath)}  [{j.reason}] {j.message}")
    return ExitCode.OK


def cmd_retry(args: argparse.Namespace) -> int:
    from . import log
    from .journal import Journal
    from .retry import RetryError, retry_job, select

    cfg = configfile.load(configfile.find(args.config))
    log.setup("warning", cfg.log.format)  # one line per file below says what happened
    path = cfg.state_dir / "journal.sqlite3"
    if not path.exists():
        print(f"ocrd: no journal at {path}: nothing has failed yet", file=sys.stderr)
        return ExitCode.USAGE
    journal = Journal(path)
    try:
        ids = [int(f) for f in args.files if f.isdigit()]
        jobs = select(journal, ids=ids, paths=[f for f in args.files if not f.isdigit()],
                      reason=args.reason, everything=args.all)
        if not jobs:
            print("ocrd: no failed file matches", file=sys.stderr)
            return 1 if args.files else ExitCode.OK
        problems = 0
        for job in jobs:
            try:
                dest = retry_job(cfg, journal, job)
            except RetryError as e:
                problems += 1
                print(f"ocrd: {e}", file=sys.stderr)
                continue
            print(f"{shown(job.relpath)} [{job.reason}] → {shown(str(dest))}")
    finally:
        journal.close()
    return 1 if problems else ExitCode.OK


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more, got {text!r}")
    return int(text)


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


def _pdf_settings(args: argparse.Namespace, path: Path, out: Any) -> Any:
    """--pdf: NAME.pdf, or NAME.ocr.pdf for a PDF converted into the folder it is in."""
    from .pdfout import BESIDE_ORIGINAL_SUFFIX, DEFAULT_SUFFIX, PdfSettings, same_folder

    beside = path.suffix.lower() == ".pdf" and same_folder(out, str(path))
    return PdfSettings(args.pdf_text_layer,
                       BESIDE_ORIGINAL_SUFFIX if beside else DEFAULT_SUFFIX)


def cmd_convert(args: argparse.Namespace) -> int:
    from . import log
    from .progress import Progress

    cfg = _convert_config(args)
    missing = [f for f in args.files if not f.exists()]
    for f in missing:
        print(f"ocrd: {f}: no such file", file=sys.stderr)
    if missing:
        return ExitCode.USAGE
    progress = Progress(len(args.files), enabled=not args.quiet)
    level = "error" if args.quiet else ("warning", "info", "debug")[min(args.verbose, 2)]
    # Log events in the same words as the progress, unless JSON is asked for by name.
    log.setup(level, "json" if cfg.log.format == "json" else "console",
              stream=progress.lines())
    try:
        failures = asyncio.run(_convert(cfg, args, progress))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    finally:
        progress.finish()
    return exit_code_for(failures)


async def _convert(cfg: Config, args: argparse.Namespace,
                   progress: Progress) -> list[OcrdError]:
    from . import errors, outbox, pages, safefs
    from .engines import create_engine
    from .pipeline import Converter, Source
    from .schedule import FairSlots

    engine = create_engine(cfg.engine)
    try:
        await engine.start()
    except errors.EngineDead as e:
        print(f"ocrd: the engine cannot start: {e}", file=sys.stderr)
        return [errors.EngineFailed(str(e))] * len(args.files)
    pool = pages.RenderPool(cfg.render.workers)
    slots = FairSlots(cfg.schedule.pages_in_flight or max(2, engine.max_concurrency))
    converter = Converter(cfg, engine, pool, slots)
    perms = outbox.Perms(tag=f"cli{os.getpid()}")
    progress.start()
    limit = asyncio.Semaphore(cfg.schedule.max_active_documents)
    failures: list[OcrdError] = []

    async def one(path: Path) -> None:
        async with limit:
            t0 = time.monotonic()
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                failures.append(errors.Unreadable(f"cannot open the file: {e.strerror}"))
                progress.done(path, f"FAILED [unreadable] {e.strerror}")
                return
            src = Source(fd, path.name, prompt_mode=args.prompt)
            try:
                with safefs.Dir.open_root(args.output, create=True) as out:
                    if args.pdf:
                        src.pdf = _pdf_settings(args, path, out)
                    written = await converter.convert(src, out, perms)
            except OcrdError as e:
                failures.append(e)
                progress.done(path, f"FAILED [{e.reason}] {e}")
                return
            except errors.EngineDead as e:
                failures.append(errors.EngineFailed(str(e)))
                progress.done(path, f"FAILED [engine_failed] {e}")
                return
            except OSError as e:
                failures.append(errors.OutputFailed(f"cannot write the result: {e}"))
                progress.done(path, f"FAILED [output_failed] {e}")
                return
            finally:
                os.close(fd)
            n = written.meta["page_count"]
            progress.done(path, f"ok → {written.folder / written.markdown} "
                          f"({n} page{'s' * (n != 1)}, {time.monotonic() - t0:.1f} s)")

    try:
        args.output.mkdir(parents=True, exist_ok=True)
        await asyncio.gather(*(one(f) for f in args.files))
    finally:
        await engine.close()
        await pool.close()
    return failures


if __name__ == "__main__":
    sys.exit(main())
