#!/usr/bin/env python3
"""Active Cache applet overhead: the Active Cache paper's Table 1, redone.

Response time of cache hits with each example applet (null, log, ads, apc, ssi, csid) against
the same hits without an applet, at 1, 10 and 20 clients, over the WebStone 2.0 file mix
(filelist.standard: 500 B 35 %, 5 KB 50 %, 50 KB 14 %, 500 KB 0.9 %, 5 MB 0.1 %). One meshcache
process serves every variant (each under its own URL prefix, the applet bound with
[[applets.bind]], as the paper associates every document with the same applet), so the runs
differ only in the applet: every variant sends the same request headers, and its URLs are padded
to the same lengths. Following shared/BENCHMARKING.md: meshcache and the origin pinned to
core 1, wrk to core 0; runs interleaved (every variant once per round and client count, each
round starting one variant later than the last); a fresh network namespace when the machine
allows it; the hits proven by meshcache's miss counter staying put during each run; every
applet run proven by its counters (no run may end at the origin). The response time compared
is the closed-loop clients' cycle time (clients × duration / requests, Little's law); each run
also records meshcache's CPU per hit, wrk's CPU and steal.

Usage: scripts/bench-applets.py [--duration S] [--rounds N] [--clients 1,10,20]
                                [--applets none,null,log,ads,apc,ssi,csid] [--out DIR]
                                [--bin PATH] [--no-build] [--no-netns] [--port-base N]
       scripts/bench-applets.py --pool DIR [DIR ...] [--out DIR]
Defaults take about 7 minutes. Output: a Markdown table on stdout and in OUT/results.md; raw
runs in OUT/raw.csv; OUT/results.json with the config, seed and revision. --pool measures
nothing: it reports the rounds of earlier runs' raw.csv together (each round still paired with
`none` of its own run), for medians and intervals over more pairs than one run has.
"""

import argparse
import base64
import csv
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# WebStone 2.0 filelist.standard: (bytes, weight per 1000 requests).
WEBSTONE = [(500, 350), (5000, 500), (50000, 140), (500000, 9), (5000000, 1)]
APPLETS = ["none", "null", "log", "ads", "apc", "ssi", "csid"]
# The paper's targets (issue text): ratio of mean response time with the applet to without.
TARGETS = {"null": 1.05, "log": 1.3, "apc": 1.3, "csid": 1.3, "ads": 1.5, "ssi": 1.5}
SEED = 20261124
TAG = "bench-applets"


