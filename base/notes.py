"""What could not be checked, or was assumed: each thing said once, in the order found.

The model-files reader and the planners both keep such notes; the change or
shape they return carries them.
"""

from __future__ import annotations


class Notes:
    def __init__(self) -> None:
        self._sentences: list[str] = []

    def add(self, sentence: str) -> None:
        if sentence not in self._sentences:
            self._sentences.append(sentence)

    def as_tuple(self) -> tuple[str, ...]:
        return tuple(self._sentences)

    def text(self) -> str:
        return " ".join(self._sentences)
