"""How `tether view` runs; read once from TETHER_VIEW_* (and TETHER_BUS_* for Kafka)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ViewSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_VIEW_", frozen=True)

    run_id: str | None = Field(None, description="Only this run (default: every run on the topics).")
    dsn: str | None = Field(None, description="Where the page's store lives: chdb://PATH (in this process) or a "
                            "ClickHouse URL (default: chdb://.tether/view/RUN, or .../all: chdb holds its folder, so "
                            "two pages need two). It is filled from the topics, so it may be thrown away.")
    model: Path | None = Field(None, description="A Hugging Face folder whose tokenizer shows response tokens as "
                                                 "text (default: token ids).")
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    follow: bool = Field(True, description="Keep reading the topics: a refresh shows what arrived since.")

    @property
    def store(self) -> str:
        return self.dsn or f"chdb://.tether/view/{self.run_id or 'all'}"