def log(msg):
    print(f"{TAG}: {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(msg)
    sys.exit(1)


def ensure_tools():
    missing = [p for c, p in [("wrk", "wrk"), ("taskset", "util-linux"), ("ip", "iproute2")]
               if shutil.which(c) is None]
    if missing:
        log(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                       check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    try:
        import cryptography  # noqa: F401
    except ImportError:
        log("installing cryptography (for the apc applet's signed cookie)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "cryptography"], check=True)


def revision():
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return rev + (f" + uncommitted changes in {len(dirty.splitlines())} files" if dirty else "")


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="bench-applets."))
        self.procs = []
        self.origin_port = args.port_base
        self.proxy_port = args.port_base + 1
        self.admin_port = args.port_base + 2
        self.origin = f"http://127.0.0.1:{self.origin_port}"

    # ------------------------------------------------------------------ setup
    def documents(self):
        """Per variant: the requests (url, weight, headers, expected size) and URLs to warm."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives import serialization

        key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
        public = key.public_key().public_bytes(serialization.Encoding.Raw,
                                               serialization.PublicFormat.Raw).hex()
        payload = f"{self.origin}/apc/|{int(time.time()) + 86400}".encode()
        apc_cookie = f"apc={b64url(payload)}.{b64url(key.sign(payload))}"
        spec_text = "".join(f"/banners/{i}.gif\n" for i in range(1, 6))
        spec_url = "/ads/spec?cc=max-age=86400&text=" + urllib.parse.quote(spec_text, safe="")
        q = urllib.parse.quote
        # Every variant sends the same request headers (the cookies apc and csid read), so that
        # `none` parses what the applets' hits parse.
        cookies = {"Cookie": f"{apc_cookie}; client-id=webstone"}
        variants = {}
        for name in self.args.applets:
            reqs, warm = [], []
            for size, weight in WEBSTONE:
                base = f"size={size}&cc=max-age=86400&ct=text/html"
                headers = dict(cookies)
                if name == "ads":
                    base += "&text=" + q("<html><!--#ad-->", safe="")
                    base += "&hdr=" + q("ad-spec:" + spec_url, safe="")
                elif name == "ssi":
                    base += "&text=" + q('<html><p><!--#echo var="DATE_GMT" --></p>', safe="")
                elif name == "apc":
                    base += "&hdr=" + q("apc-key:" + public, safe="")
                if name == "csid":
                    item = f"{self.origin}/csid/item{size}?{base}"
                    plan = f"*: /csid/item{size}?{base}\n"
                    url = f"{self.origin}/csid/f{size}?cc=max-age=86400&ct=text/html&text=" + q(plan, safe="")
                    warm.append((item, {}, size))
                else:
                    url = f"{self.origin}/{name}/f{size}?{base}"
                reqs.append((url, weight, headers, size))
            if name == "ads":
                warm.append((self.origin + spec_url, {}, None))
            variants[name] = (reqs, warm)
        # Every variant's URL of a size class is padded to the same length (a parameter the
        # origin ignores): the URL is hashed for the store key, parsed and logged on every hit,
        # and the applets' documents carry their content in longer URLs. Unpadded, ads' URLs
        # were 4x none's, which cost its hits about 0.7 us more MD5 alone.
        longest = [max(len(reqs[i][0]) for reqs, _ in variants.values()) for i in range(len(WEBSTONE))]
        for reqs, _ in variants.values():
            for i, (url, weight, headers, size) in enumerate(reqs):
                reqs[i] = (url + "&pad=" + "x" * (longest[i] + 3 - len(url)), weight, headers, size)
        return variants

    def config(self):
        binds = "".join(
            f'\n[[applets.bind]]\nurls = "{self.origin}/{a}/*"\nmodule = "{REPO}/applets/{a}.wasm"\n'
            for a in self.args.applets if a != "none")
        return f"""# meshcache config for scripts/bench-applets.py
name = "bench"

[http]
listen = ["127.0.0.1:{self.proxy_port}"]

[admin]
listen = "127.0.0.1:{self.admin_port}"

[store]
memory = "512 MiB"
max_object_size = "8 MiB"

[log]
access = "{self.work}/access.log"

[applets]
# The log applet's records go to the origin every second (the origin emulator answers POSTs).
log_interval = "1s"
{binds}"""

    def start(self, name, cmd, port):
        out = open(self.work / f"{name}.log", "w")
        env = {**os.environ, "TOKIO_WORKER_THREADS": "1", "MESHCACHE_LOG": "warn"}
        p = subprocess.Popen(["taskset", "-c", "1", *cmd], stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if p.poll() is not None:
                    die(f"{name} exited at startup: {(self.work / f'{name}.log').read_text()[-2000:]}")
                time.sleep(0.1)
        else:
            die(f"{name} did not listen on {port}")
        log(f"{name} running (pid {p.pid}, 127.0.0.1:{port})")
        return p

    def fetch(self, url, headers=None):
        proxy = urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{self.proxy_port}"})
        opener = urllib.request.build_opener(proxy)
        req = urllib.request.Request(url, headers=headers or {})
        with opener.open(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()

    def stats(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5) as r:
            return json.load(r)

    def misses(self):
        s = self.stats()["requests_by_result"]
        return sum(n for code, n in s.items() if "MISS" in code)

    # ------------------------------------------------------------------ runs
    def lua(self, name, reqs):
        """A wrk script issuing this variant's requests in WebStone proportions."""
        host = f"127.0.0.1:{self.origin_port}"
        entries = []
        for url, weight, headers, _ in reqs:
            h = {"Host": host, **headers}
            hl = ", ".join(f'["{k}"] = "{v}"' for k, v in h.items())
            entries.append(f'  {{ {weight}, wrk.format("GET", "{url}", {{ {hl} }}) }}')
        path = self.work / f"{name}.lua"
        path.write_text(f"""-- generated by scripts/bench-applets.py: WebStone 2.0 mix for variant {name}
local mix = {{
{(','+chr(10)).join(entries)}
}}
local total = 0
for _, e in ipairs(mix) do total = total + e[1] end
local seed = {SEED}
function init(args) math.randomseed(seed) end
function request()
  local r = math.random(total)
  for _, e in ipairs(mix) do
    r = r - e[1]
    if r <= 0 then return e[2] end
  end
  return mix[1][2]
end
function done(summary, latency, requests)
  io.write(string.format("RESULT %d %d %.3f %.3f %.3f %d\\n", summary.requests, summary.duration,
    latency.mean, latency:percentile(50), latency:percentile(99),
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
""")
        return path

    def proxy_ticks(self):
        """utime + stime of the meshcache process (all its threads), in clock ticks."""
        fields = Path(f"/proc/{self.proxy_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    @staticmethod
    def steal():
        """(steal, total) ticks of the whole machine."""
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        return int(cpu[7]), sum(int(x) for x in cpu)

    def run_one(self, name, clients, script, rnd):
        before = self.stats()
        a0 = before.get("applets", {})
        m0 = self.misses()
        cmd = ["taskset", "-c", "0", "wrk", "-t1", f"-c{clients}", f"-d{self.args.duration}s",
               "-s", str(script), f"http://127.0.0.1:{self.proxy_port}"]
        hz = os.sysconf("SC_CLK_TCK")
        p0, s0, w0, t0 = self.proxy_ticks(), self.steal(), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.duration + 60)
        p1, s1, w1, t1 = self.proxy_ticks(), self.steal(), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        wall = t1 - t0
        proxy_cpu = (p1 - p0) / hz
        wrk_cpu = (w1.ru_utime + w1.ru_stime) - (w0.ru_utime + w0.ru_stime)
        steal_pct = 100 * (s1[0] - s0[0]) / max(1, s1[1] - s0[1])
        line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
        if out.returncode != 0 or line is None:
            die(f"wrk failed for {name}: {out.stdout}{out.stderr}")
        _, reqs, dur_us, mean, p50, p99, errors = line.split()
        m1 = self.misses()
        after = self.stats().get("applets", {})
        if m1 != m0:
            die(f"{name}: {m1 - m0} misses during a hit run")
        if int(errors):
            die(f"{name}: wrk saw {errors} errors")
        runs = after.get("runs", 0) - a0.get("runs", 0)
        failed = sum(after.get(k, 0) - a0.get(k, 0) for k in
                     ["asked_origin", "traps", "timeouts", "memory_overruns", "output_overruns",
                      "invalid_results", "instantiate_failures"])
        if name != "none" and (runs < int(reqs) or failed):
            die(f"{name}: {runs} applet runs for {reqs} requests, {failed} ended at the origin")
        row = dict(applet=name, clients=clients, round=rnd, requests=int(reqs),
                   seconds=int(dur_us) / 1e6, mean_ms=float(mean) / 1000,
                   p50_ms=float(p50) / 1000, p99_ms=float(p99) / 1000, applet_runs=runs,
                   cycle_ms=clients * (int(dur_us) / 1e3) / int(reqs),
                   proxy_cpu_us=proxy_cpu * 1e6 / int(reqs), proxy_cpu_pct=100 * proxy_cpu / wall,
                   wrk_cpu_pct=100 * wrk_cpu / wall, steal_pct=steal_pct)
        log(f"  round {rnd} {clients:>2} clients {name:<5} {row['requests'] / row['seconds']:9.0f} req/s"
            f"  mean {row['mean_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  proxy {row['proxy_cpu_us']:.1f} us/req"
            f" ({row['proxy_cpu_pct']:.0f}%)  wrk {row['wrk_cpu_pct']:.0f}%  steal {steal_pct:.1f}%")
        return row

    def main(self):
        args = self.args
        variants = self.documents()
        (self.work / "meshcache.toml").write_text(self.config())
        self.start("origin", [str(args.bin), "lab", "origin", "--listen", f"127.0.0.1:{self.origin_port}"],
                   self.origin_port)
        self.proxy_pid = self.start("meshcache", [str(args.bin), "run", "-c", str(self.work / "meshcache.toml")],
                                    self.proxy_port).pid
        scripts = {}
        for name, (reqs, warm) in variants.items():
            for url, headers, size in warm:
                self.fetch(url, headers)
            for url, _, headers, size in reqs:
                self.fetch(url, headers)  # the miss
                status, h, body = self.fetch(url, headers)
                if status != 200 or "HIT" not in h.get("x-cache", "") or len(body) < size:
                    die(f"{name}: {url} not served as a {size}-byte hit: {status} {h}")
            scripts[name] = self.lua(name, reqs)
            log(f"{name}: {len(reqs)} documents cached")
        rows = []
        for rnd in range(1, args.rounds + 1):
            # Each round starts one variant later, so that no variant (the baseline included)
            # always runs in the same place in the sequence.
            k = (rnd - 1) % len(args.applets)
            order = args.applets[k:] + args.applets[:k]
            for clients in args.clients:
                for name in order:
                    rows.append(self.run_one(name, clients, scripts[name], rnd))
        return rows

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()


def median_interval(values, level=0.95):
    """A distribution-free confidence interval for the median of `values`: the order statistics
    x(j) and x(n+1-j) for the largest j whose coverage, 1 - 2 P(Binomial(n, 1/2) < j), is at
    least `level`. None when there are too few values for any (fewer than 6 at 95 %)."""
    xs = sorted(values)
    n = len(xs)
    found = None
    for j in range(1, n // 2 + 1):
        below = sum(math.comb(n, i) for i in range(j)) / 2 ** n
        if 1 - 2 * below < level:
            break
        found = (xs[j - 1], xs[n - j])
    return found


def report(args, rows, out):
    by = {}
    for r in rows:
        by.setdefault((r["applet"], r["clients"]), []).append(r)

    def median_of(a, c, key):
        return statistics.median(x[key] for x in by[(a, c)])

    def ratios(a, c, key):
        xs = sorted(by[(a, c)], key=lambda r: r["round"])
        ys = sorted(by[("none", c)], key=lambda r: r["round"])
        return [x[key] / y[key] for x, y in zip(xs, ys)]

    def paired(a, c, key):
        return statistics.median(ratios(a, c, key))

    # The response time is the closed-loop clients' cycle time (Little's law): clients ×
    # duration / requests. wrk's mean latency is shown beside it but not judged by.
    lines = [
        "| applet | " + " | ".join(f"{c} client{'s' if c > 1 else ''}" for c in args.clients) + " | target |",
        "| --- |" + " ---: |" * len(args.clients) + " --- |",
    ]
    verdicts = {}
    for a in args.applets:
        cells = []
        for c in args.clients:
            bound = " †" if median_of(a, c, "wrk_cpu_pct") >= 95 else ""
            if a == "none":
                cells.append(f"{median_of(a, c, 'cycle_ms'):.3f} ms, {median_of(a, c, 'proxy_cpu_us'):.1f} µs{bound}")
            else:
                ratio = paired(a, c, "cycle_ms")
                verdicts.setdefault(a, []).append(ratio)
                interval = median_interval(ratios(a, c, "cycle_ms"))
                within = f" ({interval[0]:.3f}–{interval[1]:.3f})" if interval else ""
                cells.append(f"{ratio:.3f}{within}{bound}")
        target = TARGETS.get(a)
        if target is None:
            verdict = ""
        else:
            met = [str(c) for c, r in zip(args.clients, verdicts[a]) if r <= target]
            verdict = f"≤ {target}: " + ("met at every count" if len(met) == len(args.clients)
                                          else f"met at {', '.join(met)}" if met else "not met")
        lines.append(f"| {a} | " + " | ".join(cells) + f" | {verdict} |")
    lines += ["", "meshcache's CPU per hit (µs; utime + stime of the process / requests), its paired "
              "ratio to `none` (median, 95 % interval: unlike the cycle time, it does not depend on "
              "how busy the client is), and wrk's mean-latency ratio to `none`. † marks a cell "
              "where wrk used ≥ 95 % of its core (client-bound).", "",
              "| applet | " + " | ".join(f"{c}: CPU µs/hit | {c}: CPU ratio | {c}: wrk latency ratio"
                                        for c in args.clients) + " |",
              "| --- |" + " ---: | ---: | ---: |" * len(args.clients)]
    for a in args.applets:
        cells = []
        for c in args.clients:
            if a == "none":
                cpu, latency = "", ""
            else:
                interval = median_interval(ratios(a, c, "proxy_cpu_us"))
                within = f" ({interval[0]:.3f}–{interval[1]:.3f})" if interval else ""
                cpu = f"{paired(a, c, 'proxy_cpu_us'):.3f}{within}"
                latency = f"{paired(a, c, 'mean_ms'):.3f}"
            cells.append(f"{median_of(a, c, 'proxy_cpu_us'):.1f} | {cpu} | {latency}")
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    header = (f"Applet overhead, WebStone mix, {args.rounds} rounds × {args.duration} s per cell; "
              f"cells: median over rounds of the paired ratio of the clients' mean response time "
              f"(cycle time, clients × duration / requests) to `none` (the same hits with no "
              f"applet), in brackets a 95 % confidence interval of that median (order statistics, "
              f"shown from 6 rounds); for `none`, its cycle time and meshcache's CPU per hit.\n"
              + (f"Pooled from {', '.join(map(str, args.pool))}.\n" if args.pool else
                 f"Revision {revision()}; binary {args.bin}.\n"))
    (out / "results.md").write_text(header + "\n" + table + "\n")
    with open(out / "raw.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    (out / "results.json").write_text(json.dumps({
        "revision": None if args.pool else revision(), "seed": SEED, "webstone_mix": WEBSTONE,
        "args": json.loads(json.dumps(vars(args), default=str)),
        "ratios": {a: dict(zip(map(str, args.clients), v)) for a, v in verdicts.items()},
        "rows": rows}, indent=2))
    print(header)
    print(table)


