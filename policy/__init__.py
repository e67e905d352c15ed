"""The graph-network policy, its search and training (tfplace.policy)."""

import contextlib
import io
import warnings


def _import_gym_quietly() -> None:
    """Imports gym (tf_agents imports it) with its import-time notice held back: gym prints a note
    about its own maintenance on stderr (gym_notices) that a user of tfplace cannot act on, at the
    top of every command that loads the policy. Without gym nothing happens here."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import gym  # noqa: F401
    except ImportError:
        pass  # tf_agents reports its own missing dependency when it is imported


_import_gym_quietly()
# AutoGraph compiles the network's converted code with `state is not ()` in it: Python warns about
# that generated file, at the top of the main job's output, though nothing in it can be changed.
warnings.filterwarnings("ignore", message=r'"is not" with a literal', category=SyntaxWarning)
