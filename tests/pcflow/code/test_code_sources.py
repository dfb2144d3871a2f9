"""Where a run's code comes from (pcflow.code.sources, deliver.pin_code): a git ref resolved once to a
commit, which is what is fetched even after the branch moves; a ref that does not exist refused by the
first task; a checkout's dirty flag; a tar in S3 hashed by what it holds."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from pcflow.bundles import BundleRefused, pack
from pcflow.code.deliver import build, pin_code
from pcflow.code.sources import checkout_state, resolve_commit
from pcflow.patterns import check_git_url
from pcflow.runspec import CodeSettings, TrainingSettings

pytestmark = pytest.mark.security  # docs/security.md names this module's refusals

LIMITS = {"max_mib": 1, "allow_secrets": False}


def training(code) -> TrainingSettings:
    """The training section of a run of this code (`training.code`), its bundle within LIMITS."""
    return TrainingSettings(program=["train.py"], code=code, bundle=LIMITS)


def sh(*args: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(
        args, cwd=cwd, env={**env, "PATH": "/usr/bin:/bin"}, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit(work: Path, name: str, text: str) -> str:
    (work / name).parent.mkdir(parents=True, exist_ok=True)
    (work / name).write_text(text)
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-qm", name, cwd=work)
    return sh("git", "rev-parse", "HEAD", cwd=work)


@pytest.fixture
def repo(tmp_path) -> tuple[Path, str]:
    """A working copy and its bare remote (file://), one commit on main with a project in `proj/`."""
    work = tmp_path / "work"
    work.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=work)
    commit(work, "proj/train.py", "print(1)\n")
    sh("git", "clone", "-q", "--bare", str(work), str(tmp_path / "remote.git"), cwd=tmp_path)
    sh("git", "remote", "add", "origin", str(tmp_path / "remote.git"), cwd=work)
    return work, f"file://{tmp_path / 'remote.git'}"


def test_a_ref_that_does_not_exist_is_refused_by_the_first_task(repo):
    _, url = repo
    code = CodeSettings.model_validate({"git": {"url": url, "ref": "no-such-branch"}})
    with pytest.raises(
        BundleRefused,
        match=r"training\.code\.git\.ref: .* has no branch or tag 'no-such-branch'.*"
        r"; whoever",
    ):
        pin_code(code, lambda path: "whoever")


def test_the_commit_pinned_first_is_what_is_fetched_after_the_branch_moves(repo):
    work, url = repo
    code = pin_code(CodeSettings.model_validate({"git": {"url": url, "ref": "main", "subdir": "proj"}}), str)
    pinned = code.git.commit
    first, fetched, _ = build(training(code), s3=None)
    assert (fetched.source, fetched.commit, fetched.dirty) == ("git", pinned, False)
    commit(work, "proj/train.py", "print(2)\n")
    sh("git", "push", "-q", "origin", "main", cwd=work)
    assert resolve_commit(url, "main") != pinned  # the branch moved...
    again, _, _ = build(training(code), s3=None)
    assert again.digest == first.digest  # ...the run's code did not


def test_a_tag_resolves_to_its_commit_and_bad_urls_are_refused(repo):
    work, url = repo
    head = sh("git", "rev-parse", "HEAD", cwd=work)
    sh("git", "tag", "-a", "v1", "-m", "v1", cwd=work)
    sh("git", "push", "-q", "origin", "v1", cwd=work)
    assert resolve_commit(url, "v1") == head
    for bad in ("ext::sh -c id", "--upload-pack=id", "http://plain/repo.git", "https://user:tok@host/r.git"):
        with pytest.raises(BundleRefused):  # refused as the code's before git is asked
            resolve_commit(bad, "main")
        with pytest.raises(ValueError, match="git URL"):  # and by the run spec's own check
            check_git_url(bad)


def test_a_checkout_directory_reports_its_commit_and_whether_it_is_dirty(repo, tmp_path):
    work, _ = repo
    head = sh("git", "rev-parse", "HEAD", cwd=work)
    assert checkout_state(work / "proj") == (head, False)
    (work / ".gitignore").write_text("*.log\n")
    sh("git", "add", ".gitignore", cwd=work)
    sh("git", "commit", "-qm", "ignore", cwd=work)
    (work / "proj" / "run.log").write_text("ignored: not dirty\n")
    assert checkout_state(work / "proj")[1] is False
    (work / "proj" / "train.py").write_text("print('edited')\n")
    assert checkout_state(work / "proj")[1] is True
    plain = tmp_path / "plain"
    plain.mkdir()
    assert checkout_state(plain) == (None, None)


def test_an_s3_bundle_is_unpacked_and_hashed_by_what_it_holds(tmp_path, s3):
    s3.create_bucket(Bucket="code-bucket")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        data = b"print('from s3')\n"
        info = tarfile.TarInfo("train.py")
        info.size, info.mtime = len(data), 12345  # another packer's times: not part of the id
        tar.addfile(info, io.BytesIO(data))
    s3.put_object(Bucket="code-bucket", Key="proj/v1.tar.gz", Body=raw.getvalue())
    bundle, fetched, _ = build(training({"s3": "s3://code-bucket/proj/v1.tar.gz"}), s3=s3)
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / "train.py").write_bytes(data)
    assert bundle.digest == pack(tmp_path / "same", name="x", max_bytes=1 << 20).digest
    assert (fetched.source, fetched.url, fetched.commit) == ("s3", "s3://code-bucket/proj/v1.tar.gz", None)


def test_an_s3_bundle_over_the_cap_is_refused_before_it_is_read(s3):
    """The object's size (HEAD) against `training.bundle.max_mib`: refused, and nothing is downloaded."""
    s3.create_bucket(Bucket="code-bucket")
    s3.put_object(Bucket="code-bucket", Key="proj/big.tar", Body=b"\0" * (LIMITS["max_mib"] * 2 << 20))
    gets: list[dict] = []
    s3.meta.events.register("before-parameter-build.s3.GetObject", lambda params, **kw: gets.append(params))
    with pytest.raises(BundleRefused, match=r"s3://code-bucket/proj/big\.tar is 2097152 bytes, over the code's cap"):
        build(training({"s3": "s3://code-bucket/proj/big.tar"}), s3=s3)
    assert gets == []
