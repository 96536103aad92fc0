"""The fleet's versions: one counter per area of tables, raised by the database in every
transaction that writes one of them (``versions/triggers.py``), and read by every cached answer
(``versions/cache.py``) to know whether what it kept still holds."""

from __future__ import annotations

from django.db import models


class Version(models.Model):
    """An area's counter. ``born`` is drawn at random when the row is made, so a counter that was
    deleted and made again (by hand, or a flush) never repeats a key an earlier one gave."""

    area = models.CharField(max_length=32, primary_key=True)
    n = models.BigIntegerField(default=0)
    born = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.area} {self.born}.{self.n}"
