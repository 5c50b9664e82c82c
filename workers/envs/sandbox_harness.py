"""Runs untrusted code inside the sandbox child process (started by `workers.envs.sandbox`).

Standard library only, started as `python -I -S`. Before the untrusted code runs it: leaves the
network (a new network namespace when the kernel allows it), sets resource limits (CPU time, address
space, file size, open files, processes, no core dumps), drops to an unprivileged uid when it runs as
root, silences stdout/stderr, and installs an audit hook that ends the process on any attempt to
fork, exec, open sockets, load native code, signal other processes, or write outside its directory.
The verdict goes back as one JSON line prefixed by a nonce, on a duplicate of the original stdout.
"""

import contextlib
import json
import os
import resource
import sys

NOBODY = 65534
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED_EVENTS = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn",
                  "subprocess.Popen", "os.kill", "os.killpg", "pty.spawn", "os.setuid", "os.setgid",
                  "os.chroot", "resource.setrlimit", "resource.prlimit", "sys._current_frames")
PRELOAD = ("math", "re", "itertools", "functools", "collections", "heapq", "bisect", "string", "random",
           "operator", "time", "socket", "subprocess", "multiprocessing", "threading", "encodings.idna")
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
               "os.link", "os.truncate", "os.utime", "shutil.rmtree", "os.chdir", "os.chflags")


def leave_network():
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


def main():
    job = json.loads(sys.stdin.buffer.read(1 << 20))
    out_fd = os.dup(1)
    nonce = job["nonce"]
    home = os.path.realpath(os.getcwd())

    def report(**result):
        os.write(out_fd, (nonce + json.dumps(result) + "\n").encode())

    def violation(what):
        report(passed=0, total=len(job["tests"]), reason=f"blocked: {what}")
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
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS)
            if writing and not inside(path):
                violation(f"write outside the sandbox directory ({path!r})")
        elif event in PATH_EVENTS and args and not inside(args[0]):
            violation(f"{event} outside the sandbox directory ({args[0]!r})")

    # The interpreter's files may be unreadable once the uid is dropped: import what solutions may
    # use now (and socket/subprocess too, so that using them meets the audit hook, not an ImportError).
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    network = leave_network()
    set_limits(job["limits"])
    user = drop_privileges()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    tests = job["tests"]
    sys.addaudithook(hook)
    passed, reason = 0, None
    try:
        namespace = {"__name__": "solution"}
        exec(compile(job["source"], "solution.py", "exec"), namespace)
        fn = namespace.get(job["func"])
        if not callable(fn):
            reason = f"no function named {job['func']}"
        else:
            for i, (args, expected) in enumerate(tests):
                got = fn(*args)
                if got == expected:
                    passed += 1
                elif reason is None:
                    reason = f"test {i}: got {got!r:.80}, expected {expected!r:.80}"
    except MemoryError:
        reason = "MemoryError: memory limit"
    except RecursionError:
        reason = "RecursionError"
    except BaseException as exc:  # the untrusted code's failure is the verdict, not ours
        reason = f"{type(exc).__name__}: {exc}"[:300]
    report(passed=passed, total=len(tests), reason=reason, network=network, user=user)
    os._exit(0)


if __name__ == "__main__":
    main()
