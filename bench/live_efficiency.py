"""A decode worker's live efficiency (cleave_worker_step_floor_seconds_total over
cleave_worker_step_seconds_total, the metric the dashboards show) next to bench_engine's
floor/time for the same batch, threads and context, measured in the same run.

`cleave up` runs a router, a prefill worker and a decode worker (one thread each, target
concurrency 16); `cleave bench` keeps more requests in flight than the target, so the
decode batch stays at 16 while sequences hold 64..320 positions (192 on average). The
script samples the decode worker's counters every 0.2 s and keeps the intervals during
which the batch was 16 at both ends. Then, with the deployment stopped, bench_engine runs
decode at batch 16 with one thread and 192 positions of context.

Run (after a build): /usr/bin/python3 bench/live_efficiency.py [--requests N]
"""
import argparse
import re
import subprocess
import sys
import threading
import time

from harness import MODEL, ct
TARGET, PROMPT, OUTPUT = 16, 64, 256

parser = argparse.ArgumentParser()
parser.add_argument("--requests", type=int, default=48)
args = parser.parse_args()

HARDWARE = ("cleave_worker_roofline_bandwidth_bytes_per_second",
            'cleave_worker_roofline_flops_per_second{operation="weights"}',
            'cleave_worker_roofline_flops_per_second{operation="attention"}')
COUNTERS = ("cleave_worker_decode_sequences", "cleave_worker_steps_total",
            "cleave_worker_step_seconds_total", "cleave_worker_step_floor_seconds_total")


def sample(port, names=COUNTERS):
    _, body = ct.http_get(port)
    values = dict(line.rsplit(" ", 1) for line in body.splitlines() if line and line[0] != "#")
    return tuple(float(values[name]) for name in names)


up = ct.Process([ct.binary("cleave"), "up", f"--model={MODEL}", "--listen=127.0.0.1:0",
                 "--prefill=1", "--decode=1", "--threads=1", f"--target-concurrency={TARGET}",
                 f"--planned-seq-len={PROMPT + OUTPUT + 16}"], ready_timeout=120)
decode_port = up.ready["decode-0_metrics_port"]
bandwidth, flops, attention_flops = sample(decode_port, HARDWARE)
samples, done = [], threading.Event()


def watch():
    while not done.is_set():
        samples.append(sample(decode_port))
        time.sleep(0.2)


watcher = threading.Thread(target=watch)
watcher.start()
try:
    load = subprocess.run([ct.binary("cleave"), "bench", f"--router=127.0.0.1:{up.ready['grpc_port']}",
                           f"--concurrency={TARGET + 8}", f"--requests={args.requests}",
                           "--warmup=0", f"--prompt-len={PROMPT}", f"--output-len={OUTPUT}"],
                          capture_output=True, text=True, timeout=900)
finally:
    done.set()
    watcher.join()
    up.proc.send_signal(2)
    up.proc.wait(60)
if load.returncode != 0:
    sys.exit(f"cleave bench failed:\n{load.stdout}{load.stderr}")
print(load.stdout.strip())

steady_floor = steady_time = steady_steps = 0.0
for (b0, n0, t0, f0), (b1, n1, t1, f1) in zip(samples, samples[1:]):
    if b0 == TARGET and b1 == TARGET:
        steady_steps += n1 - n0
        steady_time += t1 - t0
        steady_floor += f1 - f0
total_floor = samples[-1][3] - samples[0][3]
total_time = samples[-1][2] - samples[0][2]
if steady_steps == 0:
    sys.exit("the decode batch never stayed at the target; raise --requests")



def bench_engine(*hardware):
    """bench_engine's decode row at the target batch: (ms per step, floor/time)."""
    engine = subprocess.run([ct.binary("bench_engine"), "--threads", "1", "--reps", "5",
                             "--context", str(PROMPT + OUTPUT // 2), *hardware],
                            capture_output=True, text=True, timeout=900)
    row = re.search(rf"^decode batch {TARGET} +([0-9.]+) .* ([0-9.]+)$", engine.stdout, re.M)
    if engine.returncode != 0 or row is None:
        sys.exit(f"bench_engine failed:\n{engine.stdout}{engine.stderr}")
    return float(row.group(1)), float(row.group(2))


# The worker's floors are computed against what it measured at start; bench_engine
# measures again (the two can differ by tens of percent on a shared machine), so it runs
# once against the worker's numbers (the like-for-like comparison) and once on its own.
same_ms, same_ratio = bench_engine("--bandwidth", str(bandwidth), "--flops", str(flops),
                                   "--attention-flops", str(attention_flops))
own_ms, own_ratio = bench_engine()
live = steady_floor / steady_time
print(f"live decode worker, batch {TARGET}: {steady_steps:.0f} steps, "
      f"{1e3 * steady_time / steady_steps:.2f} ms/step, floor "
      f"{1e3 * steady_floor / steady_steps:.2f} ms/step, efficiency {live:.3f}")
print(f"live decode worker, whole run (batches ramping up and down): "
      f"efficiency {total_floor / total_time:.3f}")
print(f"the worker's floors use {bandwidth / 1e9:.1f} GB/s, {flops / 1e9:.0f} GOP/s (weights), "
      f"{attention_flops / 1e9:.0f} GFLOP/s (attention)")
print(f"bench_engine decode batch {TARGET}, 1 thread, {PROMPT + OUTPUT // 2} positions: "
      f"{same_ms:.2f} ms/step, floor/time {same_ratio:.3f} against the worker's hardware "
      f"({own_ratio:.3f} against its own measurement)")
print(f"live / bench_engine efficiency: {live / same_ratio:.2f}")
