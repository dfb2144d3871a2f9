"""Where a run's data comes from: `dataset.source` as a profile or a run's conf writes it, read in this one
module, so the conf check, the first task, the dataset task and the loaders agree on what it names.

    builtin:<name>        a dataset pcflow makes itself (`BUILTINS`: the digits as PNG class folders)
    s3://bucket/prefix    the objects under an S3 prefix
    anything else         a directory on the worker

A profile's `overridable` lists the roots a trigger user may pick a source under, in the same three forms
(trust.py): a built-in by its name, an S3 prefix, an absolute directory.

Light on purpose (no boto3, no pydantic): the trigger form reads `DIGITS` when a DAG file is parsed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pcflow.errors import PcflowInputError

BUILTIN = "builtin:"
S3 = "s3://"
#: The embedded default: scikit-learn's digits (dataset/digits.py), the source a profile starts from.
DIGITS = f"{BUILTIN}digits"
#: Every built-in dataset there is; a source naming another is refused.
BUILTINS = (DIGITS,)
#: The forms a source takes, for a setting's description.
FORMS = f"local directory, s3://bucket/prefix, or {DIGITS}"


class SourceRefused(PcflowInputError):
    """A dataset source refused for what it says (none, an unknown built-in, a malformed S3 URI, outside the
    profile's roots): bad input, not retried. The message is the problem alone; the caller, which knows the
    profile, adds who may change it (errors.refusal)."""


@dataclass(frozen=True)
class DatasetSource:
    """A dataset source read once: its kind and the text as the user wrote it (`text` is what a loader
    and a manifest name it by)."""

    kind: Literal["builtin", "local", "s3"]
    text: str

    def builtin_name(self) -> str:
        """The built-in dataset's name (`digits`), refused unless pcflow has it: the dataset task makes
        only the ones in `BUILTINS`."""
        if self.kind != "builtin" or self.text not in BUILTINS:
            raise SourceRefused(f"no built-in dataset {self.text!r} (there is {', '.join(BUILTINS)})")
        return self.text[len(BUILTIN) :]

    def s3_location(self) -> tuple[str, str]:
        """The S3 source's bucket and key prefix (`split_s3_uri`), refused when it is not an S3 URI."""
        return split_s3_uri(self.text)

    def under(self, roots: Sequence[str]) -> bool:
        """Whether the source lies under one of a profile's roots: a built-in listed by name, an S3 URI
        within an S3 root (whole key segments, no `.` or `..`), an absolute directory within an absolute
        root once symlinks and `..` are resolved (paths.within)."""
        if self.kind == "builtin":
            return self.text in roots
        if self.kind == "s3":
            return any(_s3_under(self.text, root) for root in roots if root.startswith(S3))
        if not os.path.isabs(self.text):
            return False
        return any(_local_under(self.text, root) for root in roots if os.path.isabs(root))


def parse_source(text: str | os.PathLike[str]) -> DatasetSource:
    """The kind of source `text` names, by its form alone (nothing is read); refused when it is empty,
    as a load of nothing is a mistake."""
    text = os.fspath(text)
    if not text:
        raise SourceRefused("no dataset source given: pass a local directory or an s3:// prefix")
    if text.startswith(BUILTIN):
        return DatasetSource("builtin", text)
    return DatasetSource("s3" if text.startswith(S3) else "local", text)


def resolve_source(text: Any, roots: Sequence[str]) -> DatasetSource:
    """The source a run's conf names, refused (SourceRefused) unless it is one under the profile's
    `roots`: what a trigger user may pick is bounded by the admin's roots (trust.Rule.under)."""
    if not isinstance(text, str) or not text:
        raise SourceRefused(f"{text!r} is not a dataset source")
    source = parse_source(text)
    if source.under(roots):
        return source
    if source.kind == "builtin":
        raise SourceRefused(f"{text!r} is not a built-in dataset the profile allows")
    raise SourceRefused(f"{text!r} is not under a dataset root the profile allows ({', '.join(roots) or 'none'})")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> (`bucket`, `a/b/`): prefixes always end with a slash, so `a/b` never matches
    `a/bc`; refused (SourceRefused) when `uri` is not an S3 URI."""
    if not uri.startswith(S3) or len(uri) <= len(S3):
        raise SourceRefused(f"not an S3 URI: {uri!r} (expected s3://bucket/prefix)")
    bucket, _, prefix = uri[len(S3) :].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _s3_under(source: str, root: str) -> bool:
    parts, top = source[len(S3) :].rstrip("/").split("/"), root[len(S3) :].rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return False
    return parts[: len(top)] == top


def _local_under(source: str, root: str) -> bool:
    from pcflow.paths import within

    try:
        within(source, root)
    except ValueError:
        return False
    return True
