"""Processes that start warm: one template process per job, which has imported torch and
equipoise, forks each server and worker the local launcher asks for.

Why: importing torch costs a process about 1.6 s of CPU before it does anything. A job of
four workers and four servers on two cores spent most of its start-up importing it eight
times over, and a replacement after a loss paid it again.

How. `Template` starts ``python -m equipoise.launch.warm`` with the environment the
children get (OpenMP and MKL threads and TMPDIR are read at import). It imports what every
child needs — before any thread or socket exists: a fork copies the calling thread only —
and reads requests on its stdin, one JSON line each: the role, rank, coordinator address,
log file and job document (the config and the role's keys: on a pipe, never on a command
line). For each it forks twice. The first child forks the process and exits at once, so
the process is reparented to the launcher, which is a child subreaper
(PR_SET_CHILD_SUBREAPER) while a template runs: the launcher waits for it, reads its exit
status and kills it by pid as for a child of its own. The process waits until it is the
launcher's, then asks to die with it (PR_SET_PDEATHSIG) as a cold child does. The
template answers each request with the pid.

Where the template cannot start or answer (not Linux, no prctl, it died, or
``EQUIPOISE_WARM=0`` in the environment), a child starts cold as before
(``python -m equipoise.launch.proc``).

The template is started as early as the job's thread count is known (``prestart``: the
command line calls it before it imports torch itself, ``train`` before it checks the
workload), with the job's folder for temporary files, so that its imports run beside the
launcher's own imports and checks rather than after them; the launcher ``adopt``s it,
and one not adopted (the job refused) is stopped (``discard_early``, also at exit).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["Template", "WarmProcess", "adopt", "discard_early", "ipc_fits", "job_env", "preload", "prestart"]

PR_SET_CHILD_SUBREAPER = 36
TITLE_ROOM = 1024  # bytes of command line the template reserves for its children's (`_retitle`)
_reaping = [0]  # templates alive in this process: it is a subreaper while any is
_reaping_lock = threading.Lock()


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _subreaper(on: bool) -> bool:
    with _reaping_lock:
        if on:
            if _reaping[0] == 0 and not _prctl(PR_SET_CHILD_SUBREAPER, 1):
                return False
            _reaping[0] += 1
        else:
            _reaping[0] -= 1
            if _reaping[0] == 0:
                _prctl(PR_SET_CHILD_SUBREAPER, 0)
        return True


def job_env(threads: int) -> dict[str, str]:
    """The environment the job's processes start with: this one's, with `threads` for
    OpenMP and MKL (TMPDIR, the job's folder, is added where it fits an ipc socket). With
    more than one thread, OpenMP's idle threads sleep instead of spinning (unless
    OMP_WAIT_POLICY is set already): the job's processes share the machine's cores, and a
    worker's threads spinning after its step take them from the server and the
    coordinator just when the exchange needs them."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if threads > 1:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


# What an ipc listener's socket (wire/zmq_transport.py) adds to its folder's path:
# "/equipoise-<pid>-<8>.sock", a pid of up to 7 digits (tempfile.mktemp's names are 8
# characters). Here, not in the wire package, whose import is torch's: `prestart` runs
# before it, so that the template's imports run beside the command's.
IPC_NAME_LEN = len("/equipoise--12345678.sock") + 7


def ipc_fits(folder: str) -> bool:
    """Whether an ipc listener's socket in `folder` has a path a Unix socket can bind."""
    import zmq

    return len(folder) + IPC_NAME_LEN <= zmq.IPC_PATH_MAX_LEN


def job_folder(env: dict[str, str]) -> str | None:
    """A new folder for the job's temporary files (its children's ipc sockets), set as
    `env`'s TMPDIR; None (and no TMPDIR) where a socket's path in it would be too long."""
    tmp = tempfile.mkdtemp(prefix="equipoise-job-")
    if not ipc_fits(tmp):
        os.rmdir(tmp)
        return None
    env["TMPDIR"] = tmp
    return tmp


_early: list = []  # at most one (threads, env, job folder, template) started by `prestart`
_registered: list = []  # discard_early, once registered to run at exit


def prestart(threads: int, timeout: float) -> None:
    """Start the template of a job about to run with `threads`, and its job folder (the
    module docstring); nothing if one is waiting already or warm starts are off."""
    if _early:
        return
    env = job_env(threads)
    tmp = job_folder(env)
    template = Template(env, timeout, Path(tmp) / "template.log" if tmp else None)
    if template.proc is None:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    _early.append((threads, env, tmp, template))
    if not _registered:
        _registered.append(atexit.register(discard_early))


def adopt(threads: int) -> tuple[dict[str, str], str | None, "Template"] | None:
    """The early template (its env and job folder) if it was started for `threads` and
    this process's environment has not changed since; else None (one that does not fit
    is stopped)."""
    if not _early:
        return None
    try:
        n, env, tmp, template = _early.pop()
    except IndexError:  # another job's thread took it meanwhile
        return None
    now = {k: v for k, v in job_env(threads).items() if k != "TMPDIR"}  # the job's own folder: not the user's
    if n != threads or {k: v for k, v in env.items() if k != "TMPDIR"} != now:
        _stop_early(tmp, template)
        return None
    return env, tmp, template


def discard_early() -> None:
    """Stop a template `prestart` started that no job adopted, and remove its folder."""
    while _early:
        try:
            _, _, tmp, template = _early.pop()
        except IndexError:  # another thread took it meanwhile
            return
        _stop_early(tmp, template)


