"""Hostile programs for the code sandbox that try to reach out of the box: write or remove files
outside their directory, run other programs, connect to the test's sockets, or hunt for the worker's
secret (`sandbox_hostile.py` describes the placeholders and `kernel_only`)."""

from __future__ import annotations

from tests.workers.sandbox_hostile import Hostile

# Shared by the programs that hunt for secrets: a found secret is sent back in the reason.
LEAK = """
def leak(texts):
    found = [t for t in texts if 'SECRET_VAR' in t]
    if found:
        raise RuntimeError('LEAK:' + found[0][found[0].index('SECRET_VAR'):][:120])
"""

# -- escapes ------------------------------------------------------------------------------------
ESCAPES = [
    Hostile(
        "writes outside its directory",
        """
def f(x):
    open('OUTSIDE/written.txt', 'w').write('pwned')
    return x + 1
""",
    ),
    Hostile(
        "renames a file to an outside path",
        """
import os
def f(x):
    open('mine.txt', 'w').write('pwned')
    os.rename('mine.txt', 'OUTSIDE/renamed.txt')
    return x + 1
""",
    ),
    Hostile(
        "writes through dir_fd",
        """
import os
def f(x):
    d = os.open('OUTSIDE', os.O_RDONLY)
    fd = os.open('via_dir_fd.txt', os.O_WRONLY | os.O_CREAT, 0o666, dir_fd=d)
    os.write(fd, b'pwned')
    return x + 1
""",
    ),
    Hostile(
        "writes through a symlink",
        """
import os
def f(x):
    os.symlink('OUTSIDE/via_symlink.txt', 'link')
    open('link', 'w').write('pwned')
    return x + 1
""",
    ),
    Hostile(
        "writes through a hard link",
        """
import os
def f(x):
    os.link('OUTSIDE/victim.txt', 'hard')
    open('hard', 'a').write('pwned')
    return x + 1
""",
    ),
    Hostile(
        "removes and chmods an outside file",
        """
import os
def f(x):
    os.chmod('OUTSIDE/victim.txt', 0o777)
    os.remove('OUTSIDE/victim.txt')
    return x + 1
""",
    ),
    Hostile(
        "os.execv a shell",
        """
import os
def f(x):
    os.execv('/bin/sh', ['sh', '-c', 'echo pwned > OUTSIDE/execv.txt'])
""",
    ),
    Hostile(
        "_posixsubprocess.fork_exec, imported",
        """
import _posixsubprocess, os, sys
def f(x):
    for exe in (b'/bin/sh', os.fsencode(sys.executable)):
        args = [exe, b'-c', b'echo pwned > OUTSIDE/fork_exec.txt'] if exe == b'/bin/sh' else [
            exe, b'-c', b"open('OUTSIDE/fork_exec.txt', 'w').write('pwned')"]
        _posixsubprocess.fork_exec(args, [exe], True, (), None, None, -1, -1, -1, -1, -1, -1,
                                   *os.pipe(), False, False, -1, None, None, None, -1, None, False)
    import time; time.sleep(0.5)
    return x + 1 if os.path.exists('OUTSIDE/fork_exec.txt') else None
""",
    ),
    Hostile(
        "_posixsubprocess.fork_exec, found by the garbage collector",
        """
import gc, os, sys, time
def f(x):
    hits = [o for o in gc.get_objects() if getattr(o, '__name__', '') == 'fork_exec' and callable(o)]
    for mod in list(sys.modules.values()):
        for v in list(vars(mod).values()):
            if getattr(v, '__name__', '') == 'fork_exec' and callable(v):
                hits.append(v)
    for fork_exec in hits:
        exe = os.fsencode(sys.executable)
        try:
            fork_exec([exe, b'-c', b"open('OUTSIDE/gc_fork_exec.txt', 'w').write('pwned')"], [exe],
                      True, (), None, None, -1, -1, -1, -1, -1, -1, *os.pipe(), False, False, -1,
                      None, None, None, -1, None, False)
        except Exception:
            pass
    time.sleep(0.5)
    return x + 1 if os.path.exists('OUTSIDE/gc_fork_exec.txt') else None
""",
    ),
    Hostile(
        "subprocess and os.system",
        """
import os, subprocess
def f(x):
    try:
        os.system('echo pwned > OUTSIDE/system.txt')
    finally:
        subprocess.run(['sh', '-c', 'echo pwned > OUTSIDE/subprocess.txt'])
    return x + 1
""",
    ),
    Hostile(
        "ctypes calls libc's system()",
        """
import ctypes
def f(x):
    ctypes.CDLL(None).system(b'echo pwned > OUTSIDE/ctypes.txt')
    return x + 1
""",
    ),
    Hostile(
        "fork bomb",
        """
import os
def f(x):
    while True:
        os.fork()
""",
    ),
    Hostile(
        "TCP connection to the worker's host",
        """
import socket
def f(x):
    s = socket.create_connection(('127.0.0.1', PORT), timeout=1)
    s.sendall(b'pwned')
    return x + 1
""",
    ),
    Hostile(
        "unix socket next to the worker",
        """
import socket
def f(x):
    s = socket.socket(socket.AF_UNIX)
    s.connect('UNIX_SOCK')
    s.sendall(b'pwned')
    return x + 1
""",
    ),
    Hostile(
        "reads the environment of pid 1, its parent and itself",
        LEAK
        + """
import os
def f(x):
    texts = [repr(dict(os.environ))]
    for pid in ('1', str(os.getppid()), 'self'):
        for name in ('environ', 'cmdline'):
            try:
                texts.append(open(f'/proc/{pid}/{name}', 'rb').read().decode('utf-8', 'replace'))
            except OSError as exc:
                texts.append(repr(exc))
    leak(texts)
    return None
""",
        kernel_only=True,
    ),
    Hostile(
        "walks /proc for any process's secrets",
        LEAK
        + """
import os
def f(x):
    texts = []
    for pid in os.listdir('/proc'):
        try:
            texts.append(open(f'/proc/{pid}/environ', 'rb').read().decode('utf-8', 'replace'))
        except OSError:
            pass
    leak(texts)
    return None
""",
        kernel_only=True,
    ),
    Hostile(
        "reads a world-readable file of the worker's",
        LEAK
        + """
def f(x):
    leak([open('OUTSIDE/victim.txt').read()])
    return None
""",
        kernel_only=True,
    ),
]
