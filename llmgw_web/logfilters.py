"""Log filters: a refused request is one line, not a traceback.

Django logs every 4xx answer to ``django.request`` with the exception attached,
so a page refused for a missing permission printed a whole traceback; the line
already says what was refused, where and with which status.
"""

from __future__ import annotations

import logging


class RefusalWithoutTraceback(logging.Filter):
    """Keeps a client error's record (status below 500) and drops its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