def _stop_early(tmp: str | None, template: "Template") -> None:
    template.close()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


class WarmProcess:
    """A forked child, reparented to this process: what the launcher uses of a Popen."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a caller's waitpid(-1)): gone, status unknown
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(pause)
            pause = min(0.05, pause * 2)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Template:
    """The job's template process (the module docstring); `spawn` forks a child of it."""

    def __init__(self, env: dict[str, str], timeout: float, log: Path | None = None):
        self.timeout, self.proc = timeout, None
        self.lock = threading.Lock()  # one request at a time (a replacement may be asked for on any thread)
        if env.get("EQUIPOISE_WARM", os.environ.get("EQUIPOISE_WARM", "1")) == "0" or sys.platform != "linux":
            return
        if not _subreaper(True):
            return
        try:
            with open(log or os.devnull, "wb") as err:
                self.proc = subprocess.Popen([sys.executable, "-m", "equipoise.launch.warm", "." * TITLE_ROOM],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
        except OSError:
            _subreaper(False)

    def spawn(self, role: str, rank: int, coordinator: str, log: Path, job: dict) -> WarmProcess | None:
        """The process `role` `rank`, forked warm and already the launcher's child; None
        if the template could not (the caller starts it cold)."""
        with self.lock:
            if self.proc is not None and self.proc.poll() is not None:
                self._stop()  # it died: the rest start cold
            if self.proc is None:
                return None
            request = {"role": role, "rank": rank, "coordinator": coordinator, "log": str(log), "job": job,
                       "launcher": os.getpid()}
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
                line = self._readline()
            except (OSError, ValueError):
                line = None
            if not line:
                self._stop()
                return None
            pid = json.loads(line).get("pid")
            return WarmProcess(int(pid)) if pid else None  # None: the fork failed, this one starts cold

    def _readline(self) -> bytes | None:
        """The template's answer, within `timeout` (its first includes its imports)."""
        fd, deadline, out = self.proc.stdout.fileno(), time.monotonic() + self.timeout, b""
        while not out.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 256)
            if not chunk:
                return None
            out += chunk
        return out

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()
            self.proc = None
            _subreaper(False)

    def close(self) -> None:
        """Stop the template (its children are the launcher's and live on until stopped)."""
        with self.lock:
            self._stop()


# -- the template process ---------------------------------------------------------------

def _retitle(words: list[str]) -> None:
    """Show `words` as this process's command line (/proc/<pid>/cmdline, ps), as a cold
    child's reads, by writing them over the template's own in place (what PostgreSQL's
    and setproctitle's titles do): the kernel then reads the line up to its first NUL
    while the area's last byte is not one. Best effort: a process that cannot keeps the
    template's line."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
        title = " ".join(words).encode()
        if len(title) + 2 > end - start:
            return
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(title + b"\0" * (end - start - len(title) - 1) + b".")
    except (OSError, ValueError, IndexError):
        pass


def _become(req: dict, told: int) -> None:
    """In the forked process: its title, then its pid on `told` (the template answers
    with it: a process found by its command line is found from then on), its log as
    stdout and stderr, then the role's main (launch/proc.py)."""
    _retitle([sys.executable, "-m", "equipoise.launch.proc", req["role"], str(req["rank"]), req["coordinator"]])
    os.write(told, str(os.getpid()).encode())
    os.close(told)
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    deadline = time.monotonic() + 10.0
    while os.getppid() != req["launcher"] and time.monotonic() < deadline:
        time.sleep(0.001)  # the first child exits at once: then the launcher is the parent
    code = 1
    try:
        if os.getppid() != req["launcher"]:
            print(f"error: {req['role']} {req['rank']}: not reparented to the launcher", file=sys.stderr)
        else:
            import random

            random.seed()  # the template's state, shared by every fork: drawn anew
            from .proc import main


            code = main([req["role"], str(req["rank"]), req["coordinator"]], job=req["job"])
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def preload() -> None:
    """Import what every server and worker imports first (the template's, and a Ray
    standby's, launch/ray_standby.py); no thread, socket or zmq context is made here."""
    import torch  # noqa: F401
    import torch.optim  # noqa: F401

    from ..server import core  # noqa: F401
    from ..wire import zmq_transport  # noqa: F401
    from ..worker import loop  # noqa: F401
    from . import proc  # noqa: F401


def _serve() -> None:
    from .proc import _die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    preload()

    # A fork copies the calling thread only. numpy's OpenBLAS starts its pool at import
    # (with more than one thread) and restarts it in a child (its pthread_atfork
    # handlers); torch's OpenMP pool starts at the first parallel operation, which no
    # import runs. A Python thread some import started would be lost in every child.
    if threading.active_count() != 1:
        print(f"error: the template runs {threading.active_count()} Python threads after its imports; "
              "children start cold", file=sys.stderr, flush=True)
        sys.exit(3)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        req = json.loads(line)
        r, w = os.pipe()
        first = os.fork()
        if first == 0:  # the first child: fork the process and exit
            try:
                os.close(r)
                if os.fork() == 0:
                    _become(req, w)
            finally:
                os._exit(0)
        os.close(w)
        pid = os.read(r, 64)  # the process's, once it has its title
        os.close(r)
        os.waitpid(first, 0)  # gone: the process is now the launcher's
        out.write(json.dumps({"pid": int(pid) if pid.isdigit() else None}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
