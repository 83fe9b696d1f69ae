"""The one judge's rules (verifiers/judging.py), one row each: which line of an answer is read (a worked
solution's `####` line, its "The answer is" sentence, else its last line), and the answers that assert no value
(an expression left unworked, a chain with nothing after its last '='), with their exact verdicts."""

from __future__ import annotations

import pytest

from errors import InvalidInput
from verifiers import JUDGE, Verdict, answer_line, judge

AGES = "Priya is 4 times as old as Wen. In 11 years, Priya will be 3 times as old as Wen. How old is Priya now?"
SHARK = "Benny saw a 10-foot shark with 2 6-inch remoras. What percentage of the shark's length are the remoras?"
TRAINS = "Two trains leave 36 minutes apart. How many minutes after the first train departs do they meet?"

# (answer, line read, how it was found)
LINES = [
    ("42", "42", ""),
    ("  It is 42.  ", "It is 42.", ""),
    ("48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72 clips.\n#### 72", "72", "its '####' line"),
    ("#### 1,234\nQ: next question\n#### 5", "1,234", "its '####' line"),
    ("She has 5. Then 3 more. So the answer is 8. Q: How many legs", "So the answer is 8.", "its 'The answer is' sentence"),
    ("It costs $3.50, so the answer is 3.5.\nNext", "It costs $3.50, so the answer is 3.5.", "its 'The answer is' sentence"),
    ("First 3 + 4 = 7.\n\nThen 7 × 2 = 14 apples.\n", "Then 7 × 2 = 14 apples.", "its last line"),
    ("The answer is 8.", "The answer is 8.", ""),
    ("Total: 2 + 3 = <<2+3=5>>5", "Total: 2 + 3 = 5", ""),
]


@pytest.mark.parametrize(("answer", "line", "how"), LINES, ids=[r[0][:30] for r in LINES])
def test_the_line_read_is_the_worked_solutions_answer(answer, line, how):
    assert answer_line(answer) == (line, how)


def test_a_worked_solution_is_judged_on_its_hash_line():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 in all.\n#### 72"
    assert judge(solution, "numeric", "72", "How many clips?") == Verdict(
        True,
        "numeric",
        "read from 'Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\nShe sold 48+24 = <<48+24=72>>7…': "  # quoted, cut at 80
        "its '####' line '72': answer '72' matches reference '72' (numeric, rel tol 1e-09)",
        "72",
    )
    assert not judge(solution.replace("#### 72", "#### 70"), "numeric", "72", "How many clips?").ok


def test_the_answer_is_sentence_beats_a_later_line_and_its_hedge_is_read():
    text = "Each box has 4 pens, 3 boxes make 12. The answer is 12.\nQ: A farmer has 7 cows."
    assert judge(text, "numeric", "12", "How many pens?").value == "12"
    assert not judge("I think the answer is 12.", "numeric", "12", "How many pens?").ok
    assert not judge("The answer is not 12.", "numeric", "12", "How many pens?").ok


def test_the_last_line_decides_when_nothing_marks_the_answer():
    assert judge("3 + 4 = 7 apples.\nThen 7 × 2 = 14 apples in all.", "numeric", "14", "How many apples?").ok
    assert not judge("7 × 2 = 14 apples in all.\nThen she eats some.", "numeric", "14", "How many apples?").ok


