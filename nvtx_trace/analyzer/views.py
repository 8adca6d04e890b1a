"""What a question may show, without knowing the renderer: the terminal and HTML renderers implement these.

A question's ``text(a, view)`` prints lines (rich markup allowed) and tables through a ``TextView``; its
``html(a, summary, view)`` returns HTML built with ``view.table``. So no analysis module imports a renderer.
"""

from __future__ import annotations

from typing import Protocol


class TextView(Protocol):
    def print(self, *parts, **options) -> None: ...

    def table(self, title: str, columns: list[tuple[str, str]], rows: list[list[str]]) -> None:
        """``columns``: (header, "left" | "right")."""

    def escape(self, text: str) -> str: ...

    def item(self, marker: str, *lines: str) -> None:
        """A numbered item: ``marker`` then its lines, each wrapped under the first (a hanging indent)."""


class HtmlView(Protocol):
    def table(self, df, title: str, columns: dict[str, str], explain: str = "") -> str: ...
