"""Forwards the C++ rule names that @bazel_tools loads to Bazel's native rules.

Bazel 4 (Debian's bazel-bootstrap) would otherwise download rules_cc, which an offline machine
cannot do. tfplace has no C++ targets; this only lets Bazel's own tool packages load.
"""
def cc_binary(**kwargs):
    native.cc_binary(**kwargs)
def cc_import(**kwargs):
    native.cc_import(**kwargs)
def cc_library(**kwargs):
    native.cc_library(**kwargs)
def cc_test(**kwargs):
    native.cc_test(**kwargs)
def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)
def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)
