#!/usr/bin/env python3
"""The fleet check of `gpu-slicer advise` (issue 32 item 6), driven by hack/advise-fleet.sh.

A synthetic fleet of 8 sim nodes x 8 GPUs (4 nodes of H100 80GB HBM3, 4 of A100-SXM4-80GB),
mean utilisation near 25 %: small inference workloads, some with compute bursts, two
training jobs of 4 GPUs. Each node is a real `gpu-slicer run --backend sim:<node file>`
with its kubelet (`gpu-slicer emulate --kubelet`: registration, Allocate, PodResources,
checkpoint) and a fake proc root whose `<pid>/cgroup` files name the pods' UIDs, so the
agent attributes GPU memory to pods as on a real node. A real Prometheus scrapes the agents
every second, and a generated dcgm-exporter exposition of the same GPUs.

1. Collect: every pod holds whole GPUs (`nvidia.com/gpu`); the usage of each pod is
   replayed tick by tick into the node files' `usage` sections (one tick a second).
2. Advise: `advise --prometheus` over that window, once per metric family.
3. Apply: release the pods, write each node's pool config (node-labels.yaml -> configs/),
   the agents reload; each pod asks its kubelet for the resource the plan gave its workload.
4. Replay the same usage per pod onto the device its new allocation names.
5. Check, from what Prometheus recorded during the replay: no pod's memory above its
   grant, replayed utilisation of the GPUs in use within 5 points of the projection, GPUs in
   use within 10 % of the lower bound; and the dcgm-exporter input gives the same plan,
   workload for workload.

Usage: advise-fleet.py GPU_SLICER_BIN WORKDIR (the shell wrapper makes both).
Environment: FLEET_TICKS (default 60): seconds of usage per phase.
"""

import http.server
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import yaml

BIN, WD = sys.argv[1], sys.argv[2]
TICKS = int(os.environ.get("FLEET_TICKS", "60"))
MIB = 1 << 20
MODELS = {
    "h100": ("NVIDIA H100 80GB HBM3", 81559),
    "a100": ("NVIDIA A100-SXM4-80GB", 81920),
}
NODES = [(f"gpu-node-{i}", "h100" if i < 4 else "a100") for i in range(8)]
GPUS_PER_NODE = 8
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def say(*a):
    print("advise-fleet:", *a, flush=True)


