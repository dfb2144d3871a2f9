"""A tree packed into a bundle (pcflow.bundles): the same files give the same id, what the filter
leaves out changes nothing, and every refusal (a secret, an over-size tree, a link) names what to change."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from pcflow.bundles import BundleRefused, TreeFilter, pack

pytestmark = pytest.mark.security
MiB = 1 << 20


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("WIDTH = 64\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def names(bundle) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(bundle.data)) as tar:
        return tar.getnames()


def test_the_same_tree_twice_gives_the_same_bytes_and_id(project, tmp_path):
    first = pack(project, name="p", max_bytes=MiB)
    copy = tmp_path / "copy"
    shutil.copytree(project, copy)
    os.utime(copy / "train.py", (5, 5))  # times are not content
    second = pack(copy, name="p", max_bytes=MiB)
    assert (first.data, first.digest) == (second.data, second.digest) and first.files == 4
    assert names(first) == ["pkg", "pkg/__init__.py", "pkg/model.py", "run.sh", "train.py"]
    (project / "train.py").write_text("print('changed')\n")
    assert pack(project, name="p", max_bytes=MiB).digest != first.digest


def test_ignored_files_change_nothing_whatever_they_hold(project):
    before = pack(project, name="p", max_bytes=MiB).digest
    (project / ".gitignore").write_text("data/\n*.log\n")
    after_gitignore = pack(project, name="p", max_bytes=MiB)
    (project / ".pcflowignore").write_text("notes.txt\n")
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"\0" * (2 * MiB))  # over the cap: ignored, so never counted
    (project / "train.log").write_text("AKIAABCDEFGHIJKLMNOP\n")  # a secret in an ignored file: not shipped
    (project / "notes.txt").write_text("x")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / ".env").write_text("TOKEN=hf_" + "a" * 34 + "\n")
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "last.pt").write_bytes(b"\0")
    venv = project / "myenv"  # a virtualenv by its marker, whatever its name
    (venv / "lib").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib" / "site.py").write_text("")
    bundle = pack(project, name="p", max_bytes=MiB)
    assert sorted(names(bundle)) == sorted([*names(after_gitignore), ".pcflowignore"])
    assert before != after_gitignore.digest  # the ignore file itself is code: it ships
    (project / "notes.txt").write_text("changed, ignored")
    assert pack(project, name="p", max_bytes=MiB).digest == bundle.digest


def test_a_negated_pattern_in_pcflowignore_brings_back_what_a_default_left_out(project):
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "init.pt").write_bytes(b"w")
    (project / ".pcflowignore").write_text("!checkpoints/\n")
    assert "checkpoints/init.pt" in names(pack(project, name="p", max_bytes=MiB))


def test_one_filter_answers_for_every_path(project):
    (project / ".pcflowignore").write_text("/secret_dir/\n")
    tree = TreeFilter(project)
    assert tree.excluded("secret_dir", is_dir=True) and not tree.excluded("pkg/secret_dir", is_dir=True)
    assert tree.excluded("a/b/__pycache__", is_dir=True) and tree.excluded(".env.local", is_dir=False)


@pytest.mark.parametrize(
    ("path", "content", "kind"),
    [
        (
            "keys/deploy",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n",
            "a private key",
        ),
        ("conf/settings.py", "KEY = 'AKIAIOSFODNN7EXAMPLE'\n", "an AWS access key id"),
        ("ci.sh", "export GH=ghp_" + "A1b2" * 9 + "\n", "a GitHub token"),
        ("hub.py", "token = 'hf_" + "x" * 34 + "'\n", "a Hugging Face token"),
        ("home/.aws/credentials", "[default]\n", "AWS credentials"),
        ("home/.netrc", "machine h login u password p\n", "a .netrc"),
    ],
)
def test_a_secret_in_the_tree_is_refused_naming_the_file_never_the_secret(project, path, content, kind):
    (project / path).parent.mkdir(parents=True, exist_ok=True)
    (project / path).write_text(content)
    with pytest.raises(BundleRefused, match=f"{path}: {kind}") as refused:
        pack(project, name="p", max_bytes=MiB)
    assert "allow_secrets" in str(refused.value)
    assert content.strip().splitlines()[-1] not in str(refused.value)
    assert pack(project, name="p", max_bytes=MiB, allow_secrets=True).files == 5  # the admin's choice


def test_an_over_size_tree_is_refused_naming_its_largest_files(project):
    (project / "weights.bin").write_bytes(b"\1" * (3 * MiB))
    (project / "pkg" / "table.csv").write_bytes(b"\1" * (2 * MiB))
    with pytest.raises(BundleRefused, match=r"over the 1\.0 MiB cap") as refused:
        pack(project, name="p", max_bytes=MiB)
    message = str(refused.value)
    assert "largest files: weights.bin (3.0 MiB), pkg/table.csv (2.0 MiB)" in message
    assert "training.bundle.max_mib" in message and ".pcflowignore" in message


def test_a_link_in_the_tree_is_refused(project):
    (project / "escape").symlink_to("/etc")
    with pytest.raises(BundleRefused, match="escape is not a plain file or directory"):
        pack(project, name="p", max_bytes=MiB)
    (project / ".pcflowignore").write_text("escape\n")
    assert pack(project, name="p", max_bytes=MiB).files == 5
