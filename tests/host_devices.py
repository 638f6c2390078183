"""Scripts run on 8 host CPU devices, each in a subprocess of its own, so
that the rest of the suite keeps one device (XLA fixes the count when it
starts)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax


def run_on_8_devices(script: str, timeout: int = 900) -> str:
    """`script` run in a subprocess on 8 host CPU devices; its output, once it has succeeded."""
    flags = "--xla_force_host_platform_device_count=8"
    if jax.__version_info__ >= (0, 10):
        # 8 devices' collectives on a busy 2-core machine can wait long for
        # each other; XLA's default 40 s before it aborts is too short there.
        flags += " --xla_cpu_collective_call_terminate_timeout_seconds=600"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout
