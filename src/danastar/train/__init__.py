"""Training: `loop.train(config, decision)` and the rooms it is made of.

    loop        the run, top to bottom, and what happens after each step
    decision    the start decided once (plan, run directory), for --nproc's workers too
    plan        a run planned without training: the dry run, its checks (estimate: the time,
                memory: whether it fits)
    start       the run directory taken: its lock, resume or a fresh start, the run's files
    identity    what makes a run the same run (run.json); the automatic run directory
    optimizer   the planned optimizer and its LR schedule
    step        one optimizer step (routing: a mixture of experts' statistics of it)
    evaluation  the validation loss, a sample
    checkpoint  atomic, verified checkpoints and which to write when
    parallel    processes, devices, DDP/FSDP2/TP wrapping
    data        the token streams of a run
    logging     metrics.jsonl, the console, per-rank logs, trackers
    signals     SIGTERM/SIGUSR1/SIGINT as a flag the loop reads
    weights     a trained run's weights, for the commands that read them
    experts, tau_stats, determinism: per-expert and τ statistics, reproducible CPU math

The run directory's protocol (file names, status, exit codes) is `danastar.rundir`.
"""
