"""The one place that renders deposits and queries into text, and cuts answers out of completions.

A 270M base model completes patterns, it does not follow instructions, so a verified item is
deposited as `Fact: <solution>\\nQuestion: <question>\\nAnswer: <answer>\\n` and a query is asked as
`Question: <query>\\nAnswer:`. A recurring question then continues the deposited pattern and its
answer comes back in a handful of decode tokens, ending at the newline.
"""

from __future__ import annotations

ANSWER_END = "\n"


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


def query_prompt(question: str) -> str:
    """Prompt text for a question (appended after any grafted state)."""
    return f"Question: {question.strip()}\nAnswer:"


def cut_answer(completion: str) -> str:
    """The answer part of a completion: up to the template's end of answer, stripped."""
    return completion.split(ANSWER_END, 1)[0].strip()


def is_answer_complete(completion: str) -> bool:
    return ANSWER_END in completion