def fail(msg):
    print(f"advise-fleet: FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def uuid(node, gpu):
    return f"GPU-f1ee7000-0000-4000-8000-{node:04x}{gpu:08x}"


def suffix(n, length):
    out = ""
    for _ in range(length):
        out += ALPHABET[n % len(ALPHABET)]
        n //= len(ALPHABET)
    return out


# ------------------------------------------------------------------------- the workloads
#
# (namespace, name, model, pods, gpus per pod, kind, memory MiB (base, swing), compute %
# (mean, swing)). `steady`: smooth waves; `bursty`: compute at mean+swing 3 ticks in 20,
# else mean-swing/6 (p95 the burst); `train`: busy all the time.
WORKLOADS = [
    ("serving", "chat", "h100", 10, 1, "steady", (4200, 1300), (14, 4)),
    ("serving", "embed", "h100", 8, 1, "steady", (9000, 2000), (18, 5)),
    ("serving", "rerank", "h100", 6, 1, "steady", (2600, 600), (8, 3)),
    ("search", "query-burst", "h100", 4, 1, "bursty", (6000, 1000), (12, 50)),
    ("research", "llm-train", "h100", 1, 4, "train", (62000, 6000), (90, 5)),
    ("vision", "ocr", "a100", 10, 1, "steady", (7000, 1500), (14, 4)),
    ("vision", "asr", "a100", 8, 1, "steady", (12000, 2500), (22, 5)),
    ("vision", "detect-burst", "a100", 4, 1, "bursty", (5000, 800), (12, 45)),
    ("vision", "summarize", "a100", 6, 1, "steady", (3000, 700), (15, 3)),
    ("research", "vit-train", "a100", 1, 4, "train", (58000, 8000), (88, 6)),
]


class Pod:
    def __init__(self, w, i):
        self.namespace, self.workload, self.model = w[0], w[1], w[2]
        self.gpus, self.kind, self.mem, self.util = w[4], w[5], w[6], w[7]
        if self.kind == "train":  # a Job's pod: <job>-<5>
            self.name = f"{self.workload}-{suffix(7919 * (i + 3), 5)}"
        else:  # a Deployment's pod: <deployment>-<template hash>-<5>
            self.name = f"{self.workload}-{suffix(104729 * (len(self.workload) + 1), 10)}-{suffix(31337 * (i + 1) + len(self.workload), 5)}"
        self.phase = 7 * i + len(self.workload)
        self.node = None  # index
        self.devices = []  # device IDs of the allocation
        self.resource = None
        self.uid = None

    def memory(self, t):
        base, swing = self.mem
        return int(base + swing * (0.5 + 0.5 * math.sin(2 * math.pi * (t + self.phase) / 20)))

    def compute(self, t):
        mean, swing = self.util
        if self.kind == "bursty":
            return mean + swing if (t + self.phase) % 20 < 3 else max(0, mean - swing * 3 / 17)
        return mean + swing * math.sin(2 * math.pi * (t + self.phase) / 15)


PODS = [Pod(w, i) for w in WORKLOADS for i in range(w[3])]
mean_util = sum(
    sum(p.compute(t) for t in range(TICKS)) / TICKS * p.gpus for p in PODS
) / (len(NODES) * GPUS_PER_NODE)
say(f"fleet: {len(NODES) * GPUS_PER_NODE} GPUs, {len(PODS)} pods of {len(WORKLOADS)} workloads, mean utilisation {mean_util:.1f} %")

# ------------------------------------------------------------------------ processes


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


procs = []


def start(args, **kw):
    p = subprocess.Popen(args, **kw)
    procs.append(p)
    return p


def stop_all():
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for(what, check, limit=60.0, every=0.2):
    deadline = time.time() + limit
    while time.time() < deadline:
        v = check()
        if v:
            return v
        time.sleep(every)
    fail(f"{what}: not after {limit:.0f} s")


class Kubelet:
    """One `gpu-slicer emulate --kubelet`, a line per command."""

    def __init__(self, dp):
        self.p = start(
            [BIN, "emulate", "--kubelet", "--dir", dp],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=open(f"{dp}.emulate.log", "w"),
        )
        first = self.p.stdout.readline()
        if not first.startswith("ready"):
            fail(f"kubelet emulator in {dp} did not start: {first!r}")

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        answer = self.p.stdout.readline().strip()
        if not answer.startswith("ok"):
            fail(f"kubelet `{line}`: {answer}")
        return answer[3:].split()


class Node:
    def __init__(self, i, name, model):
        self.i, self.name, self.model = i, name, model
        self.dir = f"{WD}/{name}"
        self.dp = f"{self.dir}/dp"
        os.makedirs(self.dp)
        os.makedirs(f"{self.dir}/proc")
        self.uuids = [uuid(i, g) for g in range(GPUS_PER_NODE)]
        self.config = f"{self.dir}/config/config.yaml"
        os.makedirs(os.path.dirname(self.config))
        with open(self.config, "w") as f:
            f.write("version: v1\n")
        self.write_usage({})
        self.kubelet = Kubelet(self.dp)
        self.port = free_port()
        self.agent = start(
            [BIN, "run", "--backend", f"sim:{self.dir}/node.yaml", "--config", self.config,
             "--device-plugin-dir", self.dp, "--cdi-dir", f"{self.dir}/cdi",
             "--proc-root", f"{self.dir}/proc", "--http-listen", f"127.0.0.1:{self.port}",
             "--pod-resources-socket", f"{self.dp}/pod-resources.sock",
             "--usage-interval", "500ms", "--ledger-interval", "500ms"],
            env={**os.environ, "STATE_DIR": f"{self.dir}/state",
                 "LABELS_FILE": f"{self.dir}/features.d/gpu-slicer", "RUST_LOG": "warn"},
            stdout=subprocess.DEVNULL, stderr=open(f"{self.dir}/agent.log", "w"),
        )

    def write_usage(self, usage):
        product = MODELS[self.model][0]
        spec = {
            "name": self.name, "driverVersion": "570.124.06", "cudaDriverVersion": 12080,
            "gpus": [{"index": g, "uuid": u, "product": product,
                      "pciBusId": f"00000000:{0x18 + 16 * g:02X}:00.0", "numaNode": g // 4}
                     for g, u in enumerate(self.uuids)],
            "usage": {"devices": usage},
        }
        tmp = f"{self.dir}/.node.yaml.tmp"
        with open(tmp, "w") as f:
            json.dump(spec, f)  # JSON is YAML
        os.replace(tmp, f"{self.dir}/node.yaml")

    def metrics(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                return r.read().decode()
        except OSError:
            return ""

    def resources(self):
        return dict(w.split("=") for w in self.kubelet.ask("resources"))


def write_cgroup(node, pid, uid):
    d = f"{node.dir}/proc/{pid}"
    os.makedirs(d, exist_ok=True)
    u = uid.replace("-", "_")
    with open(f"{d}/cgroup", "w") as f:
        f.write(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
                f"cri-containerd-{pid:064x}.scope\n")


# ----------------------------------------------------------------------- usage ticks

state_lock = threading.Lock()
dcgm_text = ""  # the current dcgm-exporter exposition


def holders(node):
    """GPU UUID -> pods on it (a replica ID `GPU-…::n` sits on its GPU)."""
    out = {u: [] for u in node.uuids}
    for p in PODS:
        if p.node == node.i:
            for d in p.devices:
                out[d.split("::")[0]].append(p)
    return out


def pid_of(pod, k):
    return 10000 + 10 * PODS.index(pod) + k


def tick(nodes, t, dcgm):
    global dcgm_text
    lines = {m: [] for m in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                             "DCGM_FI_DEV_FB_FREE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")}
    for node in nodes:
        usage = {}
        for g, (u, on) in enumerate(holders(node).items()):
            if not on:
                continue
            processes = []
            for pod in on:
                k = [d.split("::")[0] for d in pod.devices].index(u)
                processes.append({"pid": pid_of(pod, k), "memoryMiB": pod.memory(t)})
            util = min(100, round(sum(p.compute(t) for p in on)))
            usage[u] = {"utilizationPercent": util, "processes": processes}
            if dcgm:
                product, total = MODELS[node.model]
                used = sum(p["memoryMiB"] for p in processes)
                pod = on[0]
                labels = (f'gpu="{g}",UUID="{u}",device="nvidia{g}",modelName="{product}",'
                          f'Hostname="{node.name}",namespace="{pod.namespace}",pod="{pod.name}",'
                          f'container="main"')
                lines["DCGM_FI_DEV_GPU_UTIL"].append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}")
                lines["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}")
                lines["DCGM_FI_DEV_FB_FREE"].append(f"DCGM_FI_DEV_FB_FREE{{{labels}}} {total - used}")
                lines["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].append(
                    f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {util / 100:.6f}")
        node.write_usage(usage)
    if dcgm:
        text = []
        for name, ls in lines.items():
            text.append(f"# HELP {name} generated by hack/advise-fleet.py")
            text.append(f"# TYPE {name} gauge")
            text.extend(ls)
        with state_lock:
            dcgm_text = "\n".join(text) + "\n"


def replay(nodes, dcgm):
    """Play TICKS seconds of usage; returns (start, end) unix seconds."""
    t0 = time.time()
    for t in range(TICKS):
        tick(nodes, t, dcgm)
        time.sleep(max(0.0, t0 + t + 1 - time.time()))
    return t0, time.time()


class Dcgm(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with state_lock:
            body = dcgm_text.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


# ----------------------------------------------------------------------- Prometheus


def query(prom, q, at):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": f"{at:.3f}"})
    with urllib.request.urlopen(url, timeout=30) as r:
        answer = json.load(r)
    if answer.get("status") != "success":
        fail(f"query {q}: {answer}")
    return [(s["metric"], float(s["value"][1])) for s in answer["data"]["result"]]


def advise(prom, metrics, start, end, out):
    window = int(end - start)
    args = [BIN, "advise", "--prometheus", prom, "--metrics", metrics, "--window", f"{window}s",
            "--at", f"{end:.3f}", "--min-history", f"{window // 3}s",
            "--summary-json", f"{out}.json", "--output", out]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(args)} exited {r.returncode}: {r.stderr}")
    with open(f"{out}.txt", "w") as f:
        f.write(r.stdout)
    with open(f"{out}.json") as f:
        return json.load(f)


def main():
    dcgm_port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", dcgm_port), Dcgm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    nodes = [Node(i, name, model) for i, (name, model) in enumerate(NODES)]
    prom_port = free_port()
    targets = [{"targets": [f"127.0.0.1:{n.port}"], "labels": {"node": n.name}} for n in nodes]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [
            {"job_name": "gpu-slicer", "static_configs": targets},
            {"job_name": "dcgm-exporter", "static_configs": [{"targets": [f"127.0.0.1:{dcgm_port}"]}]},
        ],
    }
    with open(f"{WD}/prometheus.yml", "w") as f:
        yaml.safe_dump(config, f)
    start(["prometheus", f"--config.file={WD}/prometheus.yml", f"--storage.tsdb.path={WD}/tsdb",
           f"--web.listen-address=127.0.0.1:{prom_port}"],
          stdout=subprocess.DEVNULL, stderr=open(f"{WD}/prometheus.log", "w"))
    prom = f"http://127.0.0.1:{prom_port}"

    def ready():
        try:
            urllib.request.urlopen(f"{prom}/-/ready", timeout=1)
            return True
        except OSError:
            return False

    wait_for("prometheus ready", ready)
    for n in nodes:
        wait_for(f"agent of {n.name} serving /metrics", lambda n=n: "gpu_slicer_" in n.metrics())

    # 1. every pod on whole GPUs, first fit over the nodes of its model
    for pod in PODS:
        for n in nodes:
            if n.model != pod.model:
                continue
            used = sum(len(p.devices) for p in PODS if p.node == n.i)
            if GPUS_PER_NODE - used >= pod.gpus:
                words = n.kubelet.ask(f"allocate nvidia.com/gpu {pod.namespace} {pod.name} main {pod.gpus}")
                pod.node, pod.uid, pod.devices = n.i, words[0], words[1:]
                break
        else:
            fail(f"no node of {pod.model} for {pod.name}")
        for k in range(pod.gpus):
            write_cgroup(nodes[pod.node], pid_of(pod, k), pod.uid)
    wait_for("Prometheus sees every pod's allocation",
             lambda: len(query(prom, "gpu_slicer_pod_device_allocation", time.time())) == sum(p.gpus for p in PODS))
    say(f"collect: {TICKS} s of usage on whole GPUs, scraped every second")
    c0, c1 = replay(nodes, dcgm=True)
    time.sleep(3)  # the last samples scraped
    unattributed = query(prom, f"max_over_time(gpu_slicer_unattributed_processes[{int(c1 - c0)}s]) > 0", c1 + 2)
    if unattributed:
        fail(f"processes left unattributed while collecting: {unattributed}")

    # 2. advise, both metric families
    plan = advise(prom, "gpu-slicer", c0, c1, f"{WD}/plan")
    dcgm_plan = advise(prom, "dcgm", c0, c1, f"{WD}/plan-dcgm")
    server.shutdown()
    say(f"advise: {plan['gpusBefore']} GPUs -> {plan['gpusAfter']} (lower bound {plan['lowerBound']}), "
        f"utilisation {100 * plan['utilizationBefore']:.1f} % -> {100 * plan['utilizationAfter']:.1f} % projected")
    if plan["gpusBefore"] != len(NODES) * GPUS_PER_NODE:
        fail(f"advise saw {plan['gpusBefore']} GPUs held, not {len(NODES) * GPUS_PER_NODE}")
    classes = {(w["namespace"], w["name"]): w for w in plan["workloads"]}
    want = {(w[0], w[1]) for w in WORKLOADS}
    if set(classes) != want:
        fail(f"workloads found {sorted(classes)}, not {sorted(want)}")
    for key, w in classes.items():
        d = next((x for x in dcgm_plan["workloads"] if (x["namespace"], x["name"]) == key), None)
        if d is None or (d["class"], d["share"], d["resource"]) != (w["class"], w["share"], w["resource"]):
            fail(f"dcgm-exporter input plans {key} as {d and (d['class'], d['share'])}, "
                 f"gpu-slicer's as {(w['class'], w['share'])}")
    if (dcgm_plan["gpusAfter"], dcgm_plan["lowerBound"]) != (plan["gpusAfter"], plan["lowerBound"]):
        fail(f"dcgm-exporter input: {dcgm_plan['gpusAfter']} GPUs (bound {dcgm_plan['lowerBound']}), "
             f"gpu-slicer's: {plan['gpusAfter']} (bound {plan['lowerBound']})")
    if dcgm_plan["pools"] != plan["pools"]:
        fail(f"dcgm-exporter input pools {dcgm_plan['pools']}, gpu-slicer's {plan['pools']}")
    say("dcgm-exporter input: the same plan, workload for workload and pool for pool "
        f"({', '.join(sorted({w['class'] for w in plan['workloads']}))})")
    mig = f"{WD}/plan/mig-parted.yaml"  # written only when a pool has MIG GPUs
    if os.path.exists(mig):
        with open(mig) as f:
            fail("the plan uses MIG; the sim fleet check replays replicas and whole GPUs only")

    # 3. apply: release every pod, then the node's pool config (the agents reload)
    for pod in PODS:
        nodes[pod.node].kubelet.ask(f"release {pod.namespace} {pod.name}")
        pod.node, pod.devices = None, []
    for n in nodes:
        n.write_usage({})
    for n in nodes:
        wait_for(f"{n.name}'s agent sees the pods gone",
                 lambda n=n: "gpu_slicer_pod_device_allocation{" not in n.metrics())
    with open(f"{WD}/plan/node-labels.yaml") as f:
        labels = yaml.safe_load(f) or {}
    offered = {}
    for n in nodes:
        pool = (labels.get(n.name) or {}).get("nvidia.com/device-plugin.config", "default")
        with open(f"{WD}/plan/configs/{pool}.yaml") as f:
            text = f.read()
        cfg = yaml.safe_load(text)
        shared = {}
        for r in (cfg.get("sharing") or {}).get("timeSlicing", {}).get("resources", []):
            shared[r["rename"]] = r["replicas"] * len(r["devices"])
        whole = GPUS_PER_NODE - sum(
            len(r["devices"]) for r in (cfg.get("sharing") or {}).get("timeSlicing", {}).get("resources", []))
        offered[n.i] = {**shared, **({"nvidia.com/gpu": whole} if whole else {})}
        tmp = f"{os.path.dirname(n.config)}/.config.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, n.config)
    for n in nodes:
        wait_for(f"{n.name} serves its pool {offered[n.i]}",
                 lambda n=n: all(n.resources().get(r) == str(c) for r, c in offered[n.i].items()))
    say("apply: pool configs written, agents reloaded: "
        + "; ".join(f"{n.name} {offered[n.i]}" for n in nodes))

    # 4. each pod asks for its workload's share, first fit over the nodes offering it
    for pod in PODS:
        w = classes[(pod.namespace, pod.workload)]
        resource, count = w["resource"].split(": ")
        count = int(count)
        for n in nodes:
            if n.model != pod.model:
                continue
            taken = sum(1 for p in PODS if p.node == n.i for d in p.devices if p.resource == resource)
            if offered[n.i].get(resource, 0) - taken >= count:
                words = n.kubelet.ask(f"allocate {resource} {pod.namespace} {pod.name} main {count}")
                pod.node, pod.uid, pod.devices, pod.resource = n.i, words[0], words[1:], resource
                break
        else:
            fail(f"no node offers {count} x {resource} for {pod.namespace}/{pod.name}")
        for k in range(len(pod.devices)):
            write_cgroup(nodes[pod.node], pid_of(pod, k), pod.uid)
    wait_for("Prometheus sees every pod on its new share",
             lambda: len(query(prom, "gpu_slicer_pod_device_allocation", time.time())) == sum(len(p.devices) for p in PODS))
    say(f"replay: the same {TICKS} s of usage on the new shares")
    r0, r1 = replay(nodes, dcgm=False)
    time.sleep(3)
    w = f"{int(r1 - r0) - 2}s"
    at = r1 + 1

    # 5. the checks, from what Prometheus recorded during the replay
    unattributed = query(prom, f"max_over_time(gpu_slicer_unattributed_processes[{w}]) > 0", at)
    if unattributed:
        fail(f"processes left unattributed in the replay: {unattributed}")
    used = {(m["namespace"], m["pod"]): v for m, v in query(
        prom, f"max by (namespace, pod) (max_over_time(gpu_slicer_share_memory_used_bytes[{w}]))", at)}
    granted = {(m["namespace"], m["pod"]): v for m, v in query(
        prom, f"max by (namespace, pod) (max_over_time(gpu_slicer_share_memory_granted_bytes[{w}]))", at)}
    worst = 1.0
    for pod in PODS:
        key = (pod.namespace, pod.name)
        if key not in used or key not in granted:
            fail(f"no share memory series for {key} in the replay")
        plan_grant = classes[(pod.namespace, pod.workload)]["grantMemoryBytes"]
        if used[key] > granted[key] or used[key] > plan_grant * pod.gpus:
            fail(f"{key}: peak {used[key] / MIB:.0f} MiB above its grant "
                 f"{granted[key] / MIB:.0f} MiB (plan: {plan_grant / MIB:.0f} MiB)")
        worst = min(worst, 1 - used[key] / granted[key])
    gpus_in_use = {m["device"].split("::")[0] for m, _ in query(
        prom, f"max_over_time(gpu_slicer_pod_device_allocation[{w}])", at)}
    util = {m["uuid"]: v for m, v in query(prom, f"avg_over_time(gpu_slicer_device_utilization_ratio[{w}])", at)}
    replayed = sum(util[u] for u in gpus_in_use) / len(gpus_in_use)
    projected = plan["utilizationAfter"]
    bound = plan["lowerBound"]
    say(f"replayed: {len(gpus_in_use)} GPUs in use (plan {plan['gpusAfter']}, lower bound {bound}), "
        f"utilisation {100 * replayed:.1f} % (projected {100 * projected:.1f} %), "
        f"tightest pod {100 * worst:.1f} % under its grant")
    if abs(replayed - projected) > 0.05:
        fail(f"replayed utilisation {100 * replayed:.1f} % is not within 5 points of the projected {100 * projected:.1f} %")
    if len(gpus_in_use) > bound * 1.1:
        fail(f"{len(gpus_in_use)} GPUs in use is more than 10 % above the lower bound {bound}")
    with open(f"{WD}/result.json", "w") as f:
        json.dump({"gpusBefore": plan["gpusBefore"], "gpusInUse": len(gpus_in_use), "gpusAfter": plan["gpusAfter"],
                   "lowerBound": bound, "utilizationBefore": plan["utilizationBefore"],
                   "utilizationProjected": projected, "utilizationReplayed": replayed,
                   "collectSeconds": c1 - c0, "replaySeconds": r1 - r0}, f)
    say("ok: no pod above its grant, utilisation within 5 points, GPUs within 10 % of the bound")


try:
    main()
finally:
    stop_all()
