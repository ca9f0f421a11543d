"""Headless Chromium driven over the DevTools protocol on a pipe, with the network cut off.

``open_page(url)`` loads a page in a fresh headless Chromium (``--remote-debugging-pipe``: the
protocol's JSON messages, NUL-separated, on the child's fds 3 and 4; nothing listens on a port)
and returns what a reader of the page would meet:

- every request the page makes is paused by the Fetch domain: a ``file:`` URL goes on, any other
  is aborted and counted (``blocked``), so the page cannot reach the network even if it tries;
- console errors, uncaught exceptions and error log entries (``errors``);
- each image's ``src`` and whether it loaded (``images``), read after the load event;
- the page's size as laid out (``scroll_width``, ``scroll_height``, ``viewport_width``);
- a screenshot of the whole page at a fixed width, as tiles from the top down (``screenshots``:
  PNG bytes each, at most ``TILE_HEIGHT`` px tall: one capture taller than Chromium's largest
  texture is cut off), together exactly the page's height.

Every wait is bounded (``TIMEOUT`` seconds in all); the browser is killed on the way out.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

TIMEOUT = 90.0
WIDTH = 1400
TILE_HEIGHT = 16384  # Chromium's largest texture side: a taller capture loses the rest of the page

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)

IMAGES = ("JSON.stringify([...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0, "
          "i.naturalWidth, i.getBoundingClientRect().width - i.clientLeft * 2]))")  # drawn width, border off
SIZE = ("JSON.stringify([document.documentElement.scrollWidth, document.documentElement.scrollHeight, "
        "window.innerWidth])")


@dataclass
class PageVisit:
    images: list[tuple[str, bool]] = field(default_factory=list)  # (src, loaded)
    image_widths: dict[str, tuple[int, float]] = field(default_factory=dict)  # src: (its pixels, drawn CSS px)
    blocked: list[str] = field(default_factory=list)  # URLs of aborted requests
    allowed: list[str] = field(default_factory=list)  # file: URLs the page loaded
    errors: list[str] = field(default_factory=list)
    screenshots: list[bytes] = field(default_factory=list, repr=False)  # tiles, top down
    scroll_width: int = 0
    scroll_height: int = 0
    viewport_width: int = 0
    probe: object = None  # the value of ``open_page(..., probe=EXPRESSION)`` after the load


class _Pipe:
    """The protocol over the child's fds 3 (commands in) and 4 (replies and events out)."""

    def __init__(self, deadline: float):
        self.to_browser_r, self.to_browser_w = os.pipe()
        self.from_browser_r, self.from_browser_w = os.pipe()
        self.deadline = deadline
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []

    def child_setup(self) -> None:
        """In the child before exec: our pipe ends become fds 3 and 4 (copied first, so neither
        end is closed by the other's move); pass_fds keeps 3 and 4 open through the exec."""
        commands, replies = os.dup(self.to_browser_r), os.dup(self.from_browser_w)
        os.dup2(commands, 3)
        os.dup2(replies, 4)

    def parent_setup(self) -> None:
        os.close(self.to_browser_r)
        os.close(self.from_browser_w)

    def close(self) -> None:
        for fd in (self.to_browser_w, self.from_browser_r):
            try:
                os.close(fd)
            except OSError:
                pass

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser_w, json.dumps(message).encode() + b"\0")
        return self.next_id

    def receive(self) -> dict:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self.from_browser_r], [], [], left)
            if ready:
                chunk = os.read(self.from_browser_r, 1 << 20)
                if not chunk:
                    raise EOFError("Chromium closed its protocol pipe")
                self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, session: str | None = None, on_event=None) -> dict:
        """Send a command and wait for its reply; events that arrive meanwhile go to ``on_event``."""
        wanted = self.send(method, params, session)
        while True:
            message = self.receive()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if on_event is not None and "method" in message:
                on_event(message)


def open_page(url: str, width: int = WIDTH, probe: str | None = None) -> PageVisit:
    if CHROMIUM is None:
        raise FileNotFoundError("no Chromium on PATH (apt-get install -y chromium)")
    visit = PageVisit()
    deadline = time.monotonic() + TIMEOUT
    pipe = _Pipe(deadline)
    profile = tempfile.mkdtemp(prefix="kvoffload-chromium-")
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
               "--disable-background-networking", "--disable-component-update", "--no-first-run",
               "--disable-extensions", "--disable-sync", "--allow-file-access-from-files",
               f"--user-data-dir={profile}", "about:blank"]
    browser = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, pass_fds=(3, 4),
                               preexec_fn=pipe.child_setup)
    pipe.parent_setup()
    loaded = []
    session: str | None = None

    def on_event(message: dict) -> None:
        method, params = message["method"], message.get("params", {})
        if method == "Fetch.requestPaused":
            request_url = params["request"]["url"]
            if request_url.startswith("file:"):
                visit.allowed.append(request_url)
                pipe.send("Fetch.continueRequest", {"requestId": params["requestId"]}, session)
            else:
                visit.blocked.append(request_url)
                pipe.send("Fetch.failRequest", {"requestId": params["requestId"], "errorReason": "BlockedByClient"},
                          session)
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            visit.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                       for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            visit.errors.append("exception: " + str(details.get("exception", {}).get("description", details)))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            visit.errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Page.loadEventFired":
            loaded.append(True)

    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"}, on_event=on_event)["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                            on_event=on_event)["sessionId"]
        for method, params in (("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}), ("Runtime.enable", {}),
                               ("Log.enable", {}), ("Page.enable", {}),
                               ("Emulation.setDeviceMetricsOverride",
                                {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})):
            pipe.call(method, params, session, on_event=on_event)
        pipe.call("Page.navigate", {"url": url}, session, on_event=on_event)
        while not loaded:
            message = pipe.receive()
            if "method" in message:
                on_event(message)
        images = pipe.call("Runtime.evaluate", {"expression": IMAGES, "returnByValue": True}, session,
                           on_event=on_event)["result"]["value"]
        visit.images = [(src, bool(ok)) for src, ok, _, _ in json.loads(images)]
        visit.image_widths = {src: (natural, drawn) for src, _, natural, drawn in json.loads(images)}
        if probe is not None:
            visit.probe = pipe.call("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session,
                                    on_event=on_event)["result"].get("value")
        size = pipe.call("Runtime.evaluate", {"expression": SIZE, "returnByValue": True}, session,
                         on_event=on_event)["result"]["value"]
        visit.scroll_width, visit.scroll_height, visit.viewport_width = json.loads(size)
        for top in range(0, visit.scroll_height, TILE_HEIGHT):  # each tile a clip of the laid-out page
            clip = {"x": 0, "y": top, "width": visit.viewport_width,
                    "height": min(TILE_HEIGHT, visit.scroll_height - top), "scale": 1}
            shot = pipe.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                             session, on_event=on_event)
            visit.screenshots.append(base64.b64decode(shot["data"]))
        try:
            pipe.call("Browser.close", on_event=on_event)
        except (EOFError, RuntimeError):
            pass
    finally:
        pipe.close()
        browser.kill()
        browser.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
    return visit


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n") or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
