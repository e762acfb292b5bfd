"""Whether a process is still there: the watchers of a trace reader's owner and of a trial round's parent ask it.

Standard library only, low in the package: a round's bootstrap asks before anything heavy is imported.
"""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while ``pid`` exists; a process of another user (or one that cannot be asked) counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, ValueError, OverflowError):
        return True
    return True
