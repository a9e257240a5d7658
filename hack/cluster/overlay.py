#!/usr/bin/env python3
"""Render the local cluster's test overlays over the real deploy/ (hack/cluster.sh).

OUT/device-plugin/ builds on deploy/ and OUT/dra/ on deploy/dra/, each by a relative path
(kustomize refuses absolute ones). What they change, and only that:
  - hostPath volumes move under the cluster's state dir (CDI dir, agent state, hook dir;
    the kubelet's directories stay, its root is the default /var/lib/kubelet), the host root becomes the fake driver root, /proc a fake proc root
    holding the driver's mig-minors;
  - the agent loads the fake NVML and reaches the API server at the bridge address (this
    cluster has no kube-proxy, so the kubernetes Service IP does not route);
  - --cdi-hook-path names the hook where the init container copies it on this host;
  - the config is the cluster's (hack/cluster/config-<mode>.yaml) where one exists; DRA mode
    has none and runs deploy/dra/config.yaml as shipped, so the tier proves the overlay's
    own config serves deploy/dra/examples;
  - an annotation records the mode, so `hack/cluster.sh deploy` knows what to remove.
The container arguments are patched by index, found here from the rendered base, so a
change of order in deploy/ does not silently leave a stale path.

usage: overlay.py --repo REPO --root CLUSTER_DIR --out OUT --api URL
"""
import argparse, json, os, subprocess, sys, urllib.parse

import yaml

MODES = {"device-plugin": "deploy", "dra": "deploy/dra", "label-configs": "deploy/label-configs"}


def daemonset(repo, rel):
    out = subprocess.run(
        ["kubectl", "kustomize", os.path.join(repo, rel)], check=True, capture_output=True, text=True
    ).stdout
    for o in yaml.safe_load_all(out):
        if o and o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpu-slicer":
            return o
    sys.exit(f"overlay: no gpu-slicer DaemonSet in {rel}")


def render(repo, root, out, api, mode, rel):
    ds = daemonset(repo, rel)
    pod = ds["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    ci = names.index("gpu-slicer")
    args = pod["containers"][ci]["args"]
    hook = [i for i, a in enumerate(args) if a.startswith("--cdi-hook-path=")]
    if len(hook) != 1:
        sys.exit(f"overlay: {rel}: expected one --cdi-hook-path= argument, found {len(hook)}")
    u = urllib.parse.urlparse(api)
    lib = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    host = {
        "cdi": f"{root}/cdi",
        "host-proc": f"{root}/fake-proc",
        "host-root": f"{root}/driver-root",
        "state": f"{root}/agent-state",
        "hook-bin": f"{root}/hook-bin",
        "nfd-features": f"{root}/nfd-features",
    }
    volumes = [
        {"name": v["name"], "hostPath": {"path": host[v["name"]]}}
        for v in pod["volumes"]
        if "hostPath" in v and v["name"] in host
    ]
    # The kubelet's own directories stay where deploy/ puts them: the cluster's kubelet runs
    # with the default root (/var/lib/kubelet), as a real node's does. Its device manager
    # would serve /var/lib/kubelet/device-plugins whatever --root-dir says, and a DRA
    # driver registers its socket by the path it sees, which the kubelet dials as is.
    kept = {"dev", "device-plugins", "pod-resources", "plugins-registry", "plugins"}
    missing = {v["name"] for v in pod["volumes"] if "hostPath" in v} - set(host) - kept
    if missing:
        sys.exit(f"overlay: {rel}: hostPath volumes this overlay does not place: {sorted(missing)}")
    volumes.append({"name": "fake-gpu", "hostPath": {"path": f"{root}/fake-gpu", "type": "Directory"}})
    # The fake NVML reads injected events (XIDs) from a file it then removes, and keeps its
    # MIG state in a file: writable.
    volumes.append({"name": "fake-events", "hostPath": {"path": f"{root}/fake-events", "type": "DirectoryOrCreate"}})
    env = [
        {"name": "NVML_LIB", "value": f"/driver-root/{lib}"},
        {"name": "FAKE_NVML_NODE", "value": "/run/fake-gpu/node.yaml"},
        {"name": "FAKE_GPU_DEV_ROOT", "value": "/driver-root"},
        {"name": "NVIDIA_DRIVER_ROOT", "value": f"{root}/driver-root"},
        {"name": "CDI_HOOK_NVML_LIB", "value": f"{root}/driver-root/{lib}"},
        {
            "name": "CDI_HOOK_ENV",
            "value": f"FAKE_NVML_NODE={root}/fake-gpu/node.yaml,FAKE_NVML_LIMITS_FILE={root}/fake-gpu/limits.json",
        },
        {"name": "FAKE_NVML_EVENT_FILE", "value": "/run/fake-events/events.jsonl"},
        # MIG instances made or destroyed persist as a driver's do: across the agent's NVML
        # sessions and restarts (the fake keeps them in memory otherwise).
        {"name": "FAKE_NVML_STATE", "value": "/run/fake-events/mig-state.json"},
        # Recovery after an injected XID within the tests' patience (default 60s).
        {"name": "HEALTH_QUIET_PERIOD", "value": "15s"},
        {"name": "KUBERNETES_SERVICE_HOST", "value": u.hostname},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(u.port)},
    ]
    patch = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "gpu-slicer",
            "namespace": ds["metadata"]["namespace"],
            "annotations": {"gpu-slicer.io/cluster-mode": mode},
        },
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "gpu-slicer",
                            "env": env,
                            "volumeMounts": [
                                {"name": "fake-gpu", "mountPath": "/run/fake-gpu", "readOnly": True},
                                {"name": "fake-events", "mountPath": "/run/fake-events"},
                            ],
                        }
                    ],
                    "volumes": volumes,
                }
            }
        },
    }
    ops = [
        {
            "op": "replace",
            "path": f"/spec/template/spec/containers/{ci}/args/{hook[0]}",
            "value": f"--cdi-hook-path={root}/hook-bin/gpu-slicer",
        }
    ]
    # label-configs keeps deploy/'s named configs: they are what the scenario steers between;
    # dra keeps deploy/dra/config.yaml: it is what the examples scenario checks.
    cfg_path = os.path.join(repo, f"hack/cluster/config-{mode}.yaml")
    config = open(cfg_path).read() if os.path.exists(cfg_path) else None
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpu-slicer-config", "namespace": ds["metadata"]["namespace"]},
        "data": {"config.yaml": config},
    }
    d = os.path.join(out, mode)
    os.makedirs(d, exist_ok=True)
    base = os.path.relpath(os.path.join(repo, rel), d)
    kust = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "patches": ([{"path": "config.yaml"}] if config else [])
        + [
            {"path": "agent.yaml"},
            {"target": {"kind": "DaemonSet", "name": "gpu-slicer"}, "patch": json.dumps(ops)},
        ],
    }
    header = "# Rendered by hack/cluster/overlay.py for the local cluster; not for real nodes.\n"
    files = [("kustomization.yaml", kust), ("agent.yaml", patch)] + ([("config.yaml", cm)] if config else [])
    for name, obj in files:
        with open(os.path.join(d, name), "w") as f:
            f.write(header + yaml.safe_dump(obj, sort_keys=False))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repo", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--api", required=True)
    a = p.parse_args()
    for mode, rel in MODES.items():
        render(a.repo, a.root, a.out, a.api, mode, rel)


if __name__ == "__main__":
    main()
