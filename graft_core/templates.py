"""The one place that renders deposits and queries into text, and cuts answers out of completions.

A 270M base model completes patterns, it does not follow instructions, so a verified item is
deposited as `Fact: <solution>\\nQuestion: <question>\\nAnswer: <answer>\\n` and a query is asked as
`Question: <query>\\nAnswer:`. A recurring question then continues the deposited pattern and its
answer comes back in a handful of decode tokens, ending at the newline.

A second query form, `cot`, lets the model reason: lm-evaluation-harness's gsm8k-cot prompt (the eight
chain-of-thought exemplars of Wei et al. 2022, each `Q: <question>\nA: <reasoning> The answer is N.`, joined
by a blank line), then `Q: <query>\nA:`. Its answer ends where the next question would begin (`Q:`, or the
blank line before it, as gsm8k-cot's stop sequences). The form is chosen by the caller and is the same on
both sides of every comparison (eval/gsm.py). A third, `qa`, is the same `Q: <query>\nA:` line and end without
the exemplars (zero-shot): a grafted item then sits right before the question. A fourth, `steps`, is zero-shot
chain of thought (Kojima et al. 2022): the `qa` line with the answer opened by "Let's think step by step.", so
the model is invited to work the problem out and a grafted item still sits right before the question.

A model whose tokenizer carries a chat template (an instruct model: SmolLM2-Instruct's GGUF has one, the
packaged Gemma 3 270M, the pt model, has none) is asked through that template instead (`of(tokenizer)`, a
`Template`). A graft is positions 0..n-1 of what the model reads, so grafted knowledge must be a prefix of
the rendered conversation: each deposit body is one **system turn** of its own (`<|im_start|>system\n<body>
<|im_end|>\n` in SmolLM2's template; a chain's children are further system turns after it) and the question
is the user turn and the generation prompt after them. The system turn is the template's own place for
context the user did not type (a given one replaces the default system prompt, as the template renders
it); each artifact then ends at a turn boundary, so its rendering does not depend on what precedes or follows
it, and the question is rendered exactly as the template renders it after any knowledge turns. A prefix of
the user turn would leave the artifact open mid-turn and make the question's rendering depend on what the
artifact ended with. The turns are read off the template itself (`_derive`, with sentinel contents): the
whole prompt of a chain and a question is what the template renders for messages [system(body) for each
artifact] + [user(question)], and nothing grafted is what it renders for [user(question)]. A template that
cannot be split so (one that folds the system text into the user turn, or refuses a system role) is not
used: the model is asked in the plain form and a warning says why. In the chat form the answer is the
assistant's turn: it ends where the model ends its turn (its EOS), in every form (the user turn holds the
question, or the cot form's exemplars and question; the steps form's cue opens the assistant's turn), and text
given to be rendered may not contain the tokenizer's control tokens (they would forge turns).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .errors import InvalidInput

log = logging.getLogger(__name__)

ANSWER_END = "\n"
FORMS = ("answer", "cot", "qa", "steps")
COT_ENDS = ("\n\n", "Q:")  # the cot form's answer ends before the next question (gsm8k-cot's `until`)
STEPS_CUE = "Let's think step by step."  # zero-shot chain of thought (Kojima et al. 2022)

# lm-evaluation-harness gsm8k-cot's few-shot exemplars (Wei et al. 2022, "Chain-of-Thought Prompting"), verbatim.
COT_EXEMPLARS = (
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, "
        "there will be 21 trees. How many trees did the grove workers plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have "
        "been 21 - 15 = 6. The answer is 6.",
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
        "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, "
        "they had 74 - 35 = 39. The answer is 39.",
    ),
    (
        "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did "
        "Jason give to Denny?",
        "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. "
        "The answer is 8.",
    ),
    (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have now?",
        "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 + 4 = 9. "
        "The answer is 9.",
    ),
    (
        "There were nine computers in the server room. Five more computers were installed each day, from monday to "
        "thursday. How many computers are now in the server room?",
        "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 computers "
        "were added. 9 + 20 is 29. The answer is 29.",
    ),
    (
        "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many golf "
        "balls did he have at the end of wednesday?",
        "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, he "
        "had 35 - 2 = 33 golf balls. The answer is 33.",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars "
        "left. 23 - 15 is 8. The answer is 8.",
    ),
)


def check_form(form: str) -> str:
    if form not in FORMS:
        raise ValueError(f"the query form must be one of {', '.join(FORMS)}, got {form!r}")
    return form


def fact_text(solution: str) -> str:
    """The first line of an item's deposit text: the solution (the gate's fact run grafts a one-line fact as this alone)."""
    return f"Fact: {solution.strip()}\n"


def is_worked_solution(solution: str) -> bool:
    """A solution of more than one line (steps, then the result): a derivation, read with its question."""
    return len([line for line in solution.strip().splitlines() if line.strip()]) > 1


def fact_run_text(question: str, solution: str) -> str:
    """What the deposit gate's fact run grafts (a scratch artifact, never stored; never the answer a depositor
    typed). A one-line fact alone (`Fact: <solution>`): it states its value in a sentence the model reads back
    ("...fixes its flag as plain saffron with no emblem."). A worked solution with its question above it: alone,
    its steps ("After the 10% discount the price is 215 x 90/100 = 193.5. ...") read to the 270M model as a new
    problem and it computed again; asked after the question they answer, it reads the result they reach. The
    same form for every solution of a shape, chosen by the shape, not by trying both."""
    if not is_worked_solution(solution):
        return fact_text(solution)
    return f"Question: {question.strip()}\n{fact_text(solution)}"


def item_text(question: str, solution: str, answer: str) -> str:
    """Deposit text for a verified item."""
    return f"{fact_text(solution)}Question: {question.strip()}\nAnswer: {answer.strip()}\n"


def document_text(text: str) -> str:
    """Deposit text for free text: kept as given, ending with one newline so a question can follow."""
    return text.rstrip("\n") + "\n"


def query_prompt(question: str, form: str = "answer") -> str:
    """Prompt text for a question in the plain form (appended after any grafted state); in the chat form it is
    the user turn's content (`query_text`)."""
    if check_form(form) == "cot":
        shots = "\n\n".join(f"Q: {q}\nA: {a}" for q, a in COT_EXEMPLARS)
        return f"{shots}\n\nQ: {question.strip()}\nA:"
    if form == "qa":
        return f"Q: {question.strip()}\nA:"
    if form == "steps":
        return f"Q: {question.strip()}\nA: {STEPS_CUE}"
    return f"Question: {question.strip()}\nAnswer:"


