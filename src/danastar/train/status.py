"""status.json, as the run directory's protocol defines it (`danastar.rundir.status`), under the
names this package has long offered."""

from danastar.rundir.status import read_status as read_status
from danastar.rundir.status import write_status as write_status
