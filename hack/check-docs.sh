#!/usr/bin/env bash
# Check the docs: the README and the book under docs/ (mdBook).
#
#   1. every relative link and `#anchor` in README.md and docs/src/**/*.md resolves: the file
#      exists and, for an anchor, a heading of that file has that id (made from the heading
#      text as mdBook makes it); every chapter is in docs/src/SUMMARY.md and every entry there
#      exists. A broken one fails naming the file, the line and the link;
#   2. no document names a minimum Rust version other than Cargo.toml's `rust-version`, the
#      one place it is declared;
#   3. `mdbook build docs` builds the book into target/book (mdbook from hack/install-deps.sh;
#      without it this step fails and says so, unless DOCS_SKIP_BOOK=1), and every link of
#      the HTML it wrote resolves to a page and an id mdBook gave.
#
# `cargo doc` with `-D warnings` (no dangling intra-doc links) is its own phase of
# hack/test.sh. `hack/check-docs.sh --self-test` checks the checker on broken inputs.
set -euo pipefail
cd "$(dirname "$0")/.."

check_tree() {
  python3 - "$1" <<'PY'
import pathlib, re, sys

root = pathlib.Path(sys.argv[1])
errors = []

def fail(path, line, msg):
    errors.append(f"{path.relative_to(root)}:{line}: {msg}")

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")

def prose_lines(path):
    """(line number, text) of the lines outside fenced code, inline code blanked."""
    fence = None
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)

def heading_text(raw):
    text = raw.strip().rstrip("#").strip()
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"`([^`]*)`", r"\1", text)                  # code spans: their content
    text = re.sub(r"[*_]{1,3}([^*_]+)[*_]{1,3}", r"\1", text)  # emphasis
    return re.sub(r"<[^>]+>", "", text)

def normalize_id(text):
    # mdBook's normalize_id: alphanumerics (lowercased), '_' and '-' kept, whitespace -> '-'.
    out = []
    for ch in text:
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)

_ids = {}
def ids_of(path):
    if path not in _ids:
        seen, found = {}, set()
        fence = None
        for line in path.read_text(encoding="utf-8").split("\n"):
            m = FENCE.match(line)
            if m:
                fence = m.group(1) if fence is None else (None if line.strip().startswith(fence) else fence)
                continue
            h = re.match(r"^#{1,6}\s+(.*)$", line) if fence is None else None
            if h:
                base = normalize_id(heading_text(h.group(1)))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        _ids[path] = found
    return _ids[path]

src = root / "docs" / "src"
docs = [root / "README.md"] + sorted(src.rglob("*.md"))
for doc in docs:
    if not doc.exists():
        fail(doc, 0, "missing")
        continue
    for n, line in prose_lines(doc):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # https:, mailto:: not checked offline
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc
            if path_part and not dest.exists():
                fail(doc, n, f"link `{target}`: no such file {path_part}")
                continue
            if anchor:
                if dest.suffix != ".md":
                    fail(doc, n, f"link `{target}`: an anchor into a file that is not Markdown")
                elif anchor not in ids_of(dest):
                    fail(doc, n, f"link `{target}`: {dest.relative_to(root)} has no heading with id `{anchor}`")

summary = src / "SUMMARY.md"
listed = set()
if summary.exists():
    for n, line in prose_lines(summary):
        for m in LINK.finditer(line):
            listed.add((src / m.group(1).partition("#")[0]).resolve())
    for chapter in sorted(src.rglob("*.md")):
        if chapter != summary and chapter.resolve() not in listed:
            fail(chapter, 0, "chapter not listed in docs/src/SUMMARY.md")
else:
    errors.append("docs/src/SUMMARY.md: missing")

# The MSRV: declared once, in Cargo.toml; a document may name it, never another number.
# (A `rust-version = "…"` line of the root manifest: [workspace.package] or [package].)
declared = re.search(r'(?m)^rust-version\s*=\s*"([0-9.]+)"', (root / "Cargo.toml").read_text(encoding="utf-8"))
msrv = declared.group(1) if declared else None
if msrv is None:
    errors.append("Cargo.toml: no rust-version (the one place the MSRV is declared)")
