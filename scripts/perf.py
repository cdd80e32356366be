#!/usr/bin/env python3
"""Corral against nginx, HAProxy and a node directly, side by side, with oha as the load
generator; prints docs/PERFORMANCE.md's run section as markdown. Called by scripts/perf.

Upstreams are two fake Ollama nodes served by an nginx of their own from canned answers (a
16-token NDJSON chat, a 64-token NDJSON stream, a Chat Completions JSON), so the node is not the
bottleneck: the `direct` baseline must reach 5x the proxies' RPS, and the run says so when it
does not. Every (scenario, concurrency) is run in rounds; within a round every target runs once,
in an order rotated per round, so ratios compare targets that saw the same machine. Latency
percentiles are over every request of every round (oha's per-request CSV), CPU time per request
is utime+stime from /proc of each target's processes over its runs (stime shown apart), and resident memory is read
from /proc at start, after warm-up, under load (the peak seen while c=64 ran) and with 1,000
open streams. Loopback only; every run is bounded in count.
"""
import argparse
import asyncio
import csv
import io
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HZ = os.sysconf("SC_CLK_TCK")
# How long every target is left without requests before its "idle after warm-up" RSS is read.
IDLE_S = 2.5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout=20):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"no answer from {url}")


def children(pid):
    """`pid` and its descendants (nginx and HAProxy workers)."""
    out = [pid]
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return out
    for k in kids:
        out += children(int(k))
    return out


def cpu_ticks(pids):
    """(user + kernel, kernel) clock ticks of `pids` so far, from /proc (every thread's)."""
    t = k = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            t += int(f[11]) + int(f[12])
            k += int(f[12])
        except OSError:
            pass
    return t, k


def rss_mib(pids):
    kb = 0
    for p in pids:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS"):
                    kb += int(line.split()[1])
        except OSError:
            pass
    return kb / 1024


def ndjson(lines):
    return "".join(json.dumps(l, separators=(",", ":")) + "\n" for l in lines)


def canned():
    """The fake node's answers, as Ollama words them (api/types.go)."""
    def stream(n, key):
        out = []
        for i in range(n):
            piece = {"model": "llama3.2:latest", "created_at": "2026-12-01T00:00:00Z", "done": False}
            if key == "message":
                piece["message"] = {"role": "assistant", "content": f" w{i}"}
            else:
                piece["response"] = f" w{i}"
            out.append(piece)
        last = {"model": "llama3.2:latest", "created_at": "2026-12-01T00:00:00Z", "done": True, "done_reason": "length",
                "total_duration": 1000000, "load_duration": 1000, "prompt_eval_count": 32, "prompt_eval_duration": 100000,
                "eval_count": n, "eval_duration": 800000}
        if key == "message":
            last["message"] = {"role": "assistant", "content": ""}
        else:
            last["response"] = ""
        return ndjson(out + [last])
    v1 = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "llama3.2:latest",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(f"w{i}" for i in range(16))},
                                  "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 32, "completion_tokens": 16, "total_tokens": 48}})
    tags = json.dumps({"models": [{"name": "llama3.2:latest", "model": "llama3.2:latest", "modified_at": "2026-12-01T00:00:00Z",
                                   "size": 2019393189, "digest": "a80c4f17acd5", "details": {"format": "gguf", "family": "llama",
                                   "parameter_size": "3.2B", "quantization_level": "Q4_K_M"}}]})
    return {"/api/chat": ("application/x-ndjson", stream(16, "message")),
            "/api/generate": ("application/x-ndjson", stream(64, "response")),
            "/v1/chat/completions": ("application/json", v1),
            "/api/tags": ("application/json", tags),
            "/api/ps": ("application/json", json.dumps({"models": []})),
            "/api/version": ("application/json", json.dumps({"version": "0.12.0"})),
            "= /": ("text/plain", "Ollama is running")}


def nginx_conf(work, listen_blocks, name):
    return (f"worker_processes auto; pid {work}/{name}.pid; error_log {work}/{name}.err warn; daemon on;\n"
            "events { worker_connections 8192; }\n"
            f"http {{ access_log off; client_body_temp_path {work}; proxy_temp_path {work};\n{listen_blocks}\n}}\n")


