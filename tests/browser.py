"""A page as a person sees it: rendered by a real headless Chromium (Debian's ``chromium`` package).

Two passes of the browser: the DOM after loading (what the page holds) and a screenshot (what it
shows). Plots are read back from the images the page embeds.
"""

from __future__ import annotations

import base64
import html
import io
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-extensions",
]


@dataclass
class Page:
    dom: str
    screenshot: Image.Image

    def images(self) -> dict[str, Image.Image]:
        """The page's embedded PNGs by their alt text."""
        out = {}
        for alt, data in re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', self.dom):
            out[html.unescape(alt)] = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
        return out


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is not installed: `apt-get install -y chromium` (make test does it)")
    return binary


def render(page: Path, screenshot: Path, width: int = 1280, height: int = 3000) -> Page:
    url = page.resolve().as_uri()
    dom = subprocess.run([chromium(), *FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and dom.stdout, dom.stderr[-2000:]
    shot = subprocess.run(
        [chromium(), *FLAGS, f"--window-size={width},{height}", f"--screenshot={screenshot}", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    return Page(dom=dom.stdout, screenshot=Image.open(screenshot).convert("RGB"))


def colourful_pixels(image: Image.Image, spread: int = 60) -> int:
    """Pixels of a clear colour (data lines, markers, bands), not the white, grey and black of axes and text."""
    return sum(1 for r, g, b in image.get_flattened_data() if max(r, g, b) - min(r, g, b) > spread)
