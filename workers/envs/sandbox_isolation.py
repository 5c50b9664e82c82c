"""Kernel isolation of the sandbox child with bubblewrap (`bwrap`, Debian package `bubblewrap`).

The child sees a new, read-only root holding only what `python -I -S` needs (the interpreter's
prefix and the shared libraries, read-only; no /etc, no /proc, no /tmp, no home of the worker),
a 16 MB tmpfs as its home and working directory, a minimal read-only /dev, and no environment but
LANG. It gets
its own network (only a loopback), pid, IPC and UTS namespaces, a new session, and no capabilities
but CAP_SETUID/CAP_SETGID when the worker runs as root (the harness uses them to become `nobody`
at once, which clears every capability; its process count is then limited by RLIMIT_NPROC). bwrap
sets no_new_privs, so no setuid program can give privileges back, and `--die-with-parent` plus the
pid namespace mean that killing bwrap ends every process the program started. On x86-64 a seccomp
filter (`sandbox_seccomp.py`) also denies namespaces, mounts, ptrace, keyrings, BPF, io_uring and
non-unix sockets.

Whether bwrap works is probed once per worker process (the same command, running `pass`). Where it
does not (bwrap missing, or a container that forbids namespaces: Docker's default seccomp and
AppArmor profiles refuse them), the sandbox falls back to the unisolated child (rlimits, a temp
directory, the audit hook) and says so: one loud warning in the log, and `isolation="none"` on every
result. In Docker, the worker's container should need `--security-opt seccomp=unconfined
--security-opt apparmor=unconfined` (or profiles that allow clone/unshare with namespace flags and
mounts) to use bwrap as its non-root user, with unprivileged user namespaces enabled on the host, and
no added capability: that is bwrap's documented behaviour, not tried here (no Docker engine on the
machines that ran the tests). The non-root path (bwrap in a user namespace) was tried by hand as
uid nobody, outside Docker; the tests run as root.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from workers.envs.sandbox_seccomp import program

log = logging.getLogger(__name__)

HOME = "/home/sandbox"
HARNESS_AT = "/opt/astraflow/sandbox_harness.py"
TMPFS_BYTES = 16 << 20
LIB_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32")

_probed: dict[str, str | None] = {}


def python() -> str:
    """The real interpreter (not a venv's symlink): run with -I -S it needs only its own prefix."""
    return os.path.realpath(sys.executable)


def seccomp_fd() -> int | None:
    """A pipe's read end holding the seccomp filter, for bwrap's --seccomp; the caller closes it."""
    prog = program()
    if prog is None:
        return None
    r, w = os.pipe()
    os.write(w, prog)  # a few hundred bytes: the pipe holds them
    os.close(w)
    return r


def bwrap_argv(harness: Path, seccomp: int | None = None) -> list[str]:
    """The bwrap command line that runs the interpreter (`-I -S`), before the harness's own args.

    `seccomp`: a descriptor holding the filter (`seccomp_fd()`), to be passed to the process.
    """
    exe = python()
    argv = [
        "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "LANG",
        "C.UTF-8",
    ]
    if os.getuid() == 0:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    for d in LIB_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    prefix = os.path.realpath(sys.base_prefix)
    binds = [prefix] if exe.startswith(prefix + os.sep) else [prefix, exe]
    for path in binds:
        # bwrap would make the missing parents (/root for a pyenv) 0700, which the uid nobody
        # cannot pass: imports after the uid drop would fail
        for parent in reversed(Path(path).parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", path, path]
    if seccomp is not None:
        argv += ["--seccomp", str(seccomp)]
    argv += [
        "--ro-bind",
        str(harness),
        HARNESS_AT,
        "--dev",
        "/dev",
        "--perms",
        "0777",
        "--size",
        str(TMPFS_BYTES),
        "--tmpfs",
        HOME,
        "--chdir",
        HOME,
        # /dev is a tmpfs of its own, without a size: read-only too (its devices still work)
        "--remount-ro",
        "/",
        "--remount-ro",
        "/dev",
        exe,
        "-I",
        "-S",
    ]
    return argv


def probe(harness: Path) -> str | None:
    """None when bwrap can run the interpreter here, else why not (probed once per process)."""
    if "result" in _probed:
        return _probed["result"]
    why: str | None
    if shutil.which("bwrap") is None:
        why = "bwrap is not installed (apt-get install bubblewrap)"
    else:
        fd = seccomp_fd()
        try:
            done = subprocess.run(
                [*bwrap_argv(harness, fd), "-c", "pass"],
                capture_output=True,
                timeout=30,
                pass_fds=() if fd is None else (fd,),
            )
            why = None if done.returncode == 0 else done.stderr.decode("utf-8", "replace").strip()[:300]
            why = why if why is None else f"bwrap cannot create the sandbox: {why or done.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"bwrap cannot run: {exc}"
        finally:
            if fd is not None:
                os.close(fd)
    if why is not None:
        log.warning(
            "SANDBOX NOT ISOLATED: %s. Untrusted code runs with rlimits and an audit hook only "
            "(no mount, pid or network namespace); every result says isolation='none'. "
            "See workers/envs/sandbox_isolation.py for what the container needs.",
            why,
        )
    _probed["result"] = why
    return why
