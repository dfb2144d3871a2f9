"""The embedded default: AWS (moto, HTTPS), Slurm (munge, MariaDB, slurmdbd, slurmctld, 3 slurmd) and sshd.

The head node (slurmctld, slurmdbd, sshd) is this host at 127.0.0.1. Each compute node is a slurmd of
its own, with its own node name and loopback address (127.0.0.2, .3, ...), started in its own UTS and
mount namespaces: `hostname` there says the node's name, and the node's /etc/hosts (a copy of this
host's, bind-mounted in its namespace only, so the host's file is never edited) resolves every node's
name to its address, as a cluster's DNS does. Jobs run inside their node's namespaces, so launchers
rendezvous at node names as they do on ParallelCluster, and gloo binds each node's own address.

Every daemon runs in the foreground, started by this script, its pid and start time written to a file
under the state directory; `down` stops only those processes, never any found by name. All state
(keys, certificates, configs, databases, logs) lives under one directory (default `<repo>/.stack`,
override with PCFLOW_STACK_DIR), so `clean` undoes everything.

Usage: stack.py up | down | status [--json] | clean | fail-node NODE
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import getpass
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurmconf import (
    CLUSTER_NAME,
    ComputeNode,
    SlurmdbdSite,
    SlurmSite,
    render_oci_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
)

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack")).resolve()
REGION = "us-east-1"
BUILDER_PROFILE = "pcflow-ami-builder"
#: The EC2 key pair aws-gpu.yaml's cluster names (`cluster.config.key_name`): the admin imports it once.
KEY_PAIR = "pcflow"
ALREADY_DONE = ("EntityAlreadyExists", "LimitExceeded", "InvalidKeyPair.Duplicate")
#: The permissions boundary of the roles ParallelCluster creates (aws-gpu.yaml names it): the admin makes it once.
CLUSTER_BOUNDARY = REPO / "include" / "iam" / "pcflow-cluster-boundary.json"
#: The policy the cluster's nodes get beside ParallelCluster's own (aws-gpu.yaml's node_policy): the same.
CLUSTER_NODE_POLICY = REPO / "include" / "iam" / "pcflow-cluster-node-policy.json"
PCLUSTER_VERSION = "3.16.1"
READY_TIMEOUT_S = 90
STOP_TIMEOUT_S = 20
PORT_NAMES = ("moto", "sshd", "slurmctld", "slurmdbd", "mariadb")
#: The compute nodes: nodeN at 127.0.0.(N+1), each with a slurmd port of its own (`slurmd-nodeN`).
NODE_COUNT = 3
NODE_NAMES = tuple(f"node{i}" for i in range(1, NODE_COUNT + 1))
#: Where this stack's Slurm job ids start (PCFLOW_FIRST_JOB_ID, else 1). Two stacks on one host (`make test`'s
#: lanes) start 500 apart: launchers listen for their rendezvous on every address, at a port derived from the
#: job id (base + id modulo 1000 or 8000), and both stacks' job 5 met there (EADDRINUSE).
FIRST_JOB_ID = int(os.environ.get("PCFLOW_FIRST_JOB_ID", "1"))
OPEN_MPI_SITE = {
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}
#: Where the head and compute nodes see the FSx stand-in's files, as a ParallelCluster's nodes see their file
#: system (the aws-gpu profile's mount dir).
FSX_MOUNT = "/fsx"
#: The ParallelCluster CLI the local stack's runs use: the stand-in (dry runs go to the real CLI).
PCLUSTER_STANDIN = REPO / "include" / "local" / "pcluster-standin"
SYSTEM_BINARIES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "sshd": "openssh-server",
    "mariadbd": "mariadb-server",
    "ssh-keygen": "openssh-client",
    "unshare": "util-linux",
    "runc": "runc",  # Slurm's OCI runtime for a run that names a container (oci.conf)
    "umoci": "umoci",  # unpacks a run's OCI image once per digest (pcflow.slurm.images)
}


class StackError(RuntimeError):
    """A stack step failed; the message says which and what to look at."""


# --------------------------------------------------------------------------------------------
# Layout: every path and port, derived from the state directory
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    root: Path
    ports: dict[str, int]
    user: str
    host: str

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    @property
    def slurm_conf(self) -> Path:
        return self.path("slurm", "etc", "slurm.conf")

    @property
    def oci_conf(self) -> Path:
        """Slurm's OCI runtime settings: read from slurm.conf's directory by every slurmstepd."""
        return self.path("slurm", "etc", "oci.conf")

    @property
    def runc_state(self) -> Path:
        """runc's state of the running containers, one directory per job account below (sticky, like /tmp)."""
        return self.path("slurm", "runc")

    @property
    def munge_socket(self) -> Path:
        return self.path("munge", "munge.socket")

    @property
    def mariadb_socket(self) -> Path:
        return self.path("mariadb", "mariadb.sock")

    @property
    def ca_bundle(self) -> Path:
        return self.path("tls", "ca.pem")

    @property
    def client_key(self) -> Path:
        return self.path("ssh", "id_ed25519")

    @property
    def host_key(self) -> Path:
        return self.path("ssh", "ssh_host_ed25519_key")

    @property
    def env_file(self) -> Path:
        return self.path("env")

    @property
    def fsx_dir(self) -> Path:
        """The FSx stand-in's files (moto_standins.py), which the nodes see at FSX_MOUNT."""
        return self.path("fsx")

    @property
    def aws_endpoint(self) -> str:
        return f"https://127.0.0.1:{self.ports['moto']}"

    def slurm_env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    @property
    def hosts_file(self) -> Path:
        return self.path("slurm", "etc", "hosts")

    @property
    def nodes(self) -> tuple[ComputeNode, ...]:
        return tuple(ComputeNode(name, node_addr(name), self.ports.get(f"slurmd-{name}")) for name in NODE_NAMES)


