"""The image's wheel and layout, built once per session for the tests that need them (the distribution,
the image's DAG parse, the Celery deployment): deploy.image reads both from the Dockerfile."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.image import Dockerfile, Image, build_wheel


@pytest.fixture(scope="session")
def image_wheel(tmp_path_factory) -> Path:
    """The wheel the image's pip builds, from the build context its COPY lines fill in."""
    return build_wheel(Dockerfile.read(), tmp_path_factory.mktemp("image-build"))


@pytest.fixture(scope="session")
def image(image_wheel, tmp_path_factory) -> Image:
    """The image's layout under a temp root, the wheel installed where the Dockerfile installs it."""
    return Image(tmp_path_factory.mktemp("image"), Dockerfile.read()).install(image_wheel)
