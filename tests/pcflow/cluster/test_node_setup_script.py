"""node-setup.sh as ParallelCluster runs it (the bytes and arguments of the rendered config's
OnNodeConfigured), on a fake root of each OS the profiles name: Ubuntu 22.04 (aws-gpu; /bin/sh is dash)
and Amazon Linux 2023 (the rehearsal; /bin/sh is bash).

Real here: the shell, and the account tools (`groupadd`, `useradd`, `usermod` with `--prefix`, which edit
the fake root's /etc/passwd, group, shadow and gshadow exactly as they would the node's; they need root,
as on the node). Stand-ins on PATH, each recording what it was asked: `curl` answers the instance
metadata service's three questions, `aws` records its command line, and the firewall (`iptables` and
`ip6tables` on Ubuntu, `nft` on Amazon Linux) records the rules it was given and answers `--check` from
them. So the rules are the ones the script issues; the real firewall is NOT exercised (no packet is
refused here), and neither is the call to EC2 (its permission is judged by the IAM evaluator below).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import iam_calls  # include/local: the IAM policy evaluator tests/deploy/test_iam.py uses
import pytest
from cluster_specs import WITH_NODE_SETUP

from pcflow.cluster.config import render_config
from pcflow.cluster.spec import ClusterSpec

pytestmark = pytest.mark.security

INSTANCE = "i-0123456789abcdef0"
#: Each OS: its shell as /bin/sh, its default user (ParallelCluster's), the group sudoers lets in, the firewall.
OSES = {
    "ubuntu2204": ("dash", "ubuntu", "sudo", ("iptables", "ip6tables")),
    "alinux2023": ("bash", "ec2-user", "wheel", ("nft",)),
}
TOOLS = ("awk", "cut", "cp", "mkdir", "chmod", "ln", "cat", "groupadd", "useradd", "usermod")
POLICIES = iam_calls.POLICIES


def rendered(os_name: str, **overrides) -> tuple[bytes, list[str]]:
    """The script's bytes and the arguments the rendered config hands it, as ParallelCluster would."""
    spec = ClusterSpec.parse({**WITH_NODE_SETUP, "os": os_name, **overrides})
    config = render_config(spec)
    setup = config.node_setup
    action = config.document["Scheduling"]["SlurmQueues"][0]["CustomActions"]["OnNodeConfigured"]
    assert action["Script"] == setup.uri
    return setup.script, action["Args"]


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


FIREWALL = """#!/bin/sh
# {tool}: records each command; --check answers from the rules --insert added
echo "{tool} $*" >> {log}
rule=$(echo "$*" | sed 's/--wait //; s/--check //; s/--insert //')
case " $* " in
  *" --check "*) grep -qxF -- "$rule" {state} 2>/dev/null ;;
  *" --insert "*) echo "$rule" >> {state} ;;
  *) echo "{tool}: unexpected $*" >&2; exit 2 ;;
esac
"""
NFT = """#!/bin/sh
# nft: records its arguments and the ruleset it reads
echo "nft $*" >> {log}
cat >> {log}
"""
CURL = """#!/bin/sh
# curl: the instance metadata service (IMDSv2: a token first, then the token on each question)
echo "curl $*" >> {log}
for url; do :; done
case $url in
  http://169.254.169.254/latest/api/token) printf token-abc ;;
  */meta-data/instance-id) printf {instance} ;;
  */meta-data/placement/region) printf us-east-1 ;;
  *) exit 22 ;;
esac
"""
AWS = """#!/bin/sh
echo "aws $*" >> {log}
"""


