"""The evaluation harness: accuracy with and without a graft, cost against the no-graft baseline,
and a replayable results file. Run with `make eval`; re-check with `python cli.py replay-eval FILE`."""
