#!/usr/bin/env python3
"""Run the shell commands the README and the book show, as a newcomer would type them.

    hack/docs-commands.py [--list] [FILE.md ...]     (default: README.md docs/src/*.md)

Every command line of every ```sh block is either run or skipped for a named reason (it needs
a GPU, a cluster, root and Podman, the network, or it is one of the long test/bench commands
that have phases of their own); a line no rule classifies fails the check, so a new example
cannot slip past it. A command is run in the repository root with `gpu-slicer` and
`fake-nvidia-smi` on PATH (GPU_SLICER_BIN / FAKE_SMI_BIN, else target/debug/), and must exit 0.

What is rewritten, and why:
- `cargo run [-q] --` becomes `gpu-slicer`: the same binary, without a nested cargo build;
- `/tmp/` becomes a fresh temporary directory, so runs never share or leave files.

Lines inside the block that follow a run command and are neither commands nor comments are
the output the docs promise: each must appear in the command's output (whitespace-normalised).
An untyped block right after `<!-- output of: ARGS -->` is the same promise for the run command
whose arguments after `gpu-slicer` (or `cargo run -q --`) are exactly ARGS.
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (reason, predicate on the joined command line). First match wins; order matters only for
# the reason printed.
SKIP = [
    ("a real GPU (--backend nvml)", lambda c: "--backend nvml" in c),
    ("a cluster", lambda c: re.match(r"(kubectl|hack/cluster\.sh|hack/e2e-cluster\.sh|eval )", c)),
    ("root and Podman", lambda c: c.startswith(("podman ", "hack/e2e-image.sh", "hack/e2e-podman.sh"))),
    ("a Prometheus server", lambda c: "--prometheus " in c),
    ("installs software", lambda c: c.startswith(("cargo install", "hack/install-deps.sh"))),
    (
        "a test or bench phase of its own",
        lambda c: c.startswith(
            (
                "hack/test.sh",
                "cargo test",
                "cargo bench",
                "hack/bench.sh",
                "hack/rss-breakdown.sh",
                "hack/advise-prom-bench.sh",
                "hack/advise-fleet.sh",
                "hack/advise-e2e.sh",
                "hack/allocator.sh",
                "hack/fuzz.sh",
                "hack/validate-manifests.sh",
                "hack/check-docs.sh",
                "hack/fake-driver-root.sh",
            )
        ),
    ),
    # The host's CDI directories differ per machine (Podman's tests write them): what these
    # print is not the docs' promise, and `run` is a daemon.
    ("the host's CDI directories", lambda c: re.match(r"gpu-slicer cdi (validate|list)\b", c) and "/var/run/cdi" in c or c == "gpu-slicer cdi list"),
    ("a daemon", lambda c: re.match(r"gpu-slicer run\b", c)),
    ("writes the host's CDI directory", lambda c: "--output /var/run/cdi" in c),
]

RUN = re.compile(r"^(hack/docs-commands\.py --list$|gpu-slicer|fake-nvidia-smi|[A-Z_]+=\S+ (gpu-slicer|fake-nvidia-smi))\b")
COMMAND_WORDS = re.compile(
    r"^(cargo|gpu-slicer|fake-nvidia-smi|kubectl|podman|hack/|eval|sh|[A-Z_]+=\S+ \S)"
)


def blocks(path):
    """(line number, lang, lines, output-of marker) for every fenced block of `path`."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    marker = None
    while i < len(lines):
        m = re.match(r"<!-- output of: (.*) -->", lines[i].strip())
        if m:
            marker = m.group(1).strip()
        if lines[i].startswith("```"):
            lang = lines[i][3:].strip()
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((start, lang, lines[start:j], marker))
            marker = None
            i = j
        i += 1
    return out


