"""What OpenAI's requests and responses look like to kvgraft's server: the fields it takes and those it refuses,
each request field read and bounded, the error shape, and the response bodies with the answer's proof (the
`kvgraft` object). Pure functions of JSON values and `AnswerResult`s: no HTTP, no model, no guard.
"""

from dataclasses import dataclass
from pathlib import Path

from starlette.responses import JSONResponse

import settings
from access.guard import Refused
from errors import ArtifactNotFound, InputTooLong, IntegrityError, InvalidInput, KvgraftError, NotReady, VerificationFailed
from graft_core.logprobs import MAX_TOP as MAX_TOP_LOGPROBS  # torch-free: a constant and a dataclass
from services.limits import MAX_QUESTION_CHARS, MAX_TEXT_CHARS

ANONYMOUS_KEYS = frozenset({"", "anonymous", "none", "EMPTY"})  # what clients that must send a key send for none
MAX_BODY = 256 * 1024  # bytes of a completion's JSON body
MAX_DEPOSIT_BODY = 12 * MAX_TEXT_CHARS + 64 * 1024  # the admin's deposit: its longest text, every character JSON-escaped
MAX_MESSAGES = 32
DEFAULT_MAX_TOKENS = 16  # the chat's default answer length
# fields of OpenAI's requests this server refuses (400) when they ask for anything but the default
UNSUPPORTED = {
    "n": lambda v: v not in (None, 1),
    "best_of": lambda v: v not in (None, 1),
    "suffix": lambda v: v not in (None, ""),
    "logit_bias": lambda v: v not in (None, {}),
    "presence_penalty": lambda v: v not in (None, 0, 0.0),
    "frequency_penalty": lambda v: v not in (None, 0, 0.0),
    "tools": lambda v: v not in (None, []),
    "tool_choice": lambda v: v not in (None, "none", "auto"),
    "functions": lambda v: v not in (None, []),
    "function_call": lambda v: v not in (None, "none", "auto"),
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "modalities": lambda v: v not in (None, ["text"]),
    "audio": lambda v: v is not None,
    "prediction": lambda v: v is not None,
    "reasoning_effort": lambda v: v is not None,
    "web_search_options": lambda v: v is not None,
}
ACCEPTED = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop"}
ACCEPTED |= {"stream", "stream_options", "user", "kvgraft", "metadata", "store", "parallel_tool_calls", "service_tier"}
ACCEPTED |= {"logprobs", "top_logprobs", "echo"}
MAX_PROMPTS = 16  # prompts in one completions request (a batch); each is answered in turn, one admission place
MAX_PROMPT_IDS = 8192  # token ids in one prompt given as ids
EXTENSION_FIELDS = {"artifacts", "graft", "check", "k"}


class ApiError(Exception):
    """An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"retry-after": "1"} if self.status == 429 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def api_error(exc: KvgraftError) -> ApiError:
    """A kvgraft error as the API's: its message (which says what to do) and the status a client acts on."""
    msg = str(exc)
    if isinstance(exc, Refused):
        if "needs the admin token" in msg:  # an anonymous caller asked for the admin's work
            return ApiError(403, msg, "permission_error", code="admin_only")
        if "too many wrong admin tokens" not in msg.lower() and ("admin token" in msg.lower() or "admin actions" in msg.lower()):
            return ApiError(401, msg, "authentication_error", code="invalid_api_key")
        return ApiError(429, msg, "rate_limit_error", code="rate_limit_exceeded")  # a lockout or a busy share
    if isinstance(exc, InputTooLong):
        return ApiError(400, msg, code="context_length_exceeded")
    if isinstance(exc, InvalidInput):
        return ApiError(400, msg)
    if isinstance(exc, ArtifactNotFound):
        return ApiError(404, msg, param="kvgraft.artifacts", code="artifact_not_found")
    if isinstance(exc, VerificationFailed):
        return ApiError(422, msg, "gate_refused", code="verification_failed")
    if isinstance(exc, IntegrityError):
        return ApiError(409, msg, "integrity_error", code="quarantined" if "quarantined" in msg else "integrity")
    if isinstance(exc, NotReady):
        return ApiError(503, msg, "server_error", code="not_ready")
    return ApiError(500, msg, "server_error")


def model_id(library) -> str:
    """The one model this server lists: the library's model name (a path's last part), else the packaged default."""
    name = library.model_name or settings.get("KVGRAFT_MODEL") or "packaged:gemma-3-270m"
    return Path(name).name if "/" in name and not name.startswith("packaged:") else name


