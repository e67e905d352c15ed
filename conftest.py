"""pytest's set-up for the whole tree: the test process runs in a private network namespace.

Tests start TensorFlow servers (LocalCluster) and Horovod ranks from this one process, after
other tests have made TensorFlow sessions; a process can move into a private network only
before gRPC starts its threads (tfplace.runtime.netns), so it moves here, before any test runs.
Where the system forbids it, the tests that start servers stop with the fix.
"""

import sys

from tfplace.runtime import netns

try:
    netns.enter_private_network()
except netns.NetworkIsolationError as err:
    print(f"warning: {err}", file=sys.stderr)
