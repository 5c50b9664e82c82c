"""Runs untrusted code inside the sandbox child process (started by `workers.envs.sandbox`).

Standard library only, started as `python -I -S`, inside bubblewrap when the worker can use it. It
never judges: it gets the function's source and the test *inputs* (never the expected outputs), calls
the function on each and writes each result as one JSON line (see `sandbox_judge.py` for the record
format) on a duplicate of the original stdout; the trusted parent compares. So an untrusted program
that takes over this process (frame walking, patched builtins, writing to the result pipe) can only
write values, and values it does not know the expected outputs for.

Before the untrusted code runs it: leaves the network (a new network namespace when bubblewrap did
not already give it one and the kernel allows it), sets resource limits (CPU time, address space,
file size, open files, processes, no core dumps), drops to an unprivileged uid when it runs as root,
silences stdout/stderr, and installs an audit hook that ends the process on any attempt to fork,
exec, open sockets, load native code, signal other processes, write outside its directory (also by
rename, link or a dir_fd), or import a native module that escapes audit events (`_posixsubprocess`
is replaced by a stub whose fork_exec refuses). The hook is defence in depth: inside bubblewrap the
kernel enforces the walls.
"""

import contextlib
import json
import os
import resource
import sys

NOBODY = 65534
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MAX_DEPTH = 64
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED_EVENTS = (
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "subprocess.Popen",
    "os.kill",
    "os.killpg",
    "pty.spawn",
    "os.setuid",
    "os.setgid",
    "os.chroot",
    "resource.setrlimit",
    "resource.prlimit",
    "sys._current_frames",
)
PRELOAD = (
    "math",
    "re",
    "itertools",
    "functools",
    "collections",
    "heapq",
    "bisect",
    "string",
    "random",
    "operator",
    "time",
    "socket",
    "subprocess",
    "multiprocessing",
    "threading",
    "encodings.idna",
)
# Native modules that reach the kernel without an audit event: importing them ends the run.
UNAUDITED = ("_posixsubprocess", "_ctypes", "_posixshmem")
PATH_EVENTS = (
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.utime",
    "shutil.rmtree",
    "os.chdir",
    "os.chflags",
    "os.listxattr",
    "os.setxattr",
    "os.removexattr",
)


class Unjudgeable(Exception):
    pass


def leave_network(isolated):
    if isolated:
        return "netns"  # bubblewrap's --unshare-net
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) == 0:
            return "netns"
        if os.getuid() != 0 and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            return "userns+netns"
    except OSError:
        pass
    return "audit-only"


def set_limits(lim):
    mb = 1 << 20
    cpu = max(1, int(lim["cpu_s"]))
    for res, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, lim["memory_mb"] * mb, lim["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, lim["fsize_mb"] * mb, lim["fsize_mb"] * mb),
        (resource.RLIMIT_NOFILE, lim["nofile"], lim["nofile"]),
        (resource.RLIMIT_NPROC, lim["nproc"], lim["nproc"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(res, (soft, hard))


def drop_privileges():
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        return "nobody"
    return str(os.getuid())


def disarm_unaudited():
    """Put a stub in the place of `_posixsubprocess`, whose fork_exec raises no audit event.

    `subprocess` and `multiprocessing` import the stub (then meet their own audit events); the real
    module is never loaded, and importing it anew (after deleting the stub) meets the audit hook.
    """

    def fork_exec(*args, **kwargs):
        raise PermissionError("blocked: _posixsubprocess.fork_exec")

    stub = type(sys)("_posixsubprocess")
    stub.fork_exec = fork_exec
    sys.modules["_posixsubprocess"] = stub
    for name in UNAUDITED[1:]:
        sys.modules.pop(name, None)


def encode(value, depth=0):
    """`value` as a plain JSON value, or Unjudgeable: only exact built-in types, so no user code runs."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if depth < MAX_DEPTH and kind is list:
        return [encode(v, depth + 1) for v in value]
    if depth < MAX_DEPTH and kind is dict and all(type(k) is str for k in value):
        return {k: encode(v, depth + 1) for k, v in value.items()}
    raise Unjudgeable(kind.__name__[:40])


def main():
    job = json.loads(sys.stdin.buffer.read(1 << 20))
    out_fd = os.dup(1)
    home = os.path.realpath(os.getcwd())

    def emit(record):
        os.write(out_fd, (json.dumps(record) + "\n").encode())

    def violation(what):
        emit({"e": f"blocked: {what}"})
        os._exit(3)

    def inside(path):
        try:
            p = os.fsdecode(path) if not isinstance(path, int) else None
        except (TypeError, ValueError):
            return False
        if p is None:
            return True  # an already open descriptor: it passed this check when opened
        full = os.path.realpath(os.path.join(home, p))
        return full == home or full.startswith(home + os.sep)

    def hook(event, args):
        if event in BLOCKED_EVENTS or event.startswith(("socket.", "ctypes.", "_ctypes", "mmap.")):
            violation(event)
        if event == "import" and args and args[0] in UNAUDITED:
            violation(f"import of {args[0]}")
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if writing and not inside(path):
                violation(f"write outside the sandbox directory ({path!r})")
            if not inside(path) and os.path.isdir(path):  # a descriptor that dir_fd= could write through
                violation(f"open of a directory outside the sandbox directory ({path!r})")
        elif event in PATH_EVENTS and args:
            # dir_fd / src_dir_fd arguments make a relative path name something outside: refuse them
            if not inside(args[0]) or any(isinstance(a, int) and a >= 0 for a in args[2:]):
                violation(f"{event} outside the sandbox directory ({args[0]!r})")
            if event in ("os.rename", "os.link", "os.symlink") and len(args) > 1 and not inside(args[1]):
                violation(f"{event} outside the sandbox directory ({args[1]!r})")

    isolated = job.get("isolated", False)
    disarm_unaudited()
    # Unisolated, the interpreter's files may be unreadable once the uid is dropped: import what
    # solutions may use now (and socket/subprocess too, so that using them meets the audit hook, not
    # an ImportError). In bubblewrap they stay readable, and not importing them saves ~30 ms a run.
    for name in () if isolated else PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    network = leave_network(isolated)
    sys.modules.pop("_ctypes", None)  # leave_network's: ctypes itself stays, and its calls are audited
    set_limits(job["limits"])
    drop_privileges()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    inputs = job["inputs"]
    del job["inputs"]
    emit({"n": network})  # written before the untrusted code runs: the parent trusts only this first line
    sys.addaudithook(hook)
    try:
        namespace = {"__name__": "solution"}
        exec(compile(job["source"], "solution.py", "exec"), namespace)  # noqa: S102 - the sandbox runs the program
        fn = namespace.get(job["func"])
        if not callable(fn):
            emit({"e": f"no function named {job['func']}"[:300]})
            os._exit(0)
        for args in inputs:
            got = fn(*args)
            try:
                emit({"r": encode(got)})
            except (Unjudgeable, ValueError, RecursionError) as exc:  # e.g. an int past 4300 digits
                emit({"x": str(exc) if isinstance(exc, Unjudgeable) else type(exc).__name__})
    except MemoryError:
        emit({"e": "MemoryError: memory limit"})
    except RecursionError:
        emit({"e": "RecursionError"})
    except BaseException as exc:  # the untrusted code's failure is the verdict, not ours
        emit({"e": f"{type(exc).__name__}: {exc}"[:300]})
    os._exit(0)


if __name__ == "__main__":
    main()
