"""Known warnings silenced around one call, safely across threads.

`warnings.catch_warnings` swaps the process's filter list on entry and puts
back the list it saw on exit. Two threads inside it at once can each put back
the other's list, and let a silenced warning through (or drop a filter the
user added meanwhile). Every filter swap in jdtr goes through `ignoring`, under
one lock, so jdtr's own swaps never interleave.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Iterator

_LOCK = threading.RLock()  # re-entrant: a silenced call may silence another inside it


@contextlib.contextmanager
def ignoring(message: str, category: type[Warning] = Warning) -> Iterator[None]:
    """Inside: warnings of `category` whose text starts with `message` (a regular expression) are ignored."""
    with _LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=message, category=category)
        yield
