"""The run directory's protocol, which `train` writes and the other commands read (the ground
floor: it imports nothing of danastar but `errors`). For now: the lock (`rundir.lock`)."""
