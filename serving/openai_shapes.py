"""What OpenAI's requests and responses look like to kvgraft's server: the fields it takes and those it refuses,
each request field read and bounded, the error shape, and the response bodies with the answer's proof (the
`kvgraft` object). Pure functions of JSON values and `AnswerResult`s: no HTTP, no model, no guard.
"""

from pathlib import Path

from starlette.responses import JSONResponse

import settings
from access.guard import Refused
from errors import ArtifactNotFound, InputTooLong, IntegrityError, InvalidInput, KvgraftError, NotReady, VerificationFailed
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
    "logprobs": lambda v: v not in (None, False, 0),
    "top_logprobs": lambda v: v not in (None, 0),
    "echo": lambda v: v not in (None, False),
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


def question(body: dict, chat: bool) -> str:
    """The text answered: a completion's prompt, or a chat's last message, which must be the user's. Every
    message is checked and bounded; earlier turns are not part of the prompt (the base model answers one
    question, as the web chat does)."""
    if not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be one string (batches and token ids are not supported)", param="prompt")
        text = prompt
    else:
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
        text = texts[-1]
    if not text.strip():
        raise ApiError(400, "the question is empty", param="prompt" if not chat else "messages")
    if len(text) > MAX_QUESTION_CHARS:
        raise ApiError(400, f"the prompt is {len(text):,} characters; the limit is {MAX_QUESTION_CHARS:,}", param="prompt")
    return text


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
        "retrieved": [{"id": r.id, "score": r.score, "relevant": r.relevant, "reason": r.reason} for r in result.retrieved],
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


def whole_response(result, rid: str, created: int, mid: str, chat: bool) -> dict:
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": result.answer},
            "logprobs": None,
            "finish_reason": finish_reason(result),
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": result.answer, "logprobs": None, "finish_reason": finish_reason(result)}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": mid,
        "choices": [choice],
        "usage": usage(result),
        "kvgraft": kvgraft_object(result),
    }