@dataclass(frozen=True)
class Template:
    """How one model is asked: the plain form (`chat` False), or its chat template's turns as text around a
    content, each a (before, after) pair read off the template (`_derive`)."""

    chat: bool
    turn: tuple[str, str] = ("", "")  # one system turn around a deposit body
    query: tuple[str, str] = ("", "")  # after knowledge turns: the user turn and the generation prompt around the question
    bare: tuple[str, str] = ("", "")  # nothing grafted: everything the template renders around the question
    controls: tuple[str, ...] = ()  # the tokenizer's control tokens, refused inside a content
    why_plain: str = ""  # why a chat template the tokenizer carries is not used


PLAIN = Template(chat=False)
_SENTINELS = ("\ue000kvgraft one\ue001", "\ue000kvgraft two\ue001")
_KNOWN: dict[tuple, Template] = {}


def _around(text: str, sentinel: str) -> tuple[str, str]:
    if text.count(sentinel) != 1:
        raise ValueError("the template does not render a message's content once, as given")
    before, after = text.split(sentinel)
    return before, after


def _derive(render, controls: tuple[str, ...] = ()) -> Template:
    """The turns of a chat template, from `render(messages, add_generation_prompt) -> str` on sentinel
    contents; raises ValueError where the template cannot hold knowledge as a prefix of system turns."""
    a, b = _SENTINELS

    def system(c: str) -> dict:
        return {"role": "system", "content": c}

    def user(c: str) -> dict:
        return {"role": "user", "content": c}

    turn_a = render([system(a)], False)
    turn = _around(turn_a, a)
    if _around(render([system(b)], False), b) != turn:
        raise ValueError("a system turn's rendering depends on its content beyond the content itself")
    if render([system(a), system(b)], False) != turn_a + turn[0] + b + turn[1]:
        raise ValueError("a second system turn is not rendered as the first is, after it")
    asked = render([system(a), user(b)], True)
    if not asked.startswith(turn_a):
        raise ValueError("the system turn is not a prefix of the conversation it opens")
    query = _around(asked[len(turn_a) :], b)
    if render([system(b), system(a), user(a)], True) != turn[0] + b + turn[1] + turn[0] + a + turn[1] + query[0] + a + query[1]:
        raise ValueError("the question's turn is rendered differently after other knowledge")
    bare = _around(render([user(a)], True), a)
    if _around(render([user(b)], True), b) != bare:
        raise ValueError("the question's rendering depends on the question beyond the question itself")
    return Template(chat=True, turn=turn, query=query, bare=bare, controls=controls)


