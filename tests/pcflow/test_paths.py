"""Paths stay under their roots: a dataset walk never leaves its source through a symlink and ends a
symlink loop with an error; bootstrap scripts come from include/ami only (also when the bake operator
is handed a path directly); the cluster-side directories a run writes (stage-in, run directories)
are normalised and checked under their root before anything is written. Unit level: under 1 s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pcflow.dataset.errors import SourceChangedError, SourceError
from pcflow.dataset.sources import LocalDirectorySource
from pcflow.dataset.stage_in import data_dir_on_cluster
from pcflow.errors import ConfigurationError
from pcflow.paths import ami_script, checkout_root, include_dir, remote_within, within
from pcflow.slurm.spec import RunDir

pytestmark = pytest.mark.security


@pytest.fixture
def source(tmp_path):
    """A dataset source with two class folders, next to a secret it must never read."""
    root = tmp_path / "source"
    for name in ("0/a.png", "0/b.png", "1/c.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"png")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "id_ed25519").write_text("PRIVATE KEY")
    return root


def listed(root) -> list[str]:
    return [f.rel for f in LocalDirectorySource(root).list()]


def test_links_inside_the_source_are_followed(source):
    (source / "2").symlink_to(source / "1")
    (source / "0" / "d.png").symlink_to(source / "1" / "c.png")
    assert listed(source) == ["0/a.png", "0/b.png", "0/d.png", "1/c.png", "2/c.png"]


@pytest.mark.parametrize("target", ["secret", "secret/id_ed25519", "/etc"])
def test_a_link_out_of_the_source_fails_the_walk(source, target):
    (source / "1" / "leak").symlink_to(source.parent / target)
    with pytest.raises(SourceError, match=r"1/leak is a symlink to .*, outside the dataset source"):
        listed(source)


@pytest.mark.parametrize("target", [".", "..", "../../source"])
def test_a_symlink_loop_ends_the_walk_with_an_error(source, target):
    (source / "1" / "loop").symlink_to(target, target_is_directory=True)
    with pytest.raises(SourceError, match=r"1/loop is a symlink loop"):
        listed(source)


def test_links_that_lead_to_each_other_end_the_walk_with_an_error(source):
    (source / "a").symlink_to(source / "b")
    (source / "b").symlink_to(source / "a")
    with pytest.raises(SourceError, match=r"cannot read .*: Too many levels of symbolic links"):
        listed(source)


def test_a_fifo_or_dangling_link_is_refused_rather_than_read(source):
    os.mkfifo(source / "0" / "pipe")
    with pytest.raises(SourceError, match=r"0/pipe is not a regular file"):
        listed(source)
    os.unlink(source / "0" / "pipe")
    (source / "0" / "gone").symlink_to(source / "0" / "nothing")
    with pytest.raises(SourceError, match=r"cannot read .*0/gone"):
        listed(source)


def test_a_file_that_became_a_link_out_after_the_listing_is_not_read(source):
    loader = LocalDirectorySource(source)
    item = next(f for f in loader.list() if f.rel == "1/c.png")
    (source / "1" / "c.png").unlink()
    (source / "1" / "c.png").symlink_to(source.parent / "secret" / "id_ed25519")
    with pytest.raises(SourceChangedError, match="now leads outside the dataset source"):
        loader.open(item)


def test_within_resolves_links_and_dots(tmp_path):
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "root" / "out").symlink_to(tmp_path)
    assert within(tmp_path / "root" / "a" / ".." / "a", tmp_path / "root") == tmp_path / "root" / "a"
    for escape in ("a/../..", "out", "out/..", "/etc"):
        with pytest.raises(ValueError, match="is outside"):
            within(tmp_path / "root" / escape, tmp_path / "root")


def test_bootstrap_scripts_come_from_include_ami_only(tmp_path, monkeypatch):
    from pcflow.aws.ami import load_script

    assert ami_script("ami/bootstrap.sh") == include_dir().resolve() / "ami" / "bootstrap.sh"
    assert load_script(include_dir() / "ami" / "bootstrap.sh").startswith("#!")
    for path in ("/etc/hostname", "ami/../../../etc/hostname", "profiles/local.yaml", "/"):
        with pytest.raises(ValueError, match="is not in include/ami/"):
            load_script(path)  # what the bake operator does with the path it is handed
    with pytest.raises(ValueError, match="not found"):
        load_script("ami")
    fake = tmp_path / "include"
    (fake / "ami").mkdir(parents=True)
    (fake / "ami" / "link.sh").symlink_to("/etc/hostname")
    monkeypatch.setenv("PCFLOW_INCLUDE_DIR", str(fake))
    with pytest.raises(ValueError, match="is not in include/ami/"):
        load_script("ami/link.sh")


def test_include_is_the_setting_or_the_checkouts_and_a_setting_naming_nothing_is_refused(monkeypatch, tmp_path):
    """In a checkout include/ is found beside plugins/; a deployment names its mount, and a mount that is
    not there is refused by name (an installed wheel with neither: tests/deploy/test_image_layout.py)."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.delenv("PCFLOW_INCLUDE_DIR", raising=False)
    assert checkout_root() == repo and include_dir() == repo / "include"
    monkeypatch.setenv("PCFLOW_INCLUDE_DIR", str(tmp_path))
    assert include_dir() == tmp_path
    monkeypatch.setenv("PCFLOW_INCLUDE_DIR", str(tmp_path / "absent"))
    with pytest.raises(ConfigurationError, match=r"PCFLOW_INCLUDE_DIR: .*/absent is not a directory; mount"):
        include_dir()


def test_cluster_paths_are_normalised_under_their_root():
    assert remote_within("/shared/pcflow/runs/k/../k/train", "/shared/pcflow/runs") == "/shared/pcflow/runs/k/train"
    for escape in ("/shared/pcflow/runs/../../etc", "/shared/pcflow/runsx", "/etc"):
        with pytest.raises(ValueError, match="is outside"):
            remote_within(escape, "/shared/pcflow/runs")
    assert RunDir.for_job("/shared", "k1", "train").root == "/shared/pcflow/runs/k1/train"
    for key in ("..", "."):
        with pytest.raises(ValueError, match="must be simple names"):
            RunDir.for_job("/shared", key, "train")


def test_stage_in_writes_only_under_the_clusters_datasets_directory():
    static = {"provider": "static", "shared_root": "/shared"}
    quoted = {"bucket": "b", "root": "'..''/''..''/home'/p1/", "partition": "p1"}  # the literal S3 prefix
    assert data_dir_on_cluster(static, quoted) == "/shared/pcflow/datasets/b/'..''/''..''/home'/p1"
    for root in ("../../home/", "x/../../../home/"):
        with pytest.raises(ValueError, match="is outside"):
            data_dir_on_cluster(static, {"bucket": "b", "root": root, "partition": "p1"})
    with pytest.raises(ValueError, match="is outside"):
        data_dir_on_cluster(static, {"bucket": "..", "root": "../x/", "partition": "p1"})
    fsx = {"provider": "parallelcluster", "mounts": ["/fsx"]}
    assert data_dir_on_cluster(fsx, {"partition": "2026-11-29"}) == "/fsx/2026-11-29"
    with pytest.raises(ValueError, match="is outside"):
        data_dir_on_cluster(fsx, {"partition": "../home"})
