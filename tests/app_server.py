"""Start the real studio (offline model) on a free port in a subprocess, for API and browser tests."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    def __init__(self, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = open(ROOT / "tests" / "artifacts" / f"app-{self.port}.log", "w") if \
            (ROOT / "tests" / "artifacts").mkdir(parents=True, exist_ok=True) is None else None
        # one thread, as in the tests' own process (tests/conftest.py): on 2 cores beside the other pytest worker, a
        # two-threaded studio thrashes (a 40 s race took over 420 s in CI)
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(self.port), "--threads", "1",
                                      *extra],
                                     cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app exited with {self.proc.returncode}; see {self.log.name}")
            try:
                urllib.request.urlopen(self.url, timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError("the app did not start within 120 s")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
