#!/usr/bin/env python3
"""A Python inference pipeline: source -> model -> sink, three processes passing
torch tensors through tensor rings in broker memory (no copies, no pickling).
With --kill-model, the model stage is SIGKILLed a third of the way and started
again; the frame it held comes back to its replacement, and the sink checks that
every frame arrives exactly once and correct.

    examples/python/pipeline.py --socket S [--frames 120] [--kill-model]
"""
import argparse
import os
import signal
import subprocess
import sys

import numpy as np

import membroker

SHAPE = (64, 256)  # one float32 "activation" per frame: 64 KiB
SLOTS = 4
SLOT_BYTES = SHAPE[0] * SHAPE[1] * 4


def ring(c, name, create):
    if create:
        h = c.malloc_physical(membroker.TensorRing.bytes_for(SLOTS, SLOT_BYTES))
        r = membroker.TensorRing.create(c.map_handle(h), SLOTS, SLOT_BYTES)
        c.publish(name, h)
        return r
    return membroker.TensorRing.attach(c.map_handle(c.lookup(name, timeout_ms=10000)))


def source(c, frames):
    import torch
    out = ring(c, "pypipe/a", False)
    for f in range(out.last_published_frame + 1, frames + 1):
        s = out.acquire_for_write(10000)
        x = torch.from_numpy(s.array("float32", SHAPE))   # the slot itself, as a tensor
        x.fill_(float(f))
        out.publish(s, f, SLOT_BYTES)


def model(c, frames):
    import torch
    inp, out = ring(c, "pypipe/a", False), ring(c, "pypipe/b", False)
    while True:
        # A stage that replaces one killed after its last frame has nothing left to do
        # (the killed one may have run ahead of the lines its parent had read).
        if out.last_published_frame >= frames and inp.published == inp.released:
            return
        s = inp.acquire_for_read(10000)
        f = s.frame_id
        if f > out.last_published_frame:           # not done before a restart
            o = out.acquire_for_write(10000)
            y = torch.from_numpy(o.array("float32", SHAPE))
            torch.mul(torch.from_numpy(s.array("float32", SHAPE)), 2.0, out=y)
            out.publish(o, f, SLOT_BYTES)
        inp.release(s)
        print(f"model {f}", flush=True)
        if f == frames:
            return


def sink(c, frames):
    inp = ring(c, "pypipe/b", False)
    seen = np.zeros(frames + 1, dtype=np.int32)
    bad = 0
    while seen[1:].sum() < frames:
        s = inp.acquire_for_read(20000)
        a = s.array("float32", SHAPE)
        bad += int(not (a == 2.0 * s.frame_id).all())
        seen[s.frame_id] += 1
        inp.release(s)
    dup = int((seen[1:] > 1).sum())
    print(f"sink: {frames} frames, {bad} wrong, {dup} twice, {int((seen[1:] == 0).sum())} lost", flush=True)
    return 0 if bad == 0 and dup == 0 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--kill-model", action="store_true")
    ap.add_argument("--role", default="main")
    args = ap.parse_args()
    if args.role != "main":
        c = membroker.connect(args.socket, f"pypipe-{args.role}")
        return {"source": source, "model": model, "sink": sink}[args.role](c, args.frames) or 0
    c = membroker.connect(args.socket, "pypipe-main")
    rings = [ring(c, "pypipe/a", True), ring(c, "pypipe/b", True)]
    me = [sys.executable, os.path.abspath(__file__), "--socket", args.socket, "--frames", str(args.frames)]
    sink_p = subprocess.Popen(me + ["--role", "sink"], stdout=subprocess.PIPE, text=True)
    model_p = subprocess.Popen(me + ["--role", "model"], stdout=subprocess.PIPE, text=True)
    source_p = subprocess.Popen(me + ["--role", "source"])
    if args.kill_model:
        for line in model_p.stdout:
            if int(line.split()[1]) >= args.frames // 3:
                break
        model_p.send_signal(signal.SIGKILL)
        model_p.wait()
        print(f"killed the model stage (pid {model_p.pid}) after frame {line.split()[1]}; restarting it")
        model_p = subprocess.Popen(me + ["--role", "model"], stdout=subprocess.DEVNULL)
    else:
        model_p.stdout.read()
    codes = [source_p.wait(timeout=120), model_p.wait(timeout=120)]
    out, _ = sink_p.communicate(timeout=120)
    print(out.strip())
    c.unpublish("pypipe/a")
    c.unpublish("pypipe/b")
    ok = not any(codes) and sink_p.returncode == 0 and " 0 lost" in out
    print("python pipeline: ok" if ok else f"python pipeline: FAILED {codes} {sink_p.returncode}")
    del rings
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
