"""bench.api's parts that need no server: the llama.cpp launcher's arguments and its patch (a stand-in for the
bindings), the peer's mode decided from what a stand-in peer Python does (the default first, the patch only
after a crash), and the medians and the target computed from the runs' figures."""

from __future__ import annotations

import types

import pytest

from bench import api
from bench.llamacpp import server


def test_the_launcher_takes_its_own_flags_and_passes_the_rest_to_llama_cpp_server_in_order():
    argv = ["--model", "g.gguf", "--no-extra-bufts", "--port", "9", "--cache", "True"]
    assert server.split_args(argv) == (True, None, ["--model", "g.gguf", "--port", "9", "--cache", "True"])
    assert server.split_args(["--model", "g.gguf"]) == (False, None, ["--model", "g.gguf"])
    assert server.split_args(["--smoke", "g.gguf"]) == (False, "g.gguf", [])
    assert server.split_args(["--no-extra-bufts", "--smoke=g.gguf"]) == (True, "g.gguf", [])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--smoke"], "--smoke needs the GGUF's path after it"),
        (["--smoke", "--no-extra-bufts"], "--smoke needs the GGUF's path after it"),
        (["--smoke", "g.gguf", "--port", "9"], "--smoke takes no server arguments, got --port 9"),
    ],
)
def test_the_launcher_refuses_a_smoke_test_it_cannot_run(argv, message):
    with pytest.raises(SystemExit) as e:
        server.split_args(argv)
    assert str(e.value) == message


def test_the_patch_turns_extra_buffer_types_off_and_keeps_every_other_default():
    calls = []

    def defaults():
        calls.append(1)
        return types.SimpleNamespace(use_extra_bufts=True, use_mmap=True, n_gpu_layers=0)

    bindings = types.SimpleNamespace(llama_model_default_params=defaults)
    server.without_extra_bufts(bindings)
    p = bindings.llama_model_default_params()
    assert (p.use_extra_bufts, p.use_mmap, p.n_gpu_layers) == (False, True, 0) and calls == [1]


def _peer(tmp_path, body: str) -> str:
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\n" + body)
    py.chmod(0o755)
    return str(py)


def test_the_peer_runs_with_its_defaults_when_they_work(tmp_path):
    mode = api.peer_mode(_peer(tmp_path, "exit 0\n"), tmp_path / "g.gguf")
    assert mode["extra_bufts"] == "on"


def test_the_peer_loses_its_extra_buffers_only_after_the_default_crashed_and_says_why(tmp_path):
    body = 'case "$*" in *--no-extra-bufts*) exit 0;; esac\necho "amx died" >&2\nkill -SEGV $$\n'
    mode = api.peer_mode(_peer(tmp_path, body), tmp_path / "g.gguf")
    assert mode["extra_bufts"] == "off"
    assert "exited with -11" in mode["why"] and "amx died" in mode["why"]


def test_a_peer_that_crashes_both_ways_is_not_run(tmp_path):
    mode = api.peer_mode(_peer(tmp_path, 'echo "no" >&2\nexit 3\n'), tmp_path / "g.gguf")
    assert set(mode) == {"not_run"} and mode["not_run"].count("exited with 3") == 2
    assert api.peer_mode(str(tmp_path / "absent"), tmp_path / "g.gguf") == {
        "not_run": f"no peer Python at {tmp_path / 'absent'} (bench/llamacpp/build.sh makes one)"
    }


def _run(c, p95, tps, errors=0):
    return {"clients": c, "ttft_p50_s": p95 / 2, "ttft_p95_s": p95, "tokens_per_s": tps, "error_count": errors}


def test_medians_over_the_repeats_that_ran_and_the_target_from_them():
    repeats = [
        {"kvgraft": {"runs": [_run(8, 1.0, 50), _run(32, 9.0, 40)]}, "llamacpp": {"runs": [_run(8, 2.0, 30), _run(32, 8.0, 30)]}},
        {"kvgraft": {"runs": [_run(8, 3.0, 40), _run(32, 7.0, 44)]}, "llamacpp": {"not_run": "crashed"}},
    ]
    kv, peer = api.medians(repeats, "kvgraft"), api.medians(repeats, "llamacpp")
    assert [(r["clients"], r["repeats"], r["ttft_p95_s"], r["tokens_per_s"]) for r in kv] == [
        (8, 2, 2.0, 45.0),
        (32, 2, 8.0, 42.0),
    ]
    assert [r["repeats"] for r in peer] == [1, 1]
    v = api.verdict(kv, peer)
    assert v["at_clients"]["8"]["holds"] and v["at_clients"]["32"]["holds"] and v["holds"]
    slower = api.verdict([_run(8, 2.0, 45), _run(32, 8.1, 42)], peer)
    assert slower["at_clients"]["8"]["holds"] and not slower["at_clients"]["32"]["holds"] and not slower["holds"]
    fewer = api.verdict([_run(8, 2.0, 29), _run(32, 8.0, 42)], peer)
    assert not fewer["at_clients"]["8"]["holds"] and not fewer["holds"]
    erring = api.verdict([_run(8, 1.0, 45, errors=1), _run(32, 1.0, 42)], peer)
    assert not erring["holds"]
    assert api.verdict(kv, [])["holds"] is False  # nothing to compare with is not a pass
