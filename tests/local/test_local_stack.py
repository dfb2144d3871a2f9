"""The embedded default comes up from nothing, answers as AWS and as a Slurm cluster, and goes away."""

from __future__ import annotations

import json
import shlex
import socket
import time
from pathlib import Path

import boto3
import certifi
import paramiko
import pytest
from botocore.exceptions import SSLError
from stacktools import LocalStack, read_env_file, stack_cli, stack_status

pytestmark = pytest.mark.stack


def listening_addresses(ports: set[int]) -> dict[int, str]:
    """Local address of each listening TCP socket on the given ports, from /proc/net/tcp{,6}."""
    found: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(port_hex, 16) in ports:  # 0A = LISTEN
                found[int(port_hex, 16)] = address
    return found


def slurmd_ports(ports: dict[str, int]) -> set[int]:
    return {port for name, port in ports.items() if name.startswith("slurmd-")}


def process_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stack_lifecycle_from_nothing(tmp_path):
    """A second, private stack in an empty directory: up, up again, down, up, down, down."""
    state = tmp_path / "stack"

    first = stack_cli("up", state_dir=state)
    assert first.returncode == 0, first.stdout + first.stderr
    status = stack_status(state)
    assert all(s["ready"] for s in status.values()), status
    pids = {name: s["pid"] for name, s in status.items()}

    ports = json.loads((state / "ports.json").read_text())
    ports.pop("slurmd", None)  # an older stack's single slurmd
    listening = listening_addresses(set(ports.values()))
    assert set(listening) == set(ports.values()), f"not every service listens: {listening} vs {ports}"
    loopback = {"0100007F", "00000000000000000000000001000000"}
    # slurmd listens on every address (slurmconf.SlurmSite.loopback_only says why; munge signs its traffic).
    beyond = {port: a for port, a in listening.items() if a not in loopback and port not in slurmd_ports(ports)}
    assert not beyond, f"a stack service listens beyond loopback: {beyond}"
    nodes = {s["node"]["name"]: s["node"] for s in status.values() if "node" in s}
    assert sorted(nodes) == ["node1", "node2", "node3"], status
    assert {n["state"] for n in nodes.values()} == {"idle"}, nodes
    assert sorted(n["address"] for n in nodes.values()) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]

    again = stack_cli("up", state_dir=state)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already up") == len(pids), again.stdout
    assert {n: s["pid"] for n, s in stack_status(state).items()} == pids

    down = stack_cli("down", state_dir=state)
    assert down.returncode == 0, down.stderr
    assert not any(process_alive(pid) for pid in pids.values()), "a stack process survived `down`"
    assert not any(s["running"] for s in stack_status(state).values())

    up_again = stack_cli("up", state_dir=state)
    assert up_again.returncode == 0, up_again.stdout + up_again.stderr
    assert all(s["ready"] for s in stack_status(state).values())

    for _ in range(2):
        stopped = stack_cli("down", state_dir=state)
        assert stopped.returncode == 0, stopped.stderr
    assert not any(s["running"] for s in stack_status(state).values())


def test_env_file_pins_host_key_and_endpoint(local_stack: LocalStack):
    env = read_env_file(local_stack.state_dir / "env")
    ssh = json.loads(env["AIRFLOW_CONN_SLURM_DEFAULT"])
    assert ssh["extra"]["host_key"].startswith("ssh-ed25519 ")
    assert ssh["extra"]["no_host_key_check"] is False
    aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    assert aws["extra"]["endpoint_url"].startswith("https://127.0.0.1:")
    assert Path(aws["extra"]["verify"]).read_text().startswith("-----BEGIN CERTIFICATE-----")


def run_remote(client: paramiko.SSHClient, argv: list[str]) -> str:
    _, stdout, stderr = client.exec_command(shlex.join(argv), timeout=60)
    out, err = stdout.read().decode(), stderr.read().decode()
    assert stdout.channel.recv_exit_status() == 0, f"{argv}: {err}"
    return out


