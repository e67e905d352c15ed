"""Forwards the Java rule names @bazel_tools needs to Bazel's native rules (offline build)."""
def java_binary(**kwargs):
    native.java_binary(**kwargs)
def java_import(**kwargs):
    native.java_import(**kwargs)
def java_runtime(**kwargs):
    native.java_runtime(**kwargs)
def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)
