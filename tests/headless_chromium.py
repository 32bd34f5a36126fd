"""Open a page in real headless Chromium over the DevTools protocol (``--remote-debugging-pipe``):
load it, collect console errors and uncaught exceptions, evaluate expressions in the page.

The pipe protocol: JSON messages, each ended by a NUL byte; the browser reads fd 3 and writes fd 4.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


class Browser:
    """One headless Chromium process and one page; use as a context manager (the process group is
    killed and the profile removed on exit)."""

    def __init__(self, executable: str, deadline_s: float = 60.0):
        self.deadline_s = deadline_s
        self.profile = tempfile.mkdtemp(prefix="resilience-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # the browser expects its pipe ends as fds 3 and 4
            # copies first: a pipe end may already be fd 3 or 4, and dup2 onto itself would keep
            # its close-on-exec flag
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"],
            # close_fds would run after preexec_fn and close fds 3 and 4 again; the pipes themselves
            # are not inheritable, so only the two dup2 copies reach the browser
            preexec_fn=child_fds, close_fds=False, start_new_session=True,
            # its temporary files go into the profile, removed with it (a SIGKILLed browser keeps them)
            env={**os.environ, "TMPDIR": self.profile},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- protocol -------------------------------------------------------------------------------
    def _read_message(self, until: float) -> dict:
        while b"\0" not in self._buffer:
            left = until - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer over the DevTools pipe in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the DevTools pipe (exit {self.process.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = True, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        until = time.monotonic() + self.deadline_s
        while True:
            reply = self._read_message(until)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        until = time.monotonic() + self.deadline_s
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read_message(until)
            self.events.append(event)
            if event.get("method") == method:
                return event

    # -- page -----------------------------------------------------------------------------------
    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", session=False, url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", session=False, targetId=target, flatten=True)["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(domain)
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads the page produced so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return found

    def screenshot(self, path: Path) -> None:
        import base64

        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
