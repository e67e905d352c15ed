"""Runs pytest on the files given as arguments; the `main` of every Bazel py_test target, so
pytest-style test files run under `bazel test` exactly as under `pytest`."""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