def pool(args):
    """Reports earlier runs together: their rounds are numbered on, one run after another, so
    each stays paired with `none` of its own run and round."""
    rows, offset = [], 0
    for d in args.pool:
        if not (d / "raw.csv").is_file():
            die(f"--pool: {d / 'raw.csv'} not found (a directory this script wrote with --out)")
        with open(d / "raw.csv", newline="") as f:
            run = list(csv.DictReader(f))
        if not run:
            die(f"--pool: {d / 'raw.csv'} has no rows")
        for r in run:
            for k, v in r.items():
                r[k] = v if k == "applet" else int(v) if k in ("clients", "round", "requests", "applet_runs") else float(v)
            r["round"] += offset
        offset = max(r["round"] for r in run)
        rows += run
    present = {r["applet"] for r in rows}
    args.applets = [a for a in APPLETS if a in present]
    if "none" not in present:
        die("--pool: no `none` rows to pair with")
    args.clients = sorted({r["clients"] for r in rows})
    for a in args.applets:
        for c in args.clients:
            if not any(r["applet"] == a and r["clients"] == c for r in rows):
                die(f"--pool: no rows for {a} at {c} clients in every cell")
    args.rounds = offset
    args.duration = round(statistics.median(r["seconds"] for r in rows))
    out = args.out or REPO / "target/bench-applets" / ("pooled-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    out.mkdir(parents=True, exist_ok=True)
    report(args, rows, out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", default="1,10,20")
    p.add_argument("--applets", default=",".join(APPLETS))
    p.add_argument("--out", type=Path)
    p.add_argument("--bin", type=Path)
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--no-netns", action="store_true")
    p.add_argument("--port-base", type=int, default=18280)
    p.add_argument("--pool", type=Path, nargs="+", metavar="DIR")
    args = p.parse_args()
    if args.pool:
        pool(args)
        return
    args.clients = [int(c) for c in args.clients.split(",")]
    args.applets = args.applets.split(",")
    if "none" not in args.applets:
        args.applets.insert(0, "none")
    for a in args.applets:
        if a not in APPLETS:
            die(f"--applets: unknown applet {a}")
    if not 1 <= args.duration <= 120 or not 1 <= args.rounds <= 60:
        die("--duration 1..120, --rounds 1..60")
    if os.environ.get("BENCH_APPLETS_IN_NETNS") is None:
        ensure_tools()
        if not args.no_build and args.bin is None:
            log("cargo build --release -p meshcache")
            subprocess.run(["cargo", "build", "--release", "-p", "meshcache"], cwd=REPO, check=True)
        if args.bin is None:
            args.bin = REPO / "target/release/meshcache"
        if not args.no_netns and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
            os.environ["BENCH_APPLETS_IN_NETNS"] = "1"
            argv = [a for a in sys.argv[1:] if a != "--no-build"] + ["--no-build", "--bin", str(args.bin)]
            os.execvp("unshare", ["unshare", "-n", "--", sys.executable, __file__, *argv])
        log("running in the host's network namespace")
    else:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    args.bin = Path(args.bin or REPO / "target/release/meshcache").resolve()
    out = args.out or REPO / "target/bench-applets" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args)
    try:
        rows = bench.main()
    finally:
        bench.stop()
        shutil.copy(bench.work / "meshcache.toml", out / "meshcache.toml")
        for f in ["meshcache.log", "origin.log"]:
            if (bench.work / f).exists():
                shutil.copy(bench.work / f, out / f)
        shutil.rmtree(bench.work, ignore_errors=True)
    report(args, rows, out)


if __name__ == "__main__":
    main()
