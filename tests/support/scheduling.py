"""How `make test` hands the suite to its pytest-xdist workers (docs/decisions/0058).

A work unit is a test module, as with `--dist loadfile` (a module's servers start once, on one
worker), except that the modules of a directory in ONE_UNIT form one unit together: they share a
session-scoped resource that costs much to start (the local Spark session, a JVM), which would
otherwise start once on each worker their modules land on.

(Not `xdist_group` marks with `--dist loadgroup`: under pytest 9 xdist's renaming of the grouped
tests' ids has no effect, so loadgroup spreads grouped tests like ungrouped ones.)"""

from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

ONE_UNIT = ("tests/spark_jobs/",)


class ModuleOrDirectoryScheduling(LoadFileScheduling):  # type: ignore[misc]
    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return next((unit for unit in ONE_UNIT if module.startswith(unit)), module)


def make_scheduler(config: pytest.Config, log: Any) -> ModuleOrDirectoryScheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None
    return ModuleOrDirectoryScheduling(config, log)
