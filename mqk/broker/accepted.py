"""The connections a listener accepted, so that stopping the listener leaves no socket open.

asyncio's `Server.close()` only stops accepting, and in Python 3.11 `Server.wait_closed()` does not wait for the
connections already made. A connection that is closed while answers still wait in its write buffer (its client
stopped reading) keeps its socket until those bytes drain, which may be never; one accepted in the same turn of the
loop as the stop is not yet among the connections the stop closes. An embedded broker (mqk.testing) would leave such
sockets open in its host process after `stop()`. So every listener registers each transport it accepts here, and
its stop, once it has closed its connections the polite way and finished the rest of its shutdown, aborts whatever
is still open; a connection that arrives after that is aborted as it is made.
"""

from __future__ import annotations

import asyncio
import weakref


class AcceptedTransports:
    """The transports one listener accepted (weakly held: a closed one simply goes)."""

    def __init__(self) -> None:
        self._open: weakref.WeakSet[asyncio.WriteTransport] = weakref.WeakSet()
        self.stopped = False

    def add(self, transport: asyncio.WriteTransport) -> bool:
        """Track a new connection's transport; False, with the transport aborted, once the listener has stopped."""
        if self.stopped:
            transport.abort()
            return False
        self._open.add(transport)
        return True

    async def abort_all(self) -> None:
        """Abort every transport still open (their unsent bytes are dropped) and every later one; returns once their
        sockets are closed (a transport closes its socket on the loop's next turn)."""
        self.stopped = True
        aborted = False
        for transport in list(self._open):
            transport.abort()
            aborted = True
        self._open.clear()
        if aborted:
            await asyncio.sleep(0)
