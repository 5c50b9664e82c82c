"""Hostile programs for the code sandbox: each tries to forge its reward or to reach out of the box.

The test (`test_sandbox_hostile.py`) runs each on the hidden tests f(1) == 2 and f(5) == 6. Every
one must score 0 with a reason, the worker must keep serving, and no effect may show outside: the
placeholders below are filled with a directory of the test's (OUTSIDE, world-writable, holding
victim.txt), a TCP port it listens on (PORT), a unix socket it listens on (UNIX_SOCK) and the name
of an environment variable that holds a secret in the worker's process (SECRET_VAR). A forging
program "wins" only if the judge believes it; an escape "wins" if its effect outside is seen.

`kernel_only` marks the programs that only bubblewrap's walls stop for sure (the unisolated
fallback's audit hook does not stop reads; its uid drop hides /proc only when the worker is root):
the fallback is not tested against them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hostile:
    name: str
    source: str
    kernel_only: bool = False


# Shared by the programs that hunt for secrets: a found secret is sent back in the reason.
LEAK = """
def leak(texts):
    found = [t for t in texts if 'SECRET_VAR' in t]
    if found:
        raise RuntimeError('LEAK:' + found[0][found[0].index('SECRET_VAR'):][:120])
"""

CORPUS = [
    # -- forging the verdict ------------------------------------------------------------------
    Hostile(
        "__eq__ always true",
        """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
def f(x):
    return Anything()
""",
    ),
    Hostile(
        "__hash__ and __eq__ collide with everything",
        """
class Collider:
    def __hash__(self):
        return hash(2)
    def __eq__(self, other):
        return True
def f(x):
    return Collider()
""",
    ),
    Hostile(
        "int subclass equal to everything",
        """
class Int(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def f(x):
    return Int(0)
""",
    ),
    Hostile(
        "int subclass holding the right value",
        """
class Int(int):
    pass
def f(x):
    return Int(x + 1)
""",
    ),
    Hostile(
        "str subclass equal to everything",
        """
class Str(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
def f(x):
    return Str('anything')
""",
    ),
    Hostile(
        "float and bool standing in for an int",
        """
def f(x):
    return float(x + 1) if x > 2 else True
""",
    ),
    Hostile(
        "frame walking forges the reporter's call",
        """
import sys
def f(x):
    frame = sys._getframe()
    while frame is not None:
        for name in ('emit', 'report'):
            fn = frame.f_locals.get(name)
            if callable(fn):
                fn({'passed': 333333, 'total': 2})
                for _ in range(100):
                    fn({'r': 333333})
        frame = frame.f_back
    return None
""",
    ),
    Hostile(
        "frame walking looks for the expected outputs",
        """
import sys
def f(x):
    frame = sys._getframe()
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for key in ('tests', 'expected', 'job'):
                if key in scope:
                    value = scope[key]
                    if isinstance(value, dict) and 'tests' in value:
                        return value['tests'][0][1]
                    if isinstance(value, list) and value and isinstance(value[0], list):
                        return value[0][1]
        frame = frame.f_back
    return None
""",
    ),
    Hostile(
        "monkeypatched builtins and json",
        """
import builtins, json
builtins.type = lambda *a: int
builtins.isinstance = lambda *a: True
json.dumps = lambda *a, **k: '{"passed": 999, "total": 2, "reason": null}'
class Fake:
    pass
def f(x):
    return Fake()
""",
    ),
    Hostile(
        "prints a fake verdict on every descriptor",
        """
import os
def f(x):
    print('{"passed": 2, "total": 2, "reason": null}')
    for fd in range(0, 20):
        try:
            os.write(fd, b'{"passed": 2, "total": 2}\\n' * 3)
        except OSError:
            pass
    return None
""",
    ),
    Hostile(
        "floods the result pipe with results",
        """
import os
def f(x):
    for fd in range(3, 20):
        try:
            os.write(fd, b'{"r": 2}\\n' * 50)
        except OSError:
            pass
    return x + 1
""",
    ),
    Hostile(
        "sys.exit before the tests",
        """
import sys
sys.exit(0)
def f(x):
    return x + 1
""",
    ),
    Hostile(
        "os._exit before the tests",
        """
import os
os._exit(0)
def f(x):
    return x + 1
""",
    ),
    Hostile(
        "os._exit inside the function",
        """
import os
def f(x):
    os._exit(0)
""",
    ),
    # -- escapes ------------------------------------------------------------------------------
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
