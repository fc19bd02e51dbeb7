"""For bench/load.py --cprofile DIR only: every server process built from this interpreter profiles each of
its threads (the event loop's and the pools' alike) with cProfile on the thread's own CPU clock, and writes
one pstats file per thread into DIR when it is stopped. uvicorn re-raises SIGTERM after its own shutdown
(so `atexit` never runs): the files are written from a SIGTERM handler installed before it starts."""

import cProfile
import os
import signal
import threading
import time

_folder = os.environ["BENCH_CPROFILE"]
_profiles = [cProfile.Profile(time.thread_time)]
_profiles[0].enable()
_run = threading.Thread.run


def _profiled_run(self):
    profile = cProfile.Profile(time.thread_time)
    _profiles.append(profile)
    profile.enable()
    try:
        _run(self)
    finally:
        profile.disable()


def _write(*_):
    _profiles[0].disable()
    for number, profile in enumerate(list(_profiles)):
        try:
            profile.dump_stats(os.path.join(_folder, f"{os.getpid()}.{number}.pstats"))
        except (TypeError, ValueError):  # a thread's profile still running: left out
            pass
    os._exit(0)


threading.Thread.run = _profiled_run
signal.signal(signal.SIGTERM, _write)
