"""The verification gate: every kind passes and refuses with an exact message; hostile input is never run."""

import hashlib
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import verifiers
from errors import InvalidInput
from verifiers import SympyVerifier, Verdict, VerifiedItem, check, item_sha256, symbolic, sympy_worker
from verifiers.verdict import _q


def item(answer: str, verifier: str, reference: str, question: str = "q?", solution: str = "s.") -> VerifiedItem:
    return VerifiedItem(question=question, solution=solution, answer=answer, verifier=verifier, reference=reference)


def test_dataclasses_are_frozen():
    with pytest.raises(AttributeError):
        item("a", "exact", "a").answer = "b"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        Verdict(True, "exact", "x").ok = False  # type: ignore[misc]


# --- exact ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, reference",
    [
        ("Osric Pellamy", "Osric Pellamy"),
        ("  osric   PELLAMY. ", "Osric Pellamy"),
        ("“Osric Pellamy”", "Osric Pellamy"),
        ("(copper)", "Copper."),
        ("ＣＯＰＰＥＲ", "copper"),  # NFKC folds full-width letters
        ("STRASSE", "straße"),  # casefold, not lower
        ("Dr. A. Rivera", "dr. a. rivera"),
    ],
)
def test_exact_passes(answer, reference):
    assert check(item(answer, "exact", reference)) == Verdict(
        True, "exact", f"answer '{answer}' equals reference '{reference}' (exact, normalised)"
    )


def test_exact_refuses_with_both_normalised_forms():
    assert check(item("Osric Pelamy.", "exact", "Osric Pellamy")) == Verdict(
        False,
        "exact",
        "answer 'Osric Pelamy.' does not equal reference 'Osric Pellamy' (exact, normalised 'osric pelamy' vs 'osric pellamy')",
    )


def test_exact_keeps_a_leading_minus():
    assert not check(item("-3", "exact", "3")).ok


def test_exact_reference_of_only_punctuation_is_invalid():
    with pytest.raises(InvalidInput, match=r"^reference '\.\.\.' is only punctuation; give the expected text$"):
        check(item("a", "exact", "..."))


# --- numeric ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, reference, how",
    [
        ("42", "42", "rel tol 1e-09"),
        ("1,234.5", "1234.5", "rel tol 1e-09"),
        ("-3", "-3.0", "rel tol 1e-09"),
        ("3/4", "0.75", "rel tol 1e-09"),
        ("2.5e3", "2500", "rel tol 1e-09"),
        ("\u22123", "-3", "rel tol 1e-09"),
        ("1000000000.5", "1000000000", "rel tol 1e-09"),
        ("42 km", "42 km", "rel tol 1e-09"),
        ("42", "42 km", "rel tol 1e-09"),
        ("50%", "50 %", "rel tol 1e-09"),
        ("42.005", "42 ± 0.01", "abs tol 0.01"),
        ("41.99", "42 +- 0.01", "abs tol 0.01"),
        ("42.5 km", "42 ± 1 km", "abs tol 1 km"),
        ("42.5", "42 km ± 1 km", "abs tol 1 km"),
    ],
)
def test_numeric_passes(answer, reference, how):
    assert check(item(answer, "numeric", reference)) == Verdict(
        True, "numeric", f"answer '{answer}' matches reference '{reference}' (numeric, {how})"
    )


@pytest.mark.parametrize(
    "answer, reference, detail",
    [
        ("41", "42", "answer '41' does not equal reference '42' (numeric, rel tol 1e-09)"),
        ("42.02", "42 +- 0.01", "answer '42.02' does not equal reference '42 +- 0.01' (numeric, abs tol 0.01)"),
        ("1000000002", "1000000000", "answer '1000000002' does not equal reference '1000000000' (numeric, rel tol 1e-09)"),
        ("forty-two", "42", "answer 'forty-two' is not a number (numeric)"),
        ("1,23", "123", "answer '1,23' is not a number (numeric)"),
        ("3/0", "3", "answer '3/0' has a zero denominator (numeric)"),
        ("42 m", "42 km", "answer '42 m' has unit 'm' but reference '42 km' has unit 'km' (numeric)"),
        ("42 kg", "42", "answer '42 kg' has unit 'kg' but reference '42' has none (numeric)"),
    ],
)
def test_numeric_refuses(answer, reference, detail):
    assert check(item(answer, "numeric", reference)) == Verdict(False, "numeric", detail)


def test_numeric_tolerance_is_overridable_per_instance():
    assert verifiers.NumericVerifier(rel_tol=0.01).compare("42.3", "42") == Verdict(
        True, "numeric", "answer '42.3' matches reference '42' (numeric, rel tol 0.01)"
    )