else:
    claim = re.compile(
        r"(?i)(?:\bmsrv\b|minimum supported rust|\brust-version\b|\brustc?\b)"
        r"[^0-9\n]{0,40}?(?:≥|>=|at least|version|\s)\s*`?(1\.\d+)(?:\.\d+)?")
    for doc in docs:
        if not doc.exists():
            continue
        for n, line in enumerate(doc.read_text(encoding="utf-8").split("\n"), 1):
            for m in claim.finditer(line):
                if m.group(1) != ".".join(msrv.split(".")[:2]):
                    fail(doc, n, f"names Rust {m.group(1)} as the minimum; Cargo.toml's rust-version is {msrv}")

for e in errors:
    print(f"check-docs: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"check-docs: {len(docs)} documents, their links and anchors resolve; MSRV {msrv} named nowhere else")
PY
}

# The built book, as mdBook wrote it: every relative href in a chapter's <main> names a page
# of the book and, with a fragment, an id on that page (the Markdown check above works out
# the ids; this one reads them from the HTML).
check_html() {
  python3 - "$1" <<'PY'
import html, pathlib, re, sys

book = pathlib.Path(sys.argv[1])
pages = {f.name: f.read_text(encoding="utf-8") for f in book.glob("*.html")}
ids = {name: set(re.findall(r'\bid="([^"]+)"', text)) for name, text in pages.items()}
errors = []
for name, text in sorted(pages.items()):
    if name in ("print.html", "toc.html", "404.html") or "<main>" not in text:
        continue
    main = text.split("<main>", 1)[1].split("</main>", 1)[0]
    for href in re.findall(r'href="([^"]+)"', main):
        href = html.unescape(href)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", href):
            continue
        path, _, anchor = href.partition("#")
        target = path or name
        if path and not (book / path).exists():
            errors.append(f"{name}: href `{href}`: no such page")
        elif anchor and anchor not in ids.get(target, set()):
            errors.append(f"{name}: href `{href}`: {target} has no id `{anchor}`")
for e in errors:
    print(f"check-docs: built book: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"check-docs: built book: {len(pages)} pages, every link resolves")
PY
}

self_test() {
  local t
  t=$(mktemp -d)
  trap 'rm -rf "$t"' RETURN
  mkdir -p "$t/docs/src"
  printf '[workspace.package]\nrust-version = "1.89"\n' >"$t/Cargo.toml"
  printf '# Summary\n\n- [A](a.md)\n' >"$t/docs/src/SUMMARY.md"
  printf '# A\n\n## Shares that bind (`isolation`)\n\n[ok](#shares-that-bind-isolation)\n' >"$t/docs/src/a.md"
  printf '# R\n\nRust ≥ 1.89. [a](docs/src/a.md#shares-that-bind-isolation)\n```\n[not a link](nowhere.md)\n```\n' >"$t/README.md"
  check_tree "$t" >/dev/null || { echo "check-docs self-test: a good tree was refused" >&2; return 1; }
  local bad
  for bad in 'README.md:[x](docs/src/b.md)' 'README.md:[x](docs/src/a.md#nope)' \
    'README.md:Rust ≥ 1.88 is needed' 'docs/src/a.md:[x](#shares)' 'docs/src/c.md:# C'; do
    cp "$t/README.md" "$t/README.bak"
    cp "$t/docs/src/a.md" "$t/a.bak"
    printf '\n%s\n' "${bad#*:}" >>"$t/${bad%%:*}"
    if check_tree "$t" 2>/dev/null >&2; then
      echo "check-docs self-test: accepted a broken tree: ${bad}" >&2
      return 1
    fi
    mv "$t/README.bak" "$t/README.md"
    mv "$t/a.bak" "$t/docs/src/a.md"
    rm -f "$t/docs/src/c.md"
  done
  echo "check-docs self-test: ok"
}

if [ "${1:-}" = --self-test ]; then
  self_test
  exit
fi

check_tree "$PWD"
if [ "${DOCS_SKIP_BOOK:-0}" = 1 ]; then
  echo "check-docs: DOCS_SKIP_BOOK=1: the book is not built"
elif command -v mdbook >/dev/null 2>&1; then
  mdbook build docs
  echo "check-docs: book built in target/book ($(mdbook --version))"
  check_html target/book
else
  echo "check-docs: mdbook not found; hack/install-deps.sh installs it (or DOCS_SKIP_BOOK=1)" >&2
  exit 1
fi