def number(body: dict, name: str, default, low: float, high: float, low_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not (low < v if low_open else low <= v) or v > high:
        bound = f"above {low:g}" if low_open else f"at least {low:g}"
        raise ApiError(400, f"{name} must be a number {bound} and at most {high:g}, got {str(v)[:40]!r}", param=name)
    return float(v)


def _text_content(content, where: str) -> str:
    """A message's content: a string, or a list of text parts (anything else is refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        if all(isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise ApiError(
        400, f"{where}.content must be text (a string or text parts); images, audio and files are not supported", param=where
    )


@dataclass(frozen=True)
class Prompt:
    """One prompt of a completions request: its text, and its token ids when it came as ids (then the text is theirs,
    decoded by the caller of `prompts`, and only names it for retrieval and the ledger)."""

    text: str
    ids: tuple[int, ...] = ()


def _id_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)


def prompts(body: dict) -> list[Prompt]:
    """A completions request's prompts: one string, a list of strings (a batch), one list of token ids, or a list
    of such lists (a batch), as OpenAI's legacy completions and lm-evaluation-harness send them. Ids are bounded
    here and checked against the vocabulary by the library; a string is bounded as a question is."""
    p = body.get("prompt")
    if isinstance(p, str) or _id_list(p):
        p = [p]
    shape = "prompt must be a string, a list of strings, a list of token ids or a list of such lists"
    if not isinstance(p, list) or not p or not all(isinstance(x, str) or _id_list(x) for x in p):
        raise ApiError(400, shape, param="prompt")
    if len(p) > MAX_PROMPTS:
        raise ApiError(400, f"at most {MAX_PROMPTS} prompts in one request, got {len(p)}: send several requests", param="prompt")
    out = []
    for i, x in enumerate(p):
        where = "prompt" if len(p) == 1 else f"prompt[{i}]"
        if isinstance(x, str):
            if not x.strip():
                raise ApiError(400, f"{where} is empty", param="prompt")
            if len(x) > MAX_QUESTION_CHARS:
                raise ApiError(400, f"{where} is {len(x):,} characters; the limit is {MAX_QUESTION_CHARS:,}", param="prompt")
            out.append(Prompt(x))
        else:
            if len(x) > MAX_PROMPT_IDS:
                raise ApiError(400, f"{where} holds {len(x):,} token ids; the limit is {MAX_PROMPT_IDS:,}", param="prompt")
            out.append(Prompt("", tuple(x)))
    return out


@dataclass(frozen=True)
class LogprobAsk:
    """What a request asks of log-probabilities: none (`top` None), or each token's with `top` alternatives; `echo`
    (completions) the prompt's tokens too, its text before the completion's."""

    top: int | None = None
    echo: bool = False


def logprob_ask(body: dict, chat: bool) -> LogprobAsk:
    """Chat: `logprobs` true/false and `top_logprobs` 0..20 (which needs logprobs); completions: `logprobs` 0..20
    (the alternatives per token, as the legacy API's integer) and `echo`."""
    echo = body.get("echo", False)
    if echo is None:
        echo = False
    if chat:
        on, top = body.get("logprobs"), body.get("top_logprobs")
        if on is not None and not isinstance(on, bool):
            raise ApiError(400, "logprobs must be true or false", param="logprobs")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise ApiError(400, f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}", param="top_logprobs")
        if top and not on:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if "echo" in body:
            raise ApiError(400, "echo is a completions parameter: chat answers do not repeat the prompt", param="echo")
        return LogprobAsk((top or 0) if on else None)
    n = body.get("logprobs")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS):
        raise ApiError(
            400, f"logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS} (alternatives per token)", param="logprobs"
        )
    if not isinstance(echo, bool):
        raise ApiError(400, "echo must be true or false", param="echo")
    if body.get("top_logprobs") is not None:
        raise ApiError(
            400, "top_logprobs is a chat parameter: completions take logprobs as the number of alternatives", param="top_logprobs"
        )
    return LogprobAsk(n, echo)


def chat_question(body: dict) -> str:
    """The text a chat answers: its last message, which must be the user's. Every message is checked and bounded;
    earlier turns are not part of the prompt (the base model answers one question, as the web chat does). A
    completion's prompts are `prompts`'."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise ApiError(400, f"at most {MAX_MESSAGES} messages, got {len(messages)}", param="messages")
    texts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise ApiError(400, f"messages[{i}] must have a role of system, developer, user or assistant", param="messages")
        texts.append(_text_content(m.get("content"), f"messages[{i}]"))
        if len(texts[-1]) > MAX_QUESTION_CHARS:
            raise ApiError(
                400, f"messages[{i}] is {len(texts[-1]):,} characters; the limit is {MAX_QUESTION_CHARS:,}", param="messages"
            )
    if messages[-1]["role"] != "user":
        raise ApiError(400, "the last message must be the user's: it is the question answered", param="messages")
    if not texts[-1].strip():
        raise ApiError(400, "the question is empty", param="messages")
    return texts[-1]


def stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop must be a string or a list of strings", param="stop")
    return tuple(stop)


def finish_reason(result) -> str:
    return "length" if result.stopped == "length" else "stop"


def usage(result) -> dict:
    prompt = result.grafted_tokens + result.computed_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": result.decode_tokens,
        "total_tokens": prompt + result.decode_tokens,
        "prompt_tokens_details": {"cached_tokens": result.grafted_tokens},
    }


def kvgraft_object(result) -> dict:
    """What every response carries of the answer's proof: the tier, what was grafted and retrieved, the state
    proof (BLAKE3 of the served state, or the first use's probe), the exactness check's logits hashes when it
    ran, the output's hashes and token ids, and the ledger id that `cli.py replay` re-runs."""
    proof = result.proof.as_dict() if result.proof is not None else None
    check = None
    if result.check is not None:
        check = {k: getattr(result.check, k) for k in ("exact", "fresh_sha256", "grafted_sha256", "rows", "tier")}
    return {
        "tier": result.tier,
        "artifact_ids": list(result.artifact_ids),
        "retrieved": [
            {"id": r.id, "score": r.score, "relevant": r.relevant, "reason": r.reason, "use": r.use} for r in result.retrieved
        ],
        "state_proof": proof,
        "check": check,
        "grafted_tokens": result.grafted_tokens,
        "computed_tokens": result.computed_tokens,
        "decode_tokens": result.decode_tokens,
        "output_token_ids": list(result.output_token_ids),
        "output_sha256": result.output_sha256,
        "logits_sha256": result.logits_sha256,
        "ledger_id": result.ledger_id,
        "ttft_s": result.ttft_s,
        "sampling": None
        if result.seed is None
        else {"temperature": result.temperature, "top_p": result.top_p, "seed": result.seed},
        "note": result.note,
        "scope": result.scope,
    }


def completion_logprobs(result, ask: LogprobAsk, offset: int = 0) -> dict:
    """The legacy completions' logprobs object: `tokens`, `token_logprobs`, `top_logprobs` (a dict of token text to
    log-probability per position; None for the prompt's first token) and `text_offset` (each token's start in the
    returned text, which begins `offset` characters in: after the echoed prompt, or at 0)."""
    tokens, values, tops, offsets = [], [], [], []
    at = 0
    for lp in (*(result.prompt_logprobs if ask.echo else ()), *result.output_logprobs):
        tokens.append(lp.token)
        values.append(lp.logprob)
        # most likely last: where two tokens share a text, the likelier one's value is the one kept
        tops.append(None if lp.logprob is None else {s: v for _, s, v in reversed(lp.top)})
        offsets.append(at)
        at += len(lp.token)
    if not ask.echo:
        offsets = [offset + o for o in offsets]
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _bytes(s: str) -> list[int]:
    return list(s.encode("utf-8", "backslashreplace"))


def chat_logprobs(result) -> dict:
    """Chat's logprobs object: one entry per generated token with its text, bytes, value and `top_logprobs`."""
    content = [
        {
            "token": lp.token,
            "logprob": lp.logprob,
            "bytes": _bytes(lp.token),
            "top_logprobs": [{"token": s, "logprob": v, "bytes": _bytes(s)} for _, s, v in lp.top],
        }
        for lp in result.output_logprobs
    ]
    return {"content": content, "refusal": None}


def _choice(i: int, result, chat: bool, ask: LogprobAsk, echoed: str) -> dict:
    if chat:
        lp = chat_logprobs(result) if ask.top is not None else None
        return {
            "index": i,
            "message": {"role": "assistant", "content": result.answer},
            "logprobs": lp,
            "finish_reason": finish_reason(result),
        }
    text = echoed + result.answer if ask.echo else result.answer
    lp = completion_logprobs(result, ask) if ask.top is not None else None
    return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish_reason(result)}


def whole_response(results, rid: str, created: int, mid: str, chat: bool, ask: LogprobAsk = LogprobAsk(), echoed=()) -> dict:
    """The whole response to a request: one choice per result (a batch's prompts in order), the usage summed, and
    the kvgraft object of each (one object for one answer; a list for a batch). `echoed[i]` is prompt i's text as
    an echo shows it."""
    results = list(results) if isinstance(results, list | tuple) else [results]
    echoed = list(echoed) or [""] * len(results)
    choices = [_choice(i, r, chat, ask, echoed[i]) for i, r in enumerate(results)]
    each = [usage(r) for r in results]
    total = {k: sum(u[k] for u in each) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    total["prompt_tokens_details"] = {"cached_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in each)}
    proofs = [kvgraft_object(r) for r in results]
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": mid,
        "choices": choices,
        "usage": total,
        "kvgraft": proofs[0] if len(proofs) == 1 else proofs,
    }
