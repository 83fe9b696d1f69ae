"""Every KVGRAFT_* environment variable, declared once and read through one parser with one error shape.

Owns the names, kinds, defaults, bounds and one-line meanings; `get` reads a variable when it is called
(so a test's monkeypatched environment counts) and refuses a bad value with
`InvalidSetting("KVGRAFT_<NAME> must be <what>, got <value>")`. Knows nothing about what a value is used for.
Writing a variable (into a child process's environment) is not reading it and happens wherever it is
needed. `python settings.py` prints the README's configuration rows.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from errors import InvalidSetting

KINDS = ("int", "float", "bool", "choice", "path", "url", "token", "text", "size", "networks")
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")  # no sign, spaces, `_` or leading zeros
_NUMBER = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?|\.[0-9]+")  # plain decimal: no sign, exponent, nan or inf
_URL = re.compile(r"([a-z][a-z0-9+.-]*)://(\S*)")
_SIZE = re.compile(r"[0-9]+(b|kb|mb|gb|tb)")  # what Gradio's max_file_size parses
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One variable. `default` is the value when the variable is unset or blank (a callable is called
    then, for defaults under the user's home); `shown` is how the README shows a default that is not a
    plain value. `low`/`high` bound int and float kinds (`above`: float strictly greater); `choices` and
    `schemes` restrict choice and url kinds."""

    name: str
    kind: str
    default: object
    meaning: str
    low: float | None = None
    high: float | None = None
    above: float | None = None
    choices: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ()
    shown: str = ""

    def __post_init__(self):
        assert self.kind in KINDS, f"{self.name}: unknown kind {self.kind!r}"
        assert self.kind != "choice" or self.choices, f"{self.name}: a choice needs its choices"

    def what(self) -> str:
        """What a good value is, as the error message says it after "must be"."""
        if self.kind == "int":
            if self.high is None:
                return f"a whole number of at least {self.low:,}"
            return f"a whole number from {self.low:,} to {self.high:,}"
        if self.kind == "float":
            if self.above is not None:
                return f"a number above {self.above:g}"
            return f"a number of at least {self.low:g}"
        if self.kind == "bool":
            return "1 or 0 (also true/false, yes/no, on/off)"
        if self.kind == "choice":
            options = list(self.choices) + (["unset"] if self.default is None else [])
            return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
        if self.kind == "url":
            if self.schemes:
                return f"a {' or '.join(s + '://' for s in self.schemes)} URL"
            return "a URL like scheme://..."
        if self.kind == "token":
            return "printable text without spaces"
        if self.kind == "size":
            return "a size like 256mb (a whole number and b, kb, mb, gb or tb)"
        if self.kind == "networks":
            return "the proxies' addresses or networks, comma-separated (like 127.0.0.1 or 10.0.0.0/8), or 0 for none"
        return "text without control characters"  # path, text

    def parse(self, raw: str) -> object:
        """`raw` (already stripped, not blank) as this setting's value, or InvalidSetting."""
        value = _parse(self, raw)
        if value is None:
            raise InvalidSetting(f"{self.name} must be {self.what()}, got {raw!r}")
        return value

    def default_value(self) -> object:
        return self.default() if callable(self.default) else self.default


def _parse(s: Setting, raw: str) -> object | None:
    """The value, or None where `raw` is not one."""
    if any(not c.isprintable() for c in raw):
        return None
    if s.kind == "int":
        n = int(raw) if _DECIMAL.fullmatch(raw) else None
        ok = n is not None and n >= s.low and (s.high is None or n <= s.high)
        return n if ok else None
    if s.kind == "float":
        x = float(raw) if _NUMBER.fullmatch(raw) else math.nan
        ok = x > s.above if s.above is not None else x >= s.low
        return x if ok else None
    if s.kind == "bool":
        word = raw.lower()
        return True if word in _TRUE else False if word in _FALSE else None
    if s.kind == "choice":
        return raw.lower() if raw.lower() in s.choices else None
    if s.kind == "url":
        m = _URL.fullmatch(raw)
        if not m or (s.schemes and m.group(1) not in s.schemes):
            return None
        if m.group(1) in ("http", "https"):
            return raw.rstrip("/") if m.group(2).split("/")[0] else None  # a host, then an optional path
        return raw
    if s.kind == "token":
        return raw if not any(c.isspace() for c in raw) else None
    if s.kind == "size":
        size = raw.replace(" ", "").lower()
        return size if _SIZE.fullmatch(size) else None
    if s.kind == "networks":
        return _networks(raw)
    if s.kind == "path":
        return Path(raw)
    return raw  # text


