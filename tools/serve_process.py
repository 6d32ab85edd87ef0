"""An `adafuse-serve` process on the loopback, for the server's tests and its bench (tools/bench_serve.py):
started on a free port (the log says which), stopped by SIGTERM (its drain), killed only if it hangs."""

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

READY = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)")
METRIC = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$")


class ServerProcess:
    def __init__(self, process: subprocess.Popen, log: Path):
        self.process, self.log = process, log
        self.url = ""

    def wait_ready(self, seconds: float) -> None:
        """Until the log names the address uvicorn listens on; raises with the log if the process ends first."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = READY.search(self.log_text())
            if found:
                self.url = found.group(1)
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"adafuse-serve exited with {self.process.returncode}:\n{self.log_text()[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"adafuse-serve not listening after {seconds:.0f} s:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """/metrics as {"name{labels}": value}."""
        import httpx

        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return {m.group(1) + (m.group(2) or ""): float(m.group(3)) for m in map(METRIC.match, text.splitlines()) if m}

    def terminate(self, seconds: float = 60) -> int:
        """SIGTERM, then the exit status once it has drained (killed if it takes longer than `seconds`)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


@contextmanager
def serving(*args: str, log: Path, ready_seconds: float = 300, env: dict | None = None) -> Iterator[ServerProcess]:
    """`python -m serve ARGS --port 0`, its output in `log`, ready to answer on its `url`; `env` adds to the
    environment."""
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "serve", *args, "--port", "0"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    server = ServerProcess(process, log)
    try:
        server.wait_ready(ready_seconds)
        yield server
    finally:
        server.terminate()
