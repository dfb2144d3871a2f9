"""The page's app as the plugin mounts it: imported on its first request. Every Airflow process loads
plugins (scheduler, workers, each task's runner); FastAPI and Airflow's security helpers would add about
0.6 s to each of them, and only the api-server ever serves the page."""

from __future__ import annotations

import importlib
from typing import Any


class LazyApp:
    """An ASGI app standing for `module:attribute`, imported when the first request arrives."""

    def __init__(self, target: str):
        self.target = target
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            module, _, attribute = self.target.partition(":")
            self._app = getattr(importlib.import_module(module), attribute)
        await self._app(scope, receive, send)

    def __repr__(self) -> str:
        return f"LazyApp({self.target!r})"
