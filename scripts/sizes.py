"""List ocrd's modules over ~400 lines and functions over ~60 (the limits of
/work/shared/STYLE and the issue "One daemon, several rooms").

Usage: python scripts/sizes.py [ROOT ...]   (default: ocrd)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MODULE_LINES = 400
FUNCTION_LINES = 60


def report(root: Path) -> list[str]:
    lines: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        count = text.count("\n")
        if count > MODULE_LINES:
            lines.append(f"module   {count:5d}  {path}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    lines.append(f"function {length:5d}  {path}:{node.lineno} {node.name}")
    return lines


def main(argv: list[str]) -> int:
    for root in argv or ["ocrd"]:
        print("\n".join(report(Path(root))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