def node_addr(name: str) -> str:
    return f"127.0.0.{NODE_NAMES.index(name) + 2}"


def port_names() -> dict[str, str]:
    """Every port the stack listens on, and the address it must be free on: slurmd listens on all
    addresses (slurmconf.SlurmSite.loopback_only says why), so its port is chosen free on all of them."""
    return {**dict.fromkeys(PORT_NAMES, "127.0.0.1"), **{f"slurmd-{n}": "0.0.0.0" for n in NODE_NAMES}}


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def load_layout(create: bool) -> Layout:
    """Ports are chosen once, when the state is created, and kept so configs stay stable (a state made
    by an older stack gains the ports it lacks)."""
    ports_file = STATE / "ports.json"
    ports = json.loads(ports_file.read_text()) if ports_file.exists() else {}
    missing = {name: addr for name, addr in port_names().items() if name not in ports}
    if create and missing:
        STATE.mkdir(parents=True, exist_ok=True)
        ports.update({name: free_port(addr) for name, addr in missing.items()})
        ports_file.write_text(json.dumps(ports, indent=2))
    return Layout(root=STATE, ports=ports, user=getpass.getuser(), host=socket.gethostname().split(".")[0])


# --------------------------------------------------------------------------------------------
# Preparing state: keys, certificates and configs, each made only when missing or changed
# --------------------------------------------------------------------------------------------


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    path.chmod(mode)


