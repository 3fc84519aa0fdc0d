"""Runtime knobs of the status sidecar: one pydantic-settings object, read from IMPALA_STATUS_*."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Sidecar settings; every field can be set as IMPALA_STATUS_<FIELD> (e.g. IMPALA_STATUS_TOKEN).

    `impalajob status-server` flags override the environment.
    """

    model_config = SettingsConfigDict(env_prefix="IMPALA_STATUS_", extra="ignore")

    run_dir: Path = Path(".")
    """Run directory the trainer writes (status.json, history.jsonl, summary.json)."""

    job_name: str | None = None
    """Job name for the `job` metric label; default: the snapshot's `job`, else the dir name."""

    ready_max_age_seconds: float = Field(default=120.0, gt=0)
    """/readyz fails when a running job's snapshot is older than this. Finished runs stay ready."""

    token: SecretStr | None = None
    """Bearer token required on every endpoint but /healthz. Unset (and no token_file): no auth."""

    token_file: Path | None = None
    """File holding the token (a mounted Secret); re-read when it changes, so rotation works."""

    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Origins allowed to read the API cross-site (comma-separated or JSON). Empty: CORS off."""

    history_max_points: int = Field(default=10_000, ge=16, le=1_000_000)
    """History points held in memory, however long the run (older points are thinned, not lost)."""

    history_default_limit: int = Field(default=1000, ge=1, le=100_000)
    """Points /history returns when the request gives no `limit`."""

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        # Env vars are easier to write as "a,b" than as JSON; accept both.
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        # An empty IMPALA_STATUS_TOKEN (e.g. an optional Secret key) means "no token", not "".
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @property
    def auth_enabled(self) -> bool:
        """Whether requests must present a token."""
        return self.token is not None or self.token_file is not None


@lru_cache
def get_settings() -> Settings:
    """Settings from the environment, built once per process."""
    return Settings()
