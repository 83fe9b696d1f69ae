"""Print the polynomial coefficients of kv_gelu_erf (kernels/c/scalar.c), as C literals.

Two pieces, each a Chebyshev fit (200 Chebyshev nodes, values from mpmath at 40 digits) converted to the
power basis of a variable on [-1, 1]:
  A: erf(t) / t for t^2 = w in [0, 1], variable s = 2w - 1, degree 11 (max error 7e-16 absolute);
  B: e^(a^2) erfc(a) for a in [1, 4], variable s = (2a - 5) / 3, degree 20 (max error 7e-15 relative).
The literals in scalar.c are the definition; this script says where they came from (a rerun on another
machine may differ in the last digits through LAPACK's least squares, which changes nothing committed).

    python scripts/erf_coefficients.py
"""

import mpmath as mp
import numpy as np
from numpy.polynomial import chebyshev

mp.mp.dps = 40


def fit(f, degree: int, nodes: int = 200) -> np.ndarray:
    s = np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    y = np.array([float(f(mp.mpf(float(x)))) for x in s])
    return chebyshev.cheb2poly(chebyshev.chebfit(s, y, degree))


def erf_over_t(s):
    w = (s + 1) / 2
    return mp.erf(mp.sqrt(w)) / mp.sqrt(w) if w > 0 else 2 / mp.sqrt(mp.pi)


def scaled_erfc(s):
    a = (3 * s + 5) / 2
    return mp.exp(a * a) * mp.erfc(a)


def main() -> None:
    for name, f, degree in (("erf_a", erf_over_t, 11), ("erfc_b", scaled_erfc, 20)):
        c = fit(f, degree)
        print(f"static const double {name}[{degree + 1}] = {{ /* s^0 first */")
        print("    " + ", ".join(repr(float(x)) for x in c) + "};")


if __name__ == "__main__":
    main()
