"""A small headless-Chromium driver over the DevTools protocol (no downloads, no websocket library).

Chromium is started with ``--remote-debugging-pipe``: it reads protocol messages from file
descriptor 3 and writes its own to descriptor 4, each a JSON text ending in a NUL byte. One page
target is created and attached in flat mode, so every command carries its ``sessionId``.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

#: Names Debian and others give the browser.
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> Optional[str]:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless browser with one page; use as a context manager."""

    def __init__(self, executable: str, width: int = 1280, height: int = 900, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="twice-view-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        args = [executable, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--disable-component-update",
                "--disable-default-apps", "--mute-audio", "--hide-scrollbars", f"--window-size={width},{height}",
                "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root (CI runs as root)
        # a trampoline puts the pipe ends on descriptors 3 and 4 in the child, then becomes chromium
        wire = ("import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
                "[os.close(fd) for fd in (r, w) if fd not in (3, 4)]; os.execv(sys.argv[3], sys.argv[3:])")
        self.proc = subprocess.Popen([sys.executable, "-c", wire, str(to_child_r), str(from_child_w)] + args,
                                     pass_fds=(to_child_r, from_child_w), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict] = []
        self.session: Optional[str] = None
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # ------------------------------------------------------------------ protocol
    def _send(self, msg: dict) -> None:
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self._to_child, data)
            data = data[n:]

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("no answer from chromium in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium closed its pipe")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: Optional[dict] = None, *, session: bool = True,
             timeout: Optional[float] = None) -> dict:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Collect events for ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                self.events.append(self._read(deadline))
        except BrowserError:
            pass

    # ------------------------------------------------------------------ page
    def navigate(self, url: str) -> None:
        res = self.call("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise BrowserError(f"navigate {url}: {res['errorText']}")

    def evaluate(self, expression: str, timeout: Optional[float] = None) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                        timeout=timeout)
        if "exceptionDetails" in res:
            raise BrowserError(f"script failed: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, interval: float = 0.01) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression}")
            time.sleep(interval)

    def open(self, path: Path, timeout: float = 60.0) -> float:
        """Load a local file and wait until the page says it is ready; returns the seconds it took."""
        t0 = time.perf_counter()
        self.navigate(Path(path).resolve().as_uri())
        self.wait_for("!!document.documentElement && document.documentElement.getAttribute('data-ready') === '1'",
                      timeout=timeout)
        return time.perf_counter() - t0

    def click(self, x: float, y: float) -> None:
        """A real mouse click at page coordinates."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, path: Path, clip: Optional[dict] = None) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if clip:
            params["clip"] = {**clip, "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def requests(self) -> list[str]:
        """URLs of every request the page sent so far."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False, timeout=5)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
