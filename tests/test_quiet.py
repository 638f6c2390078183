"""`jdtr.quiet.ignoring`: filters swapped in several threads at once never let a silenced warning through."""

from __future__ import annotations

import sys
import threading
import time
import warnings

from jdtr.quiet import ignoring


def test_ignoring_in_several_threads_at_once_lets_nothing_through():
    # Switching threads every microsecond interleaves the filter swaps of
    # `catch_warnings`; without one lock around them, a thread's exit puts
    # back a list without another's filter while that one is still inside.
    errors = []

    def work():
        try:
            for _ in range(500):
                with ignoring("jdtr test warning", RuntimeWarning):
                    time.sleep(0)  # another thread enters and leaves meanwhile
                    warnings.warn("jdtr test warning", RuntimeWarning)
        except RuntimeWarning as err:
            errors.append(err)

    interval = sys.getswitchinterval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sys.setswitchinterval(1e-6)
        try:
            threads = [threading.Thread(target=work) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
        assert errors == []
        # The filters are the caller's again, and the warning is an error outside.
        try:
            warnings.warn("jdtr test warning", RuntimeWarning)
        except RuntimeWarning:
            pass
        else:
            raise AssertionError("the filter leaked out of `ignoring`")
