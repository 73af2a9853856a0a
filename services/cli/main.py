"""The `trinity` command. Heavy imports stay inside the subcommands so `--help` is instant."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from services.common.config.services import SERVICE_NAMES
from services.common.entry import add_serve_args


def _cmd_serve(args: argparse.Namespace) -> int:
    from services.common.entry import run_service

    return run_service(args.service, args.config, args.overrides)


def _cmd_run(args: argparse.Namespace) -> int:
    from services.cli.run import run

    return run(args.config, args.overrides, verbose=args.verbose)


def _cmd_status(args: argparse.Namespace) -> int:
    from services.cli.status import status

    return asyncio.run(status(args.config, args.overrides, timeout=args.timeout))


def _cmd_config_check(args: argparse.Namespace) -> int:
    from services.cli.config_check import check_file

    if (args.file is None) == (args.config_flag is None):
        print("trinity config check: give the config file once (FILE or --config FILE)", file=sys.stderr)
        return 2
    args.file = args.file or args.config_flag
    cfg, report = check_file(args.file, args.overrides)
    for line in report.warnings:
        print(f"{args.file}: warning: {line}", file=sys.stderr)
    if cfg is None or report.problems:
        print(f"{args.file}: invalid config", file=sys.stderr)
        for line in report.problems:
            print(f"  {line}", file=sys.stderr)
        return 2
    stages = ", ".join(s.stage_name for s in cfg.stages) or "(none)"
    print(
        f"{args.file}: OK (mode {cfg.mode}, algorithm {cfg.algorithm.algorithm_type}, stages: {stages}, run dir {cfg.run_dir})"
    )
    from services.cli.resolved import resolved_report

    print("\n".join(resolved_report(args.file, args.overrides, cfg)))
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    from services.common.health import check_health

    services_cfg = None
    if args.config:
        from services.common.config import load_config

        services_cfg = load_config(args.config).services
    status = asyncio.run(
        check_health(args.address, args.service, timeout=args.timeout, services_cfg=services_cfg)
    )
    print(status)
    return 0 if status == "SERVING" else 1


def build_parser() -> argparse.ArgumentParser:
    from services.common.version import __version__

    parser = argparse.ArgumentParser(
        prog="trinity", description="trinity-grpc: RL fine-tuning as four gRPC services."
    )
    parser.add_argument("--version", action="version", version=f"trinity-grpc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one service in the foreground")
    serve.add_argument("service", choices=SERVICE_NAMES)
    add_serve_args(serve)
    serve.set_defaults(func=_cmd_serve)

    run = sub.add_parser(
        "run", help="run all services of the config's mode on this machine (default: the embedded demo)"
    )
    add_serve_args(run)
    run.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="forward every log line (default: per-step lines only go to the log files)",
    )
    run.set_defaults(func=_cmd_run)

    status = sub.add_parser("status", help="health and version of each service of a config")
    add_serve_args(status)
    status.add_argument("--timeout", type=float, default=3.0, help="seconds per service (default 3)")
    status.set_defaults(func=_cmd_status)

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config file; exit 2 naming each bad key")
    check.add_argument(
        "file", nargs="?", help="the config file (or give it as --config, as to `trinity run`)"
    )
    check.add_argument("--config", dest="config_flag", default=None, metavar="FILE", help=argparse.SUPPRESS)
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.set_defaults(func=_cmd_config_check)

    from services.cli.model import add_model_parser

    add_model_parser(sub)

    from services.cli.plot import add_plot_parser

    add_plot_parser(sub)

    from services.cli.debug import add_debug_parser

    add_debug_parser(sub)

    from services.cli.view import add_view_parser

    add_view_parser(sub)

    health = sub.add_parser("health", help="gRPC health probe: exit 0 if ADDRESS is SERVING, else 1")
    health.add_argument("address", help="host:port")
    health.add_argument("--service", default="", help="service name to check (default: the whole server)")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    health.add_argument("--config", default=None, help="config whose services.tls settings the probe uses")
    health.set_defaults(func=_cmd_health)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