def test_two_task_srun_job_through_sshd(local_stack: LocalStack):
    """Through Airflow's SSH connection (pinned host key): sbatch, wait, read the output back over SFTP."""
    from airflow.providers.ssh.hooks.ssh import SSHHook

    hook = SSHHook(ssh_conn_id="slurm_default")
    assert hook.no_host_key_check is False and hook.host_key is not None
    out_dir = local_stack.shared_root / "tests"
    with hook.get_conn() as client:
        run_remote(client, ["mkdir", "-p", str(out_dir)])
        job_id = run_remote(
            client,
            [
                "sbatch",
                "--parsable",
                "--job-name=pcflow-stack-test",
                "--ntasks=2",
                f"--output={out_dir}/srun-%j.out",
                "--wrap",
                'srun bash -c "echo task \\$SLURM_PROCID of \\$SLURM_NTASKS"',
            ],
        ).strip()
        assert job_id.isdigit(), job_id

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run_remote(client, ["squeue", "-h", "-j", job_id]).strip():
            time.sleep(0.5)
        with client.open_sftp() as sftp, sftp.open(f"{out_dir}/srun-{job_id}.out") as fh:
            lines = sorted(fh.read().decode().split("\n"))
        assert [line for line in lines if line] == ["task 0 of 2", "task 1 of 2"]

        # Accounting: the job is in slurmdbd's history with its exit code (sacct lags slurmctld by a
        # moment, and shows a placeholder name until the record is complete).
        deadline = time.monotonic() + 30
        record = ""
        while time.monotonic() < deadline and record.strip() != "pcflow-stack-test|COMPLETED|0:0":
            record = run_remote(client, ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobName,State,ExitCode"])
            time.sleep(0.5)
        assert record.strip() == "pcflow-stack-test|COMPLETED|0:0"


def test_each_compute_node_has_its_own_name_and_address(local_stack: LocalStack):
    """`srun -N2 hostname` prints two names; inside a job every node's name resolves to its address."""
    from pcflow.slurm.hook import SlurmHook

    hook = SlurmHook()
    try:
        names = hook.run(["srun", "-N2", "--ntasks-per-node=1", "hostname"]).stdout.split()
        assert len(names) == 2 and len(set(names)) == 2 and set(names) <= {"node1", "node2", "node3"}, names
        resolved = hook.run(["srun", "-N3", "--ntasks-per-node=1", "getent", "hosts", "node1", "node2", "node3"])
        lines = {tuple(line.split()) for line in resolved.stdout.splitlines()}
        assert lines == {("127.0.0.2", "node1"), ("127.0.0.3", "node2"), ("127.0.0.4", "node3")}, lines
    finally:
        hook.close()


def test_changed_host_key_is_refused(local_stack: LocalStack):
    """The connection's pinned key is enforced: a server presenting another key is not trusted."""
    conn = local_stack.slurm_connection
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    other = paramiko.Ed25519Key.from_private_key_file(str(local_stack.state_dir / "ssh" / "id_ed25519"))
    client.get_host_keys().add(f"[127.0.0.1]:{conn['port']}", other.get_name(), other)
    with pytest.raises(paramiko.BadHostKeyException):
        client.connect(
            "127.0.0.1",
            port=conn["port"],
            username=conn["login"],
            key_filename=conn["extra"]["key_file"],
            look_for_keys=False,
            allow_agent=False,
        )


def test_moto_answers_boto3_over_https(local_stack: LocalStack):
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id="aws_default")
    s3 = hook.get_conn()
    assert s3.meta.endpoint_url.startswith("https://127.0.0.1:")
    bucket = f"stack-test-{time.time_ns()}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="hello.txt", Body=b"over TLS")
    assert s3.get_object(Bucket=bucket, Key="hello.txt")["Body"].read() == b"over TLS"
    s3.delete_object(Bucket=bucket, Key="hello.txt")
    s3.delete_bucket(Bucket=bucket)
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]
    assert vpc["VpcId"].startswith("vpc-")
    ec2.delete_vpc(VpcId=vpc["VpcId"])


def test_moto_certificate_is_checked(local_stack: LocalStack):
    """Without the stack's CA the server is not trusted: TLS is real, not switched off."""
    public_cas = boto3.client("s3", verify=certifi.where(), endpoint_url=local_stack.env["AWS_ENDPOINT_URL"])
    with pytest.raises(SSLError):
        public_cas.list_buckets()
    with socket.create_connection(("127.0.0.1", local_stack.ports["moto"]), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            answer = raw.recv(16)
        except OSError:
            answer = b""
    assert not answer.startswith(b"HTTP/"), "moto answers plain HTTP"
