"""A real `tensorboard` process on a free loopback port, for tests that read its HTTP API."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TensorBoardServer:
    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                logdir,
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--reload_interval",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def get(self, path: str, **params: str):
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read().decode("utf-8"))

    def wait_for(self, path: str, ready, timeout_s: float = 90.0, **params: str):
        """Poll ``path`` until ``ready(payload)`` holds; fail with the server's stderr otherwise."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tensorboard exited: {self.process.stderr.read().decode()[-2000:]}")
            try:
                last = self.get(path, **params)
                if ready(last):
                    return last
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"tensorboard {path} not ready after {timeout_s} s; last answer: {last!r}")

    def close(self) -> None:
        """Stop the server and every process it started: torch-tb-profiler's plugin loads runs in spawned
        processes that outlive a terminated server (CI left three, ~440 MB, after each browser test)."""
        import psutil

        try:
            started = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            started = []
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for child in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(started, timeout=10)
        self.process.stderr.close()