# the answers the issue names (stored recurring attempts and gate generations)
ISSUE = [
    ("84 minutes", "numeric", "84", TRAINS, True, "84"),
    ("Priya is 44 years old now.", "numeric", "44", AGES, True, "44"),
    ("42 km/h", "sympy", "2*127/(127/30 + 127/70)", "What is the average speed, in km/h?", True, "42"),
    ("Priya's age = (4x22) / 2 =", "numeric", "44", AGES, False, None),
    ("Wen = 40 + 4 * 4", "numeric", "56", AGES, False, None),
    ("Wen = 40 + 4 * 4 = 56", "numeric", "56", AGES.replace("is Priya now", "is Wen now"), True, "56"),
    ("Wen = 40 + 4 * 4 = 56", "numeric", "56", AGES, False, None),  # Wen's age, asked Priya's
    ("Priya's age = 4×12 years = 44 years", "numeric", "44", AGES, False, None),  # 4 × 12 is 48
    ("Priya was 44 when Wen was born.", "numeric", "44", AGES, False, None),  # another time than now
    ("Priya is 44 and Wen is 11.", "numeric", "44", AGES, True, "44"),  # Wen's age is not a competing claim
    ("44 years 5 months", "numeric", "44", AGES, False, None),
    ("44 times the age of Wen", "numeric", "44", AGES, False, None),
    ("(8-1)2 = 44", "numeric", "44", AGES, False, None),  # juxtaposed factors are read: (8-1)2 is 14
    ("4-2 2-8 = 44", "numeric", "44", AGES, False, None),  # working that does not read as arithmetic
    ("4x = 44", "numeric", "44", AGES, False, None),  # an equation's unknown times 4, not Priya's age
    ("4 (4x) = 44", "numeric", "44", AGES, False, None),
    ("Priya's age is 44 years less than Wen's age", "numeric", "44", AGES, False, None),
    ("Priya has a memory of 44 years.", "numeric", "44", AGES, False, None),
    ("Priya reaches an age of 44 years.", "numeric", "44", AGES, True, "44"),
    ("2x22=44 Wen is 4 times older", "numeric", "44", AGES, False, None),  # '44 Wen': Wen's value
    ("84 minutes after the first train departs.", "numeric", "84", TRAINS, True, "84"),
    ("10%", "numeric", "10", SHARK, True, "10"),  # 'What percentage ...?' asks in %; GSM8K's reference is 10
    ("10 feet", "numeric", "10", SHARK, False, None),  # the asking sentence's unit is %, not the question's feet
    ("84 hours", "numeric", "84", TRAINS, False, None),
    ("Priya is 4 × 11 = 44 years old.", "numeric", "44", AGES, True, "44"),
]


@pytest.mark.parametrize(("answer", "verifier", "reference", "question", "ok", "value"), ISSUE, ids=[r[0] for r in ISSUE])
def test_the_issues_answers(answer, verifier, reference, question, ok, value):
    v = judge(answer, verifier, reference, question)
    assert (v.ok, v.value) == (ok, value), v.detail


def test_an_expression_left_unworked_asserts_no_value():
    assert judge("Wen = 40 + 4 * 4", "numeric", "56", AGES) == Verdict(
        False,
        "numeric",
        "answer 'Wen = 40 + 4 * 4': it writes '40 + 4 * 4' without working it out: it asserts no value; "
        "nothing is asserted that numeric can accept",
    )
    assert judge("Priya's age = (4x22) / 2 =", "numeric", "44", AGES) == Verdict(
        False,
        "numeric",
        "answer 'Priya's age = (4x22) / 2 =': it writes '(4x22) / 2 =' with nothing after its last '=': it asserts no "
        "value; nothing is asserted that numeric can accept",
    )
    # a bare expression is still the sympy kind's to compare whole; in a sentence it is working, not a claim
    assert judge("40 + 4*4", "sympy", "56").ok
    assert not judge("Wen is 40 + 4 * 4 years old.", "sympy", "56", AGES).ok


def test_empty_attested_and_input_errors():
    assert judge("  \n ", "numeric", "42") == Verdict(False, "numeric", "answer '  \\n ': it is empty; nothing is asserted")
    assert judge("", "attested", "Dr. A. Rivera") == Verdict(True, "attested", "attested by Dr. A. Rivera", "")
    with pytest.raises(InvalidInput, match=r"^unknown verifier 'fuzzy'; valid kinds are: attested, exact, numeric, sympy$"):
        judge("42", "fuzzy", "42")
    with pytest.raises(InvalidInput, match=r"^reference 'forty-two' is not a number; write e\.g\. "):
        judge("It is 42.", "numeric", "forty-two")
    with pytest.raises(InvalidInput, match=r"^answer is 16,001 characters; the judge reads at most 16,000, shorten it$"):
        judge("4" * 16_001, "numeric", "42")
    assert JUDGE.startswith("kvgraft-judge/")


def test_a_long_worked_solution_is_read_beyond_the_answer_fields_bound():
    working = "".join(f"Step {i}: {i} + 1 = {i + 1}.\n" for i in range(80))
    assert len(working) > 1_000
    assert judge(working + "The answer is 81.", "numeric", "81", "How many steps?").ok


def test_the_built_in_librarys_recorded_gate_answers_still_pass():
    """The seed library's verification records hold both gate generations (the fact run's in its detail): the
    judge must still accept every one, so a rule change cannot silently refuse the built-in library."""
    import json
    import re
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parent.parent / "library_seed" / "library.json").read_text(encoding="utf-8"))
    questions = {s["artifact_id"]: s["question"] for s in doc["catalog"]["sources"]}
    judged = 0
    for v in doc["catalog"]["verifications"]:
        if v["verifier"] == "attested":
            continue
        fact = re.match(r"with the solution grafted the model answered '(.*)'; with the artifact grafted", v["detail"])
        assert fact is not None, v["detail"]
        for answer in (fact.group(1), v["generated_answer"]):
            verdict = judge(answer, v["verifier"], v["reference"], questions[v["artifact_id"]])
            assert verdict.ok, verdict.detail
            judged += 1
    assert judged == 20


