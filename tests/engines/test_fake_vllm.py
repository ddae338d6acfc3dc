"""The fake `vllm serve` itself fails as a real one does: the reliability tests trust it
to drop every connection when it stops."""

from __future__ import annotations

import asyncio
import socket

from fake_vllm import FakeVllm


def test_a_stopped_server_keeps_no_connection_it_accepted_before_stopping() -> None:
    """A server that exits closes every connection, those its event loop had accepted
    but not yet handed to a handler too: a page sent on one must not wait for an
    answer from a server that is gone (it would wait for the request's timeout)."""

    async def run() -> tuple[int, int]:
        fake = await FakeVllm(latency=3600).start()
        clients = []
        for _ in range(300):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", fake.port))
            except BlockingIOError:
                pass
            clients.append(s)
        for _ in range(3):  # the loop accepts some; their handlers have not run yet
            await asyncio.sleep(0)
        await fake.stop()
        await asyncio.sleep(0.5)  # the handlers of those accepted run now
        handled, open_ = fake.connections, len(fake._writers)
        for s in clients:
            s.close()
        return handled, open_

    handled, still_open = asyncio.run(run())
    assert handled > 0  # some were accepted before the stop (the case under test)
    assert still_open == 0
