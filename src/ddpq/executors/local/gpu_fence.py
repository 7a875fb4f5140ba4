"""Confine a job's cgroup to its leased GPUs: a cgroup v2 device program (eBPF).

This is what Slurm's ``ConstrainDevices``, systemd's ``DeviceAllow=`` and runc do
on the unified hierarchy: a ``BPF_PROG_TYPE_CGROUP_DEVICE`` program attached to
the job's cgroup decides every open (and mknod) of a device node by any process
in it. Ours denies NVIDIA GPU nodes (char major 195) other than the leased
minors, and allows everything else: ``/dev/nvidiactl`` (255), nvidia-modeset
(254), nvidia-uvm and other majors, block devices. A denied open fails with
EPERM, so a job that unsets ``CUDA_VISIBLE_DEVICES`` still sees only its GPUs.

The program is a dozen instructions assembled here and loaded with the ``bpf()``
system call through ctypes (no compiler, no libbpf). It stays attached while the
cgroup exists. The worker keeps the program of each set of GPUs it has fenced open, to
attach it again to the next cgroup given that set (``_program_fd``).
Programs attached higher up (a container's or systemd's) still run too: ours is
attached with ``BPF_F_ALLOW_MULTI`` and can only narrow what they allow.

Assumes a GPU's NVML index is its device minor (``/dev/nvidiaN``), true on usual
hosts; ``minors`` is the one place to map otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import struct
import sys
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path

NVIDIA_MAJOR = 195
ALWAYS_ALLOWED_MINORS = (255, 254)  # nvidiactl, nvidia-modeset: every CUDA program opens them

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280, "ppc64le": 361}
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6  # attach type
_BPF_F_ALLOW_MULTI = 2
_DEV_CHAR = 2  # low 16 bits of bpf_cgroup_dev_ctx.access_type

# Opcodes (class | op | source), from linux/bpf_common.h and linux/bpf.h.
_LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K: dst = (u32)dst & imm
_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K: if dst != imm goto pc + 1 + off
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_MOV64_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
_EXIT = 0x95  # BPF_JMP | BPF_EXIT: return r0


class FenceUnavailable(OSError):
    """The kernel (or our privileges) does not allow a device program here."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    # struct bpf_insn { u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm; }, host order;
    # the bit-field order follows the byte order.
    regs = dst | src << 4 if sys.byteorder == "little" else dst << 4 | src
    return struct.pack("=BBhi", code, regs, off, imm)


def program(minors: Collection[int]) -> bytes:
    """The device program: 1 (allow) unless a char device 195:N with N not in ``minors``."""
    allowed = sorted({*ALWAYS_ALLOWED_MINORS, *minors})
    # r1 = ctx; r2 = device type, r3 = major, r4 = minor.
    head = [
        _insn(_LDX_MEM_W, dst=2, src=1, off=0),
        _insn(_ALU_AND_K, dst=2, imm=0xFFFF),
        _insn(_LDX_MEM_W, dst=3, src=1, off=4),
        _insn(_LDX_MEM_W, dst=4, src=1, off=8),
    ]
    tests = [(_JNE_K, 2, _DEV_CHAR), (_JNE_K, 3, NVIDIA_MAJOR)]
    tests += [(_JEQ_K, 4, minor) for minor in allowed]
    deny = len(head) + len(tests)  # index of the "deny" block; "allow" follows it
    allow = deny + 2
    body = [
        _insn(code, dst=reg, off=allow - (len(head) + i + 1), imm=value)
        for i, (code, reg, value) in enumerate(tests)
    ]
    tail = [
        _insn(_MOV64_K, dst=0, imm=0),
        _insn(_EXIT),
        _insn(_MOV64_K, dst=0, imm=1),
        _insn(_EXIT),
    ]
    return b"".join(head + body + tail)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: bytes) -> int:
    machine = os.uname().machine
    number = _SYS_BPF.get(machine)
    if number is None:
        raise FenceUnavailable(errno.ENOSYS, f"bpf() number unknown on {machine}")
    buf = ctypes.create_string_buffer(attr, len(attr))
    result = int(_libc().syscall(ctypes.c_long(number), ctypes.c_int(cmd), buf, len(attr)))
    if result < 0:
        err = ctypes.get_errno()
        raise FenceUnavailable(err, os.strerror(err))
    return result


