"""How long the pcflow page's stack overview takes (pcflow.ui.resources.overview: every pcflow resource
listed, the janitor's dry run, buckets sized and everything priced), and how many AWS calls it makes,
against the overview as main had it before buckets were priced (two listings: the janitor's dry run,
then what it keeps; buckets unpriced), loaded from git in the same run, on the same moto state.

The state: one stack as the aws-gpu rehearsal keeps it (network, three instances, one of them expired)
and its dataset bucket of SHARDS objects (listed: moto publishes no datapoint for a bucket made today).
Needs the local stack (`make stack-up`; reads .stack/env). Removes what it made.

Usage: .venv/bin/python benchmarks/page_overview.py [--repeat 5]; prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "page_overview.json"
SHARDS = 1500
GOAL = "the overview no slower than main's while also sizing and pricing buckets; fewer AWS calls"
PEER_REF = "ba35d70"  # main before buckets were priced


def load_env() -> None:
    for line in (REPO / ".stack" / "env").read_text().splitlines():
        key, _, value = line.partition("=")
        if key and not key.startswith("#"):
            os.environ.setdefault(key, value.strip().strip("'\""))
    sys.path.insert(0, str(REPO / "plugins"))


def counted_clients() -> tuple[Any, dict[str, int]]:
    """The page's client source, counting every AWS call."""
    from pcflow.aws.clients import aws_client

    made: dict[str, Any] = {}
    calls = {"n": 0}

    def count(**_: Any) -> None:
        calls["n"] += 1

    def clients(service: str) -> Any:
        if service not in made:
            made[service] = aws_client(service, aws_conn_id="aws_default")
            made[service].meta.events.register("before-call", count)
        return made[service]

    return clients, calls


def main_overview() -> Any:
    """main's `overview`, from git, importing this tree's modules (which keep what it used)."""
    show = ["git", "show", f"{PEER_REF}:plugins/pcflow/ui/resources.py"]
    source = subprocess.run(show, cwd=REPO, check=True, capture_output=True, text=True).stdout
    module = sys.modules["main_resources"] = types.ModuleType("main_resources")  # dataclasses look it up
    exec(compile(source, "main:resources.py", "exec"), module.__dict__)  # our own file, at a commit
    return module.overview


def make_state(clients: Any) -> tuple[str, str]:
    from pcflow.aws.network import ensure_network
    from pcflow.aws.network_spec import NetworkSpec
    from pcflow.aws.tags import tag_specifications
    from pcflow.naming import aws_tags, standard_tags

    ec2, stack = clients("ec2"), f"bench{uuid.uuid4().hex[:8]}"
    spec = NetworkSpec(stack=stack, region="us-east-1")
    ids = ensure_network(ec2, spec, run=None, ttl=dt.timedelta(days=2), waiter_delay=0)
    image = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
    for ttl in (dt.timedelta(days=2), dt.timedelta(days=2), dt.timedelta(hours=-1)):
        tags = standard_tags(stack=stack, component="cluster", ttl=ttl)
        ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            InstanceType="c5.2xlarge",
            SubnetId=ids.head_subnet_id,
            TagSpecifications=tag_specifications("instance", tags),
        )
    s3, bucket = clients("s3"), f"pcflow-{stack}-data"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": aws_tags(standard_tags(stack=stack, component="dataset"))})
    for i in range(SHARDS):
        s3.put_object(Bucket=bucket, Key=f"shards/{i:05d}.tar", Body=b"x" * 64)
    return stack, bucket


def remove_state(clients: Any, stack: str, bucket: str) -> None:
    from pcflow.aws.teardown import Selector, teardown

    s3 = clients("s3")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    s3.delete_bucket(Bucket=bucket)
    teardown(clients, Selector(stack=stack), handler_sets=("ec2",), pass_delay=0, raise_on_leftovers=False)


def measure(overviews: dict[str, Any], repeat: int) -> dict[str, dict[str, Any]]:
    """Each overview `repeat` times, taking turns (the machine's load falls on both alike)."""
    seconds: dict[str, list[float]] = {name: [] for name in overviews}
    found: dict[str, dict[str, Any]] = {}
    for _ in range(repeat):
        for name, overview in overviews.items():
            clients, calls = counted_clients()
            started = time.perf_counter()
            stacks = overview(clients, "us-east-1").stacks
            seconds[name].append(time.perf_counter() - started)
            buckets = [line for lines in stacks.values() for line in lines if line["kind"] == "bucket"]
            priced = sum(line["usd_per_day"] is not None for line in buckets)
            found[name] = {"aws_calls": calls["n"], "buckets": len(buckets), "buckets_priced": priced}
    return {name: {"median_s": round(statistics.median(seconds[name]), 3), **found[name]} for name in overviews}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load_env()
    from pcflow.ui.resources import overview

    clients, _ = counted_clients()
    stack, bucket = make_state(clients)
    try:
        overviews = {"ours": overview, "main": main_overview()}
        measure(overviews, 1)  # warm both: imports, connections
        measured = measure(overviews, args.repeat)
        ours, theirs = measured["ours"], measured["main"]
    finally:
        remove_state(clients, stack, bucket)
    result = {
        "benchmark": "page_overview",
        "metrics": {**ours, "shards_in_bucket": SHARDS, "repeat": args.repeat, "load_average_1m": os.getloadavg()[0]},
        "peers": {f"main's overview at {PEER_REF} (two listings, buckets unpriced)": theirs},
        "goal": GOAL,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
