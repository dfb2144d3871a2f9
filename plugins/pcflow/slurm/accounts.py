"""Job accounts leased to runs: a cluster keeps a pool of them (`patterns.job_account_names`, the profile's
`cluster.job_user` and `cluster.job_accounts`), and each run's jobs run as one that no other running run
holds. A job directory belongs to its account's group (`SlurmHook.make_job_dirs`), so the jobs of two
runs sharing a cluster cannot enter each other's directories; and when a run ends its directory is
closed (0700, the SSH user's), so the next run leasing the same account cannot read what it left.

A lease is a file `<shared root>/pcflow/job-accounts/<account>` holding the run's key (first line) and
its DAG run (dag id and run id, the next two), made with noclobber (two runs racing for one account: one
gets it) in a directory only the SSH user enters. A run asking again (a retried task) gets the account it
holds: nothing is leased twice.

A run that never reached its release task (deleted, its teardown never run, its worker lost for good)
would hold its account forever. So when every account is held, `lease` asks Airflow about each holder's
DAG run, and reclaims the account of a run that is finished or gone and has no job left in Slurm, by
the same release that run's teardown would have done (its directory closed first). A holder whose state
Airflow does not give, or a lease from before leases named their DAG run, is kept.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pcflow.errors import PcflowError
from pcflow.slurm.spec import RUN_DATA, under_runs

if TYPE_CHECKING:
    from pcflow.slurm.hook import SlurmHook

#: Under the shared root: one file per leased account.
LEASES = "pcflow/job-accounts"
#: Exit status of the lease script when every account is held by another run.
ALL_TAKEN = 3
#: The most of a lease file that is read: a run key and a DAG run's two ids are far shorter.
LEASE_READ_BYTES = 1024
#: Whether the DAG run (dag_id, run_id) is over: finished or gone. Raises when Airflow gives no answer.
RunIsOver = Callable[[str, str], bool]

log = logging.getLogger(__name__)

# $1 the lease directory, $2 the run key, $3 $4 its DAG run, then the accounts in the order to try them.
_LEASE = (
    'd=$1; k=$2; g=$3; r=$4; shift 4; mkdir -p -m 700 -- "$d" || exit 1; '
    'for a; do [ "$(head -n 1 -- "$d/$a" 2>/dev/null)" = "$k" ] && { echo "$a"; exit 0; }; done; '
    'for a; do if (set -C; printf \'%s\\n\' "$k" "$g" "$r" > "$d/$a") 2>/dev/null; then echo "$a"; exit 0; fi; '
    f"done; exit {ALL_TAKEN}"
)
# $1 the lease file, $2 the run key, $3 the run's directory: closed and its view of the data ($4) removed,
# then the lease removed if it is the run's.
_RELEASE = (
    'l=$1; k=$2; r=$3; v=$4; if [ -d "$r" ]; then chmod 0700 -- "$r" && rm -rf -- "$v" || exit 1; fi; '
    '[ "$(head -n 1 -- "$l" 2>/dev/null)" = "$k" ] && rm -f -- "$l"; exit 0'
)
# $1 the lease directory, $2 the most bytes of each lease to show, then the accounts: each lease, NUL-ended.
_HOLDERS = (
    'd=$1; n=$2; shift 2; for a; do printf \'%s\\n\' "$a"; head -c "$n" -- "$d/$a" 2>/dev/null; printf \'\\0\'; done'
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


@dataclass(frozen=True)
class Holder:
    """Who a lease file says holds an account: a run key, and its DAG run when the lease names one."""

    account: str
    run_key: str
    dag_run: tuple[str, str] | None


def lease(
    hook: SlurmHook,
    shared_root: str,
    run_key: str,
    accounts: list[str],
    *,
    dag_run: tuple[str, str] = ("", ""),
    run_is_over: RunIsOver | None = None,
) -> str:
    """The account this run's jobs run as: the one it holds already, else a free one, leased now. With
    every account held, those of runs `run_is_over` says are over (and whose jobs have all left Slurm)
    are reclaimed first."""
    leases = posixpath.join(shared_root, LEASES)
    account = _try_lease(hook, leases, run_key, dag_run, accounts)
    if account is None and run_is_over is not None and reclaim(hook, shared_root, accounts, run_is_over):
        account = _try_lease(hook, leases, run_key, dag_run, accounts)
    if account is None:
        raise NoJobAccount(
            f"all {len(accounts)} job accounts of this cluster ({', '.join(accounts)}) are leased to runs that "
            f"are still running (leases in {leases}); this task retries. An admin raises cluster.job_accounts "
            "(and makes the accounts on every node) for more runs at once."
        )
    return account


def _try_lease(hook: SlurmHook, leases: str, run_key: str, dag_run: tuple[str, str], accounts: list[str]) -> str | None:
    """The account leased by one pass of the lease script, None when every account is held."""
    argv = ["sh", "-c", _LEASE, "sh", leases, run_key, *dag_run, *trial_order(run_key, accounts)]
    result = hook.run(argv, check=False)
    if result.exit_code == ALL_TAKEN:
        return None
    account = result.check().stdout.strip()
    if account not in accounts:
        raise PcflowError(f"the lease script answered {account!r}, not one of {accounts}")
    return account


def holders(hook: SlurmHook, shared_root: str, accounts: list[str]) -> list[Holder]:
    """Who holds each leased account, as the lease files say (each read up to LEASE_READ_BYTES)."""
    leases = posixpath.join(shared_root, LEASES)
    out = hook.run(["sh", "-c", _HOLDERS, "sh", leases, str(LEASE_READ_BYTES), *accounts]).stdout
    found = []
    for record in out.split("\0"):
        account, _, content = record.lstrip("\n").partition("\n")
        lines = content.splitlines()
        if account in accounts and lines and lines[0]:
            named = len(lines) >= 3 and all(lines[1:3])
            found.append(Holder(account, lines[0], (lines[1], lines[2]) if named else None))
    return found


def reclaim(hook: SlurmHook, shared_root: str, accounts: list[str], run_is_over: RunIsOver) -> list[str]:
    """Release the accounts whose holding run is over and has no job left in Slurm, as that run's own
    release task would have; returns them. A holder Airflow gives no state for is kept."""
    reclaimed = []
    for holder in holders(hook, shared_root, accounts):
        if holder.dag_run is None:
            continue
        try:
            over = run_is_over(*holder.dag_run)
        except Exception as exc:  # Airflow's answer missing: keep the lease, as the janitor keeps resources
            log.warning("job account %s: its run %s's state is unknown (%s); kept", holder.account, holder.dag_run, exc)
            continue
        if over and not release(hook, shared_root, holder.run_key, holder.account):
            log.warning(
                "job account %s reclaimed from run %s (%s %s), which is over but never released it",
                holder.account,
                holder.run_key,
                *holder.dag_run,
            )
            reclaimed.append(holder.account)
    return reclaimed


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
    view = posixpath.join(run_dir, RUN_DATA)
    hook.run(["sh", "-c", _RELEASE, "sh", lease_path(shared_root, account), run_key, run_dir, view])
    return []