def fake_nodes(work, ports):
    """Two fake nodes in one nginx: each answer is a file (nginx's inline strings are too short
    for a 64-line stream), served to any method through `error_page 405`, which re-enters as
    a GET."""
    os.makedirs(f"{work}/canned", exist_ok=True)
    locs = ""
    for i, (path, (ctype, body)) in enumerate(canned().items()):
        open(f"{work}/canned/{i}", "w").write(body)
        where = path if path.startswith("=") else f"= {path}"
        locs += (f"    location {where} {{ error_page 405 =200 /canned/{i}; return 405; }}\n"
                 f"    location = /canned/{i} {{ internal; root {work}; default_type {ctype}; }}\n")
    servers = "".join(f"  server {{ listen 127.0.0.1:{p} reuseport; keepalive_requests 1000000;\n{locs}  }}\n" for p in ports)
    path = f"{work}/nodes.conf"
    open(path, "w").write(nginx_conf(work, servers, "nodes"))
    subprocess.run(["nginx", "-c", path], check=True)
    return int(open(f"{work}/nodes.pid").read())


def nginx_proxy(work, port, nodes):
    ups = "".join(f"    server 127.0.0.1:{p};\n" for p in nodes)
    block = (f"  upstream ollama {{ least_conn; keepalive 256;\n{ups}  }}\n"
             f"  server {{ listen 127.0.0.1:{port}; client_max_body_size 32m; keepalive_requests 1000000;\n"
             "    location / { proxy_pass http://ollama; proxy_http_version 1.1; proxy_set_header Connection \"\";\n"
             "      proxy_buffering off; proxy_request_buffering off; proxy_read_timeout 300s; } }\n")
    path = f"{work}/proxy.conf"
    open(path, "w").write(nginx_conf(work, block, "proxy"))
    subprocess.run(["nginx", "-c", path], check=True)
    return int(open(f"{work}/proxy.pid").read())


def haproxy(work, port, nodes):
    servers = "".join(f"  server n{i} 127.0.0.1:{p}\n" for i, p in enumerate(nodes))
    cfg = (f"global\n  maxconn 8000\n  nbthread {os.cpu_count()}\n  pidfile {work}/haproxy.pid\n"
           "defaults\n  mode http\n  timeout connect 2s\n  timeout client 300s\n  timeout server 300s\n  http-reuse always\n"
           f"frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n"
           f"backend b\n  balance leastconn\n{servers}")
    path = f"{work}/haproxy.cfg"
    open(path, "w").write(cfg)
    p = subprocess.Popen(["haproxy", "-f", path], stdout=subprocess.DEVNULL, stderr=open(f"{work}/haproxy.err", "w"))
    return p.pid


def corral(binary, work, name, nodes, bare):
    port, admin = free_port(), free_port()
    cfg = f'[[listeners]]\naddr = "127.0.0.1:{port}"\n[admin]\naddr = "127.0.0.1:{admin}"\n'
    # The store in a directory of its own, as by default (the data dir, not the config's):
    # beside the config file, every WAL write would wake the config watcher.
    os.makedirs(f"{work}/data", exist_ok=True)
    cfg += f'[store]\nenabled = {"false" if bare else "true"}\npath = "{work}/data/{name}.db"\n[queue]\nmax_requests = 8192\n'
    for i, p in enumerate(nodes):
        cfg += f'[[nodes]]\nname = "n{i}"\nurl = "http://127.0.0.1:{p}"\nmax_concurrency = 1000\n'
    path = f"{work}/{name}.toml"
    open(path, "w").write(cfg)
    env = dict(os.environ, CORRAL_LOG="warn" if bare else "info", CORRAL_ADMIN_TOKEN="perf-token-0123456789abcdef0123456789")
    log = open(f"{work}/{name}.log", "w")
    p = subprocess.Popen([binary, "serve", "--config", path], stdout=subprocess.DEVNULL, stderr=log, env=env)
    wait_http(f"http://127.0.0.1:{port}/api/version")
    return p.pid, port, admin