def run(argv: list[str], env: dict[str, str] | None = None, check: bool = True, timeout: float = 60):
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise StackError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def ensure_tls(lay: Layout) -> None:
    """A private CA and a server certificate for 127.0.0.1/localhost; clients trust the CA only."""
    if lay.path("tls", "server.pem").exists():
        return
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    tls = lay.path("tls")
    tls.mkdir(parents=True, exist_ok=True)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("pcflow local stack CA"))
        .issuer_name(name("pcflow local stack CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san = [x509.DNSName("localhost"), x509.DNSName("*.localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    no_enc = serialization.NoEncryption()
    pkcs8 = serialization.PrivateFormat.PKCS8
    (tls / "ca.pem").write_bytes(ca.public_bytes(pem))
    server_key = tls / "server.key"
    server_key.write_bytes(key.private_bytes(pem, pkcs8, no_enc))
    server_key.chmod(0o600)
    (tls / "server.pem").write_bytes(cert.public_bytes(pem))


def ensure_ssh(lay: Layout) -> None:
    ssh = lay.path("ssh")
    ssh.mkdir(parents=True, exist_ok=True)
    ssh.chmod(0o700)
    for key, comment in ((lay.host_key, "pcflow-local-host"), (lay.client_key, "pcflow-local-client")):
        if not key.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
    write_if_changed(ssh / "authorized_keys", lay.client_key.with_suffix(".pub").read_text(), 0o600)
    host_pub = " ".join(lay.host_key.with_suffix(".pub").read_text().split()[:2])
    write_if_changed(ssh / "known_hosts", f"[127.0.0.1]:{lay.ports['sshd']} {host_pub}\n", 0o600)
    write_if_changed(
        ssh / "sshd_config",
        "\n".join(
            [
                f"Port {lay.ports['sshd']}",
                "ListenAddress 127.0.0.1",
                f"HostKey {lay.host_key}",
                "PidFile none",
                f"AuthorizedKeysFile {ssh / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "UsePAM no",
                # The state directory may sit in a group-writable checkout; the key file itself is 0600.
                "StrictModes no",
                "PrintMotd no",
                # A login's environment, which sbatch passes to jobs: the site's slurm.conf, and Open MPI told
                # that this site's nodes talk over the loopback interface (which it skips by default) and
                # that jobs run as root here (which mpirun refuses unless told).
                # SHLVL=1: bash, started by sshd for a command, reads ~/.bashrc only at shell level 1, and this
                # host's root ~/.bashrc is its owner's interactive setup (pyenv init: 0.3 s per command).
                f"SetEnv SLURM_CONF={lay.slurm_conf} {' '.join(f'{k}={v}' for k, v in OPEN_MPI_SITE.items())} SHLVL=1",
                "Subsystem sftp internal-sftp",
                "MaxStartups 100:30:200",
                "MaxSessions 100",
                "",
            ]
        ),
    )


def ensure_munge(lay: Layout) -> None:
    d = lay.path("munge")
    d.mkdir(parents=True, exist_ok=True)
    # Other local users may reach the socket, as /run/munge allows on a real site
    # (tests/pcflow/slurm/test_job_user.py submits as a second Slurm user); the key stays 0600 and the
    # directory unlistable.
    d.chmod(0o711)
    key = d / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)


def ensure_mariadb(lay: Layout) -> None:
    d = lay.path("mariadb")
    if (d / "data" / "mysql").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    run(
        [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={d / 'data'}",
            f"--user={lay.user}",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ],
        timeout=180,
    )


def db_password(lay: Layout) -> str:
    f = lay.path("mariadb", "slurm.password")
    if not f.exists():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(secrets.token_urlsafe(24))
        f.chmod(0o600)
    return f.read_text().strip()


def slurm_cpus() -> int:
    """Declared CPUs: the host's, or PCFLOW_SLURM_CPUS (may exceed them, so small jobs can run side by side)."""
    return int(os.environ.get("PCFLOW_SLURM_CPUS") or max(os.cpu_count() or 1, 4))


def real_memory_mb() -> int:
    out = run(["slurmd", "-C"]).stdout
    for field in out.split():
        if field.startswith("RealMemory="):
            return max(int(field.split("=", 1)[1]) - 512, 1024)
    return 4096


def ensure_slurm(lay: Layout) -> None:
    s = lay.path("slurm")
    for sub in ("etc", "state", "spool", "log", "run"):
        (s / sub).mkdir(parents=True, exist_ok=True)
    write_if_changed(lay.hosts_file, node_hosts())
    common = {"user": lay.user, "munge_socket": str(lay.munge_socket), "loopback_only": True}
    site = SlurmSite(
        **common,
        cluster=CLUSTER_NAME,
        controller=lay.host,
        controller_addr="127.0.0.1",
        ctld_port=lay.ports["slurmctld"],
        first_job_id=FIRST_JOB_ID,
        nodes=lay.nodes,
        cpus=slurm_cpus(),
        memory_mb=real_memory_mb(),
        state_dir=str(s / "state"),
        spool_dir=str(s / "spool" / "%n"),
        pid_dir=str(s / "run"),
        log_dir=str(s / "log"),
        accounting_host="127.0.0.1",
        accounting_port=lay.ports["slurmdbd"],
        header="# Generated by include/local/stack.py for this host; edits are overwritten.",
    )
    write_if_changed(lay.slurm_conf, render_slurm_conf(site))
    lay.runc_state.mkdir(parents=True, exist_ok=True)
    lay.runc_state.chmod(0o1777)
    runtime = REPO / "include" / "local" / "oci-runtime.sh"
    write_if_changed(lay.oci_conf, render_oci_conf(str(runtime), str(lay.runc_state)))
    dbd = SlurmdbdSite(
        **common,
        dbd_addr="127.0.0.1",
        dbd_host=lay.host,
        dbd_port=lay.ports["slurmdbd"],
        pid_file=str(s / "run" / "slurmdbd.pid"),
        log_file=str(s / "log" / "slurmdbd.log"),
        storage_host="127.0.0.1",
        storage_port=lay.ports["mariadb"],
        storage_pass=db_password(lay),
        header="# Generated by include/local/stack.py; holds the database password, so mode 0600.",
    )
    write_if_changed(s / "etc" / "slurmdbd.conf", render_slurmdbd_conf(dbd), 0o600)


def node_hosts() -> str:
    """The compute nodes' /etc/hosts: this host's, and every node's name at its address."""
    own = Path("/etc/hosts").read_text()
    nodes = "".join(f"{node_addr(name)} {name}\n" for name in NODE_NAMES)
    return f"{own.rstrip()}\n# pcflow local stack: the compute nodes (include/local/stack.py)\n{nodes}"


def ssh_connection(lay: Layout) -> dict:
    host_pub = " ".join(lay.host_key.with_suffix(".pub").read_text().split()[:2])
    return {
        "conn_type": "slurm",  # pcflow's connection type (its form shows the extras below); "ssh" works too
        "host": "127.0.0.1",
        "port": lay.ports["sshd"],
        "login": lay.user,
        "extra": {
            "key_file": str(lay.client_key),
            "host_key": host_pub,
            "no_host_key_check": False,
            "look_for_keys": False,
            "shared_root": str(lay.path("shared")),
        },
    }


def pcluster_connection(lay: Layout) -> dict:
    """`pcluster_default` as the aws-gpu profile expects it: login and key only; the head node's address and
    host key come from the cluster a run creates (here the pcluster stand-in's: this stack's head node)."""
    conn = ssh_connection(lay)
    extra = {k: v for k, v in conn["extra"].items() if k not in ("host_key", "shared_root")}
    return {**conn, "host": "", "extra": extra}


def aws_connection(lay: Layout) -> dict:
    return {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"endpoint_url": lay.aws_endpoint, "region_name": REGION, "verify": str(lay.ca_bundle)},
    }


