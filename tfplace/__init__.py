"""tfplace: find, simulate and apply deployment strategies for TensorFlow training graphs on
heterogeneous GPU clusters.

Importing `tfplace` is cheap: it does not import TensorFlow. Submodules that need TensorFlow
(graph loading, rewrite, runtime, profiler) import it themselves.
"""

__version__ = "0.1.0"
