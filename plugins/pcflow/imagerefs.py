"""Container image references: which image a run names (`training.container.image`) and whether the
profile's clusters can run that kind of reference. Parsing and checks only, no I/O: the run spec refuses
a bad reference with them before anything runs, and the Slurm stage (pcflow.slurm.images) imports the
image it names onto the cluster.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from pcflow.paths import remote_within

#: `oci:<absolute layout directory>:<tag>` (skopeo's and umoci's way of naming an image in a layout).
OCI_LAYOUT_REF = re.compile(r"^oci:(/[A-Za-z0-9_.@+/-]{1,1000}):([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$")
#: `[docker://]registry/repository[:tag][@sha256:...]`: a registry's host (with a dot or a port) first.
REGISTRY_REF = re.compile(
    r"^(?:docker://)?(?P<registry>[a-z0-9-]+(?:\.[a-z0-9-]+)+(?::\d{1,5})?|[a-z0-9-]+:\d{1,5})"
    r"/(?P<repository>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference: an OCI layout on the cluster, or a repository in a registry."""

    text: str
    kind: str  # "oci" (a layout: runs on the oci runtime) or "registry" (pyxis)
    layout: str | None = None
    tag: str | None = None
    registry: str | None = None
    repository: str | None = None
    digest: str | None = None

    @property
    def runtime(self) -> str:
        """The runtime that runs this kind of reference."""
        return "oci" if self.kind == "oci" else "pyxis"

    def pinned(self, digest: str) -> str:
        """Enroot's URI of this image by digest (`docker://registry#repository@sha256:...`), so a tag
        moved meanwhile cannot change what is imported under the digest's name."""
        return f"docker://{self.registry}#{self.repository}@{digest}"


def parse_image(text: str) -> ImageRef:
    """The reference `text` names; ValueError says which forms are accepted."""
    if not isinstance(text, str):
        raise ValueError(f"an image reference is a string, not {type(text).__name__}")
    if match := OCI_LAYOUT_REF.fullmatch(text):
        layout = posixpath.normpath(match[1])
        return ImageRef(text, "oci", layout=layout, tag=match[2])
    if match := REGISTRY_REF.fullmatch(text):
        tag = match["tag"] or (None if match["digest"] else "latest")
        parts = {"registry": match["registry"], "repository": match["repository"], "digest": match["digest"]}
        return ImageRef(text, "registry", tag=tag, **parts)
    raise ValueError(
        f"{text!r} is not an image reference: use oci:/abs/layout/dir:tag (an OCI image layout on the cluster) "
        "or registry/repository[:tag][@sha256:digest] (e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1)"
    )


def check_fits(ref: ImageRef, runtime: str | None, layouts: list[str]) -> None:
    """Refuse (ValueError) a reference the profile's clusters cannot run: no runtime, the other runtime's
    kind, or a layout outside the directories the admin allows (`cluster.containers.layouts`)."""
    if runtime is None:
        raise ValueError("the profile's clusters run no containers (cluster.containers.runtime is not set)")
    if ref.runtime != runtime:
        wanted = "an oci:/layout:tag reference" if runtime == "oci" else "a registry reference"
        raise ValueError(f"{ref.text!r}: this profile's clusters run containers with {runtime}, which takes {wanted}")
    if ref.layout is not None and not any(_under(ref.layout, root) for root in layouts):
        raise ValueError(f"{ref.layout!r} is not under a directory the profile allows ({', '.join(layouts) or 'none'})")


def _under(path: str, root: str) -> bool:
    try:
        remote_within(path, root)
    except ValueError:
        return False
    return True