def stack_env(lay: Layout) -> dict[str, str]:
    return {
        "PCFLOW_STACK_DIR": str(lay.root),
        "AWS_ENDPOINT_URL": lay.aws_endpoint,
        "AWS_CA_BUNDLE": str(lay.ca_bundle),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(aws_connection(lay), separators=(",", ":")),
        "AIRFLOW_CONN_SLURM_DEFAULT": json.dumps(ssh_connection(lay), separators=(",", ":")),
        "AIRFLOW_CONN_PCLUSTER_DEFAULT": json.dumps(pcluster_connection(lay), separators=(",", ":")),
        "PCFLOW_PCLUSTER": str(PCLUSTER_STANDIN),
        "SLURM_CONF": str(lay.slurm_conf),
        "PCFLOW_DEFAULT_PROFILE": "local",  # the DAGs' default profile on this deployment: the emulator's
    }


def ensure_env_file(lay: Layout) -> None:
    """Shell- and Python-readable KEY='value' lines (`set -a; . .stack/env`)."""
    lines = [f"{k}={shlex.quote(v)}" for k, v in stack_env(lay).items()]
    write_if_changed(lay.env_file, "# Generated by include/local/stack.py\n" + "\n".join(lines) + "\n", 0o600)


def prepare(lay: Layout) -> None:
    missing = [f"{b} ({pkg})" for b, pkg in SYSTEM_BINARIES.items() if not find_binary(b)]
    if missing:
        raise StackError(
            "missing system programs: " + ", ".join(missing) + ". Run `make system-deps` as root on "
            "Debian/Ubuntu, install them with your package manager, or use docker-compose (--profile local)."
        )
    for sub in ("pids", "logs", "shared", "fsx"):
        lay.path(sub).mkdir(parents=True, exist_ok=True)
    Path(FSX_MOUNT).mkdir(exist_ok=True)  # the mount point; each stack's nodes mount their own directory there
    ensure_tls(lay)
    ensure_ssh(lay)
    ensure_munge(lay)
    ensure_mariadb(lay)
    ensure_slurm(lay)
    ensure_env_file(lay)
    ensure_job_account()
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory


#: The accounts the local profile's jobs run as (its `cluster.job_user` and `cluster.job_accounts`: one leased
#: to each run while it runs), named as pcflow.patterns.job_account_names names them, with uids from 2950 where
#: free, as ParallelCluster's nodes make them (plugins/pcflow/cluster/node-setup.sh): no home, no login shell,
#: a locked password, each in a group of its own.
JOB_ACCOUNTS = ("pcflow-job", 2950, 8)


def job_account_names() -> list[tuple[str, int]]:
    """(name, uid) of each account of the pool: `pcflow-job`, then `pcflow-job-1` ..."""
    base, uid, count = JOB_ACCOUNTS
    return [(base if index == 0 else f"{base}-{index}", uid + index) for index in range(count)]


def ensure_job_account() -> None:
    """The job accounts on this host, each made when missing (with its uid where that is free). The SSH user
    submits as them through sudo (root here: sudo's default rule lets it), so jobs never run as the user
    that owns the stack's files."""
    for name, uid in job_account_names():
        if run(["getent", "passwd", name], check=False).returncode != 0:
            make_account(name, uid)


def make_account(name: str, uid: int) -> None:
    """A system account `name` in a group of its own, with `uid` (and gid) unless another holds it."""

    def number(database: str, option: str) -> list[str]:
        taken = run(["getent", database, str(uid)], check=False).returncode == 0
        return [] if taken else [option, str(uid)]

    if run(["getent", "group", name], check=False).returncode != 0:
        run(["groupadd", "--system", *number("group", "--gid"), name])
    ids = number("passwd", "--uid")
    argv = ["useradd", "--system", *ids, "--gid", name, "--no-create-home", "--home-dir", "/nonexistent"]
    run([*argv, "--shell", "/usr/sbin/nologin", "--comment", "pcflow jobs", name])


def with_fsx_mount(lay: Layout, argv: list[str]) -> list[str]:
    """`argv` in a mount namespace of its own where the FSx stand-in's directory is at FSX_MOUNT, as a
    ParallelCluster node sees its file system (this host's FSX_MOUNT stays an empty directory, so
    several stacks on one host each see their own). `unshare` and `sh` exec: the pid stays the daemon's."""
    mount = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    unshare = [find_binary("unshare"), "--mount", "--propagation", "slave", "--"]
    return [*unshare, "sh", "-c", mount, "pcflow-node", str(lay.fsx_dir), FSX_MOUNT, *argv]


def find_binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), None
    )


