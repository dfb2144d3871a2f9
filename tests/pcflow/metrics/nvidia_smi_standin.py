#!/usr/bin/env python3
"""A stand-in for `nvidia-smi` on a machine without GPUs: the query mode only, as NVIDIA documents it.

`nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]` prints one line per GPU, the
fields in the order asked, separated by ", "; with units unless `nounits`, a header line unless
`noheader`; an unknown field is refused with exit status 2. This board: four 24 GiB GPUs (a g5.12xlarge),
each at its own steady use, so a test can compute what the harvest must find.
"""

import sys

GPUS = [
    {"index": 0, "name": "NVIDIA A10G", "utilization.gpu": 85, "memory.used": 20480, "memory.total": 23028},
    {"index": 1, "name": "NVIDIA A10G", "utilization.gpu": 80, "memory.used": 18432, "memory.total": 23028},
    {"index": 2, "name": "NVIDIA A10G", "utilization.gpu": 75, "memory.used": 16384, "memory.total": 23028},
    {"index": 3, "name": "NVIDIA A10G", "utilization.gpu": 90, "memory.used": 22528, "memory.total": 23028},
]
UNITS = {"utilization.gpu": ("%", " [%]"), "memory.used": ("MiB", " [MiB]"), "memory.total": ("MiB", " [MiB]")}


def main(argv: list[str]) -> int:
    options = dict(arg.split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    if "--query-gpu" not in options or "--format" not in options:
        print(
            "stand-in nvidia-smi: only --query-gpu=... --format=csv[,noheader][,nounits] is emulated", file=sys.stderr
        )
        return 2
    fields = options["--query-gpu"].split(",")
    formats = set(options["--format"].split(","))
    if "csv" not in formats:
        print(f'"{options["--format"]}" is not a valid format.', file=sys.stderr)
        return 2
    for field in fields:
        if field not in GPUS[0]:
            print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
            return 2
    if "noheader" not in formats:
        print(", ".join(f + ("" if "nounits" in formats else UNITS.get(f, ("", ""))[1]) for f in fields))
    for gpu in GPUS:
        values = [f"{gpu[f]}" if "nounits" in formats or f not in UNITS else f"{gpu[f]} {UNITS[f][0]}" for f in fields]
        print(", ".join(values))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
