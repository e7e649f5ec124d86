"""A real SLURM on this machine for the tests: munged, slurmctld and slurmd started from a private
directory with their own slurm.conf (addressed through SLURM_CONF), stopped by pid.

Settings that make it quick and possible in a container: `cred_expire=5` (without it a requeued
job waits 120 s before it may start again), `KillWait=5`, `proctrack/linuxproc` and `task/none`
(no cgroups needed), accounting off, `MailProg=/bin/true`.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

SBIN = ("/usr/sbin", "/usr/bin")


def find(program: str) -> str | None:
    return shutil.which(program) or next(
        (f"{d}/{program}" for d in SBIN if os.access(f"{d}/{program}", os.X_OK)), None)


def why_not_available() -> str | None:
    """None when a local SLURM can run here, else the reason."""
    missing = [p for p in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if not find(p)]
    if missing:
        return (f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd "
                "slurm-client munge)")
    if os.geteuid() != 0:
        return "the local SLURM daemons must start as root"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Munge:
    """One munged for every local cluster (they share its socket)."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        self.socket = directory / "munge.socket"
        key = directory / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.process = subprocess.Popen(
            [find("munged"), "-F", "--force", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={directory / 'munged.pid'}", f"--log-file={directory / 'munged.log'}",
             f"--seed-file={directory / 'munged.seed'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(lambda: self.socket.exists(), 10, "munged did not start")

    def stop(self) -> None:
        stop_process(self.process)


class LocalSlurm:
    """One cluster: a controller and `nodes` slurmd daemons (simulated nodes on this machine)."""

    def __init__(self, directory: Path, munge: Munge, name: str = "local",
                 nodes: tuple[str, ...] = ("n1",), cpus: int = 2, gpus: int = 0):
        self.directory, self.name, self.nodes = directory, name, nodes
        directory.mkdir(parents=True, exist_ok=True)
        gres = f"gpu:h100:{gpus}" if gpus else ""
        if gpus:
            # Fake GPUs: character devices for gres.conf's File= (SLURM only checks they exist).
            lines = []
            for node in nodes:
                for index in range(gpus):
                    device = directory / f"fakegpu-{node}-{index}"
                    if not device.exists():
                        os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(195, index))
                    lines.append(f"NodeName={node} Name=gpu Type=h100 File={device}")
            (directory / "gres.conf").write_text("\n".join(lines) + "\n")
        self.conf = directory / "slurm.conf"
        self.controller_port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        node_lines = []
        for node in nodes:
            port = free_port()
            node_lines.append(f"NodeName={node} NodeHostname={socket.gethostname()} "
                              f"NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory=2000"
                              f"{' Gres=' + gres if gres else ''} State=UNKNOWN")
        (directory / "state").mkdir(exist_ok=True)
        self.conf.write_text("\n".join([
            f"ClusterName={name}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.controller_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge.socket},cred_expire=5",
            f"StateSaveLocation={directory / 'state'}",
            f"SlurmdSpoolDir={directory / 'spool-%n'}",
            f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
            f"SlurmdPidFile={directory / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={directory / 'slurmctld.log'}",
            f"SlurmdLogFile={directory / 'slurmd-%n.log'}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            "KillWait=5",
            "ReturnToService=2",
            "MpiDefault=none",
            "SchedulerParameters=sched_interval=1",
            "MinJobAge=600",
            "SlurmdTimeout=30",
            *(["GresTypes=gpu"] if gres else []),
            *node_lines,
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.start()

    def start(self) -> None:
        self.processes["slurmctld"] = subprocess.Popen(
            [find("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(lambda: self.run("sinfo", "-h").returncode == 0, 20,
                   f"slurmctld did not answer; see {self.directory / 'slurmctld.log'}")
        for node in self.nodes:
            self.processes[node] = subprocess.Popen(
                [find("slurmd"), "-D", "-N", node, "-f", str(self.conf)], env=self.env,
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(lambda: self.idle_nodes() == len(self.nodes), 30,
                   f"the nodes did not become idle; see {self.directory}")

    def run(self, *command: str, timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(list(command), env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def idle_nodes(self) -> int:
        result = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return sum(line.split()[1] == "idle" for line in result.stdout.splitlines()
                   if len(line.split()) == 2)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict of its key=value fields."""
        result = self.run("scontrol", "-o", "show", "job", job_id)
        fields = {}
        for item in result.stdout.split():
            key, sep, value = item.partition("=")
            if sep:
                fields[key] = value
        return fields

    def wait_job(self, job_id: str, timeout: float = 120,
                 until=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in until:
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {fields.get('JobState')} after "
                                     f"{timeout} s: {fields}")
            time.sleep(0.5)

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            stop_process(process)
        self.processes.clear()


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until(condition, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        time.sleep(0.2)
