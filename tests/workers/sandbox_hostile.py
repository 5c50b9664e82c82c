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

The programs that forge the verdict are here (FORGERIES); those that try to escape are in
`sandbox_escapes.py` (ESCAPES). The test runs both, forgeries first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hostile:
    name: str
    source: str
    kernel_only: bool = False


# -- forging the verdict ----------------------------------------------------------------------
FORGERIES = [
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
]