def _controls(tokenizer) -> tuple[str, ...]:
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return tuple(sorted({t.content for t in added.values() if getattr(t, "special", False) and t.content}))


def of(tokenizer) -> Template:
    """The form a model with this tokenizer is asked in: its chat template's turns where it carries one that
    can hold grafted knowledge as a prefix, else PLAIN (a template that cannot is named in a warning once)."""
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str) or not source:
        return PLAIN
    controls = _controls(tokenizer)
    key = (source, str(getattr(tokenizer, "bos_token", "")), str(getattr(tokenizer, "eos_token", "")), controls)
    if key not in _KNOWN:

        def render(messages: list[dict], generation: bool) -> str:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

        try:
            _KNOWN[key] = _derive(render, controls)
        except Exception as e:  # a template that raises on a system turn, or one that folds it into the user's
            log.warning("the model's chat template cannot hold grafted knowledge as a prefix (%s): asked in the plain form", e)
            _KNOWN[key] = Template(chat=False, why_plain=str(e))
    return _KNOWN[key]


def _checked(template: Template, text: str, what: str) -> str:
    for c in template.controls:
        if c in text:
            raise InvalidInput(f"the {what} contains the model's control token {c!r}; remove it")
    return text


def deposit_text(template: Template, body: str) -> str:
    """What the model reads for a deposit body (item_text, document_text, fact_run_text): the body itself in the
    plain form; in the chat form its own system turn, the body stripped as its content (the same turn wherever
    in a chain it sits)."""
    if not template.chat:
        return body
    before, after = template.turn
    return before + _checked(template, body.strip(), "deposit") + after