def load(minors: Collection[int]) -> int:
    """Load the program for ``minors``; returns its descriptor (the caller closes it)."""
    code = ctypes.create_string_buffer(program(minors))
    license = ctypes.create_string_buffer(b"MIT")
    # The BPF_PROG_LOAD part of union bpf_attr, up to expected_attach_type (72 bytes).
    attr = struct.pack(
        "=IIQQIIQII16sII",
        _BPF_PROG_TYPE_CGROUP_DEVICE,
        len(code.raw) // 8,
        ctypes.addressof(code),
        ctypes.addressof(license),
        0,  # log_level
        0,  # log_size
        0,  # log_buf
        0,  # kern_version
        0,  # prog_flags
        b"ddpq_gpus",
        0,  # prog_ifindex
        _BPF_CGROUP_DEVICE,  # expected_attach_type
    )
    return _bpf(_BPF_PROG_LOAD, attr)


# Programs loaded, by the minors they allow, kept open to be attached again: loading one
# (the kernel's verifier) was half of a job's fence (bench/RESULTS.md). A 1-GPU job on an
# 8-GPU host needs one of 8; the bound keeps a host with many GPU sets to what it uses.
_LOADED: OrderedDict[tuple[int, ...], int] = OrderedDict()
LOADED_MAX = 64


def _program_fd(minors: Collection[int]) -> int:
    """The loaded program for ``minors`` (kept: not for the caller to close)."""
    key = tuple(sorted({*ALWAYS_ALLOWED_MINORS, *minors}))
    fd = _LOADED.get(key)
    if fd is not None:
        _LOADED.move_to_end(key)
        return fd
    try:
        fd = load(minors)
    except FenceUnavailable as exc:
        # Before Linux 5.11 a loaded program is charged to the account's locked memory
        # (RLIMIT_MEMLOCK, 64 KiB under older systemd: ~16 programs). Those kept here are
        # given back, and the load tried once more, before a job runs unfenced for them.
        if exc.errno != errno.EPERM or not _LOADED:
            raise
        forget_programs()
        fd = load(minors)
    _LOADED[key] = fd
    if len(_LOADED) > LOADED_MAX:
        os.close(_LOADED.popitem(last=False)[1])  # attachments keep their own reference
    return fd


def forget_programs() -> None:
    """Close every program kept: cgroups they are attached to keep theirs."""
    while _LOADED:
        os.close(_LOADED.popitem()[1])


def attach(cgroup: Path, minors: Collection[int]) -> None:
    """Allow the processes of ``cgroup`` only these NVIDIA minors (plus ctl and modeset).

    Raises :class:`FenceUnavailable` where the kernel refuses (no BPF, not allowed,
    a parent program attached without ``BPF_F_ALLOW_MULTI``...).
    """
    try:
        dir_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise FenceUnavailable(exc.errno, f"cannot open {cgroup}: {exc.strerror}") from None
    try:
        # The BPF_PROG_ATTACH part: target_fd, attach_bpf_fd, attach_type, attach_flags.
        attr = struct.pack(
            "=IIII", dir_fd, _program_fd(minors), _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI
        )
        _bpf(_BPF_PROG_ATTACH, attr)
    finally:
        os.close(dir_fd)


def probe(parent: Path) -> str | None:
    """None if a fence can be attached under ``parent`` (tried on a scratch cgroup), else why."""
    scratch = parent / f"fence-probe-{os.getpid()}"
    try:
        scratch.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot create {scratch}: {exc.strerror}"
    try:
        attach(scratch, ())
    except FenceUnavailable as exc:
        return f"the kernel refused a cgroup device program ({exc.strerror or exc})"
    finally:
        with contextlib.suppress(OSError):
            scratch.rmdir()
    return None
