"""kvgraft's command line: `commands` (deposit, ask, verify, seed, solve, selftest, serve), `upkeep` (export,
import, rebuild, fsck, replay, list, show, delete), `evaluation` (replay-eval) and `judging` (judge: the one
judge on an answer). Each command calls one service and formats its result; `main` is what `python cli.py` and the `kvgraft` console script run."""

from cli.commands import main

__all__ = ["main"]