def strip_comment(line):
    """The command without a trailing `# comment`: a `#` after whitespace, outside quotes."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].strip()
    return line.strip()


def commands(block_lines):
    """(command, expected output lines) pairs of one sh block; continuations joined."""
    out = []
    k = 0
    while k < len(block_lines):
        raw = block_lines[k]
        k += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        line = raw.rstrip()
        if not COMMAND_WORDS.match(line.strip()):
            if out:
                out[-1][1].append(line.strip())
                continue
            raise SystemExit(f"docs-commands: cannot classify `{line.strip()}`")
        while line.endswith("\\") and k < len(block_lines):
            line = line[:-1].rstrip() + " " + block_lines[k].strip()
            k += 1
        out.append((strip_comment(line), []))
    return out


def normalise(text):
    return " ".join(text.split())


def gpu_slicer_form(cmd):
    return re.sub(r"^cargo run (-q )?--( |$)", "gpu-slicer ", cmd).strip()


def main(argv):
    listing = "--list" in argv
    files = [a for a in argv if a != "--list"]
    if not files:
        files = ["README.md"] + sorted(glob.glob("docs/src/*.md"))
    os.chdir(ROOT)
    bindir = tempfile.mkdtemp(prefix="gpu-slicer-docs-bin.")
    tmp = tempfile.mkdtemp(prefix="gpu-slicer-docs-tmp.")
    try:
        for name, env, default in (
            ("gpu-slicer", "GPU_SLICER_BIN", "target/debug/gpu-slicer"),
            ("fake-nvidia-smi", "FAKE_SMI_BIN", "target/debug/fake-nvidia-smi"),
        ):
            path = os.path.abspath(os.environ.get(env) or default)
            if not os.access(path, os.X_OK):
                print(f"docs-commands: {name} not found at {path} ({env}): build it first", file=sys.stderr)
                return 1
            os.symlink(path, os.path.join(bindir, name))
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        env.pop("RUST_LOG", None)
        ran = skipped = failed = 0
        outputs = {}
        pending_markers = []
        for path in files:
            for start, lang, lines, marker in blocks(path):
                if marker is not None and lang == "":
                    pending_markers.append((path, start, marker, lines))
                if lang != "sh":
                    continue
                for cmd, expected in commands(lines):
                    cmd = gpu_slicer_form(cmd)
                    where = f"{path}:{start}"
                    # Environment assignments in front do not change what a command needs.
                    bare = re.sub(r"^([A-Z_]+=\S+ )+", "", cmd)
                    reason = next((r for r, p in SKIP if p(bare)), None)
                    if reason is None and not RUN.match(cmd):
                        print(f"FAIL {where}: no rule runs or skips `{cmd}`")
                        failed += 1
                        continue
                    if reason is not None:
                        skipped += 1
                        if listing:
                            print(f"skip {where}: {cmd}  ({reason})")
                        continue
                    if listing:
                        print(f"run  {where}: {cmd}")
                        continue
                    shell = cmd.replace("/tmp/", tmp + "/")
                    res = subprocess.run(
                        ["bash", "-o", "pipefail", "-c", shell],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                    text = res.stdout + res.stderr
                    outputs[cmd.removeprefix("gpu-slicer ").strip()] = normalise(text)
                    missing = [e for e in expected if normalise(e) not in normalise(text)]
                    if res.returncode != 0 or missing:
                        failed += 1
                        print(f"FAIL {where}: `{cmd}` exited {res.returncode}")
                        for e in missing:
                            print(f"     the docs show a line it did not print: {e}")
                        print("     " + "\n     ".join(text.strip().splitlines()[-15:]))
                    else:
                        ran += 1
                        print(f"ok   {where}: {cmd}")
        for path, start, marker, lines in pending_markers:
            if listing:
                print(f"out  {path}:{start}: output of {marker}")
                continue
            got = outputs.get(marker)
            if got is None:
                failed += 1
                print(f"FAIL {path}:{start}: `<!-- output of: {marker} -->` names no command that ran")
                continue
            missing = [ln for ln in lines if ln.strip() and normalise(ln) not in got]
            if missing:
                failed += 1
                print(f"FAIL {path}:{start}: the output shown is not what `gpu-slicer {marker}` prints:")
                for ln in missing:
                    print(f"     {ln}")
            else:
                ran += 1
                print(f"ok   {path}:{start}: the output of `gpu-slicer {marker}`")
        if not listing:
            print(f"RESULT: {ran} passed, {failed} failed, {skipped} skipped (each for a named reason)")
        return 1 if failed else 0
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
