"""What the tests of both offline pages (the explorer, the atlas page) need to read one: its
<script> blocks and links, and headless Chromium with the flags a closed network needs."""

from __future__ import annotations

import shutil
from html.parser import HTMLParser

#: Chromium on PATH (None: the browser tests skip)
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
#: the flags a closed network needs (no background connections), as root in a container
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


class Scripts(HTMLParser):
    """Every <script> block's id and text, and every src/href attribute of the page."""

    def __init__(self):
        super().__init__()
        self.blocks, self.links, self._id = {}, [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [attrs[k] for k in ("src", "href") if k in attrs]
        if tag == "script":
            self._id = attrs.get("id", f"anonymous-{len(self.blocks)}")
            self.blocks[self._id] = ""

    def handle_data(self, data):
        if self._id is not None:
            self.blocks[self._id] += data

    def handle_endtag(self, tag):
        if tag == "script":
            self._id = None
