"""Screenshot every page of the rendered book, as a reader on a laptop sees it.

    make book
    .venv/bin/python tools/screenshot_book.py [--html _build/html] [--out _build/screenshots] [pages...]

Headless Chromium (`apt-get install chromium`) draws each page of the table of contents in a
1280 x 2000 window; the page is scrolled a window at a time and each view saved as
`<page>_<n>.png`, so every part of a long chapter can be looked at. Look at them for stray
warnings, machine paths, tracebacks, tables or text cut off at the right edge, and plots too
small to read. The script also lists the text of each page that looks like one of those (a
quick pointer to where to look; the screenshots are the check). `pages`: names to match
(`32_fusion`), all pages when none are given.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tornado.websocket import websocket_connect

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1280, 2000

# what a reader should not meet in a page's outputs
SUSPECT = re.compile(r"(\w*Warning:|Traceback \(most recent call last\)|/work/|/home/|/tmp/|\.venv/"
                     r"|site-packages|Error:)")


def pages(html: Path, wanted: list[str]) -> list[Path]:
    """The book's pages (not the index and search pages), by path."""
    found = [p for p in sorted(html.rglob("*.html")) if not p.name.startswith(("genindex", "search"))
             and "_static" not in p.parts and "_sources" not in p.parts]
    if wanted:
        found = [p for p in found if any(w in str(p.relative_to(html)) for w in wanted)]
    return found


def suspect_lines(page: Path) -> list[str]:
    """Text in the page's cell outputs that looks like a warning, a traceback or a machine path."""
    text = page.read_text(errors="replace")
    outputs = re.findall(r'<div class="cell_output[^"]*"[^>]*>(.*?)</div>\s*</div>', text, re.S)
    lines = []
    for block in outputs:
        plain = re.sub(r"<[^>]+>", "", block)
        lines += [line.strip()[:160] for line in plain.splitlines() if SUSPECT.search(line)]
    return lines


class Browser:
    """Headless Chromium driven through its DevTools protocol (one tab)."""

    def __init__(self, chromium: str):
        self.profile = tempfile.mkdtemp(prefix="screenshot-book-")
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={WIDTH},{HEIGHT}", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile, "DevToolsActivePort")
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        self.url = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
        self.ws, self.next_id = None, 0

    async def call(self, method: str, **params):
        self.next_id += 1
        await self.ws.write_message(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(await self.ws.read_message())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    async def evaluate(self, expression: str):
        return (await self.call("Runtime.evaluate", expression=expression, returnByValue=True))["result"]["value"]

    async def shoot(self, page: Path, out: Path, name: str) -> list[Path]:
        if self.ws is None:
            self.ws = await websocket_connect(self.url, max_message_size=1 << 28)
            await self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                            deviceScaleFactor=1, mobile=False)
        await self.call("Page.navigate", url=page.as_uri())
        for _ in range(600):
            if await self.evaluate("document.readyState") == "complete":
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)                  # fonts, MathJax
        height = await self.evaluate("document.documentElement.scrollHeight")
        shots = []
        for n, y in enumerate(range(0, max(height, 1), HEIGHT - 100), 1):   # 100 px overlap
            await self.evaluate(f"window.scrollTo(0, {y})")
            await asyncio.sleep(0.2)
            data = (await self.call("Page.captureScreenshot", format="png"))["data"]
            shots.append(out / f"{name}_{n:02d}.png")
            shots[-1].write_bytes(base64.b64decode(data))
        return shots

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


async def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "screenshots")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser")
                        or "chromium")
    parser.add_argument("pages", nargs="*")
    args = parser.parse_args()
    args.html = args.html.resolve()
    if not (args.html / "index.html").exists():
        raise SystemExit(f"no book at {args.html}: run `make book` first")
    args.out.mkdir(parents=True, exist_ok=True)
    browser = Browser(args.chromium)
    try:
        for page in pages(args.html, args.pages):
            name = str(page.relative_to(args.html).with_suffix("")).replace("/", "_")
            shots = await browser.shoot(page, args.out, name)
            print(f"{page.relative_to(args.html)}: {len(shots)} screenshot(s)")
            for line in suspect_lines(page):
                print(f"    look at: {line}")
    finally:
        browser.close()
    print(f"screenshots in {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
