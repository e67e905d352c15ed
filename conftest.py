"""pytest's set-up for the whole tree: the test process runs in a private network namespace.

Tests start TensorFlow servers (LocalCluster) and Horovod ranks from this one process, after
other tests have made TensorFlow sessions; a process can move into a private network only
before gRPC starts its threads (tfplace.runtime.netns), so it moves here, before any test runs.
Where the system forbids it, the tests that start servers stop with the fix.

TensorFlow sizes one process-wide intra-op thread pool per CPU device from the *first* session's
config and gives it to every later session, whatever that session asks for. The equivalence
references ask for 1 thread (runtime.step_runner.reference_run): ResNet-50 at 32x32 differs from
itself by up to 14.5 in a kernel between 1 and 2 threads, so a reference run after another test's
default session failed. TF_OVERRIDE_GLOBAL_THREADPOOL gives each session the pool it asks for;
it is read once, at the first session, so it is set here, before any test runs.
"""

import os
import sys

os.environ.setdefault("TF_OVERRIDE_GLOBAL_THREADPOOL", "1")

from tfplace.runtime import netns  # noqa: E402  (after the thread-pool switch above)

try:
    netns.enter_private_network()
except netns.NetworkIsolationError as err:
    print(f"warning: {err}", file=sys.stderr)
