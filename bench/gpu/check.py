"""Does `vllm serve` import on this machine? Lists every missing module in one go (each
missing one is stubbed to find the next). Exit 1 if any. Used by bench/gpu/run.sh."""

import sys
from unittest import mock

missing: list[str] = []
for _ in range(40):
    try:
        import vllm.entrypoints.cli.main  # noqa: F401
        import vllm.entrypoints.cli.serve  # noqa: F401
        import vllm.entrypoints.openai.api_server as api
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(
            ["--model", sys.argv[1], "--api-server-count", "2"])
        api.build_app(args)
        break
    except ModuleNotFoundError as e:
        missing.append(e.name)
        sys.modules[e.name] = mock.MagicMock()
        for name in [m for m in sys.modules if m.startswith("vllm.entrypoints")]:
            del sys.modules[name]
    except Exception as e:  # noqa: BLE001 - what is wrong beyond missing modules
        print("SERVE CHECK error:", repr(e)[:300])
        break
print("SERVE CHECK missing:", missing or "none")
sys.exit(1 if missing else 0)