@dataclass
class Node:
    root: Path
    bin: Path
    log: Path
    os_name: str

    def etc(self, name: str) -> str:
        return (self.root / "etc" / name).read_text()

    def lines(self, prefix: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if line.startswith(prefix)]

    def run(self, script: bytes, args: list[str]) -> subprocess.CompletedProcess:
        """The script from a file of its own (as ParallelCluster downloads it), by the OS's /bin/sh."""
        path = self.root.parent / "downloaded-node-setup.sh"
        path.write_bytes(script)
        env = {"PATH": str(self.bin), "PCFLOW_ROOT": str(self.root), "HOME": str(self.root / "root")}
        command = [str(self.bin / "sh"), str(path), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def fake_node(tmp_path: Path, os_name: str, firewall: tuple[str, ...] | None = None) -> Node:
    """A fake root as the OS image has it (the default user, the sudo group), and a PATH of only the tools
    and stand-ins; `firewall`: which firewall tools the node has (default: the OS's)."""
    shell, user, sudo, tools = OSES[os_name]
    root, bin_dir, log = tmp_path / "root", tmp_path / "bin", tmp_path / "calls.log"
    for directory in ("etc", "root", f"home/{user}"):
        (root / directory).mkdir(parents=True)
    (root / "etc/passwd").write_text(f"root:x:0:0:root:/root:/bin/bash\n{user}:x:1000:1000::/home/{user}:/bin/bash\n")
    (root / "etc/group").write_text(f"root:x:0:\n{sudo}:x:27:{user}\n{user}:x:1000:\n")
    (root / "etc/shadow").write_text(f"root:*:20000:0:99999:7:::\n{user}:!:20000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text(f"root:*::\n{sudo}:*::{user}\n{user}:!::\n")
    bin_dir.mkdir()
    log.write_text("")
    for tool in (*TOOLS, "sed", "grep", "echo"):
        found = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
        if found is None:
            pytest.fail(f"{tool} is needed to run the node setup on a fake root (apt-get install passwd gawk)")
        os.symlink(found, bin_dir / tool)
    os.symlink(shutil.which(shell), bin_dir / "sh")
    quoted = shlex.quote(str(log))
    for tool in tools if firewall is None else firewall:
        text = NFT if tool == "nft" else FIREWALL
        executable(bin_dir / tool, text.format(tool=tool, log=quoted, state=shlex.quote(str(tmp_path / tool))))
    executable(bin_dir / "curl", CURL.format(log=quoted, instance=INSTANCE))
    executable(bin_dir / "aws", AWS.format(log=quoted))
    return Node(root, bin_dir, log, os_name)


@pytest.fixture(autouse=True)
def as_root():
    if os.geteuid() != 0:
        pytest.skip("useradd --prefix edits the fake root's account files only as root (as on the node)")


@pytest.mark.parametrize("os_name", sorted(OSES))
def test_a_node_gets_the_account_its_firewall_and_hop_limit_1_and_a_rerun_changes_nothing(tmp_path, os_name):
    _, user, sudo, _ = OSES[os_name]
    node = fake_node(tmp_path, os_name)
    script, args = rendered(os_name)
    first = node.run(script, args)
    assert first.returncode == 0, first.stderr
    # The account: the fixed uid and gid, no home, no login shell, a locked password, no sudo group.
    assert "pcflow-job:x:2950:2950:pcflow jobs:/nonexistent:/usr/sbin/nologin\n" in node.etc("passwd")
    assert "pcflow-job:!:" in node.etc("shadow")
    assert f"pcflow-job:x:2950:{user}\n" in node.etc("group")  # the SSH user reads what jobs write
    assert f"{sudo}:x:27:{user}\n" in node.etc("group")
    assert not (node.root / "nonexistent").exists()
    # IMDS refused to that uid, both address families.
    if os_name == "ubuntu2204":
        assert node.lines("iptables --wait --insert") == [
            "iptables --wait --insert OUTPUT --destination 169.254.169.254 --match owner --uid-owner 2950 --jump REJECT"
        ]
        assert node.lines("ip6tables --wait --insert") == [
            "ip6tables --wait --insert OUTPUT --destination fd00:ec2::254 --match owner --uid-owner 2950 --jump REJECT"
        ]
    else:
        ruleset = node.log.read_text()
        assert "nft -f -\n" in ruleset and "flush table inet pcflow_imds\n" in ruleset
        assert "type filter hook output priority filter; policy accept;" in ruleset
        assert "meta skuid 2950 ip daddr 169.254.169.254 reject\n" in ruleset
        assert "meta skuid 2950 ip6 daddr fd00:ec2::254 reject\n" in ruleset
    # Its own instance's IMDS: tokens required, hop limit 1, asked with an IMDSv2 token.
    assert node.lines("aws ") == [
        f"aws ec2 modify-instance-metadata-options --region us-east-1 --instance-id {INSTANCE} "
        "--http-tokens required --http-put-response-hop-limit 1 --output text"
    ]
    token, *questions = node.lines("curl")
    assert "--request PUT" in token and token.endswith("http://169.254.169.254/latest/api/token")
    assert len(questions) == 2 and all("X-aws-ec2-metadata-token: token-abc" in line for line in questions)
    # Kept for the next boot.
    assert (node.root / "opt/pcflow/node-setup.sh").read_bytes() == script
    unit = (node.root / "etc/systemd/system/pcflow-node-setup.service").read_text()
    assert f"ExecStart=/bin/sh /opt/pcflow/node-setup.sh pcflow-job 2950 {user}\n" in unit
    link = node.root / "etc/systemd/system/multi-user.target.wants/pcflow-node-setup.service"
    assert os.readlink(link) == "../pcflow-node-setup.service"

    accounts = {name: node.etc(name) for name in ("passwd", "group", "shadow", "gshadow")}
    node.log.write_text("")
    again = node.run(script, args)
    assert again.returncode == 0, again.stderr
    assert {name: node.etc(name) for name in accounts} == accounts
    if os_name == "ubuntu2204":  # checked, found, not added again
        assert not node.lines("iptables --wait --insert") and node.lines("iptables --wait --check")
    else:  # the same table again (made, emptied, filled)
        assert node.log.read_text().count("meta skuid 2950 ip daddr 169.254.169.254 reject") == 1


@pytest.mark.parametrize("os_name", sorted(OSES))
def test_a_pool_of_accounts_gets_consecutive_uids_one_firewall_rule_and_is_checked_whole_first(tmp_path, os_name):
    """`cluster.job_accounts: 4`: pcflow-job, pcflow-job-1..3 with uids 2950..2953, each in its own group
    with the SSH user; IMDS refused to the uid range in one rule; a node where the last uid is taken
    changes nothing at all (the first accounts are not made either)."""
    _, user, _, _ = OSES[os_name]
    node = fake_node(tmp_path, os_name)
    script, args = rendered(os_name, job_accounts=4)
    assert args[3:] == ["4"]
    first = node.run(script, args)
    assert first.returncode == 0, first.stderr
    for index, name in enumerate(["pcflow-job", "pcflow-job-1", "pcflow-job-2", "pcflow-job-3"]):
        uid = 2950 + index
        assert f"{name}:x:{uid}:{uid}:pcflow jobs:/nonexistent:/usr/sbin/nologin\n" in node.etc("passwd")
        assert f"{name}:x:{uid}:{user}\n" in node.etc("group")
    if os_name == "ubuntu2204":
        assert node.lines("iptables --wait --insert") == [
            "iptables --wait --insert OUTPUT --destination 169.254.169.254 --match owner --uid-owner 2950-2953 "
            "--jump REJECT"
        ]
    else:
        assert "meta skuid 2950-2953 ip daddr 169.254.169.254 reject\n" in node.log.read_text()
    unit = (node.root / "etc/systemd/system/pcflow-node-setup.service").read_text()
    assert f"ExecStart=/bin/sh /opt/pcflow/node-setup.sh pcflow-job 2950 {user} 4\n" in unit

    taken = fake_node(tmp_path / "taken", os_name)
    (taken.root / "etc/passwd").write_text(taken.etc("passwd") + "builder:x:2953:2953::/home/builder:/bin/bash\n")
    before = taken.etc("passwd")
    refused = taken.run(script, args)
    assert refused.returncode != 0 and "uid 2953 belongs to 'builder', not pcflow-job-3" in refused.stderr
    assert taken.etc("passwd") == before


def test_the_script_s_call_is_one_the_node_policy_and_the_boundary_allow(tmp_path):
    """The EC2 request the script made, as IAM sees it (a pcflow cluster's node: its instance carries
    ParallelCluster's and pcflow's tags), through the evaluator: allowed by the node policy within the
    permissions boundary. Not sent to EC2."""
    node = fake_node(tmp_path, "ubuntu2204")
    assert node.run(*rendered("ubuntu2204")).returncode == 0
    words = node.lines("aws ")[0].split()
    option = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
    request = {
        "action": "ec2:ModifyInstanceMetadataOptions",
        "resource": f"arn:aws:ec2:{option['--region']}:{iam_calls.ACCOUNT}:instance/{option['--instance-id']}",
        "context": {
            "aws:ResourceTag/parallelcluster:cluster-name": "pcflow-research-cluster",
            "aws:ResourceTag/pcflow:stack": "research",
            "ec2:MetadataHttpTokens": option["--http-tokens"],
            "ec2:MetadataHttpPutResponseHopLimit": option["--http-put-response-hop-limit"],
        },
    }
    policy, boundary = POLICIES / "pcflow-cluster-node-policy.json", POLICIES / "pcflow-cluster-boundary.json"
    [result] = iam_calls.simulate(policy, [request], boundary=boundary)
    assert result["decision"] == "Allowed", result


@pytest.mark.parametrize(
    ("passwd", "message"),
    [
        ("builder:x:2950:2950::/home/builder:/bin/bash\n", "uid 2950 belongs to 'builder', not pcflow-job"),
        ("pcflow-job:x:3001:3001::/nonexistent:/usr/sbin/nologin\n", "pcflow-job has uid:gid 3001:3001, not 2950"),
    ],
)
def test_a_uid_that_would_differ_between_nodes_fails_the_node(tmp_path, passwd, message):
    """A shared file system sees numbers: a node whose account would have another uid than its peers
    fails its setup (ParallelCluster then fails the node) rather than run jobs as someone else."""
    node = fake_node(tmp_path, "ubuntu2204")
    with (node.root / "etc/passwd").open("a") as accounts:
        accounts.write(passwd)
    before = {name: node.etc(name) for name in ("passwd", "group", "shadow", "gshadow")}
    result = node.run(*rendered("ubuntu2204"))
    assert result.returncode != 0 and message in result.stderr
    assert {name: node.etc(name) for name in before} == before  # checked before anything was changed
    assert not node.lines("aws ") and not node.lines("iptables")


def test_a_node_that_cannot_refuse_imds_to_the_job_account_fails(tmp_path):
    node = fake_node(tmp_path, "alinux2023", firewall=())
    result = node.run(*rendered("alinux2023"))
    assert result.returncode != 0
    assert "neither iptables nor nft is installed: the metadata service cannot be refused" in result.stderr
    assert not node.lines("aws ")


def test_a_job_account_in_a_sudo_group_fails_the_node(tmp_path):
    node = fake_node(tmp_path, "ubuntu2204")
    node.run(*rendered("ubuntu2204"))
    group = node.etc("group").replace("sudo:x:27:ubuntu", "sudo:x:27:ubuntu,pcflow-job")
    (node.root / "etc/group").write_text(group)
    result = node.run(*rendered("ubuntu2204"))
    assert result.returncode != 0 and "pcflow-job is a member of group sudo" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["pcflow-job;touch /tmp/pcflow-pwned", "2950", "ubuntu"],
        ["pcflow-job", "2950 --non-unique", "ubuntu"],
        ["pcflow-job", "0", "ubuntu"],
        ["pcflow-job", "2950", "$(touch /tmp/pcflow-pwned)"],
        ["pcflow-job", "2950"],
    ],
)
def test_arguments_that_are_not_a_name_and_a_uid_are_refused(tmp_path, args):
    """The config passes validated values; the script checks them again before any of them is used."""
    node = fake_node(tmp_path, "ubuntu2204")
    before = node.etc("passwd")
    result = node.run(rendered("ubuntu2204")[0], args)
    assert result.returncode != 0 and result.stderr.startswith("pcflow node setup: ")
    assert node.etc("passwd") == before and not Path("/tmp/pcflow-pwned").exists()