# --------------------------------------------------------------------------------------------
# Services: how each starts in the foreground and how we know it is ready
# --------------------------------------------------------------------------------------------


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def munge_ready(lay: Layout) -> bool:
    if not lay.munge_socket.exists():
        return False
    cred = run(["munge", "-n", f"--socket={lay.munge_socket}"], check=False)
    if cred.returncode != 0:
        return False
    check = subprocess.run(
        ["unmunge", f"--socket={lay.munge_socket}"], check=False, input=cred.stdout, capture_output=True, text=True
    )
    return check.returncode == 0


def mariadb_ready(lay: Layout) -> bool:
    return lay.mariadb_socket.exists() and port_open(lay.ports["mariadb"])


def mariadb_setup(lay: Layout) -> None:
    """The slurmdbd database user; idempotent, so it runs on every start."""
    pw = db_password(lay)
    sql = (
        f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}';"
        f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}';"
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
    )
    run(["mariadb", "--no-defaults", f"--socket={lay.mariadb_socket}", "-u", lay.user, "-e", sql])


def slurmctld_ready(lay: Layout) -> bool:
    out = run(["scontrol", "ping"], env=lay.slurm_env(), check=False, timeout=15).stdout
    return "UP" in out


def node_states(lay: Layout) -> dict[str, str]:
    """Each compute node's state as sinfo prints it (`idle`, `allocated`, `down*`, `drained`...)."""
    out = run(["sinfo", "-h", "-N", "-o", "%N %T"], env=lay.slurm_env(), check=False, timeout=15)
    pairs = (line.split() for line in out.stdout.lower().splitlines()) if out.returncode == 0 else ()
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def slurmd_ready(lay: Layout, name: str) -> bool:
    """Registered and usable."""
    return node_states(lay).get(name, "").rstrip("*") in {"idle", "mixed", "allocated", "completing"}


def resume_if_held(lay: Layout, name: str) -> None:
    """A node left drained or down (by a test, or lost with fail-node) is put back in service."""
    state = node_states(lay).get(name, "")
    if "drain" in state or state.startswith("down"):
        run(["scontrol", "update", f"nodename={name}", "state=resume"], env=lay.slurm_env(), check=False)


def clustermgtd_ready(lay: Layout) -> bool:
    """The clustermgtd stand-in made a pass lately (its `alive` file, include/local/clustermgtd_standin.py)."""
    alive = lay.path("clustermgtd", "alive")
    return alive.exists() and time.time() - alive.stat().st_mtime < 30


def sshd_ready(lay: Layout) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", lay.ports["sshd"]), timeout=2) as s:
            return s.recv(64).startswith(b"SSH-2.0")
    except OSError:
        return False


def moto_ready(lay: Layout) -> bool:
    ctx = ssl.create_default_context(cafile=str(lay.ca_bundle))
    try:
        with socket.create_connection(("127.0.0.1", lay.ports["moto"]), timeout=2) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"GET /moto-api/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                return s.recv(16).startswith(b"HTTP/")
    except (OSError, ssl.SSLError):
        return False


def seed_emulated_account(lay: Layout) -> None:
    """What an administrator prepares once in a real account, made in the empty emulated one: the AMI
    builder's instance profile (on AWS it also carries AmazonSSMManagedInstanceCore, which the
    emulator does not know), the permissions boundary of the cluster's roles and the policy its nodes get
    (ParallelCluster's dry run checks that they exist), the key pair aws-gpu.yaml names (the stack's
    client key, as an admin imports the team's), and a stand-in for the ParallelCluster base image (moto
    has none)."""
    import boto3
    from botocore.exceptions import ClientError

    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)
    options = {"endpoint_url": lay.aws_endpoint, "verify": str(lay.ca_bundle)}
    iam, ec2 = session.client("iam", **options), session.client("ec2", **options)
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    steps = (
        lambda: iam.create_role(RoleName=BUILDER_PROFILE, AssumeRolePolicyDocument=json.dumps(trust)),
        lambda: iam.create_instance_profile(InstanceProfileName=BUILDER_PROFILE),
        lambda: iam.add_role_to_instance_profile(InstanceProfileName=BUILDER_PROFILE, RoleName=BUILDER_PROFILE),
        lambda: iam.create_policy(PolicyName="pcflow-cluster-boundary", PolicyDocument=CLUSTER_BOUNDARY.read_text()),
        lambda: iam.create_policy(PolicyName="pcflow-cluster-node", PolicyDocument=CLUSTER_NODE_POLICY.read_text()),
        lambda: ec2.import_key_pair(
            KeyName=KEY_PAIR, PublicKeyMaterial=lay.client_key.with_suffix(".pub").read_bytes()
        ),
    )
    for step in steps:  # each one idempotent on its own, so a half-done seeding completes
        try:
            step()
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ALREADY_DONE:
                raise
    name = f"aws-parallelcluster-{PCLUSTER_VERSION}-alinux2023-hvm-x86_64-local-standin"
    if not ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [name]}])["Images"]:
        ec2.register_image(
            Name=name,
            Description="stand-in for the ParallelCluster base image (the emulator ships none)",
            RootDeviceName="/dev/xvda",
            Architecture="x86_64",
            VirtualizationType="hvm",
            BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 40}}],
        )


