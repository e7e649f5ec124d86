"""The run directory's protocol, which `train` writes and the other commands read: the ground
floor, importing nothing of danastar but `errors` and `durable`.

    files    the names of what a run directory holds; an earlier run's files moved aside
    metrics  metrics.jsonl: one tolerant reader (it reports the lines it cannot read)
    status   status.json (where a run stands) and the STOP file (a request to stop)
    exits    exit codes 0/2/75/130 and the signals that ask a run to stop
    lock     one live run per directory
"""