OPTIONS = "The code for the given code is 11. If his code is 11 then which of the following code does mj have to do to win 11 eggs?\nA) 12\nB) 13\nC) 14\nD) 15\nE) 16"


def test_a_last_line_that_is_one_of_listed_options_asserts_nothing():
    """Rule 4d, written on a recurring attempt kvgraft-judge/2 accepted (gsm0012-original-qa, seed 379: a
    development item): the list offers 12 to 16, it does not claim 16."""
    v = judge(OPTIONS, "numeric", "16", "How many eggs won't he be able to place on the tray?")
    assert not v.ok and v.value is None and "one of the lettered options" in v.detail
    assert judge("E) 16", "numeric", "16").ok  # one line is its own claim, not a list
    assert judge("A) 12\nB) 13\nThe answer is 16.", "numeric", "16").ok  # the answer sentence is read first
    assert judge("(A) 12\n(B) 16\n#### 16", "numeric", "16").ok
    assert not judge("Options:\n(A) 12\n(B) 16", "numeric", "16").ok


SUPPOSED = (
    "Let's say Grandma walked 50 minutes on the beach. Let's say that Grandma walked the same amount of time on the "
    "sidewalk on the beach. Since Grandma walks on the beach more times than she does on the sidewalk, Grandma takes "
    "40 minutes more on the beach than she would on the sidewalk."
)


@pytest.mark.parametrize(
    "answer",
    [SUPPOSED, "Suppose she walks 50 minutes on the beach.", "Assuming 50 minutes, the rest is 40.", "Let us take 50 minutes."],
)
def test_a_supposed_value_is_not_a_claim(answer):
    """Written on the recurring attempt kvgraft-judge/2 accepted for gsm0017-original-qa (seed 353, a development
    item): 'Let's say ... 50 minutes' sets 50 up as a supposition, then reasons to something else."""
    v = judge(answer, "numeric", "50", "How many minutes does she spend walking on the beach?")
    assert not v.ok, v.detail


def test_a_stated_value_beside_the_supposition_words_elsewhere_is_still_read():
    assert judge("She walks 50 minutes on the beach.", "numeric", "50", "How many minutes on the beach?").ok
    assert judge("Assume nothing.\nThe answer is 50.", "numeric", "50").ok


FORMULA = (
    "1250 bags of hay, 1250 bags of oats, 1250 bags of carrots, 1250 bags of sugar cubes\n"
    "<tex>$O_2 + 2H_2O \\rightarrow 2H_2 + H_2O_2$</tex>"
)


def test_a_formulas_digits_are_not_numbers():
    """Written on the recurring attempt kvgraft-judge/3 accepted for gsm0007-original-qa (seed 36, a development
    item): its last line, a chemical formula, was read as asserting 2."""
    v = judge(FORMULA, "numeric", "2", "How many trips does the farmer need to transport all the feed?")
    assert not v.ok and v.value is None, v.detail
    assert not judge("It is H2O.", "numeric", "2").ok
    assert judge("He needs 2 trips.", "numeric", "2", "How many trips?").ok
    assert judge("The area is 50km2 wide, so 50.", "numeric", "50").ok
    assert judge("x^2 = 16", "numeric", "16").ok


TWO_ANSWERS = (
    "The answer is two (2). Because the yield from each bag of hay is 1 / 4 of the gross yield from the hay. (To set "
    "up the equation, multiply the number of bags of hay by the amount of hay in each bag). The answer is 2 (2) = 4 "
    "(2), which means that the farm tractor can carry 42 bags of hay on each trip."
)


def test_the_last_answer_sentence_decides():
    """Rule 4b of kvgraft-judge/4, written on round 3's first look (development items since): gsm0007-original
    seed 85 says 'The answer is two (2).' and ends 'The answer is 2 (2) = 4 (2)', an equation that does not hold
    (labelled wrong; /3 read the first sentence and accepted it, which made the cot case's gsm0007 'solved');
    gsm0002-original seed 287 says 'So the answer is 27 - 3 = 25. The answer is 25.' (labelled right)."""
    q = "How many trips does the farmer need to transport all the feed?"
    assert not judge(TWO_ANSWERS, "numeric", "2", q).ok
    fixed = judge("Jerry rolled a six-sided die. So the answer is 27 - 3 = 25. The answer is 25.", "numeric", "25")
    assert fixed.ok and "'The answer is 25.'" in fixed.detail
    assert not judge("The answer is 25. On second thought, the answer is 30.", "numeric", "25").ok
    assert judge("The answer is 30. No: the answer is 25.", "numeric", "25").ok
    assert judge("the answer is 7", "numeric", "7").ok  # one sentence, to the end of the text


