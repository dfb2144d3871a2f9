"""Headless Chromium driven through the DevTools protocol (CDP), for looking at the Airflow UI as a user
does: real mouse clicks at an element's position (the UI's widgets ignore synthetic `element.click()`),
page scripts for reading the DOM, screenshots. Chromium is started here and stopped here, by its pid."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking "
    "--disable-component-update --disable-sync --window-size=1400,1400 --remote-debugging-port=0"
).split()


class BrowserError(AssertionError):
    pass


class Chromium:
    """One page of a private headless Chromium; use as a context manager."""

    def __init__(self, executable: str):
        self.executable = executable
        self.profile: str | None = None
        self.proc: subprocess.Popen | None = None
        self.ws: Any = None
        self.ids = itertools.count(1)

    def __enter__(self) -> Chromium:
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="pcflow-chromium-")
        self.proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = Path(self.profile, "DevToolsActivePort")
        for _ in range(150):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.2)
        else:
            raise BrowserError("chromium did not open its DevTools port")
        port = port_file.read_text().split()[0]
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=30).read())
        self.ws = connect(next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page"), max_size=2**26)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the session started for it above
            self.proc.wait(timeout=20)
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)

    def cdp(self, method: str, **params: Any) -> dict:
        message_id = next(self.ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.cdp("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"page script failed: {result['exceptionDetails']}\n{expression}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.cdp("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        """Poll a page expression until it is truthy (the UI renders asynchronously). While a page loads
        its document may have no body yet, so an expression that throws is polled again too; the last
        error is reported if it never comes true."""
        deadline = time.monotonic() + timeout
        last_error = ""
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v }})()")
            except BrowserError as error:
                value, last_error = None, f" (last: {error})"
            if value:
                return value
            time.sleep(0.5)
        raise BrowserError(f"not true after {timeout}s: {expression}{last_error}")

    def click(self, element: str) -> None:
        """A left click at the centre of the element the expression yields, scrolled into view."""
        centre = self.evaluate(
            f"""(() => {{ const e = {element}; if (!e) return null; e.scrollIntoView({{block: 'center'}});
            const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2] }})()"""
        )
        if centre is None:
            raise BrowserError(f"nothing to click: {element}")
        for kind in ("mousePressed", "mouseReleased"):
            self.cdp("Input.dispatchMouseEvent", type=kind, x=centre[0], y=centre[1], button="left", clickCount=1)

    def type_text(self, text: str) -> None:
        """Text typed into the focused element, as a keyboard does (the UI's inputs are controlled: only
        input events reach their state, never an assigned `value`)."""
        self.cdp("Input.insertText", text=text)

    def screenshot(self, path: Path) -> None:
        shot = self.cdp("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
