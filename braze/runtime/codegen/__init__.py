"""Code generation for the executor: the C compiler driver (cc.py) and generated kernels."""
