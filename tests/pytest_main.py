"""Runs pytest on the files given as arguments; the `main` of every Bazel py_test target, so
pytest-style test files run under `bazel test` exactly as under `pytest`."""

import os
import sys

import pytest

if __name__ == "__main__":
    # The sandbox mounts the sources read-only: numba's compiled simulator loops (cache=True) go to
    # the test's own temporary folder instead of __pycache__ beside them.
    if os.environ.get("TEST_TMPDIR"):
        os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.environ["TEST_TMPDIR"], "numba"))
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
