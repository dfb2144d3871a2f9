"""Container images on the cluster: the one import per digest of the image a run names (its reference,
parsed and checked against the profile by pcflow.imagerefs) onto the shared file system, which every later
run reuses.

Two runtimes, chosen by the profile's `cluster.containers.runtime` (the admin's), never by an `if local`:
- `oci`: Slurm's own OCI support (`oci.conf`, `srun --container=<bundle>`). The image is an OCI image
  layout on the cluster (`oci:<layout dir>:<tag>`, e.g. built by include/local/build-image.sh), unpacked
  once with `umoci` to `<shared root>/pcflow/images/<digest>/` (read-only). Each job gets a bundle of its
  own in its run directory: a `config.json` that mounts exactly its run, code and data directories at
  the paths they have outside, and a `rootfs` link to the shared unpacked image.
- `pyxis`: Pyxis/Enroot (ParallelCluster's images since 3.11). The image is a registry reference (ECR),
  pinned to its digest before the import, imported once with `enroot import` to
  `<shared root>/pcflow/images/<digest>.sqsh` and run with `srun --container-image=<that file>`.
The registry's credentials reach the head node only as a file the SSH user alone reads, for the length of
the import, and never a log line, an argument or an XCom.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import uuid
from dataclasses import dataclass
from typing import Any

from pcflow.errors import ConfigurationError, PcflowError, profile_setting, refused
from pcflow.imagerefs import DIGEST, ImageRef

#: An ECR registry's host: its account and region (the ECR API answers for them).
ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")
#: The srun option each runtime adds (what the preflight looks for in `srun --help`).
RUNTIME_OPTION = {"oci": "--container", "pyxis": "--container-image"}
RUNTIMES = tuple(RUNTIME_OPTION)
MARKER = "pcflow-image.json"


class ImageError(PcflowError):
    """An image could not be imported on the cluster (the command's error says why); retried."""


def images_root(shared_root: str) -> str:
    """`<shared root>/pcflow/images`: where every run's images are imported once per digest."""
    if not shared_root or not shared_root.startswith("/"):
        raise refused("shared_root", f"must be an absolute path, not {shared_root!r}", profile_setting())
    return posixpath.join(posixpath.normpath(shared_root), "pcflow", "images")


# -- preflight ------------------------------------------------------------------------------------


def check_cluster_runs(hook: Any, runtime: str) -> None:
    """Refuse (ConfigurationError: not retried) a run whose cluster cannot run its container: its srun
    lacks the runtime's option (`--container`: Slurm's OCI support; `--container-image`: Pyxis), or, for
    `oci`, no oci.conf sits beside slurm.conf (Slurm then runs the step OUTSIDE the container, silently)."""
    option = RUNTIME_OPTION[runtime]
    result = hook.run(["srun", "--help"], check=False)
    text = f"{result.stdout}\n{result.stderr}"
    if not re.search(rf"(^|\s){re.escape(option)}([=\s\[]|$)", text, re.MULTILINE):
        problem = (
            f"the cluster cannot run containers with {runtime}: its `srun --help` has no {option} option "
            f"({'Slurm built without OCI support' if runtime == 'oci' else 'Pyxis is not enabled (plugstack.conf)'})"
        )
        raise refused("cluster.containers.runtime", problem, profile_setting())
    if runtime == "oci":
        conf = slurm_conf_path(hook)
        if conf and hook.file_size(posixpath.join(posixpath.dirname(conf), "oci.conf")) is None:
            problem = (
                f"the cluster's Slurm has no oci.conf beside {conf}: Slurm would run the job outside the "
                "container (the admin writes oci.conf, containers.html)"
            )
            raise refused("cluster.containers.runtime", problem, profile_setting())


def slurm_conf_path(hook: Any) -> str | None:
    """The slurm.conf the cluster's commands read (`scontrol show config`'s SLURM_CONF), None if unknown."""
    out = hook.run(["scontrol", "show", "config"], check=False).stdout
    match = re.search(r"^SLURM_CONF\s*=\s*(/\S+)\s*$", out, re.MULTILINE)
    return match[1] if match else None


# -- the OCI layout's digest and its one import ---------------------------------------------------


def layout_digest(hook: Any, ref: ImageRef) -> str:
    """The manifest digest the layout's index names for the reference's tag (bounded read of
    index.json); a missing layout or tag is refused (a retry would find the same)."""
    index = hook.read_json(posixpath.join(ref.layout, "index.json"))
    if index is None:
        raise refused("training.container", f"no OCI image layout at {ref.layout} (no readable index.json)", _owner())
    for manifest in index.get("manifests") or []:
        names = (manifest.get("annotations") or {}).get("org.opencontainers.image.ref.name")
        if names == ref.tag and DIGEST.fullmatch(str(manifest.get("digest", ""))):
            return manifest["digest"]
    raise refused("training.container", f"the layout {ref.layout} has no image tagged {ref.tag!r}", _owner())


def _owner() -> str:
    return "a trigger user may change this where the profile allows it, else the deployment admin"


def import_oci(hook: Any, ref: ImageRef, digest: str, shared_root: str, log: Any) -> dict[str, Any]:
    """`<images>/<digest hex>/` (rootfs and umoci's config.json) made once: reused when its marker is
    there, else unpacked into a temporary directory, made read-only without set-uid bits and renamed
    into place."""
    root = images_root(shared_root)
    final = posixpath.join(root, digest.split(":", 1)[1])
    if hook.read_json(posixpath.join(final, MARKER)) is not None:
        log.info("image %s (%s) is on the cluster already: %s", ref.text, digest, final)
        return {"path": final, "imported": False}
    hook.run(["mkdir", "-p", "-m", "755", "--", root])
    tmp = posixpath.join(root, f".tmp-{digest.split(':', 1)[1][:16]}-{uuid.uuid4().hex[:8]}")
    try:
        unpacked = hook.run(["umoci", "unpack", "--rootless", "--image", f"{ref.layout}:{ref.tag}", tmp], check=False)
        if unpacked.exit_code != 0:
            raise ImageError(f"umoci could not unpack {ref.text}: {unpacked.stderr.strip()[-800:]}")
        hook.write_file(posixpath.join(tmp, MARKER), _marker(ref, digest), mode=0o644)
        # Read-only, and no set-uid or set-gid file: a job account on the node could run one outside the
        # container, as the image's owner (the SSH user, root on the local stack).
        hook.run(["chmod", "-R", "a-w,u-s,g-s,a+rX", "--", tmp])
        moved = hook.run(["mv", "-T", "--", tmp, final], check=False)
        if moved.exit_code != 0 and hook.read_json(posixpath.join(final, MARKER)) is None:
            raise ImageError(f"could not move the unpacked image into {final}: {moved.stderr.strip()[:500]}")
    finally:
        hook.run(["sh", "-c", 'test ! -e "$1" || { chmod -R u+w "$1"; rm -rf "$1"; }', "sh", tmp], check=False)
    log.info("image %s (%s) imported to %s", ref.text, digest, final)
    return {"path": final, "imported": True}


#: Makes each missing mount point in an unpacked image, read-only like the rest: a directory, or an empty
#: file for an argument ending in `:file`; refuses (exit 3) a path that crosses a link there: an image's
#: absolute link would lead the mkdir out of its rootfs onto the head node. Paths arrive as arguments
#: (absolute, checked, without spaces or glob characters).
MOUNT_POINTS = r"""set -f; root=$1; shift
for p; do
  file=; case $p in *:file) file=${p%:file}; p=${file%/*} ;; esac
  cur=$root
  for part in $(printf '%s' "$p" | tr / ' ') ${file:+"${file##*/}"}; do
    cur=$cur/$part
    if [ -L "$cur" ]; then echo "$p crosses the link ${cur#"$root"} in the image" >&2; exit 3; fi
    [ -e "$cur" ] && continue
    parent=$(dirname "$cur"); mode=$(stat -c %a "$parent")
    if [ -n "$file" ] && [ "$cur" = "$root$file" ]; then made=": > \"\$1\" && chmod 444 \"\$1\""
    else made='mkdir "$1" && chmod 555 "$1"'; fi
    chmod u+w "$parent" && sh -c "$made" sh "$cur" && chmod "$mode" "$parent" || exit 1
  done
done"""
#: Files every container gets from its node (bound read-only): the node names, as the cluster's DNS.
NODE_FILES = ("/etc/hosts",)


def ensure_mount_points(hook: Any, image: str, points: list[str]) -> None:
    """Mount points in the unpacked image for the shared root, the admin's mounts and the node's files
    (runc cannot make them in a read-only rootfs); made once, checked by every run (an admin may add a
    mount later)."""
    argv = ["sh", "-c", MOUNT_POINTS, "sh", posixpath.join(image, "rootfs"), *points]
    done = hook.run([*argv, *(f"{path}:file" for path in NODE_FILES)], check=False)
    if done.exit_code == 3:
        raise refused("training.container", f"the image cannot take a mount: {done.stderr.strip()[:300]}", _owner())
    if done.exit_code != 0:
        raise ImageError(f"could not make the mount points {points} in {image}: {done.stderr.strip()[:500]}")


def _marker(ref: ImageRef, digest: str) -> str:
    import json

    return json.dumps({"reference": ref.text, "digest": digest}, sort_keys=True) + "\n"


def image_env(hook: Any, path: str) -> list[str]:
    """The image's own environment (PATH, its variables) from the config.json umoci wrote: the job's
    environment is laid over it."""
    config = hook.read_json(posixpath.join(path, "config.json")) or {}
    env = (config.get("process") or {}).get("env") or []
    return [item for item in env if isinstance(item, str) and "=" in item][:256]


# -- Enroot (Pyxis) -------------------------------------------------------------------------------


def enroot_credentials(registry: str, token: str) -> str:
    """Enroot's credentials file (netrc lines) for one registry: ECR's login is `AWS`."""
    if any(c.isspace() for c in registry + token):
        raise ConfigurationError("a registry name or token with whitespace cannot go into enroot's credentials")
    return f"machine {registry} login AWS password {token}\n"


def enroot_import_argv(config_dir: str, uri: str, output: str) -> list[str]:
    """`enroot import` of `uri` into `output`, its credentials read from `config_dir` (ENROOT_CONFIG_PATH)."""
    return ["env", f"ENROOT_CONFIG_PATH={config_dir}", "enroot", "import", "--output", output, "--", uri]


def import_sqsh(
    hook: Any, ref: ImageRef, digest: str, shared_root: str, *, credentials: str | None, log: Any
) -> dict[str, Any]:
    """`<images>/<digest hex>.sqsh` made once (`enroot import` by digest), reused when there. The
    credentials file lives in a directory only the SSH user enters, and goes when the import ends."""
    root = images_root(shared_root)
    final = posixpath.join(root, digest.split(":", 1)[1] + ".sqsh")
    if hook.file_size(final):
        log.info("image %s (%s) is on the cluster already: %s", ref.text, digest, final)
        return {"path": final, "imported": False}
    hook.run(["mkdir", "-p", "-m", "755", "--", root])
    private = posixpath.join(shared_root, "pcflow", ".enroot-" + uuid.uuid4().hex[:12])
    tmp = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
    hook.make_private_dirs(private)
    try:
        if credentials:
            hook.write_file(posixpath.join(private, ".credentials"), credentials, mode=0o600)
        done = hook.run(enroot_import_argv(private, ref.pinned(digest), tmp), check=False, timeout=3600)
        if done.exit_code != 0:
            raise ImageError(f"enroot could not import {ref.text} ({digest}): {done.stderr.strip()[-800:]}")
        hook.run(["chmod", "0444", "--", tmp])
        hook.run(["mv", "-f", "--", tmp, final])
    finally:
        hook.run(["rm", "-rf", "--", private, tmp], check=False)
    log.info("image %s (%s) imported to %s", ref.text, digest, final)
    return {"path": final, "imported": True}


# -- what a job's srun is given -------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """A directory the job sees inside its container, at the path it has outside."""

    path: str
    writable: bool = False


def job_mounts(run_dir: str, payload_dir: str | None, extra: list[dict[str, Any]]) -> list[Mount]:
    """The payload contract's directories: the run's (written), its code, data and environment (read)."""
    mounts = [Mount(run_dir, writable=True)]
    if payload_dir:
        mounts.append(Mount(payload_dir))
    mounts += [Mount(m["path"], bool(m.get("writable"))) for m in extra if m.get("path")]
    return list({m.path: m for m in mounts}.values())


def srun_options(container: dict[str, Any], bundle: str | None, mounts: list[Mount], workdir: str) -> list[str]:
    """The srun options that put each task in the container: Slurm's `--container=<bundle>` (mounts in
    the bundle's config.json), or Pyxis's image, mounts and working directory."""
    if container["runtime"] == "oci":
        return [f"--container={bundle}"]
    specs = ",".join(f"{m.path}:{m.path}{'' if m.writable else ':ro'}" for m in mounts)
    for m in mounts:
        if "," in m.path or ":" in m.path:
            raise ConfigurationError(f"a path with ',' or ':' cannot be given to Pyxis's --container-mounts: {m.path}")
    return [
        f"--container-image={container['path']}",
        f"--container-mounts={specs}",
        f"--container-workdir={workdir}",
        "--no-container-mount-home",
        "--no-container-remap-root",
    ]


def bundle_config(container: dict[str, Any], shared_root: str, mounts: list[Mount], workdir: str) -> dict[str, Any]:
    """A job's OCI runtime config (runc's spec): the shared image's rootfs read-only, a private /tmp, the
    shared root as an empty tmpfs with only this job's directories bound into it. Slurm replaces the
    process's arguments and environment with the step's; the site's runtime (oci.conf) maps the job
    account's uid (include/local/oci-runtime.sh)."""
    binds = [
        {
            "destination": m.path,
            "type": "bind",
            "source": m.path,
            "options": ["rbind", "nosuid", "nodev", "rw" if m.writable else "ro"],
        }
        for m in mounts
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0, "umask": 0o007},  # as the batch script's: its group reads, no one else
            "args": ["/bin/false"],
            "env": container.get("env") or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": workdir,
            "noNewPrivileges": True,
            "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
        },
        "root": {"path": "rootfs", "readonly": True},
        "mounts": [*_system_mounts(shared_root), *binds],
        "linux": {
            # The node's own hostname and network (HPC containers' way): torchrun and gloo meet by node name.
            "namespaces": [{"type": t} for t in ("pid", "ipc", "mount", "user")],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def _system_mounts(shared_root: str) -> list[dict[str, Any]]:
    """/proc, /dev, /sys (read-only) as runc's default spec has them; the node's /etc/hosts; a private
    /tmp; the shared root empty."""

    def mount(destination: str, kind: str, source: str, *options: str) -> dict[str, Any]:
        return {"destination": destination, "type": kind, "source": source, "options": list(options)}

    return [
        mount("/proc", "proc", "proc"),
        mount("/dev", "tmpfs", "tmpfs", "nosuid", "strictatime", "mode=755"),
        mount("/dev/pts", "devpts", "devpts", "nosuid", "noexec"),
        mount("/dev/shm", "tmpfs", "shm", "nosuid", "noexec", "nodev"),
        mount("/sys", "none", "/sys", "rbind", "nosuid", "noexec", "ro"),
        *(mount(path, "none", path, "bind", "ro") for path in NODE_FILES),
        mount("/tmp", "tmpfs", "tmpfs", "nosuid", "nodev", "mode=1777"),
        mount(shared_root, "tmpfs", "tmpfs", "nosuid", "nodev", "mode=755"),
    ]


def write_bundle(hook: Any, bundle: str, config: dict[str, Any], rootfs: str) -> None:
    """The job's bundle directory: its config.json (readable by the job's group) and `rootfs`, a link to
    the shared image's (the site's runtime resolves it: runc takes no linked rootfs)."""
    import json

    hook.run(["mkdir", "-p", "-m", "750", "--", bundle])
    if hook.job_user:
        hook.run(["chgrp", "--", str(hook.job_user), bundle])
    hook.write_file(posixpath.join(bundle, "config.json"), json.dumps(config, indent=1) + "\n", mode=0o640)
    hook.run(["ln", "-sfn", "--", rootfs, posixpath.join(bundle, "rootfs")])


def describe(container: dict[str, Any] | None) -> str:
    """One line for the log: which image, by digest, imported now or reused."""
    if not container:
        return "no container"
    state = "imported" if container.get("imported") else "reused"
    return f"{container['reference']} ({container['digest']}, {state}) at {shlex.quote(container['path'])}"
