"""The tests' servers (run.py, keystone.py) stop with the test process.

A test starts a server with a pipe as its stdin and holds the other end:
however that test process ends, the pipe closes, and the watcher forked
here sends the server's whole process group SIGTERM, then SIGKILL for one
that hangs on its way out, so that no server outlives its tests.
"""

import os
import signal
import time


def stop_with_stdin():
    """Stop the whole server when stdin reaches its end.

    Call it before the server starts any worker, so that the watcher
    holds no more than the process it forks from. The server itself reads
    nothing: its stdin becomes /dev/null.
    """
    if os.fork() == 0:
        # The watcher outlives its own SIGTERM, to follow it with SIGKILL
        # for a server that hangs on its way out.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            while os.read(0, 4096):
                pass
        finally:
            os.killpg(os.getpgrp(), signal.SIGTERM)
            time.sleep(5)
            os.killpg(os.getpgrp(), signal.SIGKILL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
