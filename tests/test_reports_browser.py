"""The report in a real browser: headless Chromium (Debian's package) driven over the DevTools protocol.

It loads report.html from disk and checks: no console error, no request but the file itself (data:
URIs allowed), every chart's <svg> has a nonzero box, and the screenshot is not blank. The
screenshot stays in the test's tmp_path (its path is printed).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from mystique.reports import render_report

try:  # the fixture runs are shared with test_reports.py (tests/ is on sys.path, or is a package)
    from test_reports import CPU, GPU, make_run
except ModuleNotFoundError:  # pragma: no cover
    from tests.test_reports import CPU, GPU, make_run

CHROMIUM = next(
    (
        p
        for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
        if p and os.path.exists(p)
    ),
    None,
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-port=0",
]


class DevTools:
    """A minimal Chrome DevTools Protocol client over one websocket (flattened sessions)."""

    def __init__(self, ws_url: str):
        import websocket  # websocket-client

        self.timeout = 60.0
        self.ws = websocket.create_connection(ws_url, timeout=self.timeout, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        msg_id = next(self.ids)
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for ev in self.events[seen:]:
                if ev.get("method") == method:
                    return ev
            seen = len(self.events)
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            self.events.append(json.loads(self.ws.recv()))
            self.ws.settimeout(self.timeout)
        raise TimeoutError(method)

    def drain(self, seconds: float) -> None:
        """Collect the events arriving within ``seconds`` (late console messages, requests)."""
        import websocket

        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.ws.settimeout(left)
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
        self.ws.settimeout(self.timeout)

    def close(self) -> None:
        self.ws.close()


def _start_chromium(profile: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120  # a liveness bound (a busy host starts Chromium slowly), not a speed check
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line)
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:
            return proc, m[1]
    proc.kill()
    raise RuntimeError("chromium did not start its DevTools endpoint:\n" + "".join(lines[-20:]))


def browse(html_path: Path, screenshot: Path) -> dict:
    """Load ``html_path`` in headless Chromium; return what it saw and write a full-page screenshot."""
    profile = Path(tempfile.mkdtemp(prefix="mystique-chromium-"))
    proc, ws_url = _start_chromium(profile)
    try:
        dt = DevTools(ws_url)
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            dt.call(f"{domain}.enable", session=session)
        dt.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        url = html_path.resolve().as_uri()
        dt.call("Page.navigate", {"url": url}, session=session)
        dt.wait_for("Page.loadEventFired")
        dt.drain(0.5)
        boxes = dt.call(
            "Runtime.evaluate",
            {
                "expression": "JSON.stringify(Array.from(document.querySelectorAll('figure.chart svg'))"
                ".map(s => {const r = s.getBoundingClientRect(); const c = getComputedStyle(s);"
                "return [r.width, r.height, c.visibility, c.display, s.querySelectorAll('text').length];}))",
                "returnByValue": True,
            },
            session=session,
        )["result"]["value"]
        metrics = dt.call("Page.getLayoutMetrics", session=session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        width, height = 1280, min(int(size["height"]), 12000)
        shot = dt.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
            session=session,
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        dt.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    errors = []
    requests = []
    for ev in dt.events:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(str(p.get("args")))
        elif method == "Runtime.exceptionThrown":
            errors.append(str(p.get("exceptionDetails")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append(p["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            requests.append(p["request"]["url"])
    return {"url": url, "errors": errors, "requests": requests, "boxes": json.loads(boxes)}


def test_report_in_headless_chromium(tmp_path: Path):
    make_run(tmp_path / "cpu", CPU, "a1b2c3d4e5f6", "2025-05-01T10:00:00+00:00", fail_mm_bf16=False)
    make_run(tmp_path / "gpu", GPU, "f6e5d4c3b2a1", "2025-05-02T08:00:00+00:00", fail_mm_bf16=True)
    report = render_report([tmp_path / "cpu", tmp_path / "gpu"], tmp_path / "report.html")
    screenshot = tmp_path / "report.png"
    seen = browse(report, screenshot)
    print(f"\nscreenshot: {screenshot}")

    assert seen["errors"] == []
    assert [u for u in seen["requests"] if u != seen["url"] and not u.startswith("data:")] == []
    assert seen["url"] in seen["requests"]
    assert len(seen["boxes"]) >= 6
    for w, h, visibility, display, texts in seen["boxes"]:
        assert w > 100 and h > 50 and visibility == "visible" and display != "none" and texts > 0

    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(screenshot)
    assert img.shape[1] == 1280 and img.shape[0] > 2000  # the whole page, not a viewport
    rgb = img[..., :3]
    colors = np.unique((rgb.reshape(-1, 3) * 255).astype(np.uint8)[::7], axis=0)
    assert rgb.std() > 0.05 and len(colors) > 50, "screenshot is blank"
    red = (rgb[..., 0] > 0.7) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3)
    assert red[:200].any(), "the FAIL verdict is not at the top of the page"
