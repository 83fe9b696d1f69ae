"""What a request body may hold before any handler reads it: `read_json` (JSON whose nesting is bounded and whose
every string and key is valid Unicode, a refusal naming the field otherwise), `text_problem` (text that cannot be
encoded, NULs), `remote_file` (a file named by URL, which Gradio would download), and `TextGate`, the ASGI middleware
that refuses any of them (400), or a body over MAX_BODY (413), before the page parses it. Gradio-free: the page and
the API share it.
"""

from __future__ import annotations

import json
import logging
import math

from errors import InvalidInput

log = logging.getLogger("kvgraft.refused")

MAX_DEPTH = 32  # nesting levels of a request's JSON: an OpenAI chat is 5 deep (body, messages, [i], content, [j])


class BodyRefused(InvalidInput):
    """A request body refused before any handler reads it; `field` names where (a JSON path such as
    `messages[0].content`, or "body" for the whole)."""

    def __init__(self, message: str, field: str = "body"):
        super().__init__(message)
        self.field = field


def _shown(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode("utf-8")[:80]


def json_problem(value: object, max_depth: int = MAX_DEPTH, surrogates: bool = True) -> BodyRefused | None:
    """Why a parsed JSON value is refused, or None: nested past `max_depth` levels, or a string or key holding a
    lone surrogate (U+D800-U+DFFF: a `\\ud800` escape without its pair), which no tokenizer, log line or reply can
    encode (unless `surrogates` is False: the page words that refusal itself, `text_problem`). Iterative: no value
    makes it recurse."""
    stack: list[tuple[object, str, int]] = [(value, "", 1)]
    while stack:
        v, path, depth = stack.pop()
        if depth > max_depth:
            return BodyRefused(
                f"the JSON body is nested deeper than {max_depth} levels (at {path or 'its top'}): send a flatter body",
                path or "body",
            )
        if isinstance(v, str):
            if surrogates and not v.isascii() and any("\ud800" <= c <= "\udfff" for c in v):
                where = path or "body"
                return BodyRefused(
                    f"{where} holds a lone surrogate (U+D800-U+DFFF), which is not valid Unicode text: send valid UTF-8 "
                    "(an escaped surrogate must be one half of a pair)",
                    where,
                )
        elif isinstance(v, dict):
            for k, x in v.items():
                here = f"{path}.{_shown(k)}" if path else _shown(k)
                if surrogates and not k.isascii() and any("\ud800" <= c <= "\udfff" for c in k):
                    return BodyRefused(
                        f"a key of {path or 'the body'} ({here!r}) holds a lone surrogate: send valid UTF-8", path or "body"
                    )
                stack.append((x, here, depth + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
    return None


NOT_FINITE = "the JSON body holds a number that is not finite ({text}): JSON numbers are finite, send one"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # '1e999' parses to inf, which no reply (nor FastAPI's error echo) can encode
        raise BodyRefused(NOT_FINITE.format(text=text[:40]))
    return value


def _no_constant(text: str) -> float:
    raise BodyRefused(NOT_FINITE.format(text=text))  # NaN, Infinity, -Infinity: Python's extensions to JSON


def loads(data: bytes | str) -> object:
    """`json.loads` of standard JSON only: a number that is not finite (NaN, Infinity, 1e999) is BodyRefused."""
    return json.loads(data, parse_float=_finite, parse_constant=_no_constant)


def read_json(data: bytes, max_depth: int = MAX_DEPTH) -> object:
    """The JSON value of a request body, or BodyRefused saying what to send: bytes that are not UTF-8 JSON, JSON
    nested past `max_depth` (refused whatever its depth: the parser's own recursion limit is a refusal too, never
    an internal error), or text that is not valid Unicode, naming the field."""
    try:
        value = loads(data)
    except RecursionError:
        raise BodyRefused(f"the JSON body is nested deeper than {max_depth} levels: send a flatter body") from None
    except (ValueError, UnicodeDecodeError):
        raise BodyRefused("the request body must be JSON (UTF-8)") from None
    problem = json_problem(value, max_depth)
    if problem is not None:
        raise problem
    return value


def text_problem(*values: object, nul: bool = True) -> str | None:
    """A clear message when some text among `values` (strings, also inside lists and dicts, as a chat's
    history) cannot be encoded as UTF-8 (a lone surrogate such as U+D800: echoed, it breaks the reply's
    JSON and the stream with it) or, with `nul`, holds a NUL (binary data, nothing for the model); else None."""
    lone = nuls = 0
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            nuls += v.count("\x00")
            if not v.isascii():
                lone += sum(1 for c in v if "\ud800" <= c <= "\udfff")
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    if lone:
        return f"The text holds {lone} lone surrogate character(s) (U+D800-U+DFFF), which cannot be encoded: send valid Unicode text."
    if nul and nuls:
        return f"The text holds {nuls} NUL bytes (binary data?): send plain text."
    return None


REMOTE_FILE = (
    "A file given by URL ({url}) is not fetched by this app: Gradio would download it onto the server's disk "
    "before any handler runs. Upload the file instead (the admin's)."
)


def remote_file(value: object) -> str | None:
    """A clear message when `value` (a request's JSON) names a file by an http(s) URL, which Gradio's
    preprocessing downloads into its cache for any input component before the handler can refuse anything
    (Gradio's FileData: a dict with a `path` and `meta._type` "gradio.FileData"); else None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            path, meta = v.get("path"), v.get("meta")
            if isinstance(path, str) and isinstance(meta, dict) and path.startswith(("http://", "https://")):
                return REMOTE_FILE.format(url=path[:80])
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


MAX_BODY = 16 * 1024 * 1024  # a JSON request (not an upload) larger than this is refused: no question or deposit needs it


class TextGate:
    """ASGI middleware at the edge: a request body that is not an upload is read (at most MAX_BODY bytes,
    else 413) and, where it is JSON holding text `text_problem` refuses, answered 400 with that message
    before Gradio parses it: Gradio's own checks (a dropdown's "not in the list of choices") echo the
    value, and the echo breaks the reply. JSON naming a file by URL (`remote_file`) is refused the same way:
    Gradio would download it into its cache, for anyone. Anything else passes through unchanged."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        if any(k == b"content-type" and b"multipart" in v.lower() for k, v in scope.get("headers") or []):
            return await self.app(scope, receive, send)  # an upload: access.uploads.UploadGate admitted it (the admin's)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > MAX_BODY:
                return await _answer(send, 413, f"The request is over {MAX_BODY // 2**20} MiB: send less.")
        body = b"".join(chunks)
        try:
            value = loads(body) if body else None
            deep = json_problem(value, surrogates=False) if body else None
            problem = (str(deep) if deep else None) or (text_problem(value, nul=False) or remote_file(value) if body else None)
        except RecursionError:  # nested past the parser's own limit
            problem = f"The JSON body is nested deeper than {MAX_DEPTH} levels: send a flatter body."
        except BodyRefused as exc:  # a number that is not finite
            problem = str(exc)
        except ValueError:  # not JSON (or not UTF-8): Gradio answers it as it would
            problem = None
        if problem:
            log.info("refused: %s", problem)
            return await _answer(send, 400, problem)
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _answer(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
