"""The browser tests' fixtures (tests/browser/browser_support.py)."""

from tests.browser.browser_support import browser, demo, page, shots

__all__ = ["browser", "demo", "page", "shots"]
