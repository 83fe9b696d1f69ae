"""The kernels: kvgraft's own C code for every float32 operation whose bits a forward depends on, and
their Python bindings. The floor below `graft_core` and `retrieval`: both compute through it, neither
through the other.

It owns the numerical definition's order of operations (products, attention, norms, exp, sin/cos,
GELU), its builds per instruction set (`build.VARIANTS`, KVGRAFT_ISA; build.py) and the kernel cache; it knows
nothing about models, artifacts, indexes or the store. It is the one door through which torch reaches
`retrieval` (the embedder's forward in retrieval/encoder.py runs on these kernels).
"""