def text_ids(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """Token ids of text a caller wrote, as text: a control token's name written in it (`<eos>`,
    `<start_of_turn>`) is split into the ordinary pieces of its characters, never read as the control token; text
    without one tokenises exactly as before. The tokenizer's own special tokens (BOS) come from
    `add_special_tokens` only."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens, split_special_tokens=True)["input_ids"])


def deposit_ids(tokenizer, body: str, root: bool) -> list[int]:
    """Token ids of a deposit body as capture prefills them. Plain form: the tokenizer's own special tokens
    (BOS) only on a chain's root, the body as text (`text_ids`). Chat form: the template's text carries every
    control token it has, so the tokenizer adds none (as transformers' apply_chat_template tokenises), and a body
    holding a control token is refused (`_checked`)."""
    template = of(tokenizer)
    if not template.chat:
        return text_ids(tokenizer, body, add_special_tokens=root)
    return list(tokenizer(deposit_text(template, body), add_special_tokens=False)["input_ids"])


def query_text(template: Template, question: str, form: str = "answer", grafted: bool = True) -> str:
    """The prompt text of a question: the plain form's `query_prompt`, or in the chat form the user turn and
    generation prompt after knowledge turns (`grafted`), or the whole rendering of the question alone."""
    if not template.chat:
        return query_prompt(question, form)
    content = query_prompt(question, form) if check_form(form) == "cot" else question.strip()
    before, after = template.query if grafted else template.bare
    cue = STEPS_CUE if form == "steps" else ""  # the steps form opens the assistant's turn with it
    return before + _checked(template, content, "question") + after + cue


def prompt_ids(tokenizer, question: str, form: str = "answer", grafted: bool = True) -> list[int]:
    """Token ids of a question's prompt (`query_text`): plain form with BOS only when nothing is grafted."""
    template = of(tokenizer)
    text = query_text(template, question, form, grafted)
    if not template.chat:  # the plain form's prompt is the caller's text and fixed words: all of it text
        return text_ids(tokenizer, text, add_special_tokens=not grafted)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer, question: str, grafted: bool, raw: bool = False, form: str = "answer") -> list[int]:
    """Token ids of the prompt chunk (the question in the query `form`, FORMS, as the model is asked:
    `prompt_ids`); a plain prompt with nothing grafted before it starts with BOS. `raw`: the text as given, no
    template. An empty question, or one that tokenises to nothing, is an input error."""
    if not question or not question.strip():
        raise InvalidInput("the question is empty; type a question")
    if raw:
        ids = text_ids(tokenizer, question, add_special_tokens=not grafted)
    else:
        ids = prompt_ids(tokenizer, question, form, grafted)
    if not ids:
        raise InvalidInput("the question tokenises to zero tokens")
    return list(ids)


def _end(completion: str, form: str, template: Template = PLAIN) -> int:
    """Where the answer part of a completion ends (its length when no end is in it yet; in the chat form the
    model's end of turn, which stops decoding before it is text)."""
    if template.chat:
        check_form(form)
        return len(completion)
    ends = (ANSWER_END,) if check_form(form) == "answer" else COT_ENDS
    body = completion if form == "answer" else completion.lstrip()  # a cot answer may open on a newline
    skip = len(completion) - len(body)
    found = [body.find(e) for e in ends if e in body]
    return skip + min(found) if found else len(completion)


def cut_answer(completion: str, form: str = "answer", template: Template = PLAIN) -> str:
    """The answer part of a completion: up to the template's end of answer, stripped."""
    return completion[: _end(completion, form, template)].strip()


def is_answer_complete(completion: str, form: str = "answer", template: Template = PLAIN) -> bool:
    return _end(completion, form, template) < len(completion)


def cut_stop(completion: str, stop: tuple[str, ...]) -> str:
    """`completion` up to the first of the caller's `stop` strings (OpenAI's `stop`: excluded from the text)."""
    found = [completion.find(s) for s in stop if s and s in completion]
    return completion[: min(found)] if found else completion


def answer_text(completion: str, raw: bool, form: str = "answer", stop: tuple[str, ...] = (), template: Template = PLAIN) -> str:
    """What an answer shows of its `completion`: cut at the first `stop` string, then as decoded (raw: the
    continuation exactly, its spaces and newlines kept, as OpenAI's and llama.cpp's completions return it) or cut
    at the template's end of answer. The streamed text and the finished answer are both this."""
    completion = cut_stop(completion, stop)
    return completion if raw else cut_answer(completion, form, template)


def settled(text: str, stop: tuple[str, ...] = (), raw: bool = False) -> str:
    """The part of a growing answer text (`answer_text` of the tokens so far) that later tokens cannot change,
    for a streaming caller: without a trailing half character (U+FFFD while its bytes are still arriving),
    trailing whitespace (stripped unless more text follows; kept in a `raw` continuation, which keeps it) or the
    start of a stop string."""
    text = text.rstrip("\ufffd")
    text = text if raw else text.rstrip()
    held = max((k for s in stop for k in range(1, min(len(s) - 1, len(text)) + 1) if text.endswith(s[:k])), default=0)
    return text[: len(text) - held] if raw else text[: len(text) - held].rstrip()
