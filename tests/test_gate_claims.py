"""What the deposit gate's judge reads an answer to assert (verifiers/claims.py), one row per sentence:
assertions, denials, hedges, lists, units and distractor values, each with its exact verdict and reading."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from errors import InvalidInput
from services import gate
from verifiers import Verdict, VerifiedItem, judge, judging, validate

TZERIN_Q = "What colour is the flag of the free city of Tzerin?"
TZERIN_A = "The flag of the free city of Tzerin is a plain saffron with no emblem."

# (answer, verifier, reference, question, accepted, the reading's `why`)
ROWS = [
    # assertions: the value in the clause that carries it
    (
        "The flag of the free city of Tzerin is a plain saffron with no emblem.",
        "exact",
        "saffron",
        "What colour is the flag of the free city of Tzerin?",
        True,
        "it asserts 'saffron'",
    ),
    ("It is saffron.", "exact", "saffron", "", True, "it asserts 'saffron'"),
    ("It's saffron.", "exact", "saffron", "", True, "it asserts 'saffron'"),
    ("The flag is saffron, not crimson.", "exact", "saffron", "", True, "it asserts 'saffron'"),
    ("Not crimson but saffron.", "exact", "saffron", "", True, "it asserts 'saffron'"),
    ("The flag has no emblem and is saffron.", "exact", "saffron", "", True, "it asserts 'saffron'"),
    ("The flag is saffron and is not crimson.", "exact", "saffron", "", True, "it asserts 'saffron'"),
    ("The flag is saffron; it bears no emblem.", "exact", "saffron", "", True, "it asserts 'saffron'"),
    ("The lighthouse was built by Osric Pellamy in 1841.", "exact", "Osric Pellamy", "", True, "it asserts 'Osric Pellamy'"),
    ("It was Dr. A. Rivera.", "exact", "Dr. A. Rivera", "", True, "it asserts 'Dr. A. Rivera'"),
    ("The festival is held in May.", "exact", "May", "", True, "it asserts 'May'"),
    # denials: a negation scoped to the value's clause
    ("It is not saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('not' before it)"),
    ("It is never saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('never' before it)"),
    ("It isn't saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('isn't' before it)"),
    ("The flag wasn't saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('wasn't' before it)"),
    ("The flag has no saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('no' before it)"),
    ("No saffron appears on the flag.", "exact", "saffron", "", False, "it denies 'saffron' ('No' before it)"),
    ("Neither saffron nor crimson.", "exact", "saffron", "", False, "it denies 'saffron' ('Neither' before it)"),
    ("It is crimson rather than saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('rather than' before it)"),
    ("It is crimson instead of saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('instead of' before it)"),
    ("It is any colour other than saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('other than' before it)"),
    ("Crimson, not saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('not' before it)"),
    ("Saffron is not the colour of the flag.", "exact", "saffron", "", False, "it denies 'Saffron' ('is not' after it)"),
    ("Saffron is wrong; the flag is crimson.", "exact", "saffron", "", False, "it denies 'Saffron' ('wrong' after it)"),
    ("A crimson flag without saffron.", "exact", "saffron", "", False, "it denies 'saffron' ('without' before it)"),
    # hedges
    ("Probably saffron.", "exact", "saffron", "", False, "it hedges 'saffron' ('Probably')"),
    ("I think it is saffron.", "exact", "saffron", "", False, "it hedges 'saffron' ('i think')"),
    ("It might be saffron.", "exact", "saffron", "", False, "it hedges 'saffron' ('might')"),
    ("It may be saffron.", "exact", "saffron", "", False, "it hedges 'saffron' ('may be')"),
    ("Saffron, I believe.", "exact", "saffron", "", False, "it hedges 'Saffron' ('i believe')"),
    ("Perhaps saffron.", "exact", "saffron", "", False, "it hedges 'saffron' ('Perhaps')"),
    ("It seems to be saffron.", "exact", "saffron", "", False, "it hedges 'saffron' ('seems')"),
    ("Saffron, but I am not sure.", "exact", "saffron", "", False, "it hedges 'Saffron' ('not sure')"),
    ("Some say saffron.", "exact", "saffron", "", False, "it hedges 'saffron' ('some say')"),
    # lists and alternatives
    ("saffron or crimson", "exact", "saffron", "", False, "it names 'saffron' as one of several values ('or' in its clause)"),
    (
        "Either saffron or blue.",
        "exact",
        "saffron",
        "",
        False,
        "it names 'saffron' as one of several values ('Either' in its clause)",
    ),
    (
        "Saffron and crimson.",
        "exact",
        "saffron",
        "",
        False,
        "it names 'Saffron' as one of several values ('and crimson' after it)",
    ),
    (
        "Crimson and saffron.",
        "exact",
        "saffron",
        "",
        False,
        "it names 'saffron' as one of several values ('Crimson and' before it)",
    ),
    (
        "Red, saffron and blue.",
        "exact",
        "saffron",
        "",
        False,
        "it names 'saffron' as one of several values ('and blue' after it)",
    ),
    ("saffron/crimson", "exact", "saffron", "", False, "it names 'saffron' as one of several values ('/ crimson' after it)"),
    ("Crimson (some say saffron).", "exact", "saffron", "", False, "it hedges 'saffron' ('some say')"),
    (
        "Crimson (saffron).",
        "exact",
        "saffron",
        "",
        False,
        "it names 'saffron' as one of several values (it stands only in an aside)",
    ),
    (
        "Whether saffron or crimson is unknown.",
        "exact",
        "saffron",
        "",
        False,
        "it names 'saffron' as one of several values ('Whether' in its clause)",
    ),
    # the reference not named
    ("The flag is crimson.", "exact", "saffron", "", False, "it does not name the reference 'saffron'"),
    ("Osric.", "exact", "Osric Pellamy", "", False, "it does not name the reference 'Osric Pellamy'"),
    (
        "Osric Pellamy's apprentice built it.",
        "exact",
        "Osric Pellamy",
        "",
        False,
        "it does not name the reference 'Osric Pellamy'",
    ),
    # numbers: assertions, units, working
    ("The spire is 212 metres tall.", "numeric", "212 metres", "How tall is the spire?", True, "it asserts '212 metres'"),
    ("212 m", "numeric", "212 metres", "How tall is the spire?", True, "it asserts '212 m'"),
    (
        "The population of the river town of Thonhond is 31,059 people.",
        "numeric",
        "31,059",
        "What is the population of the river town of Thonhond?",
        True,
        "it asserts '31,059 people'",
    ),
    (
        "The population is 31,059 people in 2020.",
        "numeric",
        "31,059",
        "What is the population of the river town of Thonhond?",
        True,
        "it asserts '31,059 people'",
    ),
    (
        "The bell rings eleven times at noon.",
        "numeric",
        "11",
        "How many times does the Velmora bell ring at noon?",
        True,
        "it asserts 'eleven times'",
    ),
    ("The ship was launched in 1808.", "numeric", "1808", "In which year was the ship launched?", True, "it asserts '1808'"),
    (
        "In 1841 the keeper counted 212 steps.",
        "numeric",
        "212",
        "How many steps did the keeper count?",
        True,
        "it asserts '212 steps'",
    ),
    (
        "At 559 degrees Celsius.",
        "numeric",
        "559",
        "At what temperature does it melt, in degrees Celsius?",
        True,
        "it asserts '559 degrees'",
    ),
    ("The final price is $94.976.", "numeric", "94.976", "What is the final price in dollars?", True, "it asserts '$94.976'"),
    ("It fills 3/4 of the tank.", "numeric", "0.75", "What share of the tank does it fill?", True, "it asserts '3/4'"),
    (
        "In total: 36 + 48 = 84 minutes.",
        "numeric",
        "84",
        "How many minutes does the trip take in all?",
        True,
        "it asserts '84 minutes'",
    ),
    ("14 × 1.609344 = 22.530816", "numeric", "22.530816", "How many kilometres is that?", True, "it asserts '22.530816'"),
    (
        "965/20 = 48.25%",
        "sympy",
        "(8*25 + 9*85)/(8 + 9 + 3)",
        "What is the acid concentration of the final mixture, in percent?",
        True,
        "it asserts '48.25%'",
    ),
    (
        "2277/361 ≈ 6.31 hours",
        "sympy",
        "1/(1/9 + 1/11 - 1/23)",
        "how many hours does the tank take to fill?",
        True,
        "it asserts '2277/361 ≈ 6.31 hours'",
    ),
    # numbers: denials
    (
        "The spire is not 212 metres tall.",
        "numeric",
        "212 metres",
        "How tall is the spire?",
        False,
        "it denies '212 metres' ('not' before it)",
    ),
    (
        "It isn't 212 metres.",
        "numeric",
        "212 metres",
        "How tall is the spire?",
        False,
        "it denies '212 metres' ('isn't' before it)",
    ),
    (
        "It is 300 metres rather than 212 metres.",
        "numeric",
        "212 metres",
        "How tall is the spire?",
        False,
        "it denies '212 metres' ('rather than' before it)",
    ),
    (
        "No, 300 metres; 212 metres was the old spire.",
        "numeric",
        "212 metres",
        "How tall is the spire?",
        False,
        "it names several values: '300 metres', '212 metres'",
    ),
    ("The answer is not 42.", "numeric", "42", "How many?", False, "it denies '42' ('not' before it)"),
    # numbers: hedges and ranges
    ("About 42.", "numeric", "42", "How many?", False, "it hedges '42' (an approximate value)"),
    (
        "approximately 212 metres",
        "numeric",
        "212 metres",
        "How tall is the spire?",
        False,
        "it hedges '212 metres' (an approximate value)",
    ),
    ("~42", "numeric", "42", "How many?", False, "it hedges '42' (an approximate value)"),
    ("42 or so", "numeric", "42", "How many?", False, "it hedges '42' (an approximate value)"),
    ("It is probably 42.", "numeric", "42", "How many?", False, "it hedges '42' ('probably')"),
    ("Between 40 and 45.", "numeric", "42", "How many?", False, "it gives a range around '40'"),
    ("40-45", "numeric", "42", "How many?", False, "it gives a range around '40-45'"),
    ("42 or 43", "numeric", "42", "How many?", False, "it names '42' as one of several values ('or' in its clause)"),
    ("12 and 15", "numeric", "12", "How many?", False, "it names '12' as one of several values ('and 15' after it)"),
    # numbers: other units and distractor values
    (
        "24 hours",
        "numeric",
        "24",
        "How many minutes does it take?",
        False,
        "it states '24 hours', not a quantity in the question's unit",
    ),
    (
        "212 feet",
        "numeric",
        "212 metres",
        "How tall is the spire?",
        False,
        "it states '212 feet', not a quantity in the question's unit",
    ),
    ("42 kg", "numeric", "42", "How many apples are left?", False, "it states '42 kg', not a quantity in the question's unit"),
    (
        "The bell rings 11 times, 7 of them at dawn.",
        "numeric",
        "11",
        "How many times does the bell ring?",
        False,
        "it names '11 times' as one of several values (', 7' after it)",
    ),
    (
        "2277/361 = 11.5 hours.",
        "sympy",
        "1/(1/9 + 1/11 - 1/23)",
        "how many hours does the tank take to fill?",
        False,
        "it contradicts itself: '2277/361 = 11.5' does not hold ('2277/361' is not '11.5')",
    ),
    (
        "600/7 = 100 km/h",
        "sympy",
        "2*121/(121/100 + 121/75)",
        "What is the average speed, in km/h?",
        False,
        "it contradicts itself: '600/7 = 100' does not hold ('600/7' is not '100')",
    ),
    (
        "14 × 1.609344 = 19.634462",
        "numeric",
        "2253.0816",
        "How many metres is that?",
        False,
        "it contradicts itself: '14 × 1.609344 = 19.634462' does not hold ('14 × 1.609344' is not '19.634462')",
    ),
    ("$160 + 20% = $176.", "numeric", "94.976", "What is the final price in dollars?", False, "it asserts '$176'"),
    ("1/6 + 1/8 − 1/16 = 11/48", "sympy", "1/(1/6 + 1/8 - 1/16)", "how many hours?", False, "it asserts '11/48'"),
    ("24 minutes", "numeric", "96", "How many minutes?", False, "it asserts '24 minutes'"),
    # a compound unit in the question is read as a claim's is ('in km/h' asks for km/h; p0249's answer)
    (
        "42 km/h.",
        "sympy",
        "2*127/(127/30 + 127/70)",
        "A courier drives 127 km at 30 km/h and returns at 70 km/h. What is the average speed, in km/h?",
        True,
        "it asserts '42 km/h'",
    ),
    (
        "42 minutes.",
        "sympy",
        "2*127/(127/30 + 127/70)",
        "A courier drives 127 km at 30 km/h and returns at 70 km/h. What is the average speed, in km/h?",
        False,
        "it states '42 minutes', not a quantity in the question's unit",
    ),
]


@pytest.mark.parametrize(("answer", "verifier", "reference", "question", "ok", "why"), ROWS, ids=[r[0][:40] for r in ROWS])
def test_the_judge_reads_what_the_answer_asserts(answer, verifier, reference, question, ok, why):
    assert judging._claim(answer, verifier, reference, question).why == why
    assert judge(answer, verifier, reference, question).ok is ok


def test_the_table_covers_each_kind_of_sentence():
    accepted = [r for r in ROWS if r[4]]
    assert len(ROWS) >= 60 and 20 <= len(accepted) <= len(ROWS) - 40
    assert {r[1] for r in ROWS} == {"exact", "numeric", "sympy"}


def test_the_tzerin_sentence_passes_with_the_reading_in_its_detail():
    assert judge(TZERIN_A, "exact", "saffron", TZERIN_Q) == Verdict(
        True,
        "exact",
        f"read from '{TZERIN_A}': it asserts 'saffron'; answer 'saffron' equals reference 'saffron' (exact, normalised)",
        "saffron",
    )


def test_a_denial_is_refused_with_what_it_denies():
    assert judge("It is not saffron.", "exact", "saffron") == Verdict(
        False,
        "exact",
        "answer 'It is not saffron.': it denies 'saffron' ('not' before it); nothing is asserted that exact can accept",
    )


def test_a_bare_value_is_judged_as_it_is():
    """An answer the kind accepts whole is not read: its verdict is the kind's own."""
    assert judge("Saffron.", "exact", "saffron") == Verdict(
        True, "exact", "answer 'Saffron.' equals reference 'saffron' (exact, normalised)", "Saffron."
    )
    assert judge("3/4", "numeric", "0.75") == Verdict(
        True, "numeric", "answer '3/4' matches reference '0.75' (numeric, rel tol 1e-09)", "3/4"
    )


