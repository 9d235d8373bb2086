"""A paste filter that lets one API request run at a time.

The harness keeps Neutron's data in SQLite. Two requests that write at
once under eventlet can stall each other: the second waits for SQLite's
write lock in a C-level busy wait that blocks the whole process, so the
first, which holds the lock, never gets to commit, and after SQLite's
5 s the second fails with "database is locked" (a 500). A production
Neutron uses MySQL or PostgreSQL, which take concurrent writers; here the
requests are served in turn instead.
"""

import eventlet.semaphore
import webob.dec

_ONE_AT_A_TIME = eventlet.semaphore.Semaphore(1)


def filter_factory(global_conf):
    def make_filter(app):
        return SerialFilter(app)
    return make_filter


class SerialFilter(object):

    def __init__(self, app):
        self.app = app

    @webob.dec.wsgify
    def __call__(self, req):
        with _ONE_AT_A_TIME:
            # The whole answer is made (and its transaction committed)
            # before the next request begins.
            return req.get_response(self.app)
