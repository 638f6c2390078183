"""Would compiling a plan's chunks in the background pay? (issue 21, a next step)

Today a structure's second `jdtr.grad` call cuts and compiles its plan's
chunks while the caller waits. This measures the alternative without
building it: the same chunks compiled in a thread (a `chunks="always"`
call) while the main thread keeps calling step by step (`chunks="never"`),
against the chunks compiled in the foreground. Prints seconds.

    python benchmarks/background_compile.py --model gpt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time

import jax

import jdtr
from jdtr import models

MODELS = {
    "gpt": ("flax GPT 4x128, seq 128, batch 8", lambda: models.flax_gpt()),
    "transformer": ("transformer 4x128, seq 128, batch 8",
                    lambda: models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256)),
}


def call_seconds(f, args, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt")
    parser.add_argument("--budget", type=float, default=0.5)
    options = parser.parse_args()
    label, make = MODELS[options.model]
    model = make()
    args = (model.params, model.batch)
    print(f"{time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"JAX {jax.__version__} on {jax.default_backend()}; {label}; budget {options.budget}")

    steps = jdtr.grad(model.loss, budget=options.budget, chunks="never")
    first = call_seconds(steps, args, 1)[0]
    by_steps = statistics.median(call_seconds(steps, args, 5))
    chunked = jdtr.grad(model.loss, budget=options.budget, chunks="always")
    foreground = call_seconds(chunked, args, 1)[0]  # cut, compile and run
    by_chunks = statistics.median(call_seconds(chunked, args, 5))
    print(f"first call {first:.2f} s; step by step {by_steps * 1e3:.0f} ms a call; chunks {by_chunks * 1e3:.0f} ms a call")
    print(f"chunks compiled in the foreground: the call took {foreground:.2f} s")

    jdtr.clear_caches()  # the chunks compile again; the single equations' executables too, on the next call
    steps = jdtr.grad(model.loss, budget=options.budget, chunks="never")
    call_seconds(steps, args, 2)
    chunked = jdtr.grad(model.loss, budget=options.budget, chunks="always")
    took: list[float] = []
    thread = threading.Thread(target=lambda: took.extend(call_seconds(chunked, args, 1)))
    thread.start()
    meanwhile = []
    while thread.is_alive():
        meanwhile.extend(call_seconds(steps, args, 1))
    thread.join()
    print(f"chunks compiled in the background: {took[0]:.2f} s, while {len(meanwhile)} calls ran step by step "
          f"at {statistics.median(meanwhile) * 1e3:.0f} ms a call (median)")
    # The same seconds spent the other way: the call that compiles in the foreground, then calls as chunks.
    calls = 1 + max(took[0] - foreground, 0.0) // by_chunks
    print(f"in those {took[0]:.2f} s, compiling in the foreground then calling as chunks makes {calls:.0f} calls")


if __name__ == "__main__":
    main()
