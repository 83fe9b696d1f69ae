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
"""

from __future__ import annotations

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
    """Prompt text for a question (appended after any grafted state)."""
    if check_form(form) == "cot":
        shots = "\n\n".join(f"Q: {q}\nA: {a}" for q, a in COT_EXEMPLARS)
        return f"{shots}\n\nQ: {question.strip()}\nA:"
    if form == "qa":
        return f"Q: {question.strip()}\nA:"
    if form == "steps":
        return f"Q: {question.strip()}\nA: {STEPS_CUE}"
    return f"Question: {question.strip()}\nAnswer:"


def _end(completion: str, form: str) -> int:
    """Where the answer part of a completion ends (its length when no end is in it yet)."""
    ends = (ANSWER_END,) if check_form(form) == "answer" else COT_ENDS
    body = completion if form == "answer" else completion.lstrip()  # a cot answer may open on a newline
    skip = len(completion) - len(body)
    found = [body.find(e) for e in ends if e in body]
    return skip + min(found) if found else len(completion)


def cut_answer(completion: str, form: str = "answer") -> str:
    """The answer part of a completion: up to the template's end of answer, stripped."""
    return completion[: _end(completion, form)].strip()


def is_answer_complete(completion: str, form: str = "answer") -> bool:
    return _end(completion, form) < len(completion)


def cut_stop(completion: str, stop: tuple[str, ...]) -> str:
    """`completion` up to the first of the caller's `stop` strings (OpenAI's `stop`: excluded from the text)."""
    found = [completion.find(s) for s in stop if s and s in completion]
    return completion[: min(found)] if found else completion


def answer_text(completion: str, raw: bool, form: str = "answer", stop: tuple[str, ...] = ()) -> str:
    """What an answer shows of its `completion`: cut at the first `stop` string, then stripped (raw) or cut at
    the template's end of answer. The streamed text and the finished answer are both this."""
    completion = cut_stop(completion, stop)
    return completion.strip() if raw else cut_answer(completion, form)


def settled(text: str, stop: tuple[str, ...] = ()) -> str:
    """The part of a growing answer text (`answer_text` of the tokens so far) that later tokens cannot change,
    for a streaming caller: without a trailing half character (U+FFFD while its bytes are still arriving),
    trailing whitespace (stripped unless more text follows) or the start of a stop string."""
    text = text.rstrip("\ufffd").rstrip()
    held = max((k for s in stop for k in range(1, min(len(s) - 1, len(text)) + 1) if text.endswith(s[:k])), default=0)
    return text[: len(text) - held].rstrip()
