"""Bazel macros shared by tfplace's packages."""

def pytest_tests(srcs, deps):
    """One py_test per pytest-style file, run through tests/pytest_main.py."""
    for src in srcs:
        native.py_test(
            name = src[:-3],
            srcs = [src, "//tests:pytest_main.py"],
            main = "//tests:pytest_main.py",
            args = ["$(location %s)" % src],
            python_version = "PY3",
            size = "large",
            deps = deps,
        )

def tfplace_package(name, deps = [], extra_srcs = [], test_deps = []):
    """A package's py_library (every non-test .py file) plus a py_test per test file."""
    tests = native.glob(["*_test.py", "test_*.py"])
    native.py_library(
        name = name,
        srcs = native.glob(["*.py"], exclude = tests) + extra_srcs,
        data = ["//:repo_data"],
        deps = deps,
    )
    pytest_tests(tests, [":" + name] + test_deps)
