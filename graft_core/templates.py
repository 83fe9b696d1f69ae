"""The one place that renders deposits and queries into text, and cuts answers out of completions.

A 270M base model completes patterns, it does not follow instructions, so a verified item is
deposited as `Fact: <solution>\\nQuestion: <question>\\nAnswer: <answer>\\n` and a query is asked as
`Question: <query>\\nAnswer:`. A recurring question then continues the deposited pattern and its
answer comes back in a handful of decode tokens, ending at the newline.
"""

from __future__ import annotations

ANSWER_END = "\n"


def fact_text(solution: str) -> str:
    """The first line of an item's deposit text: the solution alone (what the deposit gate grafts)."""
    return f"Fact: {solution.strip()}\n"


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
