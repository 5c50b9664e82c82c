"""A seccomp filter for the sandbox child, given to bubblewrap (`--seccomp FD`), x86-64 only.

The namespaces already wall the child in; this takes away kernel interfaces a Python function never
needs and that local privilege escalations go through: new namespaces (unshare, setns, clone with
namespace flags), mounts, ptrace and cross-process memory access, keyrings, BPF, perf events,
userfaultfd, io_uring, module and kexec loading, and sockets other than AF_UNIX. Denied calls fail
with EPERM (clone3 with ENOSYS, so that glibc falls back to clone, whose flags can be checked); a
call made under another ABI (x32, or i386 on x86-64) kills the process, since its numbers differ.
Elsewhere than x86-64 there is no filter (`program()` returns None) and the namespaces stand alone.

Written by hand as a classic BPF program (libseccomp's Python binding is not a dependency).
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # in struct seccomp_data (arg0's low word on x86-64)
SOCKET, CLONE, CLONE3 = 41, 56, 435
AF_UNIX = 1
CLONE_NAMESPACES = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
DENIED = {
    "ptrace": 101,
    "syslog": 103,
    "uselib": 134,
    "personality": 135,
    "vhangup": 153,
    "pivot_root": 155,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}


def _assemble(lines: list[tuple]) -> bytes:
    """Lines are (code, k, jt, jf) with jt/jf as label names (or 0), or a label string."""
    where, n = {}, 0
    for line in lines:
        if isinstance(line, str):
            where[line] = n
        else:
            n += 1
    out, i = b"", 0
    for line in lines:
        if isinstance(line, str):
            continue
        code, k, jt, jf = line
        jt = where[jt] - i - 1 if isinstance(jt, str) else jt
        jf = where[jf] - i - 1 if isinstance(jf, str) else jf
        out += struct.pack("=HBBI", code, jt, jf, k)
        i += 1
    return out


def program() -> bytes | None:
    """The filter as bwrap reads it (an array of struct sock_filter), or None off x86-64."""
    if platform.machine() != "x86_64":
        return None
    lines: list[tuple | str] = [
        (LD_W_ABS, ARCH_OFFSET, 0, 0),
        (JEQ, AUDIT_ARCH_X86_64, "native", 0),
        (RET, RET_KILL_PROCESS, 0, 0),
        "native",
        (LD_W_ABS, NR_OFFSET, 0, 0),
        (JGE, X32_BIT, "kill", 0),
        *[(JEQ, nr, "eperm", 0) for nr in sorted(DENIED.values())],
        (JEQ, SOCKET, "socket", 0),
        (JEQ, CLONE, "clone", 0),
        (JEQ, CLONE3, "enosys", 0),
        (RET, RET_ALLOW, 0, 0),
        "socket",
        (LD_W_ABS, ARG0_OFFSET, 0, 0),
        (JEQ, AF_UNIX, "allow", "eperm"),
        "clone",
        (LD_W_ABS, ARG0_OFFSET, 0, 0),
        (JSET, CLONE_NAMESPACES, "eperm", "allow"),
        "allow",
        (RET, RET_ALLOW, 0, 0),
        "eperm",
        (RET, RET_ERRNO | errno.EPERM, 0, 0),
        "enosys",
        (RET, RET_ERRNO | errno.ENOSYS, 0, 0),
        "kill",
        (RET, RET_KILL_PROCESS, 0, 0),
    ]
    return _assemble(lines)
