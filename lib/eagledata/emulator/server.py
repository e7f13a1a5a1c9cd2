"""Serve the emulator with uvicorn (uvloop + httptools), sized for thousands of open connections."""
from __future__ import annotations

import resource
import socket

import uvicorn

from ..text import load_tokenizer
from .config import EmulatorConfig
from .routes import create_app

BACKLOG = 4096


def raise_fd_limit() -> int:
    """Each open request is a socket: lift the soft file limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def serve(cfg: EmulatorConfig, host: str = "127.0.0.1", port: int = 0) -> None:
    """Bind first (so `--port 0` can print the port it got), then run until SIGINT/SIGTERM."""
    raise_fd_limit()
    tok = load_tokenizer(cfg.tokenizer)
    app = create_app(cfg, tok)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    bound = sock.getsockname()[1]
    # A short graceful shutdown: stopping must not wait for requests that sleep for minutes.
    config = uvicorn.Config(app, loop="uvloop", http="httptools", backlog=BACKLOG, log_level="warning",
                            access_log=False, lifespan="off", timeout_keep_alive=30,
                            timeout_graceful_shutdown=1, limit_concurrency=None)
    server = uvicorn.Server(config)
    host_url = f"[{host}]" if ":" in host else host
    print(f"eagledata emulator listening on http://{host_url}:{bound}/api/v1", flush=True)
    server.run(sockets=[sock])
