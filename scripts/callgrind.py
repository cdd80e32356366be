#!/usr/bin/env python3
"""Instructions per proxied request, under callgrind: the repeatable figure used to judge each
change to the request path (wall-clock CPU on a shared 2-core machine moves by 10% run to run;
with --bare this moves by under 0.1%; with the store on, by about 2%, as the writer's batches
fall differently from run to run, so judge a request-path change with --bare). Not a
substitute for scripts/perf: valgrind runs one thread at a time
and counts a `rep movsb` copy per byte, so memcpy weighs more and cross-thread costs less than
on the hardware; confirm a change with an interleaved wall-clock run.

    python3 scripts/callgrind.py target/profiling/corral [--requests 500] [--bare]
        [--path /api/chat|/api/generate|/v1/chat/completions] [--annotate] [--keep]

Starts two fake nodes (scripts/perf.py's nginx with canned answers), `corral serve` under
callgrind with the shipped defaults (or --bare: store off, log at warn), sends 200 warm-up
requests, zeroes the counters, sends --requests over 4 keep-alive connections, waits 1 s for
the store writer and the log thread, dumps, and prints instructions per request (with
--annotate, the top functions by inclusive count). Its work directory is removed at the end
unless --keep (then the path is printed, for callgrind_annotate). Build with `cargo build
--profile profiling` for symbols. Needs nginx and valgrind. Loopback only; bounded in count.
"""
import argparse
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--bare", action="store_true")
    ap.add_argument("--path", default="/api/chat", choices=[s[1] for s in perf.SCENARIOS])
    ap.add_argument("--annotate", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (callgrind's output) for callgrind_annotate")
    a = ap.parse_args()
    body = json.dumps(next(s[2] for s in perf.SCENARIOS if s[1] == a.path))
    work = tempfile.mkdtemp(prefix="corral-callgrind-")
    nodes = [perf.free_port(), perf.free_port()]
    npid = perf.fake_nodes(work, nodes)
    proc = None
    try:
        perf.wait_http(f"http://127.0.0.1:{nodes[0]}/api/version")
        port, admin = perf.free_port(), perf.free_port()
        cfg = (f'[[listeners]]\naddr = "127.0.0.1:{port}"\n[admin]\naddr = "127.0.0.1:{admin}"\n'
               f'[store]\nenabled = {"false" if a.bare else "true"}\npath = "{work}/cg.db"\n')
        for i, p in enumerate(nodes):
            cfg += f'[[nodes]]\nname = "n{i}"\nurl = "http://127.0.0.1:{p}"\nmax_concurrency = 1000\n'
        open(f"{work}/cg.toml", "w").write(cfg)
        env = dict(os.environ, CORRAL_LOG="warn" if a.bare else "info",
                   CORRAL_ADMIN_TOKEN="callgrind-token-0123456789abcdef0123456789")
        out = f"{work}/cg.out.%p"
        proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", a.binary, "serve",
                                 "--config", f"{work}/cg.toml"],
                                stdout=subprocess.DEVNULL, stderr=open(f"{work}/cg.log", "w"), env=env)
        perf.wait_http(f"http://127.0.0.1:{port}/api/version", timeout=120)

        def send(n):
            conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in range(4)]
            for i in range(n):
                c = conns[i % 4]
                c.request("POST", a.path, body, {"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    sys.exit(f"{a.path} answered {r.status}")

        send(200)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], capture_output=True, check=True)
        send(a.requests)
        time.sleep(1.0)  # the store writer's linger and the log thread's, inside the window
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True, check=True)
        dumps = [f for f in glob.glob(f"{work}/cg.out.*") if "Trigger: dump" in open(f).read()]
        total = sum(int(re.search(r"^summary: (\d+)", open(f).read(), re.M)[1]) for f in dumps)
        kind = "bare" if a.bare else "shipped defaults"
        print(f"{os.path.basename(a.binary)} ({kind}) {a.path}: {total / a.requests:,.0f} instructions/request")
        if a.annotate and dumps:
            text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=99", dumps[0]],
                                  capture_output=True, text=True).stdout
            for line in text.splitlines()[25:85]:
                m = re.match(r"\s*([\d,]+)", line)
                if m:
                    print(f"{int(m[1].replace(',', '')) / a.requests:10,.0f}/req {line[m.end():][:150]}")
    finally:
        if proc:
            proc.terminate()
            proc.wait()
        for p in perf.children(npid)[::-1]:
            try:
                os.kill(p, 15)
            except OSError:
                pass
        if a.keep:
            print(f"kept {work} (callgrind's output: cg.out.*)")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
