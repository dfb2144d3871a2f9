"""`make airflow`: the Airflow UI on this machine, without a container engine. docker-compose.yaml's
deployment (airflow_services.py: PostgreSQL, Redis, airflow-init, api-server, scheduler, dag-processor,
one triggerer, one Celery worker) started on the host against the local stack: the `.env` compose reads
is generated once (fresh secrets, the stack's connections, the `local` profile offered) and kept with
mode 0600, so the login printed stays the same. `up` is idempotent (what runs stays, what is missing
starts); `down` stops exactly what `up` started, keeping the database (its runs) for the next `up`.

State: <stack dir>/deployment (PCFLOW_AIRFLOW_DIR overrides it); `make stack-clean` deletes it.

Usage: airflow_ui.py up [--workers N] [--triggerers N] | down | status
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from airflow_services import ONE_MACHINE_SETTINGS, Deployment, DeploymentError
from compose_model import ComposeRefused, fill_env_file
from stack import STATE, load_layout, stack_env, status

ROOT = Path(os.environ.get("PCFLOW_AIRFLOW_DIR", STATE / "deployment")).resolve()
#: The api-server's port when it is free as the deployment is made (compose's default), else another.
PREFERRED_PORT = 8080


def ensure_env_file(root: Path) -> Path:
    """The deployment's `.env`, as README.md's steps fill it in, made once: secrets generated, then the
    local stack's connections and settings for one machine, as a user adds theirs. Kept afterwards (it
    is the deployment's own, as a user's `.env` is: edit it, then `make airflow-down airflow`)."""
    env_file = root / ".env"
    if env_file.exists():
        return env_file
    lay = load_layout(create=False)
    if not lay.ports or not all(s["ready"] for s in status(lay).values()):
        raise DeploymentError("the local stack is not up: make stack-up")
    root.mkdir(parents=True, exist_ok=True)
    extra = {**stack_env(lay), "PCFLOW_OFFERED_PROFILES": "local", **ONE_MACHINE_SETTINGS}
    return fill_env_file(env_file, extra=extra)


def show(said: dict[str, str]) -> None:
    for name, what in said.items():
        print(f"{name:24s} {what}", flush=True)


def login_lines(deployment: Deployment) -> list[str]:
    """What a person needs to open the UI (the password is this deployment's own, generated here)."""
    return [
        f"Airflow UI: {deployment.url}",
        f"  username: {deployment.username}",
        f"  password: {deployment.password}   (kept in {deployment.root / '.env'}, mode 0600)",
        f"  trigger `pretrain` from its form; pcflow's page: {deployment.url}/plugin/pcflow",
        f"  logs in {deployment.root / 'logs'}; `make airflow-down` stops it",
    ]


def cmd_up(workers: int, triggerers: int, process_env: Path | None = None) -> int:
    ensure_env_file(ROOT)
    base = json.loads(process_env.read_text()) if process_env else None
    deployment = Deployment(ROOT, workers=workers, triggerers=triggerers, api_port=PREFERRED_PORT, process_env=base)
    show(deployment.start())
    print("\n".join(login_lines(deployment)))
    return 0


def cmd_down() -> int:
    if not (ROOT / "deployment.json").exists():
        print("airflow down (no deployment)")
        return 0
    show(Deployment(ROOT).stop())
    print("airflow down")
    return 0


def cmd_status() -> int:
    if not (ROOT / "deployment.json").exists():
        print(f"no deployment in {ROOT} (make airflow)")
        return 0
    deployment = Deployment(ROOT)
    pids = deployment.status()
    show({name: f"up (pid {pid})" if pid else "down" for name, pid in pids.items()})
    print(f"postgres                 {'up' if deployment.postgres().running() else 'down'}")
    print(f"{sum(bool(p) for p in pids.values())}/{len(pids)} processes up; {deployment.url}; state in {ROOT}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--workers", type=int, default=1, help="Celery workers (when the deployment is made)")
    parser.add_argument("--triggerers", type=int, default=1, help="triggerers (when the deployment is made)")
    parser.add_argument(
        "--process-env",
        type=Path,
        help="a JSON file: the processes' base environment instead of this checkout's (when the deployment is made)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return cmd_up(args.workers, args.triggerers, args.process_env)
        return cmd_down() if args.command == "down" else cmd_status()
    except (DeploymentError, ComposeRefused) as exc:
        print(f"airflow {args.command} failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