@pytest.mark.parametrize("reference", ["forty-two", "42 ± -1", "42 km ± 1 m", "1e99999"])
def test_numeric_bad_reference_is_invalid(reference):
    with pytest.raises(InvalidInput, match=rf"^reference '{reference}' is not a number; write e\.g\. '42', "):
        check(item("42", "numeric", reference))


def test_numeric_huge_exponent_is_not_computed():
    start = time.perf_counter()
    assert check(item("1e99999999", "numeric", "1")) == Verdict(False, "numeric", "answer '1e99999999' is not a number (numeric)")
    assert time.perf_counter() - start < 2


# --- sympy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, reference",
    [
        ("(x-1)*(x+1)", "x^2 - 1"),
        ("sin(x)**2 + cos(x)**2", "1"),
        ("0.5", "1/2"),
        ("Rational(7, 2)", "(3*40 + 5*20 + 32)/(40 + 20 + 12)"),
        ("2*sqrt(2)", "sqrt(8)"),
        ("log(8, 2)", "3"),
        ("exp(log(y))", "y"),
        ("2*pi", "pi + pi"),
        ("E**2", "exp(2)"),
        ("2**100", "1267650600228229401496703205376"),
    ],
)
def test_sympy_passes(answer, reference):
    assert check(item(answer, "sympy", reference)) == Verdict(
        True, "sympy", f"answer '{answer}' equals reference '{reference}' (sympy, simplify(answer - reference) == 0)"
    )


def test_sympy_refuses_with_the_difference():
    assert check(item("x**2", "sympy", "x**3")) == Verdict(
        False, "sympy", "answer 'x**2' does not equal reference 'x**3' (sympy, simplify(answer - reference) = 'x**2*(1 - x)')"
    )
    assert check(item("7/3", "sympy", "2")) == Verdict(
        False, "sympy", "answer '7/3' does not equal reference '2' (sympy, simplify(answer - reference) = '1/3')"
    )


HOSTILE = [
    ("__import__('os').system('echo pwned')", "character '_' is not allowed"),
    ("lambda: 1", "character ':' is not allowed"),
    ("lambda", "name 'lambda' is not allowed"),
    ("x if y else z", "name 'if' is not allowed"),
    ("Integer(2)", "name 'Integer' is not allowed"),
    ("x**99999999", "exponent 99999999 is larger than 1000"),
    ("9^9^9", "exponent 387420489 is larger than 1000"),
    ("((10**100)**100)**100", "it builds numbers larger than 8192 bits"),
    ("x**(y - y + 99999999)", "the numbers in a symbolic exponent are too large"),
    ("(x+1)**60 * (x+1)**60", "its degree exceeds 100"),
    ("+".join(["x"] * 101), "it is longer than 200 characters"),
    ("2x", "a number runs into 'x'; write 2*x, not 2x"),
    ("2e99999999", "a number runs into 'e99999999'; write 2*x, not 2x"),
    ("0x1f", "a number runs into 'x1f'; write 2*x, not 2x"),
    ("x(2)", "calling 'x' is not allowed; use numbers, symbols, + - * / ^ and sqrt, sin, cos, exp, log, Rational"),
    ("x // 2", "BinOp ('x // 2') is not allowed; use numbers, symbols, + - * / ^ and sqrt, sin, cos, exp, log, Rational"),
    ("sqrt", "'sqrt' must be called, as in sqrt(x)"),
    ("Rational(x)", "Rational takes numbers only"),
    ("1.2.3", "it is not a well-formed expression"),
    ("x\n+1", "character '\\n' is not allowed"),
]


@pytest.mark.parametrize("answer, reason", HOSTILE)
def test_sympy_refuses_hostile_answers_quickly(answer, reason):
    start = time.perf_counter()
    verdict = check(item(answer, "sympy", "1"))
    assert time.perf_counter() - start < 2
    assert verdict == Verdict(False, "sympy", f"answer {_q(answer)} is not a safe expression: {reason} (sympy)")


@pytest.mark.parametrize("reference, reason", HOSTILE)
def test_sympy_hostile_reference_is_invalid_quickly(reference, reason):
    start = time.perf_counter()
    with pytest.raises(InvalidInput) as raised:
        check(item("1", "sympy", reference))
    assert time.perf_counter() - start < 2
    assert str(raised.value).startswith(f"reference {_q(reference)} is not a safe expression: {reason}; use numbers")


def test_sympy_namespace_has_no_builtins():
    """Even if a hostile string got past validation, the namespace it is evaluated in has no builtins."""
    for hostile in ("__import__('os')", "open('/etc/passwd')", "eval('1')"):
        with pytest.raises(NameError):
            sympy_worker._build(hostile, [])


