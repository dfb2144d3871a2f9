"""Job accounts leased to runs: a cluster keeps a pool of them (`patterns.job_account_names`, the profile's
`cluster.job_user` and `cluster.job_accounts`), and each run's jobs run as one that no other running run
holds. A job directory belongs to its account's group (`SlurmHook.make_job_dirs`), so the jobs of two
runs sharing a cluster cannot enter each other's directories; and when a run ends its directory is
closed (0700, the SSH user's), so the next run leasing the same account cannot read what it left.

A lease is a file `<shared root>/pcflow/job-accounts/<account>` holding the run's key, made with
noclobber (two runs racing for one account: one gets it) in a directory only the SSH user enters. A
run asking again (a retried task) gets the account it holds: nothing is leased twice.
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import TYPE_CHECKING

from pcflow.errors import PcflowError
from pcflow.slurm.spec import under_runs

if TYPE_CHECKING:
    from pcflow.slurm.hook import SlurmHook

#: Under the shared root: one file per leased account.
LEASES = "pcflow/job-accounts"
#: Exit status of the lease script when every account is held by another run.
ALL_TAKEN = 3

# $1 the lease directory, $2 the run key, then the accounts in the order to try them.
_LEASE = (
    'd=$1; k=$2; shift 2; mkdir -p -m 700 -- "$d" || exit 1; '
    'for a; do [ "$(cat -- "$d/$a" 2>/dev/null)" = "$k" ] && { echo "$a"; exit 0; }; done; '
    'for a; do if (set -C; printf \'%s\\n\' "$k" > "$d/$a") 2>/dev/null; then echo "$a"; exit 0; fi; done; '
    f"exit {ALL_TAKEN}"
)
# $1 the lease file, $2 the run key, $3 the run's directory: closed, then the lease removed if it is the run's.
_RELEASE = (
    'l=$1; k=$2; r=$3; if [ -d "$r" ]; then chmod 0700 -- "$r" || exit 1; fi; '
    '[ "$(cat -- "$l" 2>/dev/null)" = "$k" ] && rm -f -- "$l"; exit 0'
)


class NoJobAccount(PcflowError):
    """Every job account of the cluster is held by another running run: retried (one frees when its run ends)."""


def lease_path(shared_root: str, account: str) -> str:
    """Where the lease of `account` is kept on the cluster's shared file system."""
    return posixpath.join(shared_root, LEASES, account)


def trial_order(run_key: str, accounts: list[str]) -> list[str]:
    """The accounts in the order this run tries them: from a place its key picks, so concurrent runs do
    not all race for the first one."""
    start = int(hashlib.sha256(run_key.encode()).hexdigest(), 16) % len(accounts)
    return accounts[start:] + accounts[:start]


def lease(hook: SlurmHook, shared_root: str, run_key: str, accounts: list[str]) -> str:
    """The account this run's jobs run as: the one it holds already, else a free one, leased now."""
    leases = posixpath.join(shared_root, LEASES)
    result = hook.run(["sh", "-c", _LEASE, "sh", leases, run_key, *trial_order(run_key, accounts)], check=False)
    if result.exit_code == ALL_TAKEN:
        raise NoJobAccount(
            f"all {len(accounts)} job accounts of this cluster ({', '.join(accounts)}) are leased to runs that "
            f"are still running (leases in {leases}); this task retries. An admin raises cluster.job_accounts "
            "(and makes the accounts on every node) for more runs at once."
        )
    account = result.check().stdout.strip()
    if account not in accounts:
        raise PcflowError(f"the lease script answered {account!r}, not one of {accounts}")
    return account


def active_jobs(hook: SlurmHook, account: str) -> list[str]:
    """Job ids Slurm still runs or queues for `account`."""
    out = hook.run(["squeue", "--noheader", "--user", account, "--format", "%i"], check=False).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def release(hook: SlurmHook, shared_root: str, run_key: str, account: str) -> list[str]:
    """Close the run's directory (`<shared root>/pcflow/runs/<run key>`) and give the account back, once no
    job of it runs any more; returns the jobs that keep it leased (empty when released). Only this run's
    lease is removed."""
    still = active_jobs(hook, account)
    if still:
        return still
    run_dir = under_runs(shared_root, run_key)
    hook.run(["sh", "-c", _RELEASE, "sh", lease_path(shared_root, account), run_key, run_dir])
    return []
