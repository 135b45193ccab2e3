"""A seccomp filter for the sandbox: system calls model-written code has no business making.

bubblewrap loads it (`--seccomp FD`) just before it starts the code. Denied with EPERM:
the kernel keyrings (keyctl, add_key, request_key: keys of the caller's session), ptrace,
bpf, perf_event_open, userfaultfd, io_uring, mounting and new namespaces (unshare, setns,
clone with a CLONE_NEW* flag, the new mount API), loading kernel modules, kexec, file
handles (open_by_handle_at reaches files by inode, past the mounts), and the TIOCSTI ioctl
(typing into a terminal). clone3 answers ENOSYS, so the C library falls back to clone,
whose flags the filter can read. System calls of another ABI (32-bit, x32) are denied, so
they cannot go around the list.

Most of these need a capability the code does not have; the filter takes away the kernel
code it could still reach. It is a classic BPF program, built here for x86_64 and aarch64;
on other machines there is no filter (the namespaces and limits still hold).
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["program", "supported"]

_LD_ABS = 0x20     # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15        # BPF_JMP | BPF_JEQ | BPF_K
_JSET = 0x45       # BPF_JMP | BPF_JSET | BPF_K
_JGE = 0x35        # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06        # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24   # offsets in struct seccomp_data (little endian)
_X32_BIT = 0x40000000
_TIOCSTI = 0x5412
_CLONE_NEW = 0x7E020080   # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME

_DENIED = ("keyctl", "add_key", "request_key", "ptrace", "bpf", "perf_event_open",
           "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "unshare",
           "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen",
           "fsconfig", "fsmount", "fspick", "mount_setattr", "init_module", "finit_module",
           "delete_module", "kexec_load", "kexec_file_load", "name_to_handle_at",
           "open_by_handle_at")
_ARCHES = {
    "x86_64": (0xC000003E, {
        "ioctl": 16, "clone": 56, "ptrace": 101, "pivot_root": 155, "mount": 165, "umount2": 166,
        "init_module": 175, "delete_module": 176, "kexec_load": 246, "add_key": 248,
        "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323}),
    "aarch64": (0xC00000B7, {
        "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41, "unshare": 97,
        "kexec_load": 104, "init_module": 105, "delete_module": 106, "ptrace": 117,
        "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220,
        "perf_event_open": 241, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "setns": 268, "finit_module": 273, "bpf": 280, "userfaultfd": 282,
        "kexec_file_load": 294}),
}
_COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
           "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
           "fspick": 433, "clone3": 435, "mount_setattr": 442}   # the same on both


def supported() -> bool:
    return platform.machine() in _ARCHES


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter as bwrap reads it (struct sock_filter[]), or b"" on another machine."""
    if not supported():
        return b""
    arch, numbers = _ARCHES[platform.machine()]
    numbers = {**numbers, **_COMMON}
    denied = sorted({numbers[name] for name in _DENIED})
    deny = _op(_RET, _ERRNO | errno.EPERM)
    tail = [
        _op(_RET, _ALLOW),
        # clone: only without namespace flags
        _op(_LD_ABS, _ARG0), _op(_JSET, _CLONE_NEW, 0, 1), deny, _op(_RET, _ALLOW),
        # ioctl: anything but TIOCSTI
        _op(_LD_ABS, _ARG1), _op(_JEQ, _TIOCSTI, 0, 1), deny, _op(_RET, _ALLOW),
        # clone3 (flags behind a pointer): ENOSYS, the C library then uses clone
        _op(_RET, _ERRNO | errno.ENOSYS),
        deny,
    ]
    # offsets (from the instruction after each jump) of the targets in `tail`
    allow, clone_at, ioctl_at, clone3_at, deny_at = 0, 1, 5, 9, 10
    checks = [(numbers["clone"], clone_at), (numbers["ioctl"], ioctl_at),
              (numbers["clone3"], clone3_at)] + [(nr, deny_at) for nr in denied]
    head = [_op(_LD_ABS, _ARCH), _op(_JEQ, arch, 1, 0), deny,
            _op(_LD_ABS, _NR), _op(_JGE, _X32_BIT, 0, 1), deny]
    body = []
    for i, (nr, target) in enumerate(checks):
        # jump from instruction i of `body` to `target` in `tail`: skip the rest of `body`
        # and the ALLOW (tail[0]) when the target is past it
        body.append(_op(_JEQ, nr, len(checks) - i - 1 + target, 0))
    return b"".join(head + body + tail)
