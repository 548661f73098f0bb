"""The reduction loops NumPy runs slowly, and their compiled forms.

``kernels`` holds the float16 sums (accumulated in float32, rounded once), the two-rank mean
and the float32 <-> float16 casts, each in a NumPy form and, when Numba is installed, the
checked Numba form of ``compiled_sums``. ``reduce_ops`` (beside this package) applies them for
the reduction operators. Like ``reduce_ops`` they import nothing else of the package.
"""