def test_a_value_read_from_a_sentence_still_meets_the_kinds_contract():
    """The reading hands the kind one value; the kind's tolerance and unit rules still decide."""
    assert judge("The spire is 212.5 metres tall.", "numeric", "212 ± 1 metres", "How tall?").ok
    assert not judge("The spire is 214 metres tall.", "numeric", "212 ± 1 metres", "How tall?").ok


def test_attested_is_not_read_and_a_bad_reference_is_an_input_error():
    with pytest.raises(InvalidInput, match=r"^the attested verifier does not read claims; it judges the answer as given$"):
        judging._claim("Dr. A. Rivera vouches.", "attested", "Dr. A. Rivera")
    with pytest.raises(InvalidInput, match=r"^reference 'forty-two' is not a number; write e\.g\. "):
        judge("It is 42.", "numeric", "forty-two")
    with pytest.raises(InvalidInput, match=r"^unknown verifier 'fuzzy'; valid kinds are: attested, exact, numeric, sympy$"):
        judge("It is 42.", "fuzzy", "42")


_FRAMES = (
    "{}",
    "{}.",
    "It is {}.",
    "The answer is {}.",
    "The flag of {w} is {}.",
    "{} , with no {w}.",
    "The {w} is {}, not {o}.",
)
_DENIALS = (
    "It is not {}.",
    "It isn't {}.",
    "Not {}.",
    "It is never {}.",
    "{w} rather than {}.",
    "The {w} is no {}.",
    "{} is not the {w}.",
)
_HEDGES = ("Probably {}.", "It might be {}.", "I think {}.", "{}, perhaps.", "{} or {o}.", "Either {o} or {}.", "{o} and {}.")
_WORD = st.text(alphabet="bcdfghklmprstvz", min_size=4, max_size=9).map(lambda w: w + "an")


