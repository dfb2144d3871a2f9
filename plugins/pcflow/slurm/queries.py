"""What to ask Slurm, written once for both the worker (paramiko) and the triggerer (asyncssh).

Each query is a generator that yields argument lists and receives their stdout, so the same decision
steps drive a blocking SSH client in the hook and an async one in the trigger ("sans-I/O").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence

from pcflow.jobstates import SACCT_FIELDS, SQUEUE_FORMAT, JobInfo, parse_sacct, parse_scontrol, parse_squeue

Query = Generator[list[str], str, "JobInfo | list[JobInfo] | bool | None"]


def accounting_enabled() -> Generator[list[str], str, bool]:
    """sacct answers only when the cluster stores accounting (slurmdbd); otherwise scontrol must do."""
    config = yield ["scontrol", "show", "config"]
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() not in ("", "accounting_storage/none")
    return False


def job_info(job_id: str, accounting: bool) -> Generator[list[str], str, JobInfo | None]:
    """squeue while slurmctld holds the job (finished ones too, for MinJobAge); then sacct (history) or
    scontrol. sacct lags slurmctld by a moment, so it is asked only once squeue has forgotten the job."""
    live = parse_squeue((yield ["squeue", "-h", "-t", "all", "-j", job_id, "-O", SQUEUE_FORMAT]))
    if live:
        return live[0]
    if accounting:
        history = parse_sacct((yield ["sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", ",".join(SACCT_FIELDS)]))
        if history and history[0].raw_state:
            return history[0]
    return parse_scontrol((yield ["scontrol", "show", "job", "-o", job_id]))


def jobs_named(job_name: str, accounting: bool) -> Generator[list[str], str, list[JobInfo]]:
    """Jobs with exactly this name, live and (with accounting) from the last 30 days; oldest first."""
    argv = ["squeue", "-h", "-t", "all", "--name", job_name, "-O", SQUEUE_FORMAT]
    found = {j.job_id: j for j in parse_squeue((yield argv))}
    if accounting:
        argv = ["sacct", "-n", "-P", "-X", "-D", "--name", job_name, "-S", "now-30days", "-o", ",".join(SACCT_FIELDS)]
        for job in parse_sacct((yield argv)):
            found.setdefault(job.job_id, job)
    return sorted((j for j in found.values() if j.name == job_name), key=lambda j: int(j.job_id.split("_")[0]))


def array_elements(array_id: str, accounting: bool) -> Generator[list[str], str, list[JobInfo]]:
    """One line per element (`squeue -r`), finished elements included while slurmctld keeps them."""
    argv = ["squeue", "-h", "-r", "-t", "all", "-j", array_id, "-O", SQUEUE_FORMAT]
    found = {j.job_id: j for j in parse_squeue((yield argv)) if j.array_index is not None}
    if accounting:
        argv = ["sacct", "-n", "-P", "-X", "-D", "-j", array_id, "-o", ",".join(SACCT_FIELDS)]
        for record in parse_sacct((yield argv)):
            for job in record.array_elements():
                if job.array_index is not None:
                    found.setdefault(job.job_id, job)
    return sorted(found.values(), key=lambda j: j.array_index)


def jobs_state(
    singles: Sequence[str], arrays: Mapping[str, int], accounting: bool
) -> Generator[list[str], str, dict[str, list[JobInfo]]]:
    """Many waits in one question: one `squeue -r` for every job and array (one slurmctld RPC however
    many ids), then, with accounting, one sacct for those squeue has forgotten (a single job it no
    longer lists, an array short of elements). Keyed by the ids asked; an array maps to its elements, a
    single job to at most one JobInfo, none when neither knows it. scontrol is not asked: it reads the
    same slurmctld table `squeue -t all` just read, so a question per forgotten job (a thousand waits
    back after slurmctld's MinJobAge: a thousand RPCs in one round) would cost slurmctld and tell nothing."""
    found: dict[str, dict[str, JobInfo]] = {job_id: {} for job_id in (*singles, *arrays)}
    if not found:
        return {}
    argv = ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(found), "-O", SQUEUE_FORMAT]
    _collect(found, parse_squeue((yield argv)))
    missing = [j for j in singles if not found[j]] + [a for a, size in arrays.items() if len(found[a]) < size]
    if accounting and missing:
        _collect(found, (yield from _history(missing)))
    return {job_id: sorted(jobs.values(), key=lambda j: j.array_index or 0) for job_id, jobs in found.items()}


def jobs_accounted(
    singles: Sequence[str], arrays: Mapping[str, int]
) -> Generator[list[str], str, dict[str, list[JobInfo]]]:
    """What accounting (slurmdbd) holds of these jobs, in one sacct: asks slurmctld nothing. Only the ids
    it answers in full are keyed (a single job it has a record of, an array with every element): one it
    lags behind on is not "no such job", it waits for the next squeue."""
    found: dict[str, dict[str, JobInfo]] = {job_id: {} for job_id in (*singles, *arrays)}
    if not found:
        return {}
    _collect(found, (yield from _history(list(found))))
    whole = [j for j in singles if found[j]] + [a for a, size in arrays.items() if len(found[a]) >= size]
    return {job_id: sorted(found[job_id].values(), key=lambda j: j.array_index or 0) for job_id in whole}


def _history(job_ids: Sequence[str]) -> Generator[list[str], str, list[JobInfo]]:
    """sacct's record of each job's last attempt (-D: requeues counted), array elements one by one."""
    argv = ["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(job_ids), "-o", ",".join(SACCT_FIELDS)]
    records = parse_sacct((yield argv))
    return [job for record in records if record.raw_state for job in record.array_elements()]


def _collect(found: dict[str, dict[str, JobInfo]], jobs: Iterable[JobInfo | None]) -> None:
    """File each job under the id it was asked by (an element under its array); the first word stays."""
    for job in jobs:
        if job is not None and job.job_id.split("_")[0] in found:
            found[job.job_id.split("_")[0]].setdefault(job.job_id, job)


def drive(query: Generator[list[str], str, object], run: Callable[[list[str]], str]):
    """Answer a query with a blocking command runner."""
    try:
        argv = next(query)
        while True:
            argv = query.send(run(argv))
    except StopIteration as done:
        return done.value


async def adrive(query: Generator[list[str], str, object], run: Callable[[list[str]], Awaitable[str]]):
    """Answer a query with an async command runner."""
    try:
        argv = next(query)
        while True:
            argv = query.send(await run(argv))
    except StopIteration as done:
        return done.value
