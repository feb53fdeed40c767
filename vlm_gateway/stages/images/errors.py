"""The one error type of the image pipeline: a message for the client and a code."""

from __future__ import annotations


class ImageError(ValueError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
