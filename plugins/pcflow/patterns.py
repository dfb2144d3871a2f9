"""The shapes of user-supplied values that both the run spec (pydantic) and the trigger form (the
Params' JSON schema) check. Plain regular expressions, so a DAG file builds its form without
importing the run-spec models."""

from __future__ import annotations

import re

INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\d[a-z0-9-]*\.[a-z0-9]+$")
#: A dataset partition: one path segment under the dataset prefix (a date for scheduled runs).
PARTITION = re.compile(r"^[A-Za-z0-9=_.-]{1,64}$")
#: A profile's name (its file is `<name>.yaml` in a profile directory).
PROFILE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
