"""The bounds of one answer by who asks, shared by every door that answers (the chat, `/answer`, the
OpenAI-compatible API): the admin token lifts them, an anonymous caller gets about one default chat.
Gradio-free, so the Ray replicas' API applies the same function.
"""

from __future__ import annotations

import services
from access.guard import Guard, Refused
from errors import InvalidInput, KvgraftError
from services.limits import MAX_NEW_TOKENS, anon_max_new_tokens, anon_prompt_tokens, whole

ADMIN_ONLY_ANSWER = (
    "{what} needs the admin token: {why}. Anonymous answers carry the cheap probe proof. Untick it, give the "
    "admin token (KVGRAFT_ADMIN_TOKEN), or run `cli.py ask --check --compare` against your own store."
)


def answer_options(
    guard: Guard, request, k, graft, max_new, check, compare, admin_token=None, least: int = 1
) -> services.AnswerOptions:
    """The bounded options of one answer. Without the admin token the decoding is at most
    KVGRAFT_ANON_NEW_TOKENS (services.limits.anon_max_new_tokens) and neither `check` nor `compare` runs (each recomputes the whole grafted context,
    so either costs about as much again as the answer, with no bound but the context), and its question is
    at most KVGRAFT_ANON_PROMPT_TOKENS prompt tokens: an anonymous answer is one model turn of about one
    default chat, and carries the cheap probe proof only. `least` is the fewest new tokens asked for (0 where the
    prompt's own log-probabilities are the answer)."""
    admin = guard.is_admin(admin_token, request)
    check, compare = check is True, compare is True
    if not admin and (check or compare):
        what = " and ".join(n for n, on in (("check", check), ("compare", compare)) if on)
        why = {
            "check": "it recomputes the whole grafted context from its text",
            "compare": "it recomputes the whole context without the graft",
        }
        reason = " and ".join(why[n] for n in what.split(" and "))
        raise Refused(ADMIN_ONLY_ANSWER.format(what=what, why=reason))
    top = MAX_NEW_TOKENS if admin else anon_max_new_tokens()
    try:
        max_new_tokens = whole("max_new_tokens", max_new, least, top)
    except KvgraftError as exc:
        raise InvalidInput(f"{exc}{'' if admin else '; larger answers need the admin token'}") from None
    return services.AnswerOptions(
        k=whole("k", k, 1, services.MAX_K),
        graft=bool(graft),
        max_new_tokens=max_new_tokens,
        check=check,
        compare=compare,
        max_prompt_tokens=None if admin else anon_prompt_tokens(),
    )
