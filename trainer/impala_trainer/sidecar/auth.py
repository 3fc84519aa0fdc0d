"""The optional bearer token: where it comes from and how a presented one is checked."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from impala_trainer.sidecar.settings import Settings

# The dashboard is opened by a browser, which cannot add an Authorization header to a page load;
# its login form stores the token in this cookie (SameSite=Strict) instead.
TOKEN_COOKIE = "impala_status_token"


class Unauthorized(Exception):
    """No token, or the wrong one (401)."""

    def __init__(self, error: str, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


class AuthUnavailable(Exception):
    """A token file is configured but cannot be read: fail closed (503), never open."""


class TokenSource:
    """The expected token: from settings, or from a file re-read whenever it changes.

    Kubernetes updates a mounted Secret by swapping a symlink, so the file's identity (inode,
    mtime, size) is checked on each request and a rotated token applies without a restart.
    """

    def __init__(self, settings: Settings) -> None:
        self._static = settings.token.get_secret_value().strip() if settings.token else None
        self._file: Path | None = settings.token_file
        self._key: tuple[int, int, int] | None = None
        self._from_file: str | None = None

    @property
    def enabled(self) -> bool:
        return self._static is not None or self._file is not None

    def expected(self) -> str | None:
        """The token requests must present, or None when auth is off."""
        if self._static is not None:
            return self._static
        if self._file is None:
            return None
        try:
            st = os.stat(self._file)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key != self._key:
                self._from_file = self._file.read_text().strip()
                self._key = key
        except OSError as err:
            raise AuthUnavailable(f"token file {self._file} is unreadable: {err.strerror}") from err
        if not self._from_file:
            raise AuthUnavailable(f"token file {self._file} is empty")
        return self._from_file

    def check(self, presented: str | None) -> None:
        """Raise `Unauthorized` unless `presented` is the expected token (constant-time)."""
        expected = self.expected()
        if expected is None:
            return
        if not presented:
            raise Unauthorized(
                "unauthorized", "this endpoint needs 'Authorization: Bearer <token>'"
            )
        # compare_digest takes time independent of where the strings differ.
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            raise Unauthorized("invalid_token", "the bearer token is not valid")