def register_cluster(lay: Layout) -> None:
    env = lay.slurm_env()
    listed = run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], env=env, check=False).stdout
    if CLUSTER_NAME not in listed.split():
        run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], env=env)


@dataclass(frozen=True)
class Service:
    name: str
    argv: Callable[[Layout], list[str]]
    ready: Callable[[Layout], bool]
    after_start: Callable[[Layout], None] | None = None
    env: Callable[[Layout], dict[str, str]] | None = None
    node: str | None = None  # the compute node this slurmd is
    settle: Callable[[Layout], None] | None = None  # what `start` does while it waits for ready
    configs: Callable[[Layout], tuple[Path, ...]] = lambda lay: ()  # a change to one restarts the service

    def endpoint(self, lay: Layout) -> str:
        port = lay.ports.get(self.name)
        if self.name == "moto":
            return lay.aws_endpoint
        if self.name == "munge":
            return str(lay.munge_socket)
        return f"{node_addr(self.node) if self.node else '127.0.0.1'}:{port}" if port else ""


#: Run in a compute node's own namespaces: its hostname, then its /etc/hosts, then slurmd (exec'd, so the
#: recorded pid is slurmd's). Values arrive as arguments, never spliced into the script.
NODE_SHELL = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


def slurmd_service(name: str) -> Service:
    """One compute node: slurmd under `unshare` (UTS + mount namespaces; mounts made on the host later
    still reach it, its own /etc/hosts never leaves it)."""
    return Service(
        f"slurmd-{name}",
        lambda lay: with_fsx_mount(
            lay,
            [
                find_binary("unshare"),
                "--uts",
                "--mount",
                "--propagation",
                "slave",
                "--",
                "sh",
                "-c",
                NODE_SHELL,
                "pcflow-node",
                name,
                str(lay.hosts_file),
                find_binary("slurmd"),
                "-D",
                "-N",
                name,
                "-f",
                str(lay.slurm_conf),
            ],
        ),
        lambda lay: slurmd_ready(lay, name),
        env=Layout.slurm_env,
        node=name,
        settle=lambda lay: resume_if_held(lay, name),
        configs=lambda lay: (lay.slurm_conf, lay.oci_conf),
    )


SERVICES: list[Service] = [
    Service(
        "munge",
        lambda lay: [
            find_binary("munged"),
            "--foreground",
            "--force",
            f"--socket={lay.munge_socket}",
            f"--key-file={lay.path('munge', 'munge.key')}",
            f"--pid-file={lay.path('munge', 'munged.pid')}",
            f"--log-file={lay.path('munge', 'munged.log')}",
            f"--seed-file={lay.path('munge', 'munged.seed')}",
        ],
        munge_ready,
    ),
    Service(
        "mariadb",
        lambda lay: [
            find_binary("mariadbd"),
            "--no-defaults",
            f"--datadir={lay.path('mariadb', 'data')}",
            f"--socket={lay.mariadb_socket}",
            f"--port={lay.ports['mariadb']}",
            "--bind-address=127.0.0.1",
            f"--pid-file={lay.path('mariadb', 'mariadbd.pid')}",
            f"--user={lay.user}",
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=128M",
            "--innodb-lock-wait-timeout=900",
            "--innodb-log-file-size=48M",
        ],
        mariadb_ready,
        after_start=mariadb_setup,
    ),
    Service(
        "slurmdbd",
        lambda lay: [find_binary("slurmdbd"), "-D"],
        lambda lay: port_open(lay.ports["slurmdbd"]),
        after_start=register_cluster,
        env=Layout.slurm_env,
        configs=lambda lay: (lay.path("slurm", "etc", "slurmdbd.conf"),),
    ),
    Service(
        "slurmctld",
        lambda lay: [find_binary("slurmctld"), "-D", "-f", str(lay.slurm_conf)],
        slurmctld_ready,
        env=Layout.slurm_env,
        configs=lambda lay: (lay.slurm_conf,),
    ),
    *(slurmd_service(name) for name in NODE_NAMES),
    Service(
        "sshd",
        lambda lay: with_fsx_mount(lay, [find_binary("sshd"), "-D", "-e", "-f", str(lay.path("ssh", "sshd_config"))]),
        sshd_ready,
        configs=lambda lay: (lay.path("ssh", "sshd_config"),),
    ),
    Service(
        "moto",
        lambda lay: [
            sys.executable,
            str(REPO / "include" / "local" / "moto_standins.py"),
            "--fsx-dir",
            str(lay.fsx_dir),
            "-H",
            "127.0.0.1",
            "-p",
            str(lay.ports["moto"]),
            "-c",
            str(lay.path("tls", "server.pem")),
            "-k",
            str(lay.path("tls", "server.key")),
        ],
        moto_ready,
        after_start=seed_emulated_account,
    ),
    Service(
        # ParallelCluster's clustermgtd as far as the local Slurm needs it (include/local/clustermgtd_standin.py).
        "clustermgtd",
        lambda lay: [sys.executable, str(REPO / "include" / "local" / "clustermgtd_standin.py")],
        clustermgtd_ready,
        env=Layout.slurm_env,
        configs=lambda lay: (REPO / "include" / "local" / "clustermgtd_standin.py",),  # its code: changed, restarted
    ),
]


