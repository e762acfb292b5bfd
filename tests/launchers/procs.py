"""Start real launchers (Lightning's ``strategy="ddp"`` subprocess launcher, ``torchrun``) on the tiny fit script,
wait for them with a deadline, and always leave no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = str(Path(__file__).resolve().parents[2])
SCRIPT = "tests.launchers.fit_script"
# what a launcher or a cluster sets: inherited, it would make the children think they are ranks of another job
_JOB_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")
_JOB_PREFIXES = ("MASTER_", "TORCHELASTIC_", "SLURM_", "PL_", "OMPI_", "PMI_", "LSB_", "JSM_")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _JOB_VARIABLES and not key.startswith(_JOB_PREFIXES)
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"  # two or four processes on a small CI machine
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Job:
    """Processes of one launched job; each in its own session, logs in ``<root>/launch_<i>.log``."""

    def __init__(self, root: Path, commands: list[list[str]], env: dict[str, str] | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.logs = [root / f"launch_{i}.log" for i in range(len(commands))]
        self.procs: list[subprocess.Popen] = []
        try:
            for command, log in zip(commands, self.logs, strict=True):
                with open(log, "wb") as out:
                    self.procs.append(
                        subprocess.Popen(
                            command,
                            cwd=REPO,
                            env=env or clean_env(),
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
        except BaseException:
            self.kill()
            raise

    def wait(self, timeout_s: float) -> list[int]:
        """Every launcher's exit code; on the deadline everything is killed and the test fails with the logs."""
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"the job ran past {timeout_s:.0f} s (a hang?)\n{self.tail()}") from None
        return [proc.returncode for proc in self.procs]

    def tail(self, chars: int = 4000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}" for log in self.logs)

    def kill(self) -> None:
        """SIGKILL to every process of the job: the launchers, their process groups and every descendant
        (torchrun starts each worker in a session of its own), each by its pid."""
        victims: dict[int, psutil.Process] = {}
        for proc in self.procs:
            try:
                parent = psutil.Process(proc.pid)
                victims.update({p.pid: p for p in parent.children(recursive=True)})
            except psutil.NoSuchProcess:
                pass
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is its pid
        for victim in victims.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def ddp_job(root: Path, *args: str, devices: int = 2) -> Job:
    """``strategy="ddp"`` on one machine: rank 0 is the script, Lightning re-executes it for the others."""
    command = [sys.executable, "-m", SCRIPT, "--root", str(root), "--devices", str(devices), *args]
    env = clean_env()
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(free_port())
    return Job(root, [command], env)


def torchrun_job(root: Path, *args: str, nodes: int = 2) -> Job:
    """``nodes`` nodes of one process each on this machine: one ``torchrun --node-rank i`` per node, meeting at
    a free port of the loopback address (Lightning's TorchElasticEnvironment)."""
    port = str(free_port())
    commands = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "0",
            "-m",
            SCRIPT,
            "--root",
            str(root),
            "--num-nodes",
            str(nodes),
            *args,
        ]
        for node in range(nodes)
    ]
    return Job(root, commands)