@settings(max_examples=150, deadline=None)
@given(value=_WORD, w=_WORD, o=_WORD, frame=st.sampled_from(_FRAMES), bad=st.sampled_from(_DENIALS + _HEDGES))
def test_a_frame_that_asserts_passes_and_its_denial_or_hedge_does_not(value, w, o, frame, bad):
    if len({value, w, o}) < 3:
        return
    assert judge(frame.format(value, w=w, o=o), "exact", value).ok, frame
    assert not judge(bad.format(value, w=w, o=o), "exact", value).ok, bad


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300).filter(str.strip), kind=st.sampled_from(["exact", "numeric"]))
def test_any_text_gets_a_verdict(text, kind):
    v = judge(text, kind, "42")
    assert isinstance(v.ok, bool) and v.detail


# ---- through the gate ----------------------------------------------------------------------------


@pytest.mark.real_gate
def test_the_gate_accepts_the_tzerin_sentence_and_deposits_the_claimed_value():
    assert judge(TZERIN_A, "exact", "saffron", TZERIN_Q).ok
    assert gate.claimed(TZERIN_A, TZERIN_Q, "exact", "saffron") == "saffron"
    assert not judge("The flag of Tzerin is not saffron.", "exact", "saffron", TZERIN_Q).ok


@pytest.mark.real_gate
@pytest.mark.parametrize(
    ("answer", "claim"),
    [("The spire is 212 metres tall.", "212"), ("212 metres", "212 metres"), ("It is 212 m.", "212")],
)
def test_the_gate_deposits_the_number_a_sentence_asserts(answer, claim):
    assert judge(answer, "numeric", "212 metres", "How tall is the spire?").ok
    assert gate.claimed(answer, "How tall is the spire?", "numeric", "212 metres") == claim


@pytest.mark.real_gate
def test_an_empty_generation_is_refused_and_a_blank_question_is_an_input_error():
    v = judge("  ", "exact", "saffron", "q?")
    assert not v.ok and v.value is None and "empty; nothing is asserted" in v.detail
    with pytest.raises(InvalidInput, match=r"^question is empty; give a non-empty question$"):
        validate(VerifiedItem(question=" ", solution="s.", answer="saffron", verifier="exact", reference="saffron"))