SCENARIOS = [
    # name, path, body, concurrencies
    ("chat", "/api/chat", {"model": "llama3.2", "stream": False, "options": {"num_predict": 16},
                           "messages": [{"role": "user", "content": " ".join(["word"] * 32)}]}, [1, 16, 64]),
    ("v1 chat", "/v1/chat/completions", {"model": "llama3.2", "max_tokens": 16,
                                         "messages": [{"role": "user", "content": " ".join(["word"] * 32)}]}, [16, 64]),
    ("stream", "/api/generate", {"model": "llama3.2", "stream": True, "prompt": " ".join(["word"] * 32),
                                 "options": {"num_predict": 64}}, [1, 16, 64]),
]


def oha(oha_bin, url, body, c, n):
    """One oha run: (requests per second, per-request latencies in ms, failed requests). oha's
    CSV lists every successful request with its start and duration."""
    cmd = [oha_bin, "--no-tui", "-n", str(n), "-c", str(c), "-m", "POST", "-T", "application/json", "-d", json.dumps(body),
           "--output-format", "csv", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lat, first, last = [], None, 0.0
    for row in csv.DictReader(io.StringIO(out.stdout)):
        if row["status"] != "200":
            continue
        start, dur = float(row["request-start"]), float(row["request-duration"])
        lat.append(dur * 1000)
        first = start if first is None else min(first, start)
        last = max(last, start + dur)
    if not lat:
        sys.exit(f"oha got no successful answer from {url}: {out.stderr[:400]}")
    span = last - (first or 0.0)
    return (len(lat) / span if span > 0 else 0.0), lat, n - len(lat)


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def hold_streams(port, pid_list, n=1000):
    body = b'{"model":"llama3.2","prompt":"hold","stream":true}'
    req = (b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body

    async def one():
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(req)
        await w.drain()
        await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
        await asyncio.wait_for(r.readline(), 30)
        return w

    async def main():
        writers = []
        for _ in range(n // 100):
            writers += await asyncio.gather(*[one() for _ in range(100)])
        rss = rss_mib(pid_list)
        for w in writers:
            w.close()
        return rss
    return asyncio.run(main())


class Target:
    def __init__(self, name, url, pids):
        self.name, self.url, self.pids = name, url, pids
        self.rps, self.lat, self.failed, self.ticks, self.reqs = {}, {}, {}, {}, {}
        # The kernel's share of `ticks` (stime): TCP on both hops and waking the other ends.
        self.sys = {}


def run_matrix(oha_bin, targets, n, rounds, peak):
    for scen, path, body, concs in SCENARIOS:
        for c in concs:
            key = (scen, c)
            for t in targets:
                t.rps[key], t.lat[key], t.failed[key], t.ticks[key], t.reqs[key] = [], [], 0, 0, 0
                t.sys[key] = 0
            for r in range(rounds):
                order = targets[r % len(targets):] + targets[:r % len(targets)]
                for t in order:
                    pids = children(t.pids[0]) + t.pids[1:]
                    before = cpu_ticks(pids)
                    watch = Peak(pids) if c == 64 else None
                    rps, lat, failed = oha(oha_bin, t.url + path, body, c, n)
                    if watch:
                        peak[t.name] = max(peak.get(t.name, 0), watch.stop())
                    after = cpu_ticks(pids)
                    t.ticks[key] += after[0] - before[0]
                    t.sys[key] += after[1] - before[1]
                    t.rps[key].append(rps)
                    t.lat[key] += lat
                    t.failed[key] += failed
                    t.reqs[key] += len(lat)


class Peak:
    """The largest resident memory of `pids` while a run lasts, sampled every 50 ms."""
    def __init__(self, pids):
        self.pids, self.max, self.done = pids, 0.0, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.done.wait(0.05):
            self.max = max(self.max, rss_mib(self.pids))

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.max


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def report(targets, n, rounds, rss, peak, machine):
    by = {t.name: t for t in targets}
    proxies = [t for t in targets if t.name != "direct"]
    print("## The run\n")
    print(f"{machine}. Load generator: oha {n} requests per run, {rounds} interleaved rounds per row (order rotated each round).\n")
    print("| scenario | c | target | RPS (median of rounds) | x nginx | p50 ms | p99 ms | CPU us / request (kernel) | failed |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    warnings = []
    for scen, _, _, concs in SCENARIOS:
        for c in concs:
            key = (scen, c)
            base = median(by["nginx"].rps[key])
            for t in targets:
                rps = median(t.rps[key])
                cpu = t.ticks[key] / HZ / max(t.reqs[key], 1) * 1e6
                kernel = t.sys[key] / HZ / max(t.reqs[key], 1) * 1e6
                cpu_s = "–" if t.name == "direct" else f"{cpu:.1f} ({kernel:.1f})"
                print(f"| {scen} | {c} | {t.name} | {rps:,.0f} | {rps / base:.2f} | {pct(t.lat[key], 0.5):.2f} | "
                      f"{pct(t.lat[key], 0.99):.2f} | {cpu_s} | {t.failed[key]} |")
            direct = median(by["direct"].rps[key])
            fastest = max(median(t.rps[key]) for t in proxies)
            if direct < 5 * fastest:
                warnings.append(f"{scen} c={c}: direct {direct:,.0f} RPS is less than 5x the fastest proxy's {fastest:,.0f}: "
                                "the upstream or the load generator may be the limit here")
    print()
    for w in warnings:
        print(f"**Warning:** {w}.\n")
    if not warnings:
        print("The `direct` baseline reached at least 5x every proxy's RPS in every row: neither the fake nodes nor oha "
              "was the limit.\n")
    targets_table(by, rss, peak)
    print("| target | RSS after start | after warm-up | peak under c=64 | 1,000 open streams |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for t in proxies:
        r = rss.get(t.name, {})
        cell = lambda k: f"{r[k]:.0f} MiB" if k in r else "–"
        print(f"| {t.name} | {cell('start')} | {cell('warm')} | {peak.get(t.name, 0):.0f} MiB | {cell('streams')} |")
    print()


def streams_rss(binary, work):
    """Resident memory of Corral and nginx each holding 1,000 open streams to `corral sim`
    nodes that send one line and then hang (the fake nginx nodes cannot hold a stream open)."""
    out = open(f"{work}/sims.out", "w")
    sim = subprocess.Popen([binary, "sim", "--nodes", "2", "--port", "0", "--parallel", "1100", "--max-queue", "4096"],
                           stdout=out, stderr=subprocess.DEVNULL)
    urls = []
    for _ in range(200):
        urls = [u[u.index("http://"):] for u in open(f"{work}/sims.out").read().split() if u.startswith("http://")]
        if len(urls) >= 2:
            break
        time.sleep(0.05)
    for u in urls:
        urllib.request.urlopen(urllib.request.Request(u + "/_sim/faults", data=b'{"hang_after": 1}', method="POST"))
    ports = [int(u.rsplit(":", 1)[1].strip("/")) for u in urls]
    got = {}
    cpid, cport, _ = corral(binary, work, "corral-streams", ports, False)
    pport = free_port()
    open(f"{work}/streams.conf", "w").write(nginx_conf(work, (
        "  upstream sims { least_conn; keepalive 256;\n" + "".join(f"    server 127.0.0.1:{p};\n" for p in ports) + "  }\n"
        f"  server {{ listen 127.0.0.1:{pport}; location / {{ proxy_pass http://sims; proxy_http_version 1.1; "
        "proxy_set_header Connection \"\"; proxy_buffering off; proxy_read_timeout 300s; } }\n"), "streams"))
    subprocess.run(["nginx", "-c", f"{work}/streams.conf"], check=True)
    npid = int(open(f"{work}/streams.pid").read())
    try:
        got["corral"] = hold_streams(cport, children(cpid))
        got["nginx"] = hold_streams(pport, children(npid))
    finally:
        for p in children(npid)[::-1] + [cpid, sim.pid]:
            try:
                os.kill(p, 15)
            except OSError:
                pass
    return got


def targets_table(by, rss, peak):
    """Issue 16's acceptance figures, met or not, computed from this run."""
    cor, ngx = by["corral"], by["nginx"]
    rows = []
    for scen, _, _, concs in SCENARIOS:
        for c in [c for c in concs if c in (16, 64)]:
            ratio = median(cor.rps[(scen, c)]) / median(ngx.rps[(scen, c)])
            rows.append((f"throughput {scen} c={c} >= 0.8x nginx", f"{ratio:.2f}x", ratio >= 0.8))
    for scen in ("chat", "stream"):
        per = lambda t: t.ticks[(scen, 16)] / HZ / max(t.reqs[(scen, 16)], 1) * 1e6
        ratio = per(cor) / max(per(ngx), 1e-9)
        rows.append((f"CPU per request {scen} c=16 <= 2x nginx", f"{per(cor):.0f} vs {per(ngx):.0f} us ({ratio:.1f}x)", ratio <= 2))
    direct = pct(by["direct"].lat[("chat", 1)], 0.5)
    added = lambda t: pct(t.lat[("chat", 1)], 0.5) - direct
    rows.append(("added median latency c=1 <= nginx's + 0.05 ms", f"{added(cor):.3f} vs {added(ngx):.3f} ms",
                 added(cor) <= added(ngx) + 0.05))
    r = rss.get("corral", {})
    rows.append(("RSS idle after warm-up <= 24 MiB", f"{r.get('warm', 0):.1f} MiB", r.get("warm", 1e9) <= 24))
    rows.append(("RSS under c=64 <= 64 MiB", f"{peak.get('corral', 0):.1f} MiB", peak.get("corral", 1e9) <= 64))
    rows.append(("RSS with 1,000 open streams <= 100 MiB", f"{r.get('streams', 0):.1f} MiB", r.get("streams", 1e9) <= 100))
    print("### Targets (Corral with its shipped defaults)\n")
    print("| target | this run | met? |")
    print("| --- | --- | --- |")
    for name, got, ok in rows:
        print(f"| {name} | {got} | {'yes' if ok else 'no'} |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corral", required=True)
    ap.add_argument("--oha", required=True)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="corral-perf-")
    nodes = [free_port(), free_port()]
    killers = []
    try:
        npid = fake_nodes(work, nodes)
        killers.append(npid)
        wait_http(f"http://127.0.0.1:{nodes[0]}/api/version")
        targets = [Target("direct", f"http://127.0.0.1:{nodes[0]}", [npid])]
        pport = free_port()
        ppid = nginx_proxy(work, pport, nodes)
        killers.append(ppid)
        wait_http(f"http://127.0.0.1:{pport}/api/version")
        targets.append(Target("nginx", f"http://127.0.0.1:{pport}", [ppid]))
        if shutil_which("haproxy"):
            hport = free_port()
            hpid = haproxy(work, hport, nodes)
            killers.append(hpid)
            wait_http(f"http://127.0.0.1:{hport}/api/version")
            targets.append(Target("haproxy", f"http://127.0.0.1:{hport}", [hpid]))
        rss = {}
        for name, bare in [("corral", False), ("corral-bare", True)]:
            cpid, cport, _ = corral(a.corral, work, name, nodes, bare)
            killers.append(cpid)
            targets.append(Target(name, f"http://127.0.0.1:{cport}", [cpid]))
        for t in targets[1:]:
            rss[t.name] = {"start": rss_mib(children(t.pids[0]))}
        body = SCENARIOS[0][2]
        for t in targets:
            oha(a.oha, t.url + "/api/chat", body, 16, 2000)
        # "Idle after warm-up": every target left without requests for a moment first (Corral
        # gives freed memory back after a quiet second), then all are read.
        time.sleep(IDLE_S)
        for t in targets[1:]:
            rss[t.name]["warm"] = rss_mib(children(t.pids[0]))
        peak = {}
        run_matrix(a.oha, targets, a.requests, a.rounds, peak)
        machine = (f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
                   f"{platform.system()} {platform.release()}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
        for name, mib in streams_rss(a.corral, work).items():
            rss[name]["streams"] = mib
        report(targets, a.requests, a.rounds, rss, peak, machine)
    finally:
        for p in killers:
            for k in children(p)[::-1]:
                try:
                    os.kill(k, 15)
                except OSError:
                    pass
        # The stores alone are ~140 MB a run; left in /tmp, runs filled the disk, and ext4 near
        # full made every store write dearer (this is a benchmark of those writes).
        import shutil
        shutil.rmtree(work, ignore_errors=True)


def shutil_which(name):
    import shutil
    return shutil.which(name)


if __name__ == "__main__":
    main()