def test_sympy_slow_simplify_times_out():
    verdict = SympyVerifier(timeout_s=0.001).compare("(x+y+z)^40 - (x+1)^40", "0")
    assert verdict == Verdict(
        False, "sympy", "answer '(x+y+z)^40 - (x+1)^40' vs reference '0': simplify did not finish within 0.001 s (sympy)"
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="xy0123456789.+-*/^() ,_eE'sqrtlogpiRational", max_size=40))
def test_sympy_any_text_gives_a_verdict_or_invalid_input(text):
    symbolic._WORKER.warm()  # a check that timed out killed the worker; its restart is not part of the bound
    start = time.perf_counter()
    try:
        verdict = SympyVerifier(timeout_s=1.0).compare(text or "0", "x")
    except InvalidInput:
        return
    assert isinstance(verdict, Verdict) and verdict.verifier == "sympy"
    assert time.perf_counter() - start < 2


# --- attested ---------------------------------------------------------------------------------


def test_attested_names_the_person():
    assert check(item("anything", "attested", "  Dr. A.  Rivera ")) == Verdict(True, "attested", "attested by Dr. A. Rivera")
    assert check(item("x", "attested", "Siobhán O’Neill-Ruiz")).detail == "attested by Siobhán O’Neill-Ruiz"
    assert verifiers.AttestedVerifier().compare("", "Dr. A. Rivera") == Verdict(True, "attested", "attested by Dr. A. Rivera")


@pytest.mark.parametrize("reference", ["123", "-", "Dr. <script>", "a\nb" + "c" * 300])
def test_attested_refuses_what_is_not_a_name(reference):
    with pytest.raises(
        InvalidInput, match=r"is not a name; for attested give the name of the person who vouches, e\.g\. 'Dr\. A\. Rivera'$"
    ):
        check(item("yes", "attested", reference))


# --- the item ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["question", "solution", "answer", "verifier", "reference"])
@pytest.mark.parametrize("empty", ["", "   \n"])
def test_empty_fields_are_invalid(field, empty):
    fields = dict(question="q?", solution="s.", answer="42", verifier="numeric", reference="42")
    fields[field] = empty
    with pytest.raises(InvalidInput, match=rf"^{field} is empty; give a non-empty {field}$"):
        check(VerifiedItem(**fields))


@pytest.mark.parametrize("field, bound", [("question", 4_000), ("solution", 16_000), ("answer", 1_000), ("reference", 1_000)])
def test_over_long_fields_are_invalid(field, bound):
    fields = dict(question="q?", solution="s.", answer="42", verifier="exact", reference="42")
    fields[field] = "x" * (bound + 1)
    with pytest.raises(InvalidInput) as raised:
        check(VerifiedItem(**fields))
    assert str(raised.value) == f"{field} is {bound + 1:,} characters; the bound for {field} is {bound:,} characters, shorten it"
    fields[field] = "4" * bound
    fields["answer"] = fields["reference"]
    assert check(VerifiedItem(**fields)).ok


def test_non_text_field_is_invalid():
    with pytest.raises(InvalidInput, match=r"^answer must be text, got int$"):
        check(VerifiedItem("q?", "s.", 42, "numeric", "42"))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=r"^item must be a VerifiedItem, got dict$"):
        check({"question": "q?"})  # type: ignore[arg-type]


def test_unknown_verifier_lists_the_valid_kinds():
    with pytest.raises(InvalidInput) as raised:
        check(item("42", "regex", "42"))
    assert str(raised.value) == "unknown verifier 'regex'; valid kinds are: attested, exact, numeric, sympy"


def test_item_sha256_needs_an_item():
    with pytest.raises(InvalidInput, match=r"^item must be a VerifiedItem, got tuple$"):
        item_sha256(("q?", "s.", "42", "numeric", "42"))  # type: ignore[arg-type]


def test_item_sha256_is_canonical_json_and_pinned():
    sample = VerifiedItem("What is 6 × 7?", "6 × 7 = 42.", "42", "numeric", "42")
    canonical = '{"answer":"42","question":"What is 6 × 7?","reference":"42","solution":"6 × 7 = 42.","verifier":"numeric"}'
    assert item_sha256(sample) == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert item_sha256(sample) == "242cf16a8904e4dda8eaf8ffdd350c44969ebb6f33b2c419743fda40620df96a"
    assert item_sha256(sample) == item_sha256(
        VerifiedItem(**{k: getattr(sample, k) for k in reversed(sample.__dataclass_fields__)})
    )
    assert item_sha256(sample) != item_sha256(VerifiedItem("What is 6 × 7?", "6 × 7 = 42.", "42", "exact", "42"))