def test_a_bare_option_marker_line_carries_nothing():
    """Rule 4c of kvgraft-judge/4, written on gsm0017-original-qa seed 29 ('50 minutes.' then 'A)' lines to the
    token limit, the last cut to 'A'; labelled right, refused by /3 on its last line)."""
    assert judge("50 minutes.\n" + "A)\n" * 30 + "A", "numeric", "50", "How long, in minutes?").ok
    assert judge("50 minutes.\n(b)\nC.", "numeric", "50", "How long, in minutes?").ok
    assert not judge("A)\nB)", "numeric", "50").ok  # markers alone assert nothing
    assert not judge(
        "50 minutes.\nA) 40 minutes", "numeric", "50", "How long, in minutes?"
    ).ok  # an option with content is still read


def test_a_boxed_value_is_the_answers_claim():
    """Rule 4a': a model that closes its working with LaTeX's \\boxed{} (Qwen2.5 does) asserts that value, read as
    Minerva's and Qwen's math evaluations read it; the same sentence unboxed reads as an aside."""
    fog = "Thus, it will take \\(\\boxed{140}\\) minutes for the fog bank to cover the whole city."
    got = judge(fog, "numeric", "140")
    assert got.ok and got.value == "140" and "its last \\boxed{} value '140': answer '140' matches" in got.detail
    assert not judge(fog.replace("\\boxed{140}", "140"), "numeric", "140").ok  # as an aside it asserts nothing
    assert not judge(fog, "numeric", "141").ok
    assert answer_line("First \\boxed{3}, then \\boxed{\\frac{7}{2}}.") == ("7/2", "its last \\boxed{} value")
    assert answer_line("So \\[\\boxed{\\$1{,}200 \\text{ in all}}\\]")[0] == "$1{,}200 in all"
    assert answer_line("#### 12\nso \\boxed{13}") == ("12", "its '####' line")  # the strict line first


# ---- kvgraft-judge/6: three false refusals of Qwen2.5's working, found in the transfer eval's records -----------

REMORAS = (
    "First, we need to find the total length of the remoras. Since each remora is 90 inches long, and there are 2 "
    "remoras, the total length of the remoras is 90 inches * 2 = 180 inches. The whale's body length is 30 feet, which "
    "is equal to 30 * 12 = 360 inches. So, the percentage of the whale's body length that the combined length of the "
    "remoras represents is (180 inches / 360 inches) * 100 = 50%."
)


def test_a_paragraph_of_working_is_read_at_its_concluding_sentence():
    """Rule 4c': the paragraph's closing 'So, ...' sentence is its claim (it was refused as naming several values)."""
    v = judge(REMORAS, "numeric", "50", "What percentage of the whale's body length is the remoras' combined length?")
    assert v.ok and v.value == "50" and "its concluding sentence" in v.detail and "asserts '50%'" in v.detail
    assert not judge(REMORAS, "numeric", "180", "What percentage?").ok  # the earlier sentence is working, not the claim
    assert answer_line(REMORAS[:-1])[1] == ""  # cut off mid-sentence: the line whole, as before
    assert answer_line(REMORAS)[1] == ""  # a fact's line (exact) is read whole
    # closed by something other than a conclusion: read whole, several values, refused as before
    assert not judge("Sanne is 6 years old. Answer: 72 years.", "numeric", "72", "How old is Sanne's father?").ok


def test_units_between_factors_are_not_a_contradiction():
    """'90 inches * 2 = 180 inches' is one chain whose members agree (it was read as the chain '2 = 180')."""
    v = judge("The total is 90 inches * 2 = 180 inches.", "numeric", "180", "How long, in inches?")
    assert v.ok and v.value.startswith("180")
    bad = judge("The total is 90 inches * 2 = 170 inches.", "numeric", "170", "How long, in inches?")
    assert not bad.ok and "contradicts itself" in bad.detail  # members that disagree still do


def test_compared_chances_are_a_quantity_not_a_hedge():
    q = "What is the percentage likelihood that Oliver rolls a number greater than 7 more than rolls two even numbers?"
    said = judge("The difference is 50% - 25% = 25%.\nSo, Oliver is 25% more likely to roll it.", "numeric", "25", q)
    assert "hedges" not in said.detail
    assert "hedges" in judge("The answer is most likely 25.", "numeric", "25", q).detail  # 'most likely' still hedges
    assert "hedges" in judge("It is likely 25.", "numeric", "25", q).detail
