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

def tfplace_package(name, deps = [], extra_srcs = [], test_deps = [], recursive = False, data = []):
    """A package's py_library (every non-test .py file) plus a py_test per test file.

    data: files the library reads at run time besides //:repo_data (e.g. a C++ source it compiles).

    recursive: the library takes the .py files of its sub-folders too (tfplace/'s ir/, formats/,
    lowering/, ... are one library: they import each other one way, checked by tests/test_layout.py).
    """
    pattern = "**/" if recursive else ""
    tests = native.glob([pattern + "*_test.py", pattern + "test_*.py"])
    native.py_library(
        name = name,
        srcs = native.glob([pattern + "*.py"], exclude = tests) + extra_srcs,
        data = ["//:repo_data"] + data,
        deps = deps,
    )
    pytest_tests(tests, [":" + name] + test_deps)
