#!/usr/bin/env python3
"""Pack a directory into a one-layer OCI image archive that `ctr images import` reads.

The local cluster has no registry: its pause and test images are made from files on this
machine (hack/cluster/images.sh). Deterministic: sorted entries, zero mtimes, root owner.

usage: oci-archive.py ROOTFS REF OUT.tar [--entrypoint ARG]... [--cmd ARG]... [--env K=V]...
"""
import argparse, hashlib, io, json, os, tarfile


def layer(rootfs):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, os.path.relpath(path, rootfs))
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def blob(tar, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": "sha256:" + digest, "size": len(data)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("rootfs")
    p.add_argument("ref")
    p.add_argument("out")
    p.add_argument("--entrypoint", action="append", default=[])
    p.add_argument("--cmd", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    a = p.parse_args()
    diff = layer(a.rootfs)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": a.env, "Entrypoint": a.entrypoint or None, "Cmd": a.cmd or None},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(diff).hexdigest()]},
    }
    with tarfile.open(a.out, "w") as tar:
        layer_desc = blob(tar, diff)
        layer_desc["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
        config_desc = blob(tar, json.dumps(config, sort_keys=True).encode())
        config_desc["mediaType"] = "application/vnd.oci.image.config.v1+json"
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = blob(tar, json.dumps(manifest, sort_keys=True).encode())
        manifest_desc["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
        manifest_desc["annotations"] = {
            "io.containerd.image.name": a.ref,
            "org.opencontainers.image.ref.name": a.ref.rsplit(":", 1)[1],
        }
        manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
