"""tfplace's rewrite as a custom Grappler optimizer: build, load, enable.

    from tfplace.rewrite import grappler
    grappler.load_plugin()                     # builds it first if needed (g++, ~5 s)
    config = grappler.session_config("strategy.json", "clusters/local_cpu.json",
                                     train_op=train_op, loss=loss, base_config=lc.session_config())
    with tf.compat.v1.Session(target, config=config) as sess:   # the script's unchanged graph
        sess.run(init)                                          # rewritten init: every mirror
        sess.run([train_op, loss], feed_dict={x: ..., y: ...})  # the rewritten step

The optimizer (grappler_plugin.cc, registered as "tfplace") calls tfplace.rewrite.grappler_entry,
which calls tfplace.rewrite.graph_rewrite: the same rewrite as the session hook. It needs:
  * the library loaded (`load_plugin`) in the process that runs Grappler: the client for a local
    session; for a session on a cluster, the master (task 0): start workers with `worker_env()`
    (tfplace.runtime.worker loads `TFPLACE_WORKER_LIBRARIES`). Without it TensorFlow skips the
    unknown optimizer and runs the graph unplaced, with no error, so `session_config` refuses
    unless it is loaded in this process, and `LocalCluster.session` refuses a plugin config when
    task 0 was started without it;
  * `train_op` named (a NoOp: `tf.group(...)` or `minimize` without global_step), and the script
    fetching the train op (plus, as it likes, the init op, the loss, placeholders' feeds and
    variable values); other step tensors are renamed by the rewrite and fail the run;
  * the session's config from `session_config`: the plugin as the *only* Grappler optimizer
    (Grappler's other passes stay off, as for every rewritten step: runtime.step_session_config),
    so Grappler hands it the whole graph (training step and initializers), once per fetch set.
A failed rewrite fails the session's run with the reason (grappler_plugin.cc: fail closed).

The library is built against the installed TensorFlow (`tf.sysconfig` flags) into
${TFPLACE_CACHE:-~/.cache/tfplace}/grappler/<key>/, keyed by TensorFlow, Python, source and compiler
command.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Dict, List, Optional

from tfplace.formats.errors import InputError, TfplaceError
from tfplace.runtime.worker import LIBRARIES_ENV, PLUGIN_OPTIMIZER

OPTIMIZER_NAME = PLUGIN_OPTIMIZER  # "tfplace": REGISTER_GRAPH_OPTIMIZER_AS in grappler_plugin.cc
LIBRARY_NAME = "libtfplace_grappler.so"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grappler_plugin.cc")
BUILD_TIMEOUT_S = 300.0

_loaded: List[str] = []  # a second, different library would register "tfplace" twice (TF aborts)


class PluginBuildError(TfplaceError, RuntimeError):
    """The plugin could not be built (no compiler, compile error) or loaded."""


def _flags():
    import tensorflow as tf
    return list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags()), tf.__version__


def plugin_path(cache_dir: Optional[str] = None) -> str:
    """Where the plugin for this TensorFlow, Python, source and compiler command lives (built or not)."""
    _, _, version = _flags()
    # the whole command (compiler, our flags, TensorFlow's, Python's include), not only TF's flags: a
    # changed command must not reuse a library built by the old one. Without the source's and the
    # output's paths, so that every checkout of the same source shares one build.
    command = [arg for arg in compile_command("") if arg not in ("", SOURCE)]
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + repr((command, sys.version)).encode()).hexdigest()
    cache = cache_dir or os.environ.get("TFPLACE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tfplace")
    return os.path.join(cache, "grappler", f"tf{version}-py{sys.version_info[0]}{sys.version_info[1]}-{digest[:12]}",
                        LIBRARY_NAME)


def compile_command(output: str) -> List[str]:
    """The compiler call that builds the plugin into `output`."""
    compile_flags, link_flags, _ = _flags()
    cxx = shlex.split(os.environ.get("CXX") or "g++")  # CXX="ccache g++" is a command and its argument
    return [*cxx, "-shared", "-fPIC", "-O2", *compile_flags, "-I" + sysconfig.get_paths()["include"], SOURCE,
            "-o", output, *link_flags]


def build_plugin(cache_dir: Optional[str] = None, force: bool = False) -> str:
    """Builds the plugin unless it is there; returns its path. Raises PluginBuildError with the
    reason (missing compiler, the compiler's last lines)."""
    path = plugin_path(cache_dir)
    if os.path.exists(path) and not force:
        return path
    cmd = compile_command(path)
    if shutil.which(cmd[0]) is None:
        raise PluginBuildError(f"cannot build the tfplace Grappler plugin: no C++ compiler {cmd[0]!r} on PATH. "
                               "Fix: install g++ (or set CXX) and run scripts/setup_env.sh again")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Built under a temporary name and renamed: a process building at the same time, or one stopped
    # mid-build, never leaves a partial library under `path`; the temporary file goes on any exit.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        cmd = compile_command(tmp)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PluginBuildError(f"building the tfplace Grappler plugin took over {BUILD_TIMEOUT_S:.0f} s") from None
        except OSError as err:  # a CXX that is not an executable
            raise PluginBuildError(f"cannot run the C++ compiler {cmd[0]!r}: {err}. Fix: set CXX to a compiler "
                                   "(g++) and run scripts/setup_env.sh again") from None
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
            raise PluginBuildError(f"building the tfplace Grappler plugin failed:\n  {' '.join(cmd)}\n{tail}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_plugin(path: Optional[str] = None, build: bool = True) -> str:
    """Loads the plugin into this process (once; building it first unless `build` is False) and
    returns its path."""
    import tensorflow as tf
    path = os.path.abspath(path) if path else (build_plugin() if build else plugin_path())
    if path in _loaded:
        return path
    if _loaded:
        raise PluginBuildError(f"another tfplace Grappler plugin ({_loaded[0]}) is loaded in this process; "
                               "TensorFlow cannot register the optimizer name twice. Fix: load one library")
    if not os.path.exists(path):
        raise PluginBuildError(f"no tfplace Grappler plugin at {path}. Fix: run scripts/setup_env.sh "
                               "or tfplace.rewrite.grappler.build_plugin()")
    try:
        tf.load_library(path)
    except tf.errors.OpError as err:  # dlopen's reason (not a library, built for another TensorFlow)
        raise PluginBuildError(f"cannot load the tfplace Grappler plugin {path}: {err.message}. Fix: rebuild it "
                               "with tfplace.rewrite.grappler.build_plugin(force=True)") from None
    _loaded.append(path)
    return path


def worker_env(path: Optional[str] = None) -> Dict[str, str]:
    """Environment for worker tasks (LocalCluster's env_per_task) that loads the plugin in each."""
    return {LIBRARIES_ENV: os.path.abspath(path) if path else build_plugin()}


def _name(x) -> str:
    return str(getattr(x, "name", x) or "")


def _op_name(x) -> str:
    """The op's name of an op, a tensor or a name ("train_op:0" -> "train_op"): grappler_entry
    looks train_op and init_op up among the graph's nodes."""
    return _name(getattr(x, "op", x)).split(":")[0]


def add_sentinel(train_op) -> bool:
    """Makes `train_op` (an op or tensor of a graph; a name cannot be changed) wait for an
    Assert(false) that the plugin removes before it rewrites (grappler_entry.SENTINEL): a master
    whose process lacks the library (a server started without worker_env()) runs the original graph
    and the step fails, naming the fix, where it would train unplaced on one device without a word.
    Once per graph; True if the train op waits for it."""
    import tensorflow as tf
    from tfplace.rewrite.grappler_entry import SENTINEL
    op = getattr(train_op, "op", train_op)
    if not isinstance(op, tf.Operation):
        return False
    g = op.graph
    try:
        sentinel = g.get_operation_by_name(SENTINEL)
    except KeyError:
        with g.as_default(), g.name_scope(None):
            message = ("the tfplace Grappler plugin did not rewrite this graph, so it would run unplaced: the "
                       "master (task 0) has not loaded the library. Fix: start every server with "
                       "tfplace.rewrite.grappler.worker_env() in its environment")
            sentinel = tf.raw_ops.Assert(condition=tf.constant(False, name=SENTINEL + "/never"),
                                         data=[tf.constant(message, name=SENTINEL + "/message")], name=SENTINEL)
    if sentinel not in op.control_inputs:
        # no public TF API adds a control input to an existing op (as PlacementHook._repoint)
        op._add_control_inputs([sentinel])  # noqa: SLF001
    return True


def session_config(strategy_path, cluster_path, base_config=None, *, train_op, init_op="init", loss=None,
                   loss_reduction: Optional[str] = None):
    """A copy of `base_config` (a ConfigProto) whose Grappler runs only the "tfplace" optimizer, with
    the parameters grappler_entry reads. `train_op`, `init_op`, `loss`: ops, tensors or names; a
    train op given as an op gets the plugin's sentinel (add_sentinel). Raises InputError unless
    load_plugin() has loaded the plugin into this process."""
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2
    from tfplace.rewrite.grappler_entry import PluginParams
    if not _loaded:  # TensorFlow would skip the unknown optimizer and run the graph unplaced, silently
        raise InputError("grappler.session_config", "plugin", "the tfplace Grappler plugin is not loaded in this "
                         "process", "call tfplace.rewrite.grappler.load_plugin() first (and start a LocalCluster's "
                         "tasks with env_per_task=[grappler.worker_env()] * n)")
    params = PluginParams(strategy=os.path.abspath(strategy_path), cluster=os.path.abspath(cluster_path),
                          train_op=_op_name(train_op), init_op=_op_name(init_op), loss=_name(loss),
                          loss_reduction=loss_reduction or "")
    add_sentinel(train_op)
    out = tf.compat.v1.ConfigProto()
    if base_config is not None:
        out.CopyFrom(base_config)
    ro = out.graph_options.rewrite_options
    ro.disable_meta_optimizer = False
    ro.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    del ro.optimizers[:]
    ro.optimizers.append(OPTIMIZER_NAME)  # by name: only this optimizer runs, on the unpruned graph
    del ro.custom_optimizers[:]
    # v2 conds and loops stay If/While ops until the plugin has seen them: lowered to Switch/Merge
    # first (the default), a batch-norm layer's cond under a training placeholder reached the
    # rewrite as TF1 control flow, which it refuses
    out.experimental.disable_functional_ops_lowering = True
    custom = ro.custom_optimizers.add(name=OPTIMIZER_NAME)
    for key, value in vars(params).items():
        if value:
            custom.parameter_map[key].s = value.encode()
    return out
