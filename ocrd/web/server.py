"""The console inside the daemon: uvicorn on its own asyncio loop in its own thread, so
that a slow browser never holds up intake; beside it the search indexer's thread, and
the page previews' worker process when a page is first looked at.

The socket is bound at start, in the daemon's thread: a port already taken is reported
there (and the daemon runs on without its console), and a missing token stops the start.
Its connections are bounded in number and in the time they may take to say what they
want (connections.py): the console shares the daemon's descriptors.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import structlog
import uvicorn

from ocrd.config import listen
from ocrd.config.roots import Roots
from ocrd.config.settings import Config
from ocrd.live import LiveStatus
from ocrd.render.previews import Previews
from ocrd.web import connections
from ocrd.web.app import create_app
from ocrd.web.auth import load_secret, load_token
from ocrd.web.context import Context
from ocrd.web.search import Indexer
from ocrd.web.store import Store

log = structlog.get_logger("ocrd.web")


class Console:
    def __init__(self, cfg: Config, live: LiveStatus | None, roots: Roots | None = None
                 ) -> None:
        web = cfg.web
        token = load_token(web)  # ConfigError: the daemon must not start without it
        self.previews = Previews(cfg.state_dir / "previews", web.previews_days,
                                 web.previews_max_bytes) if web.previews else None
        store = Store(cfg, self.previews, roots)
        self.ctx = Context(cfg, store, live.get if live is not None else lambda: None,
                           token, load_secret(cfg.state_dir))
        self.indexer = Indexer(store.search_path,
                               lambda after, n: store.journal().done_after(*after, n),
                               lambda job: store.text(job, ".md"),
                               each_round=store.let_go_of_stale_readers) if web.search else None
        self.address: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @classmethod
    def start(cls, cfg: Config, live: LiveStatus | None, roots: Roots | None = None
              ) -> Console:
        """Previews writer running, and the console listening (unless web.listen is
        null or its port cannot be bound: logged, and the daemon goes on). `roots`: the
        daemon's pinned folders, the only way the console reads the configured ones."""
        console = cls(cfg, live, roots)
        if console.previews is not None:
            console.previews.start()
        if console.indexer is not None:
            console.indexer.start()
        if cfg.web.listen is not None:
            try:
                console._listen(cfg.web.listen)
            except OSError as e:
                log.error("console_unavailable", listen=cfg.web.listen, error=str(e))
        return console

    def _listen(self, text: str) -> None:
        addr = listen.parse(text)
        sock = socket.socket(addr.family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr.host, addr.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.address = str(addr._replace(port=sock.getsockname()[1]))
        most = connections.max_connections()
        config = uvicorn.Config(create_app(self.ctx), log_config=None, access_log=False,
                                lifespan="off", loop="asyncio",
                                http=connections.HeaderTimeoutH11Protocol, ws="none",
                                timeout_graceful_shutdown=2, server_header=False,
                                timeout_keep_alive=connections.KEEP_ALIVE,
                                # requests in progress; connections are capped at `most`
                                limit_concurrency=most + 1, backlog=128)
        self._server = connections.ConsoleServer(config, most)
        self._thread = threading.Thread(target=self._run, name="console", daemon=True)
        self._thread.start()
        log.info("console_listening", address=self.address,
                 url=f"http://{self.address}/", token_required=self.ctx.token_required,
                 max_connections=most)

    def _run(self) -> None:
        assert self._server is not None and self._sock is not None
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(connections.exception_handler)
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._sock]))
        except Exception as e:  # noqa: BLE001 - the console failing must not stop intake
            log.error("console_failed", error=repr(e))
        finally:
            loop.close()

    def update_config(self, cfg: Config) -> None:
        """After a reload: inboxes added or removed are the console's too."""
        self.ctx.cfg = cfg
        self.ctx.store.cfg = cfg

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        if self.previews is not None:
            self.previews.stop()
        if self.indexer is not None:
            self.indexer.stop()
