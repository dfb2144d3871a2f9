"""The one sha256 list format (sha256sum's) and the reader that checks a stream against a recorded hash."""

from __future__ import annotations

import hashlib
import io
import subprocess

import pytest

from pcflow.checksums import ChecksumMismatch, HashingReader, checksum_list, parse_checksum_list, s3_checksum


def test_a_list_is_what_sha256sum_prints_and_reads(tmp_path):
    (tmp_path / "sub").mkdir()
    files = {"b.py": b"b\n", "a b.txt": b"space\n", "sub/c.py": b"c\n", "B.py": b"upper\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    listed = checksum_list({name: hashlib.sha256(data).hexdigest() for name, data in files.items()})
    assert [line.split("  ", 1)[1] for line in listed.decode().splitlines()] == ["B.py", "a b.txt", "b.py", "sub/c.py"]
    subprocess.run(["sha256sum", "--check", "--strict", "-"], input=listed, cwd=tmp_path, check=True)
    printed = subprocess.run(["sha256sum", "--", *files], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert parse_checksum_list(printed.stdout) == {name: hashlib.sha256(d).hexdigest() for name, d in files.items()}


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "a\\b", "a\nb", "a\rb", ""])
def test_names_a_list_cannot_carry_are_refused(name):
    with pytest.raises(ValueError, match="cannot be named in a checksum list"):
        checksum_list({name: "0" * 64})


@pytest.mark.parametrize(
    "text", ["\\" + "0" * 64 + "  a\\nb\n", "sha256sum: x: No such file or directory\n", "0" * 63 + "  short\n"]
)
def test_a_list_that_does_not_parse_proves_nothing(text):
    with pytest.raises(ValueError, match="is not `<sha256>  <path>`"):
        parse_checksum_list(text)
    with pytest.raises(ValueError):
        parse_checksum_list("0" * 64 + "  a\n" + "1" * 64 + "  b\n", max_entries=1)


def test_the_reader_refuses_other_bytes_at_the_last_one_and_more_bytes_at_once():
    data = b"x" * 1000
    good = HashingReader(io.BytesIO(data), size=1000, sha256=hashlib.sha256(data).hexdigest(), what="f")
    assert good.read(600) + good.read(600) == data and good.read(10) == b""
    good.check()
    other = HashingReader(io.BytesIO(b"y" * 1000), size=1000, sha256=hashlib.sha256(data).hexdigest(), what="f")
    other.read(999)  # not yet: the hash is known only at the end
    with pytest.raises(ChecksumMismatch, match=r"f: 1000 bytes with sha256 .* were recorded"):
        other.read(1)
    longer = HashingReader(io.BytesIO(data + b"!"), size=1000, sha256=hashlib.sha256(data).hexdigest(), what="f")
    with pytest.raises(ChecksumMismatch, match="more than the 1000 bytes recorded"):
        longer.read(2000)
    assert s3_checksum(hashlib.sha256(b"").hexdigest()) == "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