# --------------------------------------------------------------------------------------------
# Process bookkeeping: pid files and a check that a pid still runs what we started
# --------------------------------------------------------------------------------------------


def pid_file(lay: Layout, svc: Service) -> Path:
    return lay.path("pids", f"{svc.name}.pid")


def start_time(pid: int) -> int | None:
    """The kernel's start time of a pid (clock ticks since boot): with the pid, a process's identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def running_pid(lay: Layout, svc: Service) -> int | None:
    """The recorded pid, if that very process is still alive (a reused pid has another start time)."""
    f = pid_file(lay, svc)
    if not f.exists():
        return None
    record = json.loads(f.read_text())
    if start_time(record["pid"]) == record.get("start_time") and alive(record["pid"]):
        return record["pid"]
    return None


def config_digest(lay: Layout, svc: Service) -> str:
    """What the service's config files say now; recorded at start, so a changed config restarts it."""
    digest = hashlib.sha256()
    for path in svc.configs(lay):
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest() if svc.configs(lay) else ""


def started_with_current_config(lay: Layout, svc: Service) -> bool:
    record = json.loads(pid_file(lay, svc).read_text())
    return record.get("config", "") == config_digest(lay, svc)


def alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie has exited; only its parent's wait is missing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(lay: Layout, svc: Service) -> str:
    if running_pid(lay, svc) and started_with_current_config(lay, svc) and svc.ready(lay):
        if svc.after_start:  # idempotent set-up steps: re-applied, in case the service lost its state
            svc.after_start(lay)
        return "already up"
    stop(lay, svc)  # a half-dead previous instance, or one with an older config: start afresh
    argv = svc.argv(lay)
    log = lay.path("logs", f"{svc.name}.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=svc.env(lay) if svc.env else None,
            start_new_session=True,
            cwd=lay.root,
        )
    record = {"pid": proc.pid, "start_time": start_time(proc.pid), "argv": argv, "config": config_digest(lay, svc)}
    pid_file(lay, svc).write_text(json.dumps(record))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{svc.name} exited with {proc.returncode}; last log lines ({log}):\n{log_tail(log)}")
        if svc.settle:
            svc.settle(lay)
        if svc.ready(lay):
            if svc.after_start:
                svc.after_start(lay)
            return f"started (pid {proc.pid})"
        time.sleep(0.3)
    raise StackError(f"{svc.name} not ready after {READY_TIMEOUT_S}s; last log lines ({log}):\n{log_tail(log)}")


def stop(lay: Layout, svc: Service) -> str:
    pid = running_pid(lay, svc)
    pid_file(lay, svc).unlink(missing_ok=True)
    if pid is None:
        return "not running"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "not running"
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.2)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        return f"killed (pid {pid})"
    return f"stopped (pid {pid})"


def cancel_jobs(lay: Layout) -> None:
    """Jobs' slurmstepd processes outlive slurmd: cancel them so `down` leaves nothing running."""
    svc = next(s for s in SERVICES if s.name == "slurmctld")
    if not running_pid(lay, svc):
        return
    env = lay.slurm_env()
    ids = run(["squeue", "-h", "-o", "%A"], env=env, check=False).stdout.split()
    if not ids:
        return
    run(["scancel", *ids], env=env, check=False)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and run(["squeue", "-h", "-o", "%A"], env=env, check=False).stdout.split():
        time.sleep(0.5)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


#: What older stacks started and this one no longer has (one slurmd for the whole host): `up` and `down`
#: stop it, so a state made by an older stack leaves nothing behind.
RETIRED_SERVICES = ("slurmd",)


def stop_retired(lay: Layout) -> None:
    for name in RETIRED_SERVICES:
        retired = Service(name, argv=lambda lay: [], ready=lambda lay: False)
        if pid_file(lay, retired).exists():
            print(f"{name:13s} {stop(lay, retired)} (no longer part of the stack)", flush=True)


def cmd_up() -> int:
    lay = load_layout(create=True)
    prepare(lay)
    stop_retired(lay)
    for svc in SERVICES:
        print(f"{svc.name:13s} {start(lay, svc)}", flush=True)
    print(f"stack up; environment in {lay.env_file}")
    return 0


