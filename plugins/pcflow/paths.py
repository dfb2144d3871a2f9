"""Where pcflow's non-Python assets live (`include/`), in a checkout and in the Airflow image alike."""

from __future__ import annotations

import os
from pathlib import Path


def include_dir() -> Path:
    """`PCFLOW_INCLUDE_DIR`, else the `include/` beside `plugins/` (the layout of the repo and the image)."""
    configured = os.environ.get("PCFLOW_INCLUDE_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "include"
