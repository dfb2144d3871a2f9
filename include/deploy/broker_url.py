"""Print the Celery broker's URL with the Redis password from REDIS_PASSWORD, for Airflow's
`AIRFLOW__CELERY__BROKER_URL_CMD`.

Why a command: kombu's Redis transport takes the password only inside the URL, and a URL in the
environment is what `docker inspect`, `airflow config list` and process listings show. Airflow runs
a `_CMD` of a sensitive option when it reads the option and keeps the result in memory only. The
password is percent-encoded here, so any character is safe in it (as PGPASSWORD is for PostgreSQL).

Usage: broker_url.py redis://redis:6379/0
"""

from __future__ import annotations

import os
import sys
import urllib.parse


def with_password(url: str, password: str) -> str:
    """`url` with `:<password>@` before its host; refused when the URL names a user or password already."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname or "@" in parts.netloc:
        raise ValueError(f"expected redis://host:port/db without credentials, got {url!r}")
    netloc = f":{urllib.parse.quote(password, safe='')}@{parts.netloc}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def main(argv: list[str]) -> int:
    password = os.environ.get("REDIS_PASSWORD", "")
    if len(argv) != 2 or not password:
        print("usage: REDIS_PASSWORD=... broker_url.py redis://host:port/db", file=sys.stderr)
        return 2
    print(with_password(argv[1], password))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
