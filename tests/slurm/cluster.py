"""A one-node Slurm on localhost for tests/slurm: install, configure, start, stop.

Debian's `slurm-wlm` and `munge` are installed with apt-get when missing (root only). The
daemons this module starts are the only ones it stops; a munged that was already running is
used and left alone.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "slurm.conf.in"
# srun inside a job drops SLURM_* variables (the slurm-jobstep plugin sanitises them), so
# SLURM_CONF cannot point elsewhere: the configuration must be at the default path.
SLURM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# written by headgeom tests/slurm/cluster.py"
MUNGE_KEY = Path("/etc/munge/munge.key")
PARTITION = "headgeom"
PROGRAMS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "srun", "munged")
PACKAGES = ("slurm-wlm", "munge")


class ClusterError(RuntimeError):
    """The local cluster could not be installed or started; the message says why."""


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def ensure_installed() -> None:
    """apt-get install slurm-wlm and munge when any of their programs is missing."""
    missing = missing_programs()
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ClusterError(
            f"{', '.join(missing)} missing and there is no apt-get to install {' '.join(PACKAGES)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
    ):
        proc = _run(cmd, timeout=900, env=env)
        if proc.returncode != 0:
            raise ClusterError(
                f"`{' '.join(cmd)}` failed ({proc.returncode}); Slurm cannot be installed:\n"
                f"{(proc.stdout + proc.stderr)[-3000:]}"
            )
    still = missing_programs()
    if still:
        raise ClusterError(f"apt-get installed {' '.join(PACKAGES)} but {still} are still missing")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ClusterError("no MemTotal in /proc/meminfo")


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else f"({path} not written)"


class LocalSlurm:
    """slurmctld + slurmd (+ munged when none runs) on localhost, partition PARTITION.

    State, spool and daemon logs live under `state`; the configuration is written to
    /etc/slurm/slurm.conf (refusing to replace one that this module did not write).
    """

    def __init__(self, state: Path, ctld_port: int = 6817, slurmd_port: int = 6818):
        self.state = Path(state)
        self.ctld_port, self.slurmd_port = ctld_port, slurmd_port
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list = []
        self.wrote_conf = False
        self.cpus = os.cpu_count() or 1
        self.partition = PARTITION

    # ----------------------------------------------------------------- set-up
    def write_conf(self) -> None:
        if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text(errors="replace"):
            raise ClusterError(
                f"{SLURM_CONF} exists and was not written by this test; refusing to replace a "
                "real Slurm configuration (run the test on a machine without one)"
            )
        for sub in ("ctld", "slurmd"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        text = TEMPLATE.read_text().format(
            ctld_port=self.ctld_port,
            slurmd_port=self.slurmd_port,
            state=self.state,
            cpus=self.cpus,
            # slurmd refuses a node whose configured memory exceeds what it measures
            memory_mb=int(_memory_mb() * 0.9),
            partition=self.partition,
        )
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(f"{MARKER}\n{text}")
        self.wrote_conf = True

    def ensure_munge(self) -> None:
        if not MUNGE_KEY.exists():
            MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
            MUNGE_KEY.write_bytes(os.urandom(1024))
            munge_user = pwd.getpwnam("munge")
            os.chown(MUNGE_KEY, munge_user.pw_uid, munge_user.pw_gid)
            MUNGE_KEY.chmod(0o400)
        if self._munge_works():
            return  # someone else's munged: use it, leave it running
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        munge_user = pwd.getpwnam("munge")
        os.chown(run_dir, munge_user.pw_uid, munge_user.pw_gid)
        log = self._log("munged")
        self.procs["munged"] = subprocess.Popen(
            ["/usr/sbin/munged", "--foreground"],
            user="munge",
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait(self._munge_works, 20, "munged", self.state / "munged.out")

    @staticmethod
    def _munge_works() -> bool:
        try:
            enc = _run(["munge", "-n"], timeout=10)
            if enc.returncode != 0:
                return False
            return _run(["unmunge"], input=enc.stdout, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _log(self, name: str):
        """Console output of a daemon we start, closed in stop()."""
        handle = open(self.state / f"{name}.out", "w")
        self.logs.append(handle)
        return handle

    def _start(self, name: str, cmd: list[str]) -> None:
        out = self._log(name)
        self.procs[name] = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _wait(self, ready, seconds: float, name: str, log: Path) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}:\n{_tail(log)}")
            if ready():
                return
            time.sleep(0.5)
        raise ClusterError(f"{name} not ready after {seconds:.0f} s:\n{_tail(log)}")

    def node_state(self) -> str:
        proc = _run(
            ["sinfo", "--noheader", "--format=%T", "--partition", self.partition], timeout=15
        )
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def start(self) -> LocalSlurm:
        for port in (self.ctld_port, self.slurmd_port):
            if not _port_free(port):
                raise ClusterError(
                    f"port {port} is in use: another slurmctld/slurmd runs on this machine; "
                    "stop it or run the test elsewhere"
                )
        self.write_conf()
        self.ensure_munge()
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(SLURM_CONF)])
        self._wait(
            lambda: _run(["scontrol", "ping"], timeout=10).stdout.count("UP") > 0,
            60,
            "slurmctld",
            self.state / "slurmctld.log",
        )
        self._start("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", str(SLURM_CONF)])
        self._wait(
            lambda: self.node_state() in ("idle", "mixed", "allocated"),
            60,
            "slurmd",
            self.state / "slurmd.log",
        )
        return self

    # ----------------------------------------------------------------- queries
    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as key → value (finished jobs stay for MinJobAge)."""
        proc = _run(["scontrol", "show", "job", "--oneliner", str(job_id)], timeout=15)
        if proc.returncode != 0:
            raise ClusterError(f"scontrol show job {job_id}: {proc.stderr.strip()}")
        fields = {}
        for item in proc.stdout.split():
            key, _, value = item.partition("=")
            fields[key] = value
        return fields

    # ----------------------------------------------------------------- teardown
    def stop(self) -> None:
        """Stop the daemons this object started (slurmd first), and remove its slurm.conf."""
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for handle in self.logs:
            handle.close()
        self.logs.clear()
        if self.wrote_conf and SLURM_CONF.exists():
            SLURM_CONF.unlink()
            self.wrote_conf = False

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