def cmd_down() -> int:
    lay = load_layout(create=False)
    if not lay.ports:
        print("stack down (no state)")
        return 0
    cancel_jobs(lay)
    for svc in reversed(SERVICES):
        print(f"{svc.name:13s} {stop(lay, svc)}", flush=True)
    stop_retired(lay)
    print("stack down")
    return 0


def compute_nodes(lay: Layout | None = None) -> list[dict]:
    """The compute nodes: name, address, slurmd port and state as Slurm reports it now (`idle`,
    `allocated`, `down*`...; "" while slurmctld is not answering). For tools that present the local
    Slurm as a cluster (the rehearsal's stand-in lists them as the cluster's compute instances)."""
    lay = lay or load_layout(create=False)
    ctld = next(svc for svc in SERVICES if svc.name == "slurmctld")
    states = node_states(lay) if lay.ports and running_pid(lay, ctld) else {}
    return [{"name": n.name, "address": n.addr, "port": n.port, "state": states.get(n.name, "")} for n in lay.nodes]


def status(lay: Layout) -> dict[str, dict]:
    """Every service: running (our pid alive), ready, pid, endpoint; a slurmd's also its node."""
    result = {}
    nodes = {node["name"]: node for node in compute_nodes(lay)}
    for svc in SERVICES:
        pid = running_pid(lay, svc) if lay.ports else None
        result[svc.name] = {
            "running": pid is not None,
            "ready": bool(pid) and svc.ready(lay),
            "pid": pid,
            "endpoint": svc.endpoint(lay) if lay.ports else "",
            **({"node": nodes[svc.node]} if svc.node else {}),
        }
    return result


def cmd_status(as_json: bool) -> int:
    lay = load_layout(create=False)
    st = status(lay)
    if as_json:
        print(json.dumps(st, indent=2))
        return 0
    for name, s in st.items():
        word = "up" if s["ready"] else ("starting/unhealthy" if s["running"] else "down")
        node = f"{s['node']['name']} {s['node']['state'] or '?'}" if "node" in s else ""
        print(f"{name:13s} {word:20s} {'pid ' + str(s['pid']) if s['pid'] else '':12s} {s['endpoint']:24s} {node}")
    ups = sum(s["ready"] for s in st.values())
    print(f"{ups}/{len(st)} services up; state in {lay.root}")
    return 0


def fail_node(lay: Layout, name: str) -> list[int]:
    """Lose a compute node as a spot interruption does: everything on it (its slurmd, its jobs' steps
    and programs: the processes of its UTS namespace) dies at once, then slurmctld is told the node is
    DOWN, as ParallelCluster's clustermgtd does when EC2 reports the instance gone. Slurm then requeues
    the node's jobs. `up` brings the node back. Returns the pids killed."""
    svc = next((svc for svc in SERVICES if svc.node == name), None)
    if svc is None:
        raise StackError(f"no compute node {name!r}; the nodes are {', '.join(NODE_NAMES)}")
    pid = running_pid(lay, svc)
    killed = []
    if pid is not None:
        namespace = os.readlink(f"/proc/{pid}/ns/uts")
        if namespace == os.readlink("/proc/self/ns/uts"):
            raise StackError(f"{svc.name} (pid {pid}) runs in this host's namespace; refusing to kill it")
        killed = _kill_namespace(namespace)
    reason = "pcflow stack.py fail-node: node lost"
    run(["scontrol", "update", f"nodename={name}", "state=down", f"reason={reason}"], env=lay.slurm_env())
    return killed


def _kill_namespace(namespace: str, timeout: float = 30.0) -> list[int]:
    """SIGKILL every process of the UTS namespace until none is left. Once is not enough: a slurmd
    can fork a step between the listing and the kill, and a process is not gone (its sockets still
    accept) the moment it is signalled; marking the node DOWN before then let a late answer from it
    put the node back in service (ReturnToService=2) and the requeued job was placed on it again."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while alive := [p for p in _pids() if _uts_namespace(p) == namespace]:
        if time.monotonic() > deadline:
            raise StackError(f"processes {alive} of the lost node survived SIGKILL for {timeout:.0f} s")
        for victim in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        killed.update(alive)
        time.sleep(0.05)
    return sorted(killed)


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _uts_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def cmd_fail_node(name: str) -> int:
    lay = load_layout(create=False)
    killed = fail_node(lay, name)
    print(f"{name} lost: {len(killed)} process(es) killed, node DOWN; `stack.py up` brings it back")
    return 0


def cmd_clean() -> int:
    cmd_down()
    if STATE.exists():
        shutil.rmtree(STATE)
    print(f"removed {STATE}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status", "clean", "fail-node"])
    parser.add_argument("node", nargs="?", help="fail-node: the compute node to lose (node1, node2, ...)")
    parser.add_argument("--json", action="store_true", help="status as JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return cmd_up()
        if args.command == "down":
            return cmd_down()
        if args.command == "status":
            return cmd_status(args.json)
        if args.command == "fail-node":
            return cmd_fail_node(args.node or "")
        return cmd_clean()
    except StackError as exc:
        print(f"stack {args.command} failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
