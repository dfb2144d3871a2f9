"""A dataset source is read in one module (pcflow.datasource): the conf check, the first task, the dataset task
and the loaders ask it what `dataset.source` names instead of each looking at the text again."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcflow.datasource import (
    DIGITS,
    DatasetSource,
    SourceRefused,
    parse_source,
    resolve_source,
    split_s3_uri,
)

REPO = Path(__file__).resolve().parents[3]


def test_builtin_is_spelled_in_one_module():
    """Where `builtin:` is written is where a built-in is interpreted: one module, so no second reading."""
    files = [p for top in ("plugins", "dags", "include") for p in (REPO / top).rglob("*.py")]
    spelled = sorted(str(p.relative_to(REPO)) for p in files if "builtin:" in p.read_text())
    assert spelled == ["plugins/pcflow/datasource.py"]


@pytest.mark.parametrize(
    ("text", "kind"),
    [(DIGITS, "builtin"), ("builtin:other", "builtin"), ("s3://b/p", "s3"), ("/data/raw", "local"), ("~/d", "local")],
)
def test_a_source_is_of_one_kind_by_its_form(text, kind):
    assert parse_source(text) == DatasetSource(kind, text)


def test_the_refusals_say_what_is_wrong():
    with pytest.raises(SourceRefused, match="no dataset source given"):
        parse_source("")
    with pytest.raises(SourceRefused, match=r"no built-in dataset 'builtin:other' \(there is builtin:digits\)"):
        parse_source("builtin:other").builtin_name()
    assert parse_source(DIGITS).builtin_name() == "digits"
    for bad in ("s3://", "/local", ""):
        with pytest.raises(SourceRefused, match=r"not an S3 URI: .* \(expected s3://bucket/prefix\)"):
            split_s3_uri(bad)
    assert parse_source("s3://b/a/b/").s3_location() == ("b", "a/b/")


def test_a_conf_source_must_lie_under_the_profiles_roots(tmp_path):
    roots = [DIGITS, str(tmp_path / "data"), "s3://raw/imagenet"]
    (tmp_path / "data" / "set").mkdir(parents=True)
    assert resolve_source(str(tmp_path / "data" / "set"), roots).kind == "local"
    assert resolve_source("s3://raw/imagenet/train", roots).kind == "s3"
    assert resolve_source(DIGITS, roots).kind == "builtin"
    refused = {
        "builtin:../../etc": "is not a built-in dataset the profile allows",
        "s3://raw/imagenet/../secret": "is not under a dataset root the profile allows",
        "s3://raw/imagenetx": "is not under a dataset root the profile allows",
        str(tmp_path / "data" / ".." / "other"): "is not under a dataset root the profile allows",
        "data/set": "is not under a dataset root the profile allows",
        "": "'' is not a dataset source",
        None: "None is not a dataset source",
    }
    for text, why in refused.items():
        with pytest.raises(SourceRefused, match=why):
            resolve_source(text, roots)