def _networks(raw: str) -> tuple[str, ...] | None:
    """Comma-separated addresses or networks, each written as its network (10.0.0.7 -> 10.0.0.7/32), or
    None. A word for off (0, false, no, off) is no network; a word for on (1, true, ...) names none and is
    refused, as no value means "believe anyone's forwarded headers"."""
    if raw.lower() in _FALSE:
        return ()
    try:
        return tuple(str(ipaddress.ip_network(part.strip(), strict=False)) for part in raw.split(","))
    except ValueError:
        return None


def _home_share() -> Path:
    return Path.home() / ".local" / "share" / "kvgraft"


def _cache(what: str) -> Callable[[], Path]:
    return lambda: Path.home() / ".cache" / "kvgraft" / what


_DECLARED = (
    # the store and the model
    Setting("KVGRAFT_HOME", "path", _home_share, "the store: catalog, blobs, index, ledger", shown="`~/.local/share/kvgraft`"),
    Setting(
        "KVGRAFT_DB_URL",
        "url",
        None,
        "the catalog's database (postgresql+psycopg://... to share one)",
        shown="SQLite in the home",
    ),
    Setting(
        "KVGRAFT_MODEL",
        "text",
        None,
        "a Hugging Face causal LM folder or hub id, a Gemma 3 or Llama-family .gguf file, packaged:smollm2-135m-instruct "
        "or packaged:qwen2.5-coder-1.5b-instruct",
        shown="packaged Gemma 3 270M",
    ),
    Setting(
        "KVGRAFT_MACHINE_BOUND",
        "bool",
        False,
        "load a model outside the numerical definition anyway; its answers are exact on this machine class only",
    ),
    Setting(
        "KVGRAFT_MODEL_CACHE",
        "path",
        _cache("models"),
        "converted models, shared by every store",
        shown="`~/.cache/kvgraft/models`",
    ),
    Setting("KVGRAFT_KERNEL_CACHE", "path", _cache("kernels"), "where the kernels are built", shown="`~/.cache/kvgraft/kernels`"),
    Setting(
        "KVGRAFT_THREADS", "int", 2, "intra-op threads every process computes with; part of the fingerprint", low=1, high=256
    ),
    Setting(
        "KVGRAFT_LINEAR",
        "choice",
        "fma16",
        "matrix products: kvgraft's fma16 kernel (float32); int8: the same, with each row of x quantised to int8 per block "
        "where a weight's GGUF blocks are Q8_0, Q5_0, Q4_K or Q6_K (integer sums, i8dot-v1, a record of its own); or torch's (MKL)",
        choices=("fma16", "int8", "torch"),
    ),
    Setting(
        "KVGRAFT_ISA",
        "choice",
        None,
        "which build of fma16 runs (all compute the same bits); unset: the best this CPU has",
        choices=("avx512", "avx2", "portable"),
        shown="the best this CPU has",
    ),
    Setting("KVGRAFT_PRODUCTS", "choice", None, "with torch's products: plain turns off their faster calls", choices=("plain",)),
    # a serving process (the web app, a replica)
    Setting("KVGRAFT_WARM_PROOFS", "int", 64, "newest artifacts proved after start-up; 0 turns it off", low=0, high=100_000),
    Setting(
        "KVGRAFT_DECODE_TOGETHER", "int", 8, "answers run at once, their steps taken together; 1: one at a time", low=1, high=8
    ),
    Setting(
        "KVGRAFT_LEDGER_DAYS",
        "float",
        None,
        "ledger rows older than this many days are pruned",
        above=0,
        shown="unset (keep every row)",
    ),
    Setting(
        "KVGRAFT_LEDGER_MAX_ROWS",
        "int",
        100_000,
        "only the newest this many ledger rows are kept",
        low=1,
    ),
    # the web app
    Setting(
        "KVGRAFT_ADMIN_TOKEN", "token", "", "the secret that deposits, imports and deletes need", shown="unset (deposits off)"
    ),
    Setting("KVGRAFT_MAX_UPLOAD", "size", "256mb", "largest file the web app accepts (uploads are the admin's only)"),
    Setting("KVGRAFT_UPLOAD_BUDGET", "size", "1gb", "bytes one caller's uploads may hold in the upload folder at once"),
    Setting("KVGRAFT_UPLOAD_TOTAL", "size", "2gb", "bytes the upload folder may hold at once, every caller together"),
    Setting("KVGRAFT_UPLOAD_FREE_FLOOR", "size", "2gb", "free disk under the upload folder below which no upload is written"),
    Setting("KVGRAFT_PER_ADDRESS", "int", 1, "model slots one address holds at once (at most the slots less one)", low=1),
    Setting("KVGRAFT_ADDRESS_DEPTH", "int", 4, "model requests one address may have queued or running; more are refused", low=1),
    Setting("KVGRAFT_JOINS_PER_S", "float", 4.0, "requests that queue or run work one address may start per second", low=0.1),
    Setting("KVGRAFT_JOINS_BURST", "int", 8, "how many of those one address may start at once before the rate applies", low=1),
    Setting(
        "KVGRAFT_ANON_PROMPT_TOKENS", "int", 256, "prompt tokens of one question without the admin token", low=16, high=32_768
    ),
    Setting(
        "KVGRAFT_ANON_NEW_TOKENS",
        "int",
        32,
        "decode steps of one answer without the admin token, on the page, /v1 and every replica",
        low=1,
        high=512,  # services.limits.MAX_NEW_TOKENS, every caller's bound
    ),
    Setting(
        "KVGRAFT_TRUST_PROXY",
        "networks",
        None,
        "proxies whose X-Forwarded-For is believed",
        shown="none (private networks on a Space)",
    ),
    Setting(
        "KVGRAFT_PUBLIC_URL",
        "url",
        None,
        "the URL users reach the web app at; Gradio's root, whatever Host a request claims",
        schemes=("http", "https"),
        shown="the bind address (https://$SPACE_HOST on a Space)",
    ),
    Setting(
        "KVGRAFT_BACKEND_URL",
        "url",
        "",
        "the app as the front end of a deployment at this URL",
        schemes=("http", "https"),
        shown="unset (own store)",
    ),
    Setting("KVGRAFT_BACKEND_CONCURRENCY", "int", 4, "as a front end: requests sent to the deployment at once", low=1, high=16),
    # a Ray Serve deployment (serving/settings.py)
    Setting("KVGRAFT_BLOB_ROOT", "path", None, "the shared blob folder every replica reads", shown="`<home>/blobs`"),
    Setting(
        "KVGRAFT_REPLICA_STATE",
        "path",
        lambda: Path(tempfile.gettempdir()) / "kvgraft-replicas",
        "per-replica local state (index cache)",
        shown="`$TMPDIR/kvgraft-replicas`",
    ),
    Setting(
        "KVGRAFT_SERVE_EMBEDDER", "choice", "minilm", "the replicas' embedder (hash: the test double)", choices=("minilm", "hash")
    ),
    Setting("KVGRAFT_SERVE_REPLICAS", "int", 0, "a fixed replica count; 0 autoscales", low=0),
    Setting("KVGRAFT_SERVE_MIN_REPLICAS", "int", 1, "autoscaling: fewest replicas", low=0),
    Setting("KVGRAFT_SERVE_MAX_REPLICAS", "int", 4, "autoscaling: most replicas", low=1),
    Setting("KVGRAFT_SERVE_TARGET_ONGOING", "float", 1.0, "autoscaling: requests per replica aimed at", low=0),
    Setting("KVGRAFT_SERVE_MAX_ONGOING", "int", 2, "requests one replica holds at once", low=1),
    Setting("KVGRAFT_SERVE_DRAIN_S", "float", 120.0, "seconds a stopping replica may finish what it holds", low=0),
    Setting("KVGRAFT_SERVE_HEALTH_PERIOD_S", "float", 10.0, "seconds between health checks", low=0),
    Setting("KVGRAFT_SERVE_REPLICA_CPUS", "float", 1.0, "Ray CPUs reserved per replica", low=0),
    Setting("KVGRAFT_SERVE_THREADS", "int", 0, "KVGRAFT_THREADS inside the replicas; 0 inherits", low=0, high=256),
    Setting("KVGRAFT_SERVE_HOST", "text", "127.0.0.1", "the deployment's HTTP host"),
    Setting("KVGRAFT_SERVE_PORT", "int", 8000, "the deployment's HTTP port", low=0, high=65_535),
    # test and bench hooks
    Setting("KVGRAFT_TEST_SLOW_IMPORT_S", "float", 0.0, "test-only: the web-framework import stage waits this long", low=0),
    Setting("KVGRAFT_TEST_SLOW_LOAD_S", "float", 0.0, "test-only: the model-load stage sleeps this long", low=0),
    Setting(
        "KVGRAFT_SCREENSHOTS",
        "path",
        lambda: Path(tempfile.gettempdir()) / "kvgraft-screenshots",
        "test-only: where the browser test saves its screenshots",
        shown="`$TMPDIR/kvgraft-screenshots`",
    ),
    Setting("KVGRAFT_BROWSER_TINY", "bool", False, "test-only: the browser test uses the tiny model"),
    Setting(
        "KVGRAFT_BENCH_LINEAR", "choice", None, "bench-only: a kernels variant's products through OpenBLAS", choices=("openblas",)
    ),
    Setting("KVGRAFT_PEER_PYTHON", "path", Path("/tmp/peer/venv/bin/python"), "bench-only: a python with llama-cpp-python"),
    Setting("KVGRAFT_PEER_GGUF", "path", Path("/tmp/gemma.gguf"), "bench-only: the GGUF the peer loads"),
    Setting(
        "KVGRAFT_RECURRING_BUDGET",
        "int",
        4096,
        "eval-only: the recurring case's sampling budget per problem, every prompt and decode token",
        low=64,
        high=1_000_000,
    ),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}
assert len(SETTINGS) == len(_DECLARED), "a variable is declared twice"

_UNSET = object()


def get(name: str, environ: Mapping[str, str] | None = None, *, default: object = _UNSET) -> object:
    """The value of `name` in `environ` (default: os.environ, read now). Unset or blank gives `default`
    where given, else the declared default; a bad value raises InvalidSetting."""
    setting = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return setting.default_value() if default is _UNSET else default
    return setting.parse(raw)


_UNITS = {"b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40}


def size_bytes(size: str) -> int:
    """A `size` setting's value (like "256mb", as Gradio's max_file_size reads it: 1 kb = 1,024 bytes) in bytes."""
    m = _SIZE.fullmatch(size.replace(" ", "").lower())
    assert m, f"not a size: {size!r}"
    return int(size.replace(" ", "").lower()[: -len(m.group(1))]) * _UNITS[m.group(1)]


def table() -> str:
    """The README's configuration rows, one per variable: | `KVGRAFT_<NAME>` | default | meaning |."""
    rows = []
    for s in _DECLARED:
        shown = s.shown or ("unset" if s.default in (None, "") else f"`{s.default}`")
        rows.append(f"| `{s.name}` | {shown} | {s.meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
