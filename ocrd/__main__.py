"""The `ocrd` command's entry point (and `python -m ocrd`): refuses to start in an
environment where another distribution shares the `ocrd` package, then runs the CLI."""

from __future__ import annotations

import sys


def main() -> int:
    from ocrd.service.owner import refusal

    problem = refusal()
    if problem is not None:
        print(f"ocrd: cannot start: {problem}", file=sys.stderr)
        return 2  # ExitCode.USAGE, without importing more of a package that may be mixed
    from ocrd.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
